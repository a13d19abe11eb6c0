"""`--json` on every command that reads: each prints one document that parses and fits the
JSON Schema committed under docs/cli-json/ (which is what `perdure.cli.schemas` builds),
the same object the HTTP API answers where it has one; `--version`; and text that is cut
to fit says so and `--wide` shows it whole, a step's traceback included."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from extras_needed import needs

pytest.importorskip("starlette", reason=needs("server"))
jsonschema = pytest.importorskip("jsonschema")

from perdure.cli import schemas  # noqa: E402 - after the skips
from perdure.cli.main import cli  # noqa: E402
from perdure.store.workers_sql import WorkerRow  # noqa: E402
from perdure.testing import SimulatedCrash, TestWorker  # noqa: E402
from perdure.triggers.dead_sql import DeadMessage, DeadMessages  # noqa: E402

ROOT = Path(__file__).parents[2]
SPEC = """
name = "notes"
goal = "Summarise the file"

[models.fast]
provider = "scripted"
script = "builtin:extractive"

[tools]
read_paths = ["in"]
write_paths = ["out"]

[output]
path = "out/{stem}.md"
"""


def fits(command: str, text: str) -> Any:
    """`text` parsed, after checking it against docs/cli-json/COMMAND.schema.json."""
    schema = json.loads((ROOT / "docs" / "cli-json" / f"{command}.schema.json").read_text())
    value = json.loads(text)
    jsonschema.validate(value, schema, cls=jsonschema.Draft202012Validator)
    return value


def run(*args: str, code: int = 0) -> Result:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == code, result.output
    return result


def test_the_committed_schemas_are_what_the_module_builds() -> None:
    """docs/cli-json/ holds one schema per reading command, each as the module builds it
    (regenerate: python -m perdure.cli.schemas)."""
    for command in schemas.COMMANDS:
        path = ROOT / "docs" / "cli-json" / f"{command}.schema.json"
        assert path.read_text() == schemas.render(command), f"{path} is stale"
        jsonschema.Draft202012Validator.check_schema(json.loads(path.read_text()))


def test_every_reading_command_prints_json_that_fits_its_schema(env: dict[str, str]) -> None:
    """A run waiting for a person (a once step cut off, its probe unable to tell), a
    finished one, a schedule, a worker and a dead message: ls, show (also --step), explain,
    stuck, workers, triggers, schedules ls/show, effects, dead ls and audit each print JSON
    that fits its schema and says what the text says."""
    module = sys.modules["cli_app"]
    app = module.app
    run("start", "return_order", '["o1"]', "--id", "j1")
    dying = TestWorker(app)
    dying.crash_after_intent("refund")
    with pytest.raises(SimulatedCrash):
        dying.run_until_idle()
    app.clock.advance(31)
    TestWorker(app).run_until_idle()
    run("schedules", "add", "nightly", "checkout", '["o2"]', "--every", "3600")
    beat = WorkerRow("host-a:42:w", "host-a", 42, time.time() - 60, time.time(), 4, 1)
    app.runtime.sync(app.runtime.store.worker_beat(beat), "beat")
    dead = DeadMessage("orders", "m-7", "redis", "payload is not JSON (line 1)", "{x", 2, 1.0)
    app.runtime.sync(DeadMessages(app.runtime.store).add_dead_message(dead), "dead")

    listed = fits("ls", run("ls", "--json").output)
    [j1] = [r for r in listed["runs"] if r["id"] == "j1"]
    assert j1["status"] == "needs_attention" and "cannot tell" in j1["reason"]
    shown = fits("show", run("show", "j1", "--json").output)
    kinds = [e["kind"] for e in shown["entries"]]
    assert shown["run"]["id"] == "j1" and kinds[0] == "step.intent"
    assert "step.needs_attention" in kinds
    step = fits("show", run("show", "j1", "--step", "0", "--json").output)
    assert {e["position"] for e in step["entries"]} == {0}
    explained = fits("explain", run("explain", "j1", "--json").output)
    assert explained["steps"][0]["state"] == "needs_attention"
    stuck = fits("stuck", run("stuck", "--json", code=1).output)
    assert [r["run_id"] for r in stuck["runs"]] == ["j1"]
    assert [d["message_id"] for d in stuck["dead_messages"]] == ["m-7"]
    workers = fits("workers", run("workers", "--json").output)
    assert [(w["id"], w["state"], w["running"]) for w in workers["workers"]] == [
        ("host-a:42:w", "alive", 1)
    ]
    triggers = fits("triggers", run("triggers", "--json").output)
    assert [(t["kind"], t["name"]) for t in triggers["triggers"]] == [("schedule", "nightly")]
    every = fits("schedules-ls", run("schedules", "ls", "--json").output)
    assert [s["name"] for s in every["schedules"]] == ["nightly"]
    one = fits("schedules-show", run("schedules", "show", "nightly", "--json").output)
    assert one["schedule"]["every"] == 3600 and len(one["upcoming"]) == 5
    steps = fits("effects", run("effects", "--json").output)
    assert {s["name"]: s["effect"] for s in steps["steps"]}["refund"] == "once"
    messages = fits("dead-ls", run("dead", "ls", "--json").output)
    assert messages["dead_messages"][0]["reason"] == "payload is not JSON (line 1)"
    lines = run("audit", "--json").output.splitlines()
    assert [fits("audit", line)["action"] for line in lines] == ["schedule.add", "run.start"]


def test_an_agents_usage_budget_and_spec_as_json(tmp_path: Path) -> None:
    """validate (a passing and a failing spec), usage and budget of an agent that ran."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("First sentence here. Second one. Third.")
    spec = tmp_path / "agent.toml"
    spec.write_text(SPEC)
    db = f"sqlite:///{tmp_path}/s.db"
    ok = fits("validate", run("validate", str(spec), "--json").output)
    assert ok["ok"] is True and ok["agent"] == "notes" and ok["tiers"][0]["provider"] == "scripted"
    bad = tmp_path / "bad.toml"
    bad.write_text(SPEC.replace('provider = "scripted"', 'provider = "nope"'))
    refused = fits("validate", run("validate", str(bad), "--json", code=2).output)
    assert refused["ok"] is False and "models.fast.provider" in refused["error"]
    run("--db", db, "run", str(spec), "--file", str(tmp_path / "in" / "a.txt"), "--wait")
    used = fits("usage", run("--db", db, "usage", "--by", "agent", "--json").output)
    assert [(g["agent"], g["calls"]) for g in used["groups"]] == [("notes", 1)]
    changed = run("--db", db, "budget", "notes", "--tokens-per-day", "5", "--json").output
    budget = fits("budget", changed)
    assert budget["in_force"]["tokens_per_day"] == {"limit": 5, "from": "stored"}
    assert budget["woken"] == 0


def test_version() -> None:
    """`perdure --version` prints the installed version."""
    from importlib.metadata import version

    assert run("--version").output.strip() == f"perdure {version('perdure')}"


def test_cut_text_says_so_and_wide_and_step_show_it_whole(env: dict[str, str]) -> None:
    """A failed step's long error: `show` cuts DATA and says how to see it whole; `--wide`
    prints it whole; the run's traceback is named and `--wide` prints it; `--step N` prints
    the step's entries in full with the traceback as text; `explain --wide` likewise."""
    app = sys.modules["cli_app"].app
    long = "x" * 300

    @app.step(name="explode", retry=None)
    def explode() -> None:
        raise ValueError(f"the ledger said no: {long}")

    @app.workflow(name="boom")
    async def boom() -> None:
        await explode()

    run("start", "boom", "--id", "b1")
    TestWorker(app).run_until_idle()
    assert app.get_run("b1").status == "failed"
    short = run("show", "b1").output
    assert short.count(long) == 1  # the run's error, whole; its step's DATA cut
    assert "--wide prints every value in full" in short
    assert "(its traceback: perdure show b1 --wide)" in short
    wide = run("show", "b1", "--wide").output
    assert wide.count(long) > 1 and "Traceback (most recent call last)" in wide
    step = run("show", "b1", "--step", "0").output
    assert long in step and "traceback:" in step and 'raise ValueError(f"the ledger' in step
    assert long in run("explain", "b1", "--wide").output
    missing = CliRunner().invoke(cli, ["show", "b1", "--step", "9"])
    assert missing.exit_code == 2 and "has no step at position 9" in missing.output


def test_audit_says_when_it_cut_and_wide_shows_it_whole(env: dict[str, str]) -> None:
    """A refusal whose reason is longer than the column: `audit` ends it in … and says how to
    see it whole; `audit --wide` prints it whole."""
    long_id = "r-" + "y" * 90
    run("start", "checkout", '["o1"]', "--id", "a1")
    refused = CliRunner().invoke(cli, ["cancel", long_id])
    assert refused.exit_code == 2
    short = run("audit").output
    reason = short.split("refused: ", 1)[1].splitlines()[0]
    assert long_id not in reason and reason.rstrip().endswith("…")
    assert "perdure audit --wide prints every value in full" in short
    wide = run("audit", "--wide").output
    assert long_id in wide.split("refused: ", 1)[1] and "cut to fit" not in wide
