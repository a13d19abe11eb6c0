"""Is an answer grounded in its source? The checkable claims of a text, and which are missing.

A small model's typical failures are an invented date, a number that is not in the
document, a name it made up, an answer cut off at the token limit, or a line echoed
from another run's context. Each of these is checkable without a model: every
number, date, time, amount and capitalised name of the answer must occur in the
source. The check is strict on purpose (a reworded date is rejected too): a rejected
answer is retried or escalated, a wrong one would be trusted.
"""

from __future__ import annotations

import difflib
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from .dates import ENGLISH_WEEKDAYS, FOREIGN_MONTHS, MONTHS, WEEKDAYS
from .sentences import has_one

# a number with its decimal part or thousands groups: 4,500 · 99.9 · 2.3.1 · 03
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_THOUSANDS = re.compile(r"^\d{1,3}(?:,\d{3})+$")
_LIST_MARK = re.compile(r"^[ \t]*\d{1,2}[.)][ \t]", re.M)  # "1. " opening a line: numbering
# a word of letters (any script's), with inner apostrophes, hyphens and dots (e.g. "O'Neil")
_WORD = re.compile(r"[^\W\d_](?:[\w'’.-]*[^\W_])?")
_CLAUSE_END = re.compile(r"[.!?:;\n。！？：；]\s*$")  # what a word after it starts
_POSSESSIVE = re.compile(r"['’]s$")  # "Nwosu's" claims "Nwosu", "It's" is "It"
_JOINERS = re.compile(r"[-_.'’/]")  # "api-gateway" also holds the words "api", "gateway"
_ACRONYM_SKIP = frozenset({"of", "and", "the", "for", "&", "in", "on", "to", "a"})
# never a name: "I", and labels a summary may start with
_NOT_NAMES = {"i", "i'm", "i've", "i'd", "i'll", "summary", "note", "ok", "yes", "no"}
# common words that start sentences; any other sentence-initial capitalised word is taken
# for a name unless the source has it (so "Bob fixed it" is checked, "The team" is not)
_STARTERS = frozenset(
    """a about above according across after afterwards again against all also although
    among an and another any anyone around as at because before being below besides
    both but by can could despite do does due during each earlier either every
    everyone finally first following for from further given had has have he her here
    his how however if in instead it its last later many meanwhile more moreover most
    much my next no none not now of on once one only or other our over overall per
    several she since so some soon still such than that the their them then there
    therefore these they this those though three through thus to today together two
    under unless until up upon we were what when where whether which while who why
    will with within without yesterday yet you your""".split()  # noqa: SIM905
)
# what a summary is not: a greeting, a refusal, the model's own feedback said back
_GREETING = re.compile(
    r"^\W*(hi|hello|hey|dear|greetings|good (morning|afternoon|evening)|hallo|liebe[rs]?|"
    r"sehr geehrte[rs]?|bonjour|hola|ciao)\b[^.!?\n]{0,40}([,!:\n]|$)", re.I,
)  # fmt: skip
_REFUSAL = re.compile(
    r"\b(i'?m sorry|i am sorry|i apologi[sz]e|i (cannot|can ?not|can't|am unable|'m unable|"
    r"am not able|won't be able)|as an ai\b|unable to (provide|summari[sz]e|help|assist))",
    re.I,
)  # fmt: skip
_ECHO = re.compile(
    r"(not accepted|not grounded|\bis grounded\b|your (previous )?answer|answer again|"
    r"not in the source|names nothing from|the answer (has|repeats|was|names))", re.I,
)  # fmt: skip
# a word for the copy check: a CJK character is one (those scripts put no space between words)
_TOKEN = re.compile(r"[\u2e80-\u9fff\uac00-\ud7af\uff00-\uffef]|[^\s\u2e80-\u9fff]+")
COPY = 0.8  # an answer this similar to a same-length window of its source is a copy
CUT_OFF = ("length", "max_tokens")  # stop reasons of an answer cut at the token limit
TRIMMED = "trimmed"  # an answer cut off, kept up to its last whole sentence (sentences.whole)
SHINGLE = 8  # words in a row that, found in another run's context, mark a copied line
LOOP = 12  # words in a row that, said twice in one answer, mark a model looping
VAGUE = 0.6  # an answer naming no fact must have this share of its words from the source


def _fold(text: str) -> str:
    """Case-, accent- and width-insensitive form of a text, for finding a claim in a source."""
    text = unicodedata.normalize("NFKC", text).casefold()
    return " ".join(text.replace("’", "'").split())


def _number(token: str) -> str:
    """One spelling per number: thousands separators and leading zeros dropped."""
    if _THOUSANDS.match(token):
        token = token.replace(",", "")
    parts = re.split(r"([.,])", token)
    parts[0] = parts[0].lstrip("0") or "0"
    return "".join(parts)


def claims(text: str) -> list[str]:
    """The numbers, dates, times, amounts and capitalised names of `text`, in order.

    A number is claimed as written (`4,500`; `14:05` gives `14` and `05`); a name is a
    capitalised word, unless it starts a sentence and is a common word (`The`, `After`).
    """
    marks = {m.end() for m in _LIST_MARK.finditer(text)}
    found: list[str] = [m.group() for m in _NUMBER.finditer(text) if m.end() + 2 not in marks]
    for match in _WORD.finditer(text):
        word = _POSSESSIVE.sub("", match.group().strip(".'’-"))
        if not word or not word[0].isupper() or word.casefold() in _NOT_NAMES:
            continue
        before = text[: match.start()]
        starts_sentence = not before.strip() or bool(_CLAUSE_END.search(before))
        acronym = len(word) > 1 and word.isupper()
        if starts_sentence and not acronym and word.casefold() in _STARTERS:
            continue  # "The", "After", "It": a common word, capitalised by its place
        found.append(word)
    return found


@dataclass(frozen=True)
class _Source:
    """A source text prepared for lookups: its words, numbers and months."""

    folded: str
    words: frozenset[str]
    numbers: frozenset[str]
    months: frozenset[int]
    weekdays: frozenset[int] = frozenset()
    acronyms: frozenset[str] = frozenset()

    @classmethod
    def of(cls, text: str) -> _Source:
        folded = _fold(text)
        in_order = [_POSSESSIVE.sub("", m.group().strip(".'-")) for m in _WORD.finditer(folded)]
        words = set(in_order)
        words |= {part for w in words for part in _JOINERS.split(w) if part}
        numbers = frozenset(_number(m.group()) for m in _NUMBER.finditer(text))
        months = {MONTHS.get(w) or FOREIGN_MONTHS[w] for w in words
                  if w in MONTHS or w in FOREIGN_MONTHS}  # fmt: skip
        for iso in re.finditer(r"\b\d{4}-(\d{1,2})-\d{1,2}\b", text):  # 2026-03-14
            months.add(int(iso.group(1)))
        for cjk in re.finditer(r"(\d{1,2})\s*月", text):  # 3月14日
            months.add(int(cjk.group(1)))
        weekdays = {number for name, number in WEEKDAYS.items()
                    if (name in words if name.isascii() else name in folded)}  # fmt: skip
        return cls(folded, frozenset(words), numbers, frozenset(months), frozenset(weekdays),
                   _spelled_out(in_order))  # fmt: skip

    def has(self, claim: str) -> bool:
        if claim[0].isdigit():
            return _number(claim) in self.numbers
        word = _fold(claim)
        if word in self.words or (not word.isascii() and word in self.folded):
            return True
        if word in MONTHS:  # "March" is grounded by a date in March written any way
            return MONTHS[word] in self.months
        if word in ENGLISH_WEEKDAYS:  # "Thursday" by "Donnerstag" or "星期四"
            return WEEKDAYS[word] in self.weekdays
        if claim.isupper() and 2 <= len(claim) <= 6:  # "SLA": "service level agreement"
            return word in self.acronyms
        return False


def _spelled_out(words: list[str]) -> frozenset[str]:
    """The initials of every run of two to six words (small words like "of" skipped or
    kept), so an acronym the source spells out is grounded by it."""
    found: set[str] = set()
    for i in range(len(words)):
        for n in range(2, 8):
            run = words[i : i + n]
            if len(run) < n:
                break
            found.add("".join(w[0] for w in run))
            found.add("".join(w[0] for w in run if w not in _ACRONYM_SKIP))
    return frozenset(f for f in found if len(f) >= 2)


def unsupported(answer: str, source: str) -> list[str]:
    """The claims of `answer` that do not occur in `source` (each once, in order)."""
    return _missing(claims(answer), _Source.of(source))


def _missing(said: list[str], src: _Source) -> list[str]:
    return list(dict.fromkeys(c for c in said if not src.has(c)))


def _facts(source: str) -> list[str]:
    """The source's facts a summary should name some of: its numbers (not list numbering)
    and names that are not a line's first word; empty for a text with fewer than two."""
    found = []
    for claim in claims(source):
        if claim[0].isdigit() or (len(claim) > 1 and claim.isupper()):
            found.append(claim)
        elif re.search(rf"[^\s\W]\W*[ \t]+{re.escape(claim)}\b", source):
            found.append(claim)  # a capitalised word inside a line: a name
    unique = list(dict.fromkeys(found))
    return unique if len(unique) >= 2 else []


def _overlap(answer: str, src: _Source) -> float:
    """The share of the answer's content words (four letters or more, not a common
    sentence opener) that the source has."""
    words = [w for w in (_POSSESSIVE.sub("", m.group()) for m in _WORD.finditer(_fold(answer)))
             if len(w) >= 4 and w not in _STARTERS]  # fmt: skip
    return sum(w in src.words for w in words) / len(words) if words else 0.0


def _shingles(text: str) -> set[str]:
    words = _fold(text).split()
    return {" ".join(words[i : i + SHINGLE]) for i in range(len(words) - SHINGLE + 1)}


def repeated(answer: str) -> str | None:
    """A sentence of four words or more said twice, or the first run of LOOP words that
    occurs twice (a model looping); parallel sentences ("Terminal 1 is off ...
    Terminal 2 is also off ...") are neither."""
    said: set[str] = set()
    for sentence in re.split(r"(?<=[.!?。！？])\s+|\n+", _fold(answer)):
        if len(sentence.split()) >= 4:
            if sentence in said:
                return sentence
            said.add(sentence)
    words = _fold(answer).split()
    seen: set[str] = set()
    for i in range(len(words) - LOOP + 1):
        run = " ".join(words[i : i + LOOP])
        if run in seen:
            return run
        seen.add(run)
    return None


def copy_ratio(answer: str, source: str) -> float:
    """How close `answer` comes to a copy of its source: the best difflib ratio between its
    words (a CJK character counting as one) and any run of as many words of the source (0
    when the source is not at least twice as long: a one-line note may be said again)."""
    mine, theirs = _TOKEN.findall(_fold(answer)), _TOKEN.findall(_fold(source))
    n = len(mine)
    if n < 6 or len(theirs) < 2 * n:
        return 0.0
    best = 0.0
    matcher = difflib.SequenceMatcher(autojunk=False)
    matcher.set_seq2(mine)
    for i in range(0, len(theirs) - n + 1):
        matcher.set_seq1(theirs[i : i + n])
        if matcher.real_quick_ratio() > best and matcher.quick_ratio() > best:
            best = max(best, matcher.ratio())
    return best


def not_a_summary(answer: str) -> str | None:
    """Why `answer` is not a summary at all (a greeting, a refusal, the feedback said
    back, a title or signature alone), or None."""
    text = answer.strip()
    if _REFUSAL.search(text):
        return "the answer is a refusal, not a summary"
    if _ECHO.search(text):
        return "the answer repeats the feedback instead of summarising the file"
    if _GREETING.match(text):
        return "the answer opens with a greeting; write the summary itself, not a letter"
    if not has_one(text):
        return ("the answer has no whole sentence (a title, heading, signature or address "
                "block alone is not a summary)")  # fmt: skip
    return None


def borrowed(answer: str, source: str, foreign: Iterable[str]) -> list[str]:
    """Runs of SHINGLE words the answer shares with `foreign` texts (other runs' notes or
    memories shown in the prompt) and not with its own source."""
    mine = _shingles(answer) - _shingles(source)
    found: list[str] = []
    for text in foreign:
        found += sorted(mine & _shingles(text))
    return found


@dataclass(frozen=True)
class Grounding:
    """The verdict on one answer, journaled as the acceptance step's evidence."""

    ok: bool
    reasons: list[str] = field(default_factory=list)
    unsupported: list[str] = field(default_factory=list)
    borrowed: list[str] = field(default_factory=list)
    chars: int = 0
    stop_reason: str = ""

    @property
    def evidence(self) -> str:
        if self.ok:
            return f"grounded: every claim is in the source ({self.chars} characters)"
        return "not grounded: " + "; ".join(self.reasons)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "evidence": self.evidence}


def check(
    answer: str,
    source: str,
    *,
    stop_reason: str = "",
    min_chars: int = 1,
    max_chars: int | None = None,
    foreign: Iterable[str] = (),
    extract: bool = False,
) -> Grounding:
    """Whether `answer` may be accepted as a faithful answer about `source`.

    Rejected: an answer cut off at the token limit (stop reason `length`, or Anthropic's
    `max_tokens`); one outside the length bounds; one that names nothing of a source
    that has numbers, dates or names and shares few of its words ("the document
    contains a summary of a report"); one with a claim not in the source; one that
    copies a run of words from `foreign` (other runs' context) that its source does not
    have; one that repeats itself (a model looping); one that is not a summary at all
    (a greeting, a refusal, the feedback said back, a title or signature alone); one that
    copies its source (`extract`: an extract of the file's sentences, which may).
    """
    text = answer.strip()
    reasons: list[str] = []
    if stop_reason in CUT_OFF:
        reasons.append(f"the answer was cut off at the token limit (stop reason: {stop_reason})")
    elif stop_reason == TRIMMED and not has_one(text):
        reasons.append("the answer was cut off at the token limit before a whole sentence")
    if len(text) < min_chars:
        reasons.append(f"the answer has {len(text)} characters, fewer than {min_chars}")
    if max_chars is not None and len(text) > max_chars:
        reasons.append(f"the answer has {len(text)} characters, more than {max_chars}")
    shape = not_a_summary(text)
    if shape is not None:
        reasons.append(shape)
    similar = 0.0 if extract else copy_ratio(text, source)
    if similar >= COPY:
        reasons.append(f"the answer copies the file ({similar:.0%} the same as a passage of "
                       "it); say what it means in fewer words of your own")  # fmt: skip
    src = _Source.of(source)
    said = claims(text)
    missing = _missing(said, src)
    named = any(src.has(c) for c in said)
    facts = _facts(source)
    if not named and facts:
        reasons.append("the answer names nothing of the file's facts (its amounts, dates, "
                       f"numbers and names, such as {', '.join(facts[:3])})")  # fmt: skip
    elif not named and claims(source) and _overlap(text, src) < VAGUE:
        reasons.append("the answer names nothing from the source (none of its numbers, "
                       "dates or names) and few of its words are the source's")  # fmt: skip
    if missing:
        shown = ", ".join(repr(c) for c in missing[:8])
        more = f" and {len(missing) - 8} more" if len(missing) > 8 else ""
        reasons.append(f"not in the source: {shown}{more}")
    copied = borrowed(text, source, foreign)
    if copied:
        reasons.append(f"copied from another run's context: {copied[0]!r}")
    loop = repeated(text)
    if loop is not None:
        reasons.append(f"the answer repeats itself: {loop!r}")
    return Grounding(not reasons, reasons, missing, copied, len(text), stop_reason)
