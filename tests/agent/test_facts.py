"""The output's list of checked facts: only what the summary leaves out, never invented."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from perdure.agent.facts import HEADING, check_facts, facts_section, unstated
from perdure.agent.grounding import unsupported

SOURCE = (
    "Invoice 2026-0457 from Brightline Ltd to Oakfield GmbH: 1,392.00 EUR for 12 licences, "
    "due 15 October 2026. The amount is due in full."
)
LISTED = [
    "Invoice 2026-0457 from Brightline Ltd",
    "Billed to Oakfield GmbH",
    "Amount 1,392.00 EUR",
    "Due 15 October 2026",
]


def test_a_summary_that_states_every_fact_of_the_file_gets_no_list() -> None:
    answer = (
        "Brightline Ltd billed Oakfield GmbH 1,392.00 EUR for 12 licences (invoice 2026-0457), "
        "due 15 October 2026."
    )
    assert unstated(LISTED, answer, SOURCE) == []
    assert facts_section(LISTED, answer, SOURCE) == ""


def test_the_facts_a_summary_leaves_out_follow_it_in_order() -> None:
    answer = "Brightline Ltd sent invoice 2026-0457 to Oakfield GmbH."
    assert facts_section(LISTED, answer, SOURCE) == (
        f"\n\n{HEADING}\n- Amount 1,392.00 EUR\n- Due 15 October 2026"
        # then the file's own line naming what is still left out: the 12 licences
        "\n- Invoice 2026-0457 from Brightline Ltd to Oakfield GmbH: 1,392.00 EUR for 12 "
        "licences, due 15 October 2026."
    )


@settings(deadline=None, database=None)  # a loaded machine's first call is slow
@given(st.lists(st.sampled_from([*LISTED, "Paid by Carla on 3 May", "Due 1 June 2027"])))
def test_only_checked_facts_ever_reach_the_list(listed: list[str]) -> None:
    """Whatever the model lists, the list under the summary holds only checked facts and
    the file's own lines: none names a number, date or name the file lacks."""
    checked = check_facts("\n".join(f"- {line}" for line in listed), SOURCE)["facts"]
    section = facts_section(checked, "Brightline Ltd sent an invoice.", SOURCE)
    for line in section.splitlines()[3:]:
        fact = line.removeprefix("- ")
        assert fact in LISTED or fact in " ".join(SOURCE.split())
        assert unsupported(fact, SOURCE) == []


def test_a_fact_line_is_cleaned_cut_to_its_first_sentence_and_never_the_title() -> None:
    source = "Invoice 2026-0457\n\n" + SOURCE
    listed = (
        "- **Invoice 2026-0457**\n"
        "- **Amount**: 1,392.00 EUR for 12 licences, due 15 October 2026. " + "Word " * 30 + "\n"
        "- " + "Brightline " * 31 + "\n"
        "- Decisions"
    )
    checked = check_facts(listed, source)
    assert checked["facts"] == ["Amount: 1,392.00 EUR for 12 licences, due 15 October 2026."]
    assert [d["why"] for d in checked["dropped"]] == [
        "the file's title",
        "longer than 30 words",
        "a heading, not a fact",
    ]
