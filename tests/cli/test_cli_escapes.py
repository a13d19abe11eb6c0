"""What the CLI prints of stored text never drives the terminal: runs, schedules, tokens and
audit entries written before the id rule (with ESC, BEL, CR, LF, TAB, U+202E in their ids
and names) are shown escaped, one table row each."""

from __future__ import annotations

import sqlite3

from click.testing import CliRunner, Result

from perdure.cli.main import cli
from perdure.store.names import REFUSED, escape

EVIL = "x\x1b]0;owned\x07\x1b[2J\r\nfake row\t\u202eevil"  # retitle, clear, split, reorder


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def refused_in(text: str) -> list[str]:
    """The refused characters of `text` that are not line breaks, as U+XXXX."""
    return [
        f"U+{ord(c):04X}" for c in text if c != "\n" and any(a <= ord(c) <= b for a, b in REFUSED)
    ]


def old_rows(db_url: str) -> None:
    """Give a run, its schedule tick, a schedule, a token and an audit entry the evil id,
    as a store written before the rule would hold them."""
    path = db_url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as db:
        db.execute("UPDATE runs SET id = ?, waiting_for = ? WHERE id = 'r1'", (EVIL, EVIL))
        db.execute("UPDATE journal SET run_id = ?, name = ? WHERE run_id = 'r1'", (EVIL, EVIL))
        db.execute("UPDATE schedules SET name = ?", (EVIL,))
        db.execute("UPDATE api_tokens SET name = ?", (EVIL,))
        db.execute("UPDATE audit_log SET target = ?, actor = ?", (f"run:{EVIL}", EVIL))


def test_old_ids_with_control_and_bidi_characters_print_escaped(env: dict[str, str]) -> None:
    """ls, show, explain, schedules, token ls and audit escape every control and format
    character (no ESC, BEL, CR, TAB or U+202E reaches the terminal), a stored newline never
    splits a row, and an escaped id is printed the same everywhere."""
    assert run("start", "checkout", '["o1"]', "--id", "r1").exit_code == 0
    added = run("schedules", "add", "nightly", "checkout", '["o2"]', "--every", "60")
    assert added.exit_code == 0, added.output
    assert run("token", "create", "alice", "--scope", "read").exit_code == 0
    old_rows(env["PERDURE_DB"])
    shown = escape(EVIL)
    assert "\\x1b]0;owned\\x07" in shown and "\\u202e" in shown and "\n" not in shown

    listing = run("ls")
    assert listing.exit_code == 0, listing.output
    assert refused_in(listing.output) == []
    assert len(listing.output.splitlines()) == 2  # the header and the one run
    assert shown in listing.output

    for command in (("show", EVIL), ("explain", EVIL)):
        out = run(*command)
        assert out.exit_code == 0, out.output
        assert refused_in(out.output) == [], command
        assert f"run       {shown}" in out.output
        assert "fake row" not in [line.strip() for line in out.output.splitlines()]

    for command in (("schedules", "ls"), ("schedules", "show", EVIL), ("token", "ls"), ("audit",)):
        out = run(*command)
        assert out.exit_code == 0, out.output
        assert refused_in(out.output) == [], command
        assert shown in out.output, command
        assert not any(line.startswith("fake row") for line in out.output.splitlines())


def test_an_error_naming_an_old_id_is_one_escaped_line(env: dict[str, str]) -> None:
    """A refused new id, and an unknown old-style one, are each one escaped line on stderr."""
    refused = run("start", "checkout", '["o1"]', "--id", EVIL)
    assert refused.exit_code == 2
    assert refused.output.count("\n") == 1 and refused_in(refused.output) == []
    assert "run id" in refused.output and "U+001B (a control character)" in refused.output
    missing = run("show", EVIL)
    assert missing.exit_code == 2
    assert missing.output.count("\n") == 1 and refused_in(missing.output) == []
