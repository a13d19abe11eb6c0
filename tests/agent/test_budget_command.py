"""`perdure budget AGENT` cannot surprise: it shows the budget in force and where each limit
comes from, changes only the limits given, --reset returns to the spec, refuses unknown
agents and bad numbers in one line, and every change is in the audit log."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

import perdure
from perdure.agent.budgets import declare
from perdure.agent.spec import load_spec
from perdure.cli.main import cli

SPEC = """
name = "spender"
goal = "Answer"

[models.fast]
provider = "scripted"
script = "builtin:extractive"
price = { input_per_mtok = 1.0, output_per_mtok = 1.0 }

[budget]
tokens_per_day = 40000
cost_per_day = 0.03
"""


def _declared(tmp_path: Path) -> str:
    path = tmp_path / "spender.toml"
    path.write_text(SPEC)
    db = f"sqlite:///{tmp_path}/s.db"
    app = perdure.App(db)
    try:
        app.runtime.sync(
            declare(app.runtime, load_spec(path)), "declare"
        )  # as `perdure agent SPEC` does
    finally:
        app.close()
    return db


def _limits(output: str) -> dict[str, tuple[str, str]]:
    """LIMIT -> (IN FORCE, FROM) from the command's table."""
    rows = [line.split() for line in output.splitlines()[1:] if line.startswith(("tokens", "cost"))]
    return {r[0]: (r[1], r[2]) for r in rows}


def test_budget_shows_changes_only_what_is_given_and_resets(tmp_path: Path) -> None:
    """No flags: the spec's limits, from the spec, nothing stored; one flag changes that limit
    alone (the spec's cost limit stays in force); --reset: all from the spec again."""
    db = _declared(tmp_path)
    runner = CliRunner()
    shown = runner.invoke(cli, ["--db", db, "budget", "spender"])
    assert shown.exit_code == 0, shown.output
    assert _limits(shown.output) == {
        "tokens_per_hour": ("none", "none"), "tokens_per_day": ("40000", "spec"),
        "cost_per_hour": ("none", "none"), "cost_per_day": ("0.03", "spec"),
    }  # fmt: skip
    changed = runner.invoke(cli, ["--db", db, "budget", "spender", "--tokens-per-day", "1000000"])
    assert changed.exit_code == 0, changed.output
    limits = _limits(changed.output)
    assert limits["tokens_per_day"] == ("1000000", "stored")
    assert limits["cost_per_day"] == ("0.03", "spec")  # not dropped
    again = runner.invoke(cli, ["--db", db, "budget", "spender", "--cost-per-hour", "0.5"])
    assert _limits(again.output)["tokens_per_day"] == ("1000000", "stored")  # kept
    assert _limits(again.output)["cost_per_hour"] == ("0.5", "stored")
    reset = runner.invoke(cli, ["--db", db, "budget", "spender", "--reset"])
    assert reset.exit_code == 0 and "reset to the spec" in reset.output
    assert _limits(reset.output)["tokens_per_day"] == ("40000", "spec")
    assert _limits(reset.output)["cost_per_hour"] == ("none", "none")
    audit = runner.invoke(cli, ["--db", db, "audit", "--target", "agent:spender"])
    assert audit.exit_code == 0, audit.output
    assert audit.output.count("budget.set") == 3


def test_budget_refuses_unknown_agents_and_bad_numbers_in_one_line(tmp_path: Path) -> None:
    """A typo'd agent, a negative or non-numeric limit, --reset with a limit: exit non-zero,
    one line, nothing stored."""
    db = _declared(tmp_path)
    runner = CliRunner()
    for args, said in (
        (["spendr", "--tokens-per-day", "5"], "no agent named 'spendr'"),
        (["spendr"], "no agent named 'spendr'"),
        (["spender", "--tokens-per-day", "-5"], "--tokens-per-day: '-5' must be 0 or more"),
        (["spender", "--tokens-per-day", "lots"], "'lots' is not a whole number of tokens"),
        (["spender", "--cost-per-day", "nan"], "--cost-per-day: 'nan' must be 0 or more"),
        (["spender", "--reset", "--cost-per-day", "1"], "--reset goes alone"),
    ):
        out = runner.invoke(cli, ["--db", db, "budget", *args])
        assert out.exit_code != 0, args
        assert said in out.output and len(out.output.strip().splitlines()) == 1, out.output
    shown = runner.invoke(cli, ["--db", db, "budget", "spender"])
    assert "stored" not in shown.output  # nothing was stored by the refused commands
