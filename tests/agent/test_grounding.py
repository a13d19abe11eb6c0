"""The grounding check: what counts as a claim, and which answers about a source it refuses."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from perdure.agent.grounding import (
    TRIMMED,
    borrowed,
    check,
    claims,
    copy_ratio,
    unsupported,
)

SOURCE = (
    "Incident report: checkout outage, 3 November, 09:12 to 09:47 UTC. Maria Lopez rolled "
    "back the change at 09:41; 1,200 orders (about $4,500) failed. Version 2.3.1 fixes it."
)


def test_claims_are_numbers_and_names_not_sentence_starting_common_words() -> None:
    """Numbers as written and capitalised names count; "The" at a sentence start does not."""
    found = claims("The outage on 3 November hit API users. Bob Stone fixed it at 09:41.")
    assert found == ["3", "09", "41", "November", "API", "Bob", "Stone"]
    assert claims("After that, it recovered.") == []


def test_a_faithful_summary_is_grounded() -> None:
    """Reformatted thousands and leading zeros still match; every claim is in the source."""
    answer = "Checkout failed on 3 November from 9:12 to 9:47 UTC: 1200 orders, $4,500."
    verdict = check(answer, SOURCE)
    assert verdict.ok, verdict.reasons
    assert verdict.evidence.startswith("grounded")


def test_invented_dates_numbers_and_names_are_named() -> None:
    """The refusal lists exactly the claims the source lacks."""
    answer = "On 2024-05-01 Bob fixed the outage; 3,000 orders failed in March."
    assert unsupported(answer, SOURCE) == ["2024", "05", "01", "3,000", "Bob", "March"]
    verdict = check(answer, SOURCE)
    assert not verdict.ok
    assert "'Bob'" in verdict.evidence and "'2024'" in verdict.evidence


def test_a_month_is_grounded_by_a_date_in_that_month_written_any_way() -> None:
    """ "March" is supported by 2026-03-14, not by a date in April."""
    assert unsupported("It shipped in March.", "Shipped 2026-03-14.") == []
    assert unsupported("It shipped in March.", "Shipped 2026-04-14.") == ["March"]


def test_a_cut_off_answer_and_length_bounds_are_refused() -> None:
    """stop_reason "length" is never accepted, nor an answer outside min/max characters."""
    assert not check("Checkout failed.", SOURCE, stop_reason="length").ok
    assert not check("Checkout failed.", SOURCE, stop_reason="max_tokens").ok  # Anthropic's
    assert "fewer than 40" in check("Checkout failed.", SOURCE, min_chars=40).evidence
    assert "more than 10" in check("Checkout failed badly.", SOURCE, max_chars=10).evidence


def test_an_answer_that_names_nothing_of_its_source_is_refused() -> None:
    """ "The document is a report" says nothing checkable: refused when the source has facts."""
    vague = "The document contains a summary of a report about something."
    assert "names nothing" in check(vague, SOURCE).evidence
    invented = "Bob wrote a report about something. Bob sent it."  # a name said twice
    assert "names nothing" in check(invented, SOURCE).evidence
    assert check("It was fine.", "It was a fine day, all quiet.").ok  # nothing to name
    fact_free = "The change failed orders; checkout recovered after rolling back."
    assert "names nothing of the file's facts" in check(fact_free, SOURCE).evidence


def test_possessives_compounds_and_cjk_sentence_ends_do_not_make_false_claims() -> None:
    """ "Lopez's", "It's", "api" inside "api-gateway", and "The" after "。" are grounded."""
    source = SOURCE + " The api-gateway failed. 会议结束。"
    assert unsupported("Lopez's change failed. It's fixed. The API failed.", source) == []
    assert unsupported("会议结束。The API failed.", source) == []
    assert unsupported("The Chinese Notice moved.", "公司搬迁。") == ["Chinese", "Notice"]


def test_list_numbering_is_not_a_claim() -> None:
    """ "1." opening a line is numbering, not a number of the text."""
    assert claims("Steps:\n1. Boil 2 eggs.\n 2) Add 300 g flour.")[:2] == ["2", "300"]


def test_an_answer_that_repeats_itself_is_refused() -> None:
    """A small model looping on one sentence is refused even if every claim is grounded."""
    loop = "Maria Lopez rolled back the change at 09:41 and checkout recovered. " * 2
    assert "repeats itself" in check(loop, SOURCE).evidence
    assert check("Checkout broke; Maria Lopez undid the change at 09:41.", SOURCE).ok


def test_text_copied_from_another_runs_context_is_refused() -> None:
    """Eight words in a row from foreign context and not from the source: borrowed."""
    note = "- 2026-11-30 done: notes.txt: the team agreed to ship the billing export soon"
    answer = "Checkout failed and the team agreed to ship the billing export soon."
    assert borrowed(answer, SOURCE, [note])
    assert "another run" in check(answer, SOURCE, foreign=[note]).evidence
    assert check("Checkout failed for a while.", SOURCE, foreign=[note]).ok


def test_chinese_text_checks_its_numbers() -> None:
    """Scripts without capitals: the numbers are still checked."""
    source = "会议于11月14日举行，预算为3000元。"
    assert check("会议在11月14日举行，预算3000元。", source).ok
    assert unsupported("会议在12月14日举行。", source) == ["12"]


words = st.text(alphabet=st.characters(categories=["L", "N", "Zs", "P"]), max_size=200)


@given(words)
def test_any_text_is_grounded_in_itself(text: str) -> None:
    """Property: every claim of a text occurs in that same text."""
    assert unsupported(text, text) == []


@given(words, words)
def test_an_unsupported_claim_is_a_claim_of_the_answer(answer: str, source: str) -> None:
    """Property: the check only ever names claims the answer makes."""
    assert set(unsupported(answer, source)) <= set(claims(answer))


LETTER = (
    "From: Marco Santini\nTo: Laura Bennett\nSubject: Delivery of order HF-40917\n\n"
    "Dear Laura,\n\nthe truck with order HF-40917 (18 pallets of tinned tomatoes) was held up "
    "by snow at the Brenner pass. We can now deliver on Wednesday 4 November in the morning. "
    "The delay surcharge of EUR 350 is of course waived, and the driver will call ahead.\n\n"
    "Kind regards,\nMarco Santini\nDispatch, Santini Logistics\n"
)


def test_non_summaries_are_refused_with_their_reason() -> None:
    """A greeting, a refusal, the feedback said back, a title or a signature alone: each
    is refused, and the reason says which."""
    cases = {
        "Dear Laura, the truck was held up by snow and comes later.": "greeting",
        "I'm sorry, but I'm unable to provide a summary of this e-mail.": "refusal",
        "Your answer was not accepted: it is not grounded in the file.": "repeats the feedback",
        "Delivery of order HF-40917": "no whole sentence",
        "Kind regards,\nMarco Santini\nDispatch, Santini Logistics": "no whole sentence",
    }
    for answer, reason in cases.items():
        verdict = check(answer, LETTER)
        assert not verdict.ok and reason in verdict.evidence, (answer, verdict.evidence)
    good = (
        "Snow at the Brenner pass held up order HF-40917; Marco Santini can deliver the 18 "
        "pallets on Wednesday 4 November and waives the EUR 350 surcharge."
    )
    assert check(good, LETTER).ok, check(good, LETTER).reasons


def test_a_copy_of_the_source_is_refused_and_a_rewording_is_not() -> None:
    """An answer 80% the same as a passage of its (twice as long) source is a copy."""
    copy = (
        "the truck with order HF-40917 (18 pallets of tinned tomatoes) was held up by snow "
        "at the Brenner pass. We can now deliver on Wednesday 4 November."
    )
    assert copy_ratio(copy, LETTER) > 0.9
    assert "copies the file" in check(copy, LETTER).evidence
    reworded = (
        "Snow at the Brenner pass held up order HF-40917; Marco Santini can deliver the "
        "18 pallets on Wednesday 4 November and waives the EUR 350 surcharge."
    )
    assert copy_ratio(reworded, LETTER) < 0.8
    assert copy_ratio("A one-line note, said again.", "A one-line note, said again.") == 0.0
    moving = "公司上海办公室将于2026年12月12日搬迁至浦东新区世纪大道1198号。"
    notice = (moving + "旧办公室12月11日停止使用。") * 2  # no spaces: each character a word
    assert copy_ratio(moving, notice) > 0.9


def test_a_spelled_out_acronym_and_translated_dates_are_grounded() -> None:
    """ "SLA" for "service level agreement", March for März, Thursday for Donnerstag and
    for 星期四 are the document's own facts in the summary's words."""
    spelled = "The service level agreement allows 4 hours."
    assert unsupported("The SLA allows 4 hours.", spelled) == []
    assert unsupported("The SLA allows 4 hours.", "The support plan allows 4 hours.") == ["SLA"]
    german = "Die Sitzung ist am Donnerstag, 12. März 2026, um 10 Uhr im Rathaus."
    assert unsupported("The meeting is on Thursday 12 March 2026 at 10.", german) == []
    assert unsupported("The meeting is on Friday 12 April.", german) == ["Friday", "April"]
    assert unsupported("It opens on Thursday, 14 March.", "3月14日（星期四）开放。") == []


def test_a_trimmed_answer_with_no_whole_sentence_is_rejected() -> None:
    verdict = check("The team", "The team met on 14 November.", stop_reason=TRIMMED)
    assert not verdict.ok and "before a whole sentence" in verdict.evidence
