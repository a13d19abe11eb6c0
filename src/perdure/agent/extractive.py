"""The extractive summary: the sentences of a document that carry its facts, in its order.

No model: a document's prose is cut into sentences (never inside a date such as the
German "12. März" or after "No." or "Dr."), each scored by the facts it names (amounts,
dates, numbers, names), and the best ones that fit are kept in document order. Header
lines (`From:`, `Subject:`), greetings, sign-offs, signatures and address blocks are not
prose and are never picked; a document with no prose at all (an invoice's table, a log)
gives its lines that name the most facts, joined with semicolons.
"""

from __future__ import annotations

import re

from .dates import MONTH_NAMES
from .grounding import claims
from .sentences import split, wide

LIMIT = 400  # characters of the summary at most
_MONTH_WORDS = "|".join(MONTH_NAMES)
_LABEL = re.compile(r"^\s*[\w .'/-]{1,24}:\s")  # "From: ...", "Subject: ...", "Date: ..."
_GREETING = re.compile(
    r"^\W*(hi|hello|hey|dear|good (morning|afternoon|evening)|hallo|liebe[rs]?|sehr geehrte"
    r"|bonjour|hola|kind regards|best regards|regards|best|thanks|thank you|cheers|sincerely"
    r"|yours|mit freundlichen grüßen|viele grüße|cordialement)\b[^.!?]{0,40}$",
    re.I,
)
_HEADER = re.compile(r"^\s*(from|to|cc|bcc|subject|date|sent|reply-to|attn)\b\W", re.I)
_AMOUNT = re.compile(r"[$€£¥]\s?\d|\d\s?(?:%|eur|usd|gbp|chf|euros?|dollars?|元)\b", re.I)
_DATE = re.compile(
    rf"\b\d{{1,2}}\.?\s+(?:{_MONTH_WORDS})|\b(?:{_MONTH_WORDS})\w*\s+\d{{1,2}}\b|"
    r"\b\d{4}-\d{2}-\d{2}\b|\d{1,2}:\d{2}|\d+月\d+日",
    re.I,
)


_BULLET = re.compile(r"^\s*(?:[-*•·]|\d{1,2}[.)])\s+")
_HEADING = re.compile(r"^\s*#+\s|^\s*\d{1,2}(?:\.\d+)*\.?\s+\S[^.!?]{0,40}$")


def units(text: str) -> list[tuple[str, bool]]:
    """The document's text in units: each paragraph of prose, and each list item, as
    (text, is prose); headings, header lines, greetings and sign-offs are dropped, and so
    is a table or address line (kept as not prose, for a document with no prose at all)."""
    found: list[tuple[str, bool]] = []
    for paragraph in re.split(r"\n\s*\n", text.strip()):
        block: list[str] = []
        lines = [line for line in paragraph.splitlines() if line.strip()]
        for n, line in enumerate(lines):
            if (
                n == 0
                and len(lines) > 1
                and not re.search(r"[.!?,;:。！？]\s*$", line)
                and (lines[1].strip()[:1].isupper())
            ):  # a title or heading over its paragraph ("What happened\nAt 06:40 ...")
                found.append((" ".join(line.split()), False))
                continue
            if block == [] and found and line[:1] in " \t" and not _BULLET.match(line):
                found[-1] = (found[-1][0] + " " + line.strip(), found[-1][1])  # wrapped item
                continue
            if _BULLET.match(line) or _HEADING.match(line) or _LABEL.match(line):
                if block:
                    found.append((" ".join(block), True))
                    block = []
                if _HEADING.match(line) and not _BULLET.match(line):
                    continue
                item = _BULLET.sub("", line, count=1)
                found.append((" ".join(item.split()), not _LABEL.match(line)))
            else:
                block.append(line.strip())
        if block:
            found.append((" ".join(block), True))
    return [(t, prose and _sentence_like(t)) for t, prose in found if t]


def _sentence_like(text: str) -> bool:
    if _GREETING.match(text):
        return False
    return bool(re.search(r"[.!?](?:\s|$)|[。！？]", text)) and (
        len(text.split()) >= 6 or wide(text) >= 12
    )


def score(sentence: str) -> float:
    """The facts a sentence names: distinct numbers and names, amounts and dates counted
    again; a greeting or sign-off is worth nothing, a very long sentence a little less."""
    if _GREETING.match(sentence):
        return 0.0
    facts = len(set(claims(sentence)))
    facts += 2 * len(_AMOUNT.findall(sentence)) + 2 * len(_DATE.findall(sentence))
    return facts / (1.0 + max(0, len(sentence) - 220) / 220)


def extract(text: str, limit: int = LIMIT) -> str:
    """The sentences of `text` that carry the most facts, in the document's order, within
    `limit` characters (the lead sentence counts extra: it usually says what the document
    is about); a document with little prose adds its lines that name facts."""
    picked, joiner = extract_pieces(text, limit)
    summary = joiner.join(picked).strip()
    if summary and not summary.endswith((".", "!", "?", "。", "！", "？")):
        summary += "."
    return summary


def extract_pieces(text: str, limit: int = LIMIT) -> tuple[list[str], str]:
    """The pieces `extract` joins (sentences, or fact lines), and how it joins them."""
    pieces = units(text)
    candidates: list[str] = []
    lines: list[str] = []  # short non-prose lines with an amount or a date: "Total due £1,392"
    for piece, prose in pieces:
        if prose:
            candidates += split(piece)
        elif (
            piece != pieces[0][0]
            and len(piece) <= 90
            and not _HEADER.match(piece)
            and (_AMOUNT.search(piece) or _DATE.search(piece))
        ):
            lines.append(piece if piece.endswith((".", "!", "?")) else f"{piece}.")
    title = pieces[0][0] if pieces and not pieces[0][1] else ""
    if not 3 <= len(title.split()) <= 16 or _HEADER.match(title) or _GREETING.match(title):
        title = ""
    lead = max(2, len(candidates) // 4)  # the first quarter: where a writer says what matters
    bonus = {i: (4.0 if i == 0 else 2.0) for i in range(min(lead, len(candidates)))}
    joiner = " "
    if len(candidates) < 3:  # little prose: an invoice, a log; its fact lines too
        others = [p for p, prose in pieces if not prose and score(p) > 0 and p != title]
        candidates, joiner = others + candidates, "; "
        bonus = {}
    else:
        candidates += lines
    if title:  # the document's own title says what it is: first, if it names something
        limit -= len(title) + 2
    ranked = sorted(range(len(candidates)),
                    key=lambda i: (-(score(candidates[i]) + bonus.get(i, 0.0)), i))  # fmt: skip
    chosen: list[int] = []
    used = 0
    for i in ranked:
        piece = candidates[i]
        if score(piece) + bonus.get(i, 0.0) == 0 and chosen:
            break  # the rest name nothing
        if used + len(piece) + len(joiner) > limit:
            if not chosen and len(piece) > limit:  # one long sentence: its words that fit
                chosen, candidates[i] = [i], piece[:limit].rsplit(" ", 1)[0]
            continue
        chosen.append(i)
        used += len(piece) + len(joiner)
        if len(chosen) == 3:
            break
    picked = [candidates[i].rstrip(";, ") for i in sorted(chosen)]
    if title and score(title) > 0:
        picked.insert(0, title if title.endswith((".", "!", "?", ":")) else f"{title}:")
    return picked, joiner


def fact_lines(text: str, most_words: int = 30) -> list[str]:
    """The document's sentences and lines that name facts (amounts, dates, numbers,
    names), most facts first: its prose cut into sentences, its list items and table
    lines; never its title, header lines, greetings or sign-offs, nor one over
    `most_words` words."""
    pieces = units(text)
    title = pieces[0][0] if pieces and not pieces[0][1] else ""
    found: list[str] = []
    for piece, prose in pieces:
        for line in split(piece) if prose else [" ".join(piece.split())]:
            if line == title or _HEADER.match(line) or _GREETING.match(line):
                continue
            if len(line.split()) <= most_words and score(line) > 0 and line not in found:
                found.append(line)
    return sorted(found, key=lambda line: -score(line))
