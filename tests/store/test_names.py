"""The id rule (store.names): what it refuses, how it says so, what it shows, and that every
id perdure makes itself passes it."""

from __future__ import annotations

import re
import sys
import unicodedata
import uuid

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from perdure.errors import ConfigError
from perdure.store.names import (
    MAX_NAME,
    MAX_RUN_ID,
    PATTERN,
    REFUSED,
    BadName,
    check,
    check_run_id,
    escape,
    problem,
)
from perdure.triggers.schedules import run_id_for

REFUSED_CATEGORIES = {"Cc", "Cf", "Cs", "Zl", "Zp"}


def refused(char: str) -> bool:
    return any(a <= ord(char) <= b for a, b in REFUSED)


def test_the_table_refuses_every_character_of_the_refused_categories() -> None:
    """Every control, format, surrogate, separator and non-ASCII space character
    of this Python's Unicode database is in the table (a newer Unicode adding one fails here)."""
    missing = [
        f"U+{c:04X}"
        for c in range(sys.maxunicode + 1)
        if (cat := unicodedata.category(chr(c))) in REFUSED_CATEGORIES
        or (cat == "Zs" and c != 0x20)
        if not refused(chr(c))
    ]
    assert missing == []


def test_the_table_refuses_no_letter_digit_or_punctuation() -> None:
    """The table stays a list of invisible characters: no letter, mark, number, punctuation or
    symbol of the database is refused, but the default-ignorable fillers (U+115F, U+3164...)."""
    fillers = {0x115F, 0x1160, 0x3164, 0xFFA0, 0x034F, 0x17B4, 0x17B5, 0x180B, 0x180C, 0x180D,
               0x180F, *range(0xFE00, 0xFE10), *range(0xE0100, 0xE01F0)}  # fmt: skip
    visible = [
        f"U+{c:04X}"
        for a, b in REFUSED
        for c in range(a, b + 1)
        if unicodedata.category(chr(c))[0] in "LMNPS" and c not in fillers
    ]
    assert visible == []


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("a\x1b[2Jb", "U+001B (a control character) at character 2"),
        ("bell\x07", "U+0007 (a control character) at character 5"),
        ("cr\rlf", "U+000D (a control character)"),
        ("line\nbreak", "U+000A (a control character)"),
        ("tab\tbed", "U+0009 (a control character)"),
        ("del\x7f", "U+007F (a control character)"),
        ("c1\x9b", "U+009B (a control character)"),
        ("x\u202eevil", "U+202E (a format character) at character 2"),
        ("iso\u2066late", "U+2066 (a format character)"),
        ("zero\u200bwidth", "U+200B (a format character)"),
        ("bom\ufeff", "U+FEFF (a format character)"),
        ("tag\U000e0041", "U+E0041 (a format character)"),
        ("ls\u2028", "U+2028 (a line separator)"),
        ("ps\u2029", "U+2029 (a paragraph separator)"),
        ("nb\u00a0sp", "U+00A0 (a space other than ' ')"),
        ("ideo\u3000", "U+3000 (a space other than ' ')"),
        ("filler\u3164", "U+3164 (an invisible character)"),
        ("sur\ud800", "U+D800 (a surrogate)"),
        (" lead", "starts with a space"),
        ("trail ", "ends with a space"),
        (".", "cannot be reached by its URL"),
        ("..", "a path segment '.' or '..' means here or up"),
        ("", "run id is empty"),
        ("x" * (MAX_RUN_ID + 1), f"is {MAX_RUN_ID + 1} characters long; at most {MAX_RUN_ID}"),
    ],
)
def test_refusals_are_one_line_naming_the_character_never_echoing_it(value: str, says: str) -> None:
    """Each refusal is a one-line BadName (a ConfigError and a ValueError) that names the kind
    and the character as U+XXXX, with the value shown escaped: no refused character in it."""
    with pytest.raises(BadName) as caught:
        check_run_id(value)
    message = str(caught.value)
    assert isinstance(caught.value, ConfigError) and isinstance(caught.value, ValueError)
    assert message.startswith("run id") and says in message, message
    assert "\n" not in message and not any(refused(c) for c in message), repr(message)
    assert len(message) < 250


def test_names_are_bounded_tighter_than_run_ids() -> None:
    """A name takes MAX_NAME characters, a run id MAX_RUN_ID; not text is refused too."""
    assert check("n" * MAX_NAME, "queue name") == "n" * MAX_NAME
    with pytest.raises(BadName, match=r"^queue name 'nnn.*' is 201 characters long; at most 200"):
        check("n" * (MAX_NAME + 1), "queue name")
    assert check_run_id("r" * MAX_RUN_ID) == "r" * MAX_RUN_ID
    assert problem(42, "schedule name") == "schedule name must be text, not int"


@pytest.mark.parametrize(
    "value",
    ["hook:push:a1b2-c3", "sched:nightly:2026-12-01T09:00:00Z", "x/y@z", "Zürich-日本-Ελλάδα",
     "a b", "emoji-🚀", "ٱلعربية", "עברית", "C:\\path", "\ufffd", "pua-\ue000\U000f0000",
     "...", ".a", "a.", "./.", "a" * MAX_RUN_ID],
)  # fmt: skip
def test_unusual_but_visible_ids_pass(value: str) -> None:
    """Letters of any script, punctuation, symbols, emoji and inner spaces are ids."""
    assert check_run_id(value) == value


def test_every_id_perdure_makes_passes_the_rule() -> None:
    """Generated ids (uuid, schedule ticks, webhook deliveries, events, inbox files, children,
    forks) fit, at their longest parts, within MAX_RUN_ID."""
    longest = "d" * 200  # the most a delivery id, event id, trigger or schedule name holds
    made = [
        uuid.uuid4().hex,
        run_id_for("s" * MAX_NAME, 1_796_000_000.123456),
        f"hook:{'h' * 100}:{longest}",  # webhook names: at most 100 characters
        f"event:{longest}:{longest}",
        f"{'i' * MAX_NAME}:{'0' * 32}",  # inbox name and 32 digest characters
        f"event:{longest}:{longest}" + ".12" * 10,  # a child ten levels down
        f"{longest}~fork-{uuid.uuid4().hex[:8]}",
        f"plan:{'p' * MAX_NAME}",
    ]
    for run_id in made:
        assert check_run_id(run_id) == run_id


def test_escape_shows_what_the_rule_refuses_and_keeps_only_what_it_is_told() -> None:
    """Refused characters become Python escapes, kept ones stay, visible ones are unchanged."""
    assert escape("a\x1b[31mb\x07") == "a\\x1b[31mb\\x07"
    assert escape("x\u202eevil") == "x\\u202eevil"
    assert escape("t\U000e0001") == "t\\U000e0001"
    assert escape("one\ntwo\r", keep="\n") == "one\ntwo\\x0d"
    assert escape("Zürich 日本 🚀") == "Zürich 日本 🚀"


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40))
@example(".")
@example("..")
@example("...")
@example(". ")
@example(".x")
@example("x.")
def test_the_rule_and_its_pattern_agree(value: str) -> None:
    """The OpenAPI pattern accepts exactly what the rule does (length aside), and an accepted
    value has no control, format, separator or surrogate character."""
    ok = problem(value, "run id", MAX_RUN_ID) is None
    assert ok == (bool(re.fullmatch(PATTERN, value)) and value != "")
    if ok:
        cats = {unicodedata.category(c) for c in value}
        assert not cats & REFUSED_CATEGORIES, value
        assert value == value.strip(" ")


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=30))
def test_escaped_text_never_holds_a_refused_character(value: str) -> None:
    """Whatever is stored, what escape gives back is safe to print."""
    assert not any(refused(c) for c in escape(value))
    assert escape(value, keep="\n").count("\n") == value.count("\n")
