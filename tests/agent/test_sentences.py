"""The one sentence splitter: where sentences end, and what a cut-off answer keeps."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perdure.agent.grounding import claims
from perdure.agent.sentences import ends, has_one, split, whole


def test_a_german_date_is_not_cut_at_its_ordinal_dot() -> None:
    """ "am 12. März 2026" stays one sentence; "Nr. 4" does not end one either."""
    text = "Die Sitzung ist am 12. März 2026 im Rathaus. Antrag Nr. 4 wird vertagt. Ende."
    assert split(text) == [
        "Die Sitzung ist am 12. März 2026 im Rathaus.",
        "Antrag Nr. 4 wird vertagt.",
        "Ende.",
    ]


@pytest.mark.parametrize(
    ("text", "sentences"),
    [
        ("Dr. Kim met Bob. They agreed.", ["Dr. Kim met Bob.", "They agreed."]),
        ("It costs approx. the same. Fine.", ["It costs approx. the same.", "Fine."]),
        ("Wait... Then it broke. Done", ["Wait... Then it broke.", "Done"]),
        ('She said "yes." Then left.', ['She said "yes."', "Then left."]),
        ("Version 2.3.1 ships. Good!", ["Version 2.3.1 ships.", "Good!"]),
        ("Paid on 3. Juni. Next item.", ["Paid on 3. Juni.", "Next item."]),
        ("会议于11月14日举行。预算为", ["会议于11月14日举行。", "预算为"]),
    ],
)
def test_where_sentences_end(text: str, sentences: list[str]) -> None:
    assert split(text) == sentences


@pytest.mark.parametrize(
    ("cut", "kept"),
    [
        (
            "Version 3.8.0 adds HTTP/3. The timeout is 5 s. It also fi",
            "Version 3.8.0 adds HTTP/3. The timeout is 5 s.",
        ),
        (
            "The invoice is EUR 1,704.00. It is due on 12. Dezember 2026. Pay",
            "The invoice is EUR 1,704.00. It is due on 12. Dezember 2026.",
        ),
        ("会议于11月14日举行。预算为", "会议于11月14日举行。"),
        ("No sentence ends here", ""),
        ("Paid in full (see p. 2).", "Paid in full (see p. 2)."),
    ],
)
def test_an_answer_cut_off_keeps_its_whole_sentences(cut: str, kept: str) -> None:
    assert whole(cut) == kept


@settings(deadline=None, database=None)
@given(st.text(alphabet="ab .!?12DM\"')\n。", max_size=80))
def test_whole_is_a_prefix_ending_a_sentence(text: str) -> None:
    kept = whole(text)
    assert text.strip().startswith(kept)
    assert kept == "" or kept.rstrip("\"')")[-1] in ".!?。"


@settings(deadline=None, database=None)
@given(st.text(alphabet="ab .!?12DM\n", max_size=80))
def test_split_keeps_every_word_in_order(text: str) -> None:
    assert " ".join(split(text)) == " ".join(text.split())
    assert all(0 < end <= len(text) for end in ends(text))


def test_a_title_or_a_signature_has_no_sentence() -> None:
    assert not has_one("Release notes, Atlas 4.2 (released 30 November 2026)")
    assert not has_one("Maria Lopez\nHead of Finance")
    assert not has_one("No. 4.")
    assert has_one("The invoice of 1,704.00 EUR is due on 12 December.")
    assert has_one("会议于十一月十四日举行。")


def test_a_word_after_a_colon_starts_a_clause_for_claims() -> None:
    """A word after a colon or a semicolon starts a clause: "The" there is a common word
    capitalised by its place, not a name."""
    assert claims("the budget: The plan is 40.") == ["40"]
    assert claims("the budget; The plan holds.") == []
