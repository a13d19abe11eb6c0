"""The CLI: each command against a real store, and one-line errors with exit code 2."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
from click.testing import CliRunner, Result

from extras_needed import require
from perdure.cli.main import cli
from perdure.server.access_sql import Access
from perdure.testing import SimulatedCrash, TestWorker
from perdure.triggers.dead_sql import DeadMessages

HERE = Path(__file__).parent


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def app_module() -> ModuleType:
    return sys.modules["cli_app"]


def test_start_show_explain_send_and_finish(env: dict[str, str]) -> None:
    """start, ls, show and explain describe a run; send delivers the event it waits for."""
    started = run("start", "checkout", '["o1"]', "--id", "r1")
    assert started.exit_code == 0, started.output
    assert started.output.strip() == "r1"
    worker = TestWorker(app_module().app)
    worker.run_until_idle()
    listing = run("ls", "--status", "waiting")
    assert "r1" in listing.output and "waiting" in listing.output
    shown = run("show", "r1")
    assert "step.outcome" in shown.output and "event.wait" in shown.output
    explained = run("explain", "r1")
    assert "keyed" in explained.output and "re-run" not in explained.output.split("\n")[0]
    assert "waiting" in explained.output
    sent = run("send", "r1", "approved", "true")
    assert sent.exit_code == 0
    worker.run_until_idle()
    assert app_module().app.get_run("r1").status == "completed"
    assert json.loads(app_module().app.get_run("r1").result) == "receipt-o1 approved=True"


def test_start_is_idempotent(env: dict[str, str]) -> None:
    """Starting the same id twice prints the same id and keeps one run."""
    assert run("start", "checkout", '["o1"]', "--id", "same").output.strip() == "same"
    assert run("start", "checkout", '["o1"]', "--id", "same").output.strip() == "same"
    assert len(app_module().app.list_runs()) == 1


def test_pause_resume_cancel(env: dict[str, str]) -> None:
    """pause parks a waiting run, resume makes it runnable, cancel ends it."""
    run("start", "checkout", '["o2"]', "--id", "r2")
    TestWorker(app_module().app).run_until_idle()
    assert run("pause", "r2").output.strip() == "paused"
    assert run("resume", "r2").output.strip() == "pending"
    assert run("cancel", "r2").output.strip() == "cancelled"


def test_steer_refuses_a_plain_workflow_and_a_finished_run_in_one_line(
    env: dict[str, str],
) -> None:
    """`perdure steer` to a run whose workflow never asked for steering, or to a finished
    run, exits 2 with one line, and the refusal is audited."""
    run("start", "checkout", '["o9"]', "--id", "r9")
    TestWorker(app_module().app).run_until_idle()
    refused = CliRunner().invoke(cli, ["steer", "r9", "be quick"])
    assert refused.exit_code == 2
    assert refused.output.count("\n") == 1 and "does not take steering" in refused.output
    run("send", "r9", "approved", "true")
    TestWorker(app_module().app).run_until_idle()
    late = CliRunner().invoke(cli, ["steer", "r9", "be quick"])
    assert late.exit_code == 2 and "finished run cannot be steered" in late.output
    audited = run("audit", "--run", "r9")
    assert audited.output.count("run.steer") == 2 and "refused" in audited.output


def test_resolve_needs_attention_with_value(env: dict[str, str]) -> None:
    """A once step interrupted mid-effect is resolved from the CLI with a value."""
    run("start", "checkout", '["o3"]', "--id", "r3")
    app = app_module().app
    worker = TestWorker(app)
    worker.run_until_idle()
    run("send", "r3", "approved", "1")
    worker.crash_after_intent("send_mail")
    with pytest.raises(SimulatedCrash):
        worker.run_until_idle()
    app.clock.advance(31)  # past the dead worker's lease
    TestWorker(app).run_until_idle()
    assert app.get_run("r3").status == "needs_attention"
    explained = run("explain", "r3")
    assert "needs_attention" in explained.output and "--retry" in explained.output
    resolved = run("resolve", "r3", "send_mail", "--value", '"mailed by hand"')
    assert resolved.exit_code == 0, resolved.output
    TestWorker(app).run_until_idle()
    assert app.get_run("r3").status == "completed"


def test_stuck_lists_a_run_that_needs_attention_in_full(env: dict[str, str]) -> None:
    """A once step interrupted mid-effect: `stuck` exits 1 naming the run, its whole reason
    (how the step was cut off), how long it has waited and the command that settles it;
    `ls` shows the same reason; once resolved, neither says anything."""
    run("start", "checkout", '["o9"]', "--id", "r9")
    app = app_module().app
    TestWorker(app).run_until_idle()
    run("send", "r9", "approved", "1")
    dying = TestWorker(app)
    dying.crash_after_intent("send_mail")
    with pytest.raises(SimulatedCrash):
        dying.run_until_idle()
    app.clock.advance(31)  # past the dead worker's lease
    TestWorker(app).run_until_idle()
    app.clock.advance(3 * 3600)
    result = CliRunner().invoke(cli, ["stuck"])
    assert result.exit_code == 1, result.output
    line = next(ln for ln in result.output.splitlines() if ln.startswith("r9 "))
    assert "needs_attention" in line and "needs attention for 3h at step" in line
    assert "between intent and outcome of a once step" in line  # the reason, not cut
    assert line.endswith("perdure resolve r9 2 --value JSON | --retry | --fail")
    listed = next(ln for ln in run("ls").output.splitlines() if ln.startswith("r9 "))
    assert "between intent and outcome of a once step" in listed
    assert json.loads(app.get_run("r9").error or "{}")["step"] == "send_mail"
    assert run("resolve", "r9", "send_mail", "--retry").exit_code == 0
    TestWorker(app).run_until_idle()
    assert app.get_run("r9").status == "completed" and app.get_run("r9").error is None
    assert run("stuck").exit_code == 0


def test_fork_and_effects(env: dict[str, str]) -> None:
    """fork copies the first N positions into a new run; effects lists every step."""
    run("start", "checkout", '["o4"]', "--id", "r4")
    TestWorker(app_module().app).run_until_idle()
    forked = run("fork", "r4", "--from-step", "1", "--id", "r4b")
    assert forked.output.strip() == "r4b"
    kinds = [(e.position, e.kind) for e in app_module().app.journal("r4b")]
    assert kinds == [(None, "run.origin"), (0, "step.intent"), (0, "step.outcome")]
    effects = run("effects")
    assert "charge" in effects.output and "keyed" in effects.output
    assert "send_mail" in effects.output and "needs_attention" in effects.output


def test_replay_check_reports_divergence(env: dict[str, str], tmp_path: Path) -> None:
    """replay-check exits 0 for matching code and 1 naming the run and position otherwise."""
    run("start", "checkout", '["o5"]', "--id", "r5")
    TestWorker(app_module().app).run_until_idle()
    clean = run("replay-check")
    assert clean.exit_code == 0 and "replay cleanly" in clean.output
    changed = tmp_path / "changed_app.py"
    changed.write_text(
        (HERE / "cli_app.py")
        .read_text()
        .replace("receipt = await charge(order)", "receipt = await send_mail(order)")
    )
    sys.path.insert(0, str(tmp_path))
    try:
        result = CliRunner().invoke(cli, ["--app", "changed_app:app", "replay-check"])
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("changed_app", None)
    assert result.exit_code == 1
    assert "r5" in result.output and "'charge'" in result.output and "'send_mail'" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["show", "nope"], "no run with id 'nope'"),
        (["send", "nope", "ev", "{bad"], "not valid JSON"),
        (["--db", "postgresql://nobody@127.0.0.1:1/none", "ls"], "cannot connect to PostgreSQL"),
        (["--db", "mysql://x", "ls"], "unknown scheme"),
        (["start", "nope"], "no workflow named 'nope'"),
        (["resolve", "nope", "1"], "exactly one of"),
        (["--db", "sqlite:///no/such/dir/x.db", "show", "r"], "no perdure store at"),
    ],
)
def test_user_errors_are_one_line_exit_2(
    env: dict[str, str], args: list[str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bad input gives one line on stderr, exit code 2 and no traceback."""
    if message == "cannot connect to PostgreSQL":
        require("postgres")  # the driver's own refusal
    if args[0] == "--db":
        monkeypatch.delenv("PERDURE_APP")  # a bare App on the given URL
    else:
        assert run("start", "checkout", '["seed"]').exit_code == 0  # the store exists
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


@pytest.mark.parametrize("args", ['"str"', "5", "true", "null"])
def test_start_refuses_args_that_are_neither_list_nor_object(
    env: dict[str, str], args: str
) -> None:
    """`perdure start checkout '"str"'`: one line, exit 2, and no run is started."""
    assert run("start", "checkout", '["seed"]', "--id", "seed").exit_code == 0
    result = CliRunner().invoke(cli, ["start", "checkout", args])
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [
        f"error: ARGS must be a JSON list (positional) or object (keywords), not {args!r}; "
        f"e.g. '[{args}]' to pass it as the one argument"
    ]
    assert [r.id for r in app_module().app.list_runs()] == ["seed"]


def test_stuck_reports_runs_nobody_moves(env: dict[str, str]) -> None:
    """`perdure stuck` exits 0 when all is well and 1, naming the run and why, when one is stuck."""
    run("start", "checkout", '["o9"]', "--id", "r9")
    assert run("stuck").exit_code == 0
    app_module().app.clock.advance(600)  # pending for ten minutes with no worker
    result = CliRunner().invoke(cli, ["stuck"])
    assert result.exit_code == 1
    assert "r9" in result.output and "pending" in result.output


def test_stuck_lists_a_skip_schedule_held_by_a_run_that_needs_attention(
    env: dict[str, str],
) -> None:
    """A schedule's run parks in needs_attention: later ticks say so in `schedules show`,
    and `perdure stuck` lists the schedule as blocked, with the run and the command to
    resolve it, and exits 1; once resolved, stuck is clean again."""
    assert run("schedules", "add", "nightly", "checkout", '["n1"]', "--every", "60").exit_code == 0
    app = app_module().app
    first = "sched:nightly:2026-01-01T00:01:00Z"
    app.clock.advance(60)
    TestWorker(app).run_until_idle()
    run("send", first, "approved", "true")
    dying = TestWorker(app)
    dying.crash_after_intent("send_mail")
    with pytest.raises(SimulatedCrash):
        dying.run_until_idle()
    app.clock.advance(31)
    TestWorker(app).run_until_idle()
    assert app.get_run(first).status == "needs_attention"
    app.clock.advance(29)  # 00:02 is skipped behind it
    TestWorker(app).run_until_idle()
    shown = run("schedules", "show", "nightly").output
    assert f"previous run {first} needs attention" in shown and "still running" not in shown
    result = CliRunner().invoke(cli, ["stuck"])
    assert result.exit_code == 1, result.output
    runs, schedules = result.output.strip().split("\n\n")
    parked = runs.splitlines()[1]
    assert parked.split()[:3] == [first, "checkout", "needs_attention"]
    assert "needs attention for 29s at step" in parked and "send_mail" in parked
    assert "perdure resolve" in parked
    header, row = schedules.splitlines()
    assert header.split() == ["SCHEDULE", "BLOCKED", "BY", "RUN", "STATUS", "HELD", "BACK",
                              "TO", "FREE", "IT"]  # fmt: skip
    assert row.split()[:5] == ["nightly", first, "needs_attention", "1", "tick(s)"]
    fix = f"perdure resolve {first} send_mail --value JSON | --retry | --fail"
    assert row.endswith(fix)
    assert run("resolve", first, "send_mail", "--value", '"mailed by hand"').exit_code == 0
    TestWorker(app).run_until_idle()
    clean = run("stuck")
    assert (
        clean.exit_code == 0
        and "no stuck runs, blocked schedules, dead messages or triggers in error" in clean.output
    )


def test_gc_deletes_runs_beyond_retention(env: dict[str, str]) -> None:
    """`perdure gc` applies the app's retention policies and says what it deleted."""
    import perdure

    app = app_module().app
    app.runtime.workflows["checkout"].retention = perdure.Retention(keep_last=1)
    for order in ("g1", "g2"):
        run("start", "checkout", f'["{order}"]', "--id", order)
        TestWorker(app).run_until_idle()
        run("send", order, "approved", "true")
        TestWorker(app).run_until_idle()
        app.clock.advance(1)
    result = run("gc")
    assert result.exit_code == 0, result.output
    assert "deleted 1 run(s)" in result.output
    assert "no run" in CliRunner().invoke(cli, ["show", "g1"]).output
    assert run("show", "g2").exit_code == 0


def test_gc_names_workflows_it_keeps_whole(env: dict[str, str]) -> None:
    """Workflows without a retention policy are listed as kept, so nobody expects otherwise."""
    assert run("start", "checkout", '["seed"]').exit_code == 0  # the store exists
    result = run("gc")
    assert "deleted 0 run(s)" in result.output
    assert "without retention: checkout" in result.output


def test_dead_runs_are_listed_and_resumed(env: dict[str, str]) -> None:
    """`ls --status dead` lists a dead run; `resume` replays it; `show` prints why it died."""
    app = app_module().app
    run("start", "checkout", '["d1"]', "--id", "d1")
    TestWorker(app).run_until_idle()
    run("send", "d1", "approved", "true")
    dying = TestWorker(app, max_recoveries=0)
    dying.crash_after_intent("send_mail")
    with pytest.raises(SimulatedCrash):
        dying.run_until_idle()
    app.clock.advance(31)
    TestWorker(app, max_recoveries=0).run_until_idle()
    listing = run("ls", "--status", "dead")
    assert "d1" in listing.output and "dead" in listing.output
    shown = run("show", "d1")
    assert "run.dead" in shown.output and "perdure resume d1" in shown.output
    assert run("resume", "d1").output.strip() == "pending"
    assert app.get_run("d1").status == "pending"


def test_schedules_add_show_pause_resume_delete(env: dict[str, str]) -> None:
    """A schedule added from the CLI fires from a worker; show lists next times and ticks."""
    added = run("schedules", "add", "nightly", "checkout", '["o-sched"]', "--every", "60")
    assert added.exit_code == 0, added.output
    assert "nightly: next fire 2026-01-01 00:01:00" in added.output
    listing = run("schedules", "ls")
    assert "nightly" in listing.output and "every 60s" in listing.output
    app = app_module().app
    app.clock.advance(60)
    TestWorker(app).run_until_idle()
    shown = run("schedules", "show", "nightly", "--next", "2")
    assert shown.exit_code == 0, shown.output
    assert "sched:nightly:2026-01-01T00:01:00Z" in shown.output and "fired" in shown.output
    assert "2026-01-01 00:02:00, 2026-01-01 00:03:00" in shown.output
    assert run("schedules", "pause", "nightly").output.strip() == "nightly: paused"
    app.clock.advance(120)
    TestWorker(app).run_until_idle()
    resumed = run("schedules", "resume", "nightly")
    assert "next fire 2026-01-01 00:04:00" in resumed.output
    assert "passed while the schedule was paused" in run("schedules", "show", "nightly").output
    assert run("schedules", "delete", "nightly").output.strip() == "nightly: deleted"
    assert run("schedules", "ls").output.strip() == "no schedules"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["schedules", "show", "nope"], "no schedule named 'nope'"),
        (["schedules", "add", "s", "checkout", "--cron", "bad cron"], "not a cron expression"),
        (["schedules", "add", "s", "nowhere", "--every", "5"], "no workflow named 'nowhere'"),
        (["schedules", "add", "s", "checkout", '{"x":', "--every", "5"], "not valid JSON"),
    ],
)
def test_schedule_errors_are_one_line(env: dict[str, str], args: list[str], message: str) -> None:
    assert run("start", "checkout", '["o1"]').exit_code == 0  # creates the store
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1


def test_pause_and_resume_a_whole_workflow(env: dict[str, str]) -> None:
    assert run("start", "checkout", '["o9"]', "--id", "w1").exit_code == 0
    assert run("pause", "--workflow", "checkout").output.strip() == "workflow checkout: paused"
    again = run("pause", "--workflow", "checkout").output.strip()
    assert again == "workflow checkout: paused (already)"
    app = app_module().app
    assert TestWorker(app).run_until_idle() == 0  # nothing of a paused workflow is claimed
    assert run("resume", "--workflow", "checkout").output.strip() == "workflow checkout: resumed"
    assert TestWorker(app).run_until_idle() == 1
    both = CliRunner().invoke(cli, ["pause", "w1", "--workflow", "checkout"])
    assert both.exit_code == 2 and "name one RUN" in both.output


def test_stuck_lists_dead_messages(env: dict[str, str]) -> None:
    """A broker message that could start no run shows in `perdure stuck` and `perdure dead`,
    with the reason, until an operator forgets it (audited)."""
    from perdure.triggers.dead_sql import DeadMessage

    app = app_module().app
    dead = DeadMessage("orders", "m-7", "redis", "payload is not JSON (line 1)", "{x", 2, 1.0)
    app.runtime.sync(DeadMessages(app.runtime.store).add_dead_message(dead), "dead")
    result = CliRunner().invoke(cli, ["stuck"])
    assert result.exit_code == 1, result.output
    header, row = result.output.strip().splitlines()
    assert header.split() == ["MESSAGE", "TRIGGER", "DEAD", "MESSAGE", "SOURCE", "WHY"]
    assert row.split() == ["orders", "m-7", "redis", "payload", "is", "not", "JSON", "(line", "1)"]
    listed = run("dead", "ls").output
    assert "m-7" in listed and "payload is not JSON (line 1)" in listed
    shown = run("dead", "show", "orders", "m-7").output.splitlines()
    assert shown[0].startswith("orders m-7 (redis, 2 bytes, ") and shown[1] == "{x"
    assert run("dead", "forget", "orders", "m-7").output.strip() == "orders m-7: forgotten"
    assert run("stuck").exit_code == 0
    again = CliRunner().invoke(cli, ["dead", "forget", "orders", "m-7"])
    assert again.exit_code != 0 and "no dead message 'm-7' of trigger 'orders'" in again.output
    assert len(again.output.strip().splitlines()) == 1
    audit = app.runtime.sync(Access(app.runtime.store).audit_log("message:orders:m-7"), "audit")
    assert [(a.action, a.outcome) for a in audit] == [
        ("dead_message.forget", "refused"), ("dead_message.forget", "ok"),
    ]  # fmt: skip
