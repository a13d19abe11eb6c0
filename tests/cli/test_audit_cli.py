"""The CLI's operator actions land in the audit log as `cli:<OS user>@<host>`, refused ones
too, and `perdure audit` shows the log newest first, filtered by run, actor and since."""

from __future__ import annotations

import getpass
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from click.testing import CliRunner, Result

from perdure.agent.budget_sql import Budgets
from perdure.cli.main import cli
from perdure.server.access import record
from perdure.server.access_sql import Access, AuditRow
from perdure.testing import SimulatedCrash, TestWorker

ME = f"cli:{getpass.getuser()}@{socket.gethostname()}"  # who runs the tests, where


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def ok(*args: str) -> str:
    done = run(*args)
    assert done.exit_code == 0, (args, done.output)
    return done.output


def app_module() -> ModuleType:
    return sys.modules["cli_app"]


def log() -> list[AuditRow]:
    app = app_module().app
    return list(
        reversed(app.runtime.sync(Access(app.runtime.store).audit_log(limit=1000), "log"))
    )  # oldest first


def stuck(run_id: str) -> None:
    """Start `checkout` as `run_id` and leave it needs_attention (crashed inside send_mail)."""
    app = app_module().app
    ok("start", "checkout", '["o"]', "--id", run_id)
    TestWorker(app).run_until_idle()
    ok("send", run_id, "approved", "true")
    crashing = TestWorker(app)
    crashing.crash_after_intent("send_mail")
    with pytest.raises(SimulatedCrash):
        crashing.run_until_idle()
    app.clock.advance(31)  # past the dead worker's lease
    TestWorker(app).run_until_idle()
    assert app.get_run(run_id).status == "needs_attention"


def test_every_cli_operator_action_is_audited_with_its_actor_target_and_outcome(
    env: dict[str, str],
) -> None:
    """start, send, pause, resume, cancel, resolve (value, retry, fail), fork, whole-workflow
    and worker pauses, emit, gc, budget, schedules and tokens each leave one `ok` record
    naming the OS user and host, the action and its target."""
    app = app_module().app
    ok("start", "checkout", '["o1"]', "--id", "r1")
    TestWorker(app).run_until_idle()
    ok("pause", "r1")
    ok("resume", "r1")
    ok("send", "r1", "nudge", '{"n": 1}')
    ok("emit", "approved", "true", "--id", "ev1", "--run", "r1")
    ok("fork", "r1", "--from-step", "1", "--id", "r1b")
    ok("cancel", "r1b")
    ok("pause", "--workflow", "checkout")
    ok("resume", "--workflow", "checkout")
    ok("pause", "--worker", "host9")
    ok("resume", "--worker", "host9")
    for run_id, how in (("r2", ["--value", '"by hand"']), ("r3", ["--retry"]), ("r4", ["--fail"])):
        stuck(run_id)
        ok("resolve", run_id, "send_mail", *how)
    ok("schedules", "add", "nightly", "checkout", '["o9"]', "--every", "3600")
    ok("schedules", "pause", "nightly")
    ok("schedules", "resume", "nightly")
    ok("schedules", "delete", "nightly")
    token_id = ok("token", "create", "bot", "--scope", "read").split()[1]
    ok("token", "revoke", token_id)
    app.runtime.sync(
        Budgets(app.runtime.store).declare_agent("triage", "{}", 0.0), "declare"
    )  # a worker serves it
    ok("budget", "triage", "--tokens-per-day", "1000")
    ok("gc")
    done = [(r.actor, r.action, r.target, r.outcome) for r in log()]
    expected = [
        ("run.start", "run:r1"), ("run.pause", "run:r1"), ("run.resume", "run:r1"),
        ("run.event", "run:r1"), ("event.emit", "run:r1"), ("run.fork", "run:r1"),
        ("run.cancel", "run:r1b"), ("workflow.pause", "workflow:checkout"),
        ("workflow.resume", "workflow:checkout"), ("worker.pause", "worker:host9"),
        ("worker.resume", "worker:host9"),
        *[(a, f"run:{r}") for r in ("r2", "r3", "r4")
          for a in ("run.start", "run.event", "run.resolve")],
        ("schedule.add", "schedule:nightly"), ("schedule.pause", "schedule:nightly"),
        ("schedule.resume", "schedule:nightly"), ("schedule.delete", "schedule:nightly"),
        ("token.create", f"token:{token_id}"), ("token.revoke", f"token:{token_id}"),
        ("budget.set", "agent:triage"), ("gc", "store"),
    ]  # fmt: skip
    assert done == [(ME, action, target, "ok") for action, target in expected]
    by_action = {(r.action, r.target): json.loads(r.detail) for r in log()}
    assert by_action[("run.fork", "run:r1")] == {"from_step": 1, "new_id": "r1b"}
    assert by_action[("run.start", "run:r1")] == {"workflow": "checkout", "via": "cli",
                                                  "created": True}  # fmt: skip
    resolved = [by_action[("run.resolve", f"run:{r}")]["how"] for r in ("r2", "r3", "r4")]
    assert resolved == ["value", "retry", "fail"]
    assert by_action[("token.create", f"token:{token_id}")] == {"name": "bot", "scopes": "read"}


def test_a_refused_cli_action_is_audited_as_refused_with_its_reason(
    env: dict[str, str],
) -> None:
    """Cancelling an unknown run, resuming a run that is not paused and revoking an unknown
    token each fail with one line (exit 2) and are recorded as refused, with that line."""
    ok("start", "checkout", '["o1"]', "--id", "r1")
    for args in (["cancel", "nope"], ["resume", "r1"], ["token", "revoke", "t0"]):
        refused = run(*args)
        assert refused.exit_code == 2 and refused.output.startswith("error: "), refused.output
    rows = log()[1:]
    assert [(r.actor, r.action, r.target, r.outcome) for r in rows] == [
        (ME, "run.cancel", "run:nope", "refused"),
        (ME, "run.resume", "run:r1", "refused"),
        (ME, "token.revoke", "token:t0", "refused"),
    ]
    assert rows[0].reason == "no run with id 'nope' (list runs with `perdure ls`)"
    assert "not paused or dead" in rows[1].reason


def test_perdure_audit_filters_by_run_actor_and_since(env: dict[str, str]) -> None:
    """`perdure audit --run X --actor Y --since 1h` shows only X's actions by Y of the last
    hour, newest first, as a table or JSON lines; a bad --since is one line."""
    app = app_module().app

    def note(actor: str, action: str, target: str) -> int:
        return int(app.runtime.sync(record(app, actor, action, target, {"n": 1}), "record"))

    note("cli:ana@h1", "run.pause", "run:x")  # too old
    app.clock.advance(7200)
    note("cli:bob@h2", "run.pause", "run:x")  # another actor
    note("cli:ana@h1", "run.pause", "run:y")  # another run
    first = note("cli:ana@h1", "run.resume", "run:x")
    app.clock.advance(60)
    second = note("cli:ana@h1", "run.cancel", "run:x")
    table = ok("audit", "--run", "x", "--actor", "cli:ana@h1", "--since", "1h")
    header, *lines = table.strip().splitlines()
    assert header.split() == ["#", "WHEN", "ACTOR", "ACTION", "TARGET", "OUTCOME", "DETAIL"]
    assert [line.split()[0] for line in lines] == [str(second), str(first)]
    assert "run.cancel" in lines[0] and "cli:ana@h1" in lines[0] and "n=1" in lines[0]
    as_json = ok("audit", "--run", "x", "--actor", "cli:ana@h1", "--since", "1h", "--json")
    entries = [json.loads(line) for line in as_json.splitlines()]
    assert [(e["id"], e["action"], e["outcome"]) for e in entries] == [
        (second, "run.cancel", "ok"), (first, "run.resume", "ok"),
    ]  # fmt: skip
    assert len(ok("audit", "--run", "x").strip().splitlines()) == 1 + 4
    assert ok("audit", "--actor", "nobody").strip() == "no audit entries match"
    bad = run("audit", "--since", "yesterday")
    assert bad.exit_code == 2 and bad.output.count("\n") == 1 and "90m" in bad.output


def test_a_real_cli_process_records_the_os_user_and_host(tmp_path: Path) -> None:
    """`perdure cancel` in its own process, as user alice, is recorded as cli:alice@<host>
    (refused: no such run) and `perdure audit --json` there shows it."""
    env = {**os.environ, "PERDURE_DB": f"sqlite:///{tmp_path}/p.db", "LOGNAME": "alice"}
    env.pop("PERDURE_APP", None)

    def perdure(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "perdure", *args], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)  # fmt: skip

    assert perdure("token", "create", "ops", "--scope", "read").returncode == 0
    cancelled = perdure("cancel", "ghost")
    assert cancelled.returncode == 2 and "ghost" in cancelled.stderr
    shown = perdure("audit", "--json", "--actor", f"cli:alice@{socket.gethostname()}")
    entries = [json.loads(line) for line in shown.stdout.splitlines()]
    assert [(e["action"], e["target"], e["outcome"]) for e in entries] == [
        ("run.cancel", "run:ghost", "refused"),
        ("token.create", entries[1]["target"], "ok"),
    ]
    assert entries[1]["target"].startswith("token:")
