"""The extractive fallback: fact sentences, not headers; dates kept whole; past `---`."""

from __future__ import annotations

from perdure.agent.extractive import extract, fact_lines
from perdure.agent.grounding import unsupported
from perdure.agent.messages import Message, ModelRequest
from perdure.agent.providers.scripted import extractive_summary

LETTER = """From: Marco Santini <m.santini@example.it>
To: Laura Bennett
Date: Fri, 30 Oct 2026 16:12
Subject: Delivery of order HF-40917

Dear Laura,

the truck with order HF-40917 (18 pallets) was held up by snow at the Brenner pass.
We can now deliver on Wednesday 4 November. The delay surcharge of EUR 350 is waived.

Kind regards,
Marco Santini
Dispatch, Santini Logistics
"""


def test_the_sentences_with_facts_are_picked_not_the_header_or_the_signature() -> None:
    """No `From:` line, greeting or signature; the amount and the date are in it."""
    summary = extract(LETTER)
    assert "EUR 350" in summary and "4 November" in summary
    for header in ("From:", "Subject:", "Dear Laura", "Kind regards", "Dispatch"):
        assert header not in summary
    assert unsupported(summary, LETTER) == []


def test_the_builtin_summariser_reads_the_whole_file_past_a_rule() -> None:
    """A `---` inside the file is not its end: a fact after it can be picked."""
    text = "Notes\n\nThe weather was fine and the team met.\n\n---\n\n"
    text += "Ana signed the EUR 9,400 order on 3 May.\n"
    user = Message("user", f"File n.txt:\n---\n{text}\n---")
    request = ModelRequest(model="x", messages=[Message("system", "Summarise."), user])
    answer = extractive_summary(request).message.content
    assert "EUR 9,400" in answer and "3 May" in answer


def test_fact_lines_are_the_files_fact_sentences_most_facts_first() -> None:
    text = (
        "Invoice 2026-0457\n\n"
        "From: Brightline Print Studio\n"
        "Hi Maria,\n\n"
        "Thank you for the order. The total due is £1,392.00 by 15 October 2026.\n"
        "It was nice to meet you.\n\n"
        "Subtotal   £1,160.00\n\n"
        "Kind regards,\nTom\n"
    )
    lines = fact_lines(text)
    assert lines[0] == "The total due is £1,392.00 by 15 October 2026."
    assert "Subtotal £1,160.00" in lines  # a table line, its spacing collapsed
    assert not any(line.startswith(("Invoice 2026-0457", "From:", "Hi ", "Kind")) for line in lines)
    assert "It was nice to meet you." not in lines  # it names nothing
