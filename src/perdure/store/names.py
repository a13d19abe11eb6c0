"""The one rule for ids and names (runs, schedules, agents, queues, tokens), and how to show
text that breaks it.

An id is shown on terminals, in pages and in logs, and is typed back to reach its run. So it
holds visible characters only: no control characters (C0, C1, DEL), no format characters
(bidirectional overrides and isolates, zero-width ones), no line or paragraph separators,
no space but U+0020 and none at either end, no surrogates, none of Unicode's
default-ignorable (invisible) ones; it is not "." or ".." (a URL could not reach it); and it
is bounded: a run id to
`MAX_RUN_ID` characters (ids made from an event, delivery or schedule name plus a prefix fit),
any other name to `MAX_NAME`. The refused characters are a fixed table (`REFUSED`), not the
running Python's Unicode database, so what one perdure accepts every other reaches.
"""

from __future__ import annotations

import re
import unicodedata

from ..errors import ConfigError

MAX_NAME = 200  # characters of a schedule, agent, queue or token name
MAX_RUN_ID = 512  # characters of a run id (trigger ids are a prefix and two names of 200)

# Ranges of refused code points: categories Cc, Cf, Cs, Zl, Zp, Zs but U+0020 (Unicode 15.1),
# and Default_Ignorable_Code_Point (private-use characters are glyphs of the fonts that define
# them: allowed). tests/store/test_names.py checks the table
# against the running Python's Unicode database.
REFUSED: tuple[tuple[int, int], ...] = (
    (0x0000, 0x001F), (0x007F, 0x00A0), (0x00AD, 0x00AD), (0x034F, 0x034F),
    (0x0600, 0x0605), (0x061C, 0x061C), (0x06DD, 0x06DD), (0x070F, 0x070F),
    (0x0890, 0x0891), (0x08E2, 0x08E2), (0x115F, 0x1160), (0x1680, 0x1680),
    (0x17B4, 0x17B5), (0x180B, 0x180F), (0x2000, 0x200F), (0x2028, 0x202F),
    (0x205F, 0x206F), (0x3000, 0x3000), (0x3164, 0x3164), (0xD800, 0xDFFF),
    (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFFB),
    (0x110BD, 0x110BD), (0x110CD, 0x110CD), (0x13430, 0x1343F), (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A), (0xE0000, 0xE0FFF),
)  # fmt: skip


def _class(ranges: tuple[tuple[int, int], ...]) -> str:
    """A regex character class body of `ranges`: BMP code points as \\xXX or \\uXXXX escapes
    (as JSON Schema's ECMA patterns and Python's `re` read them), others as the characters."""

    def one(code: int) -> str:
        if code < 0x100:
            return f"\\x{code:02x}"
        return f"\\u{code:04x}" if code <= 0xFFFF else chr(code)

    parts = [one(a) if a == b else f"{one(a)}-{one(b)}" for a, b in ranges]
    return "".join(parts)


_BAD_CHAR = re.compile(f"[{_class(REFUSED)}]")
# The refused characters as a class for documents (OpenAPI): surrogates left out, as no JSON
# text holds one (the API refuses them apart) and patterns are read as Unicode scalars.
REFUSED_CLASS = _class(tuple(r for r in REFUSED if r != (0xD800, 0xDFFF)))
# The rule as a pattern (the length aside), for the OpenAPI document: no refused character,
# and no space at either end, and not "." or ".." (the whole value).
_OK = f"[^{REFUSED_CLASS}]"
_OK_END = f"[^{REFUSED_CLASS} ]"
_NO_DOT = f"[^{REFUSED_CLASS} .]"
# one character, two, or more; no lookaround: generators and Rust regex read it
PATTERN = f"^({_NO_DOT}|{_NO_DOT}{_OK_END}|\\.{_NO_DOT}|{_OK_END}{_OK}+{_OK_END})?$"
DOT_SEGMENTS = (".", "..")  # a URL's "here" and "up": no id can be one, or no path reaches it


class BadName(ConfigError, ValueError):
    """Raised when an id or a name breaks the id rule (a one-line message, the value escaped).

    A ValueError too, so that validators (pydantic, argument parsers) report it as such.
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


_WHAT = {
    "Cc": "a control character",
    "Cf": "a format character",
    "Cs": "a surrogate",
    "Zl": "a line separator",
    "Zp": "a paragraph separator",
    "Zs": "a space other than ' '",
}


def code(char: str) -> str:
    """`char` as U+XXXX."""
    return f"U+{ord(char):04X}"


def escape(text: str, *, keep: str = "") -> str:
    """`text` with every character the id rule refuses written as a Python escape (\\x1b,
    \\u202e, \\U000e0001), except those in `keep` (e.g. "\\n" for text shown as lines): what
    a terminal or a page shows of a stored id or name, old ones that break the rule too."""

    def one(match: re.Match[str]) -> str:
        char = match.group()
        if char in keep:
            return char
        value = ord(char)
        if value < 0x100:
            return f"\\x{value:02x}"
        return f"\\u{value:04x}" if value <= 0xFFFF else f"\\U{value:08x}"

    return _BAD_CHAR.sub(one, text)


def _shown(value: str) -> str:
    cut = value if len(value) <= 60 else value[:57] + "..."
    return "'" + escape(cut) + "'"


def problem(value: object, kind: str, limit: int = MAX_NAME) -> str | None:
    """Why `value` cannot be a `kind` ("run id", "schedule name", ...), in one line with the
    value escaped, or None if it can."""
    if not isinstance(value, str):
        return f"{kind} must be text, not {type(value).__name__}"
    if not value:
        return f"{kind} is empty"
    if len(value) > limit:
        return f"{kind} {_shown(value)} is {len(value)} characters long; at most {limit}"
    bad = _BAD_CHAR.search(value)
    if bad is not None:
        char = bad.group()
        what = _WHAT.get(unicodedata.category(char), "an invisible character")
        return (
            f"{kind} {_shown(value)} has {code(char)} ({what}) at character {bad.start() + 1}; "
            "ids and names take visible characters only"
        )
    if value[0] == " " or value[-1] == " ":
        end = "starts" if value[0] == " " else "ends"
        return f"{kind} {_shown(value)} {end} with a space"
    if value in DOT_SEGMENTS:
        return (f"{kind} {_shown(value)} cannot be reached by its URL (a path segment '.' or "
                "'..' means here or up); add another character")  # fmt: skip
    return None


def check(value: object, kind: str, limit: int = MAX_NAME) -> str:
    """`value` if it may be a `kind`, else `BadName` saying why.

    Args:
        value: the id or name.
        kind: what it names, for the message ("run id", "queue name", ...).
        limit: the most characters it may have.

    Raises:
        BadName: it is not text, empty, too long, has a refused character or an end space,
            or is "." or "..".
    """
    why = problem(value, kind, limit)
    if why is not None:
        raise BadName(kind, why)
    assert isinstance(value, str)
    return value


def check_run_id(value: object) -> str:
    """`value` if it may be a run id (the rule, at most MAX_RUN_ID characters)."""
    return check(value, "run id", MAX_RUN_ID)
