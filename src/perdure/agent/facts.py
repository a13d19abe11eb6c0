"""Facts first: the who, what, when and how much of a file, listed by the model and each
checked against the file, before the model writes its summary from them.

A small model that writes a summary straight from a document copies its first lines or
drops the amounts; asked first for the facts, one a line, it names them, and each line
can be checked on its own (every number, date and name in the file). The lines that hold
are put after the file in the request for the summary (both requests begin alike, so a
model server with a prompt cache reads the file once); the rest are dropped, and which
were dropped is journaled with the step.

Two or three sentences leave facts out; the output's `{facts}` (`facts_section`) lists up
to five of them under the summary: the checked facts it does not state, then the file's
own lines that name the most facts it still lacks. Nothing in that list is the model's
unchecked word.
"""

from __future__ import annotations

import re
from typing import Any

from .extractive import fact_lines
from .grounding import claims, unsupported
from .sentences import split

HEADING = "Key facts:"  # the output's list of the facts its summary leaves out

PROMPT = (
    "List the key facts of the file above for a busy reader: what happened or was decided, "
    "amounts, dates and deadlines, who does what. One fact a line, each starting with '- ' "
    "and under 15 words, at most {most} lines, using the file's own numbers, dates, amounts "
    "and names. Not the title, not a list of people. No introduction, no summary."
)
MOST = 5  # facts kept at most (and listed under the summary)
MAX_TOKENS = 120  # for the list: five short lines fit, a rambling one is cut
_MARK = re.compile(r"^\s*(?:[-*•·]|\d{1,2}[.)])\s*")
_EMPHASIS = re.compile(r"\*\*|__|`")  # markdown a model puts around a fact's label
SHORT = 3  # words: a shorter line ("Decisions") is a heading
LONG = 30  # words: a fact line longer than this (after its first sentence) is a passage


def request_text(most: int = MOST) -> str:
    """The instruction that asks for the facts list."""
    return PROMPT.format(most=most)


def check_facts(answer: str, source: str, most: int = MOST) -> dict[str, Any]:
    """The fact lines of `answer` that name something checkable and claim nothing the
    source lacks (at most `most`, each once), and the dropped lines with why."""
    kept: list[str] = []
    dropped: list[dict[str, str]] = []
    title = next((t.strip() for t in source.splitlines() if t.strip()), "")
    for raw in answer.splitlines():
        line = _EMPHASIS.sub("", _MARK.sub("", raw)).strip().rstrip(";")
        if not line or line.endswith(":"):
            continue  # a blank line or a heading ("Key facts:")
        if len(line.split()) > LONG:  # a passage copied whole: its first sentence, if short
            line = split(line)[0]
        if len(line.split()) > LONG:
            dropped.append({"fact": line, "why": f"longer than {LONG} words"})
            continue
        if line.casefold() == title.casefold():
            dropped.append({"fact": line, "why": "the file's title"})
            continue
        if len(line.split()) < SHORT:
            dropped.append({"fact": line, "why": "a heading, not a fact"})
            continue
        said = claims(line)
        missing = unsupported(line, source)
        if missing:
            dropped.append({"fact": line, "why": "not in the file: " + ", ".join(missing)})
        elif not said:
            dropped.append({"fact": line, "why": "names no number, date or name"})
        elif line.casefold() in (k.casefold() for k in kept):
            continue
        elif len(kept) < most:
            kept.append(line)
    return {"facts": kept, "dropped": dropped}


def facts_block(facts: list[str]) -> str:
    """The checked facts, as put in the request for the summary."""
    lines = "\n".join(f"- {fact}" for fact in facts)
    return (
        f"Facts checked against the file (use them; add nothing that is not in the file):\n{lines}"
    )


def unstated(facts: list[str] | tuple[str, ...], answer: str, source: str) -> list[str]:
    """The checked facts whose numbers, dates or names the answer does not all state. A
    fact line's first word is a name only if the source writes it so ("Amount 1,392.00
    EUR", "Billed to ..." name nothing by their first word)."""
    left = []
    for fact in facts:
        missing = unsupported(fact, answer)
        first = fact.split(maxsplit=1)[0].strip(".,:;'’") if fact.strip() else ""
        if missing and missing[0] == first and not _written(first, source):
            missing = missing[1:]
        if missing:
            left.append(fact)
    return left


def _written(word: str, text: str) -> bool:
    """`word` occurs in `text` as written (case and all), as a whole word."""
    return re.search(rf"(?<!\w){re.escape(word)}(?!\w)", text) is not None


def facts_section(
    facts: list[str] | tuple[str, ...], answer: str, source: str, most: int = MOST
) -> str:
    """The output's `{facts}`: up to `most` facts the answer leaves out, as a list under
    HEADING after a blank line: the model's checked facts first, then the file's own
    sentences and lines that name the most facts (`extractive.fact_lines`), each only if
    it names a number, date or name the answer and the list do not; empty when there is
    nothing left to add."""
    left = unstated(facts, answer, source)[:most]
    for line in fact_lines(source):
        if len(left) >= most:
            break
        if unstated([line], "\n".join([answer, *left]), source):
            left.append(line)
    if not left:
        return ""
    lines = "\n".join(f"- {fact}" for fact in left)
    return f"\n\n{HEADING}\n{lines}"
