"""Where sentences end: the one splitter behind every check that cuts text into sentences.

A sentence ends at `.`, `!` or `?` (with any closing quote or bracket after it) followed
by space or the end of the text, or at `。！？`. It does not end inside an ellipsis, after
an abbreviation ("No. 4", "Dr. Kim", "e.g. the"), before a word in lower case, or at a
German ordinal's dot before its month ("am 12. März"). The extractive summary cuts prose
with it, a cut-off answer keeps what it said in whole sentences, a fact line copied as a
passage keeps its first sentence, and the acceptance asks for at least one sentence.
"""

from __future__ import annotations

import re

from .dates import is_month

# a mark that may end a sentence, with the closing quotes and brackets after it
_MARK = re.compile(r"[.!?][\"'’”)\]]*(?=\s|$)|[。！？][\"'’”)\]」』]*")
_ABBREVIATION = re.compile(
    r"\b(?:no|nr|dr|mr|mrs|ms|st|vs|etc|e\.g|i\.e|approx|ca|incl|attn|ref|fig|z\.b|bzw)\.$", re.I
)
_ORDINAL = re.compile(r"(?:^|(?<=\s))\d{1,2}\.$")  # "12." before its month
_NEXT_WORD = re.compile(r"\s*(\S*)")
_LOOK_BACK = 16  # characters before a mark that hold its abbreviation or ordinal ("approx.")
# CJK scripts from here on: a character is about a word (and a token); they put no space
# between words, so a sentence of six such characters has words enough
WIDE = 0x2E80


def wide(text: str) -> int:
    """How many characters of `text` are of the CJK scripts (from WIDE on)."""
    return sum(1 for ch in text if ord(ch) >= WIDE)


def ends(text: str) -> list[int]:
    """The offsets in `text` just past each sentence's end, in order. Each mark is judged
    by the few characters before it and the word after it, so a long text costs linear
    time."""
    found: list[int] = []
    for match in _MARK.finditer(text):
        at = match.start()  # the mark itself
        if text[at] in "。！？":
            found.append(match.end())
            continue
        if at == 0 or text[at - 1].isspace() or text[at - 1] == ".":
            continue  # a mark on its own, or an ellipsis
        after = _NEXT_WORD.match(text, match.end())
        following = after.group(1) if after else ""
        window = (max(0, at - _LOOK_BACK), at + 1)  # the lookbehinds still see before it
        if following[:1].islower() or _ABBREVIATION.search(text, *window):
            continue  # "approx. the", "No. 4", "Dr. Kim"
        if text[at] == "." and _ORDINAL.search(text, *window) and is_month(following):
            continue  # "12. März"
        found.append(match.end())
    return found


def split(text: str) -> list[str]:
    """The sentences of prose `text`, whitespace collapsed; a tail with no end is the last."""
    words = " ".join(text.split())
    found: list[str] = []
    start = 0
    for end in ends(words):
        found.append(words[start:end].strip())
        start = end
    found.append(words[start:].strip())
    return [s for s in found if s]


def whole(text: str) -> str:
    """`text` up to the end of its last complete sentence ("" if it has none): what an
    answer cut off at the token limit said in full."""
    found = ends(text.rstrip())
    return text[: found[-1]].strip() if found else ""


def has_one(text: str) -> bool:
    """Whether `text` holds one sentence at least: three words, or six CJK characters,
    with its end mark. A title, a heading, a signature or an address block has none."""
    return any(len(s.split()) >= 3 or wide(s) >= 6 for s in split(whole(text)))
