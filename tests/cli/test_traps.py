"""The small traps of the CLI, each shut: a wait with no worker says so, an out-of-range
fork and a reused id with other arguments are told, `validate` lists every problem, hints
name the right flag, schedule times say UTC, a secret missing from this shell is not an
error, and /favicon.ico answers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from perdure.cli.main import cli
from perdure.testing import TestWorker

HERE = Path(__file__).parent
SRC = HERE.parents[1] / "src"


def run(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), env=env)


def test_start_wait_without_a_live_worker_says_so_and_names_the_command(
    env: dict[str, str],
) -> None:
    """`start --wait` with no worker alive prints, after a few seconds, that none is and how
    to start one; the wait goes on and ends with the result once the run is worked."""
    environ = {**os.environ, **env, "PYTHONPATH": f"{SRC}{os.pathsep}{HERE}"}
    waiting = subprocess.Popen(
        [sys.executable, "-m", "perdure", "start", "checkout", '["w1"]', "--id", "w1", "--wait"],
        env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert waiting.stderr is not None
        said = waiting.stderr.readline()
        assert "no live worker is registered" in said, said
        assert "--app cli_app:app worker`" in said
        assert waiting.poll() is None  # still waiting
        app = sys.modules["cli_app"].app
        app.send_event("w1", "approved", True)
        TestWorker(app).run_until_idle()
        out, _ = waiting.communicate(timeout=30)
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.wait()
    assert waiting.returncode == 0
    assert json.loads(out.splitlines()[-1]) == "receipt-w1 approved=True"


def test_fork_past_the_last_step_is_refused_in_one_line(env: dict[str, str]) -> None:
    """`fork --from-step 99` of a run with 2 steps is refused, naming the range; N equal to
    the step count is the whole journal, still allowed."""
    assert run("start", "checkout", '["f1"]', "--id", "f1").exit_code == 0
    TestWorker(sys.modules["cli_app"].app).run_until_idle()
    refused = run("fork", "f1", "--from-step", "99")
    assert refused.exit_code == 2
    assert refused.stderr.strip().splitlines() == [
        "error: fork: --from-step 99 is past the end of run 'f1': it has 2 step(s), so give 0 to 2"
    ]
    assert run("fork", "f1", "--from-step", "2", "--id", "f1b").stdout.strip() == "f1b"


def test_starting_an_existing_id_with_other_arguments_says_so(env: dict[str, str]) -> None:
    """A start of an existing id with other arguments prints the id (exit 0) and one line
    saying nothing new was started; the same arguments say nothing."""
    assert run("start", "checkout", '["a"]', "--id", "s1").exit_code == 0
    again = run("start", "checkout", '["a"]', "--id", "s1")
    assert (again.exit_code, again.stdout.strip(), again.stderr) == (0, "s1", "")
    other = run("start", "checkout", '["b"]', "--id", "s1")
    assert other.exit_code == 0 and other.stdout.strip() == "s1"
    lines = other.stderr.strip().splitlines()
    assert len(lines) == 1 and "exists already" in lines[0] and "other arguments" in lines[0]
    assert '"a"' in lines[0] and "nothing new was started" in lines[0]
    assert len(sys.modules["cli_app"].app.list_runs()) == 1


SPEC_WITH_PROBLEMS = """
name = "broken"
goal = "g"

[models.fast]
provider = "scripted"
script = "missing.json"

[routing]
default = "fast"
escalate = ["strong"]
escalate_after_failures = 2

[tools]
grant = ["no_such_tool"]

[[tools.mcp]]
name = "gh"
command = "perdure-no-such-mcp-server"

[acceptance]
python = "no_colon"
"""


def test_validate_reports_every_problem_at_once(tmp_path: Path) -> None:
    """`validate` lists all five problems of a spec, one a line (exit 2): a missing script,
    an unknown tier, a bad acceptance, an unknown tool and an MCP command that is not on
    PATH."""
    spec = tmp_path / "agent.toml"
    spec.write_text(SPEC_WITH_PROBLEMS)
    result = run("validate", str(spec))
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 5, lines
    assert all(line.startswith(f"error: {spec}:") for line in lines)
    for said in ("no file 'missing.json'", "no model tier 'strong'", "module:function",
                 "no tool 'no_such_tool'",
                 "MCP server 'gh': no command 'perdure-no-such-mcp-server' on PATH"):  # fmt: skip
        assert sum(said in line for line in lines) == 1, said


def test_validate_finds_an_mcp_command_on_path_or_from_the_spec_folder(tmp_path: Path) -> None:
    """An MCP server command on PATH (`python3`) or an executable beside the spec passes."""
    server = tmp_path / "server.sh"
    server.write_text("#!/bin/sh\n")
    server.chmod(0o755)
    spec = tmp_path / "agent.toml"
    spec.write_text(
        'name = "ok"\ngoal = "g"\n[models.fast]\nprovider = "scripted"\nscript = "builtin:echo"\n'
        '[[tools.mcp]]\nname = "a"\ncommand = "python3"\n'
        '[[tools.mcp]]\nname = "b"\ncommand = "./server.sh"\n'
    )
    result = run("validate", str(spec))
    assert result.exit_code == 0, result.stderr
    assert "ok: agent ok" in result.stdout


def test_ls_refuses_a_status_that_does_not_exist(env: dict[str, str]) -> None:
    """`ls --status bogus` is one line naming the statuses (claimable among them), not an
    empty list."""
    assert run("start", "checkout", '["l"]').exit_code == 0
    refused = run("ls", "--status", "bogus")
    assert refused.exit_code == 2
    assert refused.stderr.startswith("error: --status 'bogus': use one of pending, running,")
    assert refused.stderr.strip().endswith(", claimable")


def test_emit_without_a_trigger_names_the_run_flag(env: dict[str, str]) -> None:
    """The hint of an event type nobody listens to names `--run`, the flag that exists."""
    result = run("emit", "nobody.listens", "--id", "e1")
    assert result.exit_code == 2
    assert "pass --run RUN_ID" in result.stderr and "run_id=..." in result.stderr


def test_schedules_add_says_utc_and_its_help_says_it_needs_app(env: dict[str, str]) -> None:
    """`schedules add` prints its next fire time in UTC; its one-line help and the group's
    listing say it needs --app."""
    added = run("schedules", "add", "nightly", "checkout", '["o"]', "--every", "60")
    assert added.stdout.strip() == "nightly: next fire 2026-01-01 00:01:00 UTC"
    listing = run("schedules", "--help").stdout
    assert "add     Store a schedule (needs --app or --agent)" in listing
    assert (
        "perdure --app module:attribute schedules add" in run("schedules", "add", "--help").stdout
    )


def test_triggers_tells_a_secret_unset_in_this_shell_from_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A webhook whose secret variable this shell lacks is `unset here`, exit 0 (a worker
    or server may hold it); with the variable set it is `ready`."""
    monkeypatch.syspath_prepend(str(HERE))
    sys.modules.pop("traps_app", None)
    monkeypatch.delenv("TRAPS_HOOK_SECRET", raising=False)
    base = {"PERDURE_DB": f"sqlite:///{tmp_path}/t.db", "PERDURE_APP": "traps_app:app"}
    try:
        assert run("start", "handle", "[1]", env=base).exit_code == 0  # makes the store
        unset = run("triggers", env=base)
        assert unset.exit_code == 0, unset.output
        row = next(line for line in unset.stdout.splitlines() if "push" in line)
        assert "unset here" in row and "TRAPS_HOOK_SECRET is not set in this process" in row
        ready = run("triggers", env={**base, "TRAPS_HOOK_SECRET": "s3cret"})
        assert ready.exit_code == 0
        row = next(line for line in ready.stdout.splitlines() if "push" in line)
        assert " ready " in row
    finally:
        module = sys.modules.pop("traps_app", None)
        if module is not None:
            module.app.close()


def test_favicon_answers(tmp_path: Path) -> None:
    """/favicon.ico is the dashboard's icon (an SVG), not a 404, and pages link to it."""
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    import perdure
    from perdure.server import create_app

    app = perdure.App(f"sqlite:///{tmp_path}/f.db")
    try:
        with TestClient(create_app(app)) as client:
            icon = client.get("/favicon.ico")
            assert icon.status_code == 200
            assert icon.headers["content-type"].startswith("image/svg+xml")
            assert icon.content.startswith(b"<svg")
            assert '<link rel="icon" href="/favicon.ico"' in client.get("/ui/login").text
    finally:
        app.close()
