"""Facts first: the who, what, when and how much of a file, listed by the model and each
checked against the file, before the model writes its summary from them.

A small model that writes a summary straight from a document copies its first lines or
drops the amounts; asked first for the facts, one a line, it names them, and each line
can be checked on its own (every number, date and name in the file). The lines that hold
are put before the file in the request for the summary; the rest are dropped, and which
were dropped is journaled with the step.
"""

from __future__ import annotations

import re
from typing import Any

from .grounding import claims, unsupported

PROMPT = (
    "List the key facts of the file below: who, what, when, where and how much. "
    "One short fact a line, each starting with '- ', at most {most} lines, using the "
    "file's own numbers, dates, amounts and names. No introduction, no summary."
)
SYSTEM = "You list the facts of a document, one short line each, in the document's own words."
MOST = 6  # facts kept at most
_MARK = re.compile(r"^\s*(?:[-*•·]|\d{1,2}[.)])\s*")


def request_text(most: int = MOST) -> str:
    """The instruction that asks for the facts list."""
    return PROMPT.format(most=most)


def check_facts(answer: str, source: str, most: int = MOST) -> dict[str, Any]:
    """The fact lines of `answer` that name something checkable and claim nothing the
    source lacks (at most `most`, each once), and the dropped lines with why."""
    kept: list[str] = []
    dropped: list[dict[str, str]] = []
    for raw in answer.splitlines():
        line = _MARK.sub("", raw).strip().rstrip(";")
        if not line or line.endswith(":"):
            continue  # a blank line or a heading ("Key facts:")
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
