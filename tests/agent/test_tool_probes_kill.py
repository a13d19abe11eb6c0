"""Real processes: a spec agent's `once` refund tool, probed by its read tool, is cut off by
`kill -9` of its `perdure worker` before or after paying; a new worker asks the probe and
settles the call (done: not paid again) or runs it again (not done). The model is the
deterministic scripted one, replayed by transcript length across processes."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import perdure
from waits import wait_for

HERE = Path(__file__).resolve().parent

SPEC = """
name = "refunder"
goal = "Refund"

[models.fast]
provider = "scripted"
script = "replies.jsonl"
context_tokens = 100000

[tools]
grant = ["issue_refund", "find_refund", "finish"]

[tools.effects]
issue_refund = { probe = "find_refund" }
"""
REPLIES = [
    {"content": "", "tool_calls": [{"name": "issue_refund", "arguments": {"order": "o1"}}]},
    {"content": "", "tool_calls": [{"name": "finish", "arguments": {"summary": "refunded"}}]},
]


def worker(url: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    full = {**os.environ, **env, "PERDURE_DB": url, "PYTHONUNBUFFERED": "1"}
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "perdure", "--app", "probe_kill_app:app", "worker",
             "--poll", "0.05"],
            cwd=HERE, env=full, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("paid", [False, True], ids=["before-paying", "after-paying"])
def test_kill_9_inside_the_refund_is_settled_by_the_probe(
    tmp_path: Path, paid: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kill -9 while the refund waits before (or after) paying: the next worker asks
    find_refund, which journals not done (the refund runs again: one payment) or done (the
    refund is not run again: one payment, one start); the run completes, nobody resolves."""
    (tmp_path / "agent.toml").write_text(SPEC)
    (tmp_path / "replies.jsonl").write_text("\n".join(json.dumps(r) for r in REPLIES))
    env = {"PROBE_KILL_SPEC": str(tmp_path / "agent.toml"), "PROBE_KILL_DIR": str(tmp_path)}
    url = f"sqlite:///{tmp_path}/store.db"
    for key, value in {**env, "PERDURE_DB": url}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.syspath_prepend(str(HERE))
    sys.modules.pop("probe_kill_app", None)  # its App and agent on this test's store
    kill_app = importlib.import_module("probe_kill_app")
    client: perdure.App = kill_app.app
    markers, ledger = tmp_path / "markers", tmp_path / "ledger"
    first = second = None
    try:
        handle = client.start(kill_app.agent.workflow, {"prompt": "refund o1"}, run_id="r-o1")
        first = worker(url, env, tmp_path / "w1.log")
        if paid:
            (tmp_path / "pay").touch()
            wait_for("the refund paid", lambda: kill_app.lines(ledger) == ["o1"],
                     tmp_path / "w1.log", timeout=60)  # fmt: skip
        else:
            wait_for("the refund started", lambda: kill_app.lines(markers) == ["started:o1"],
                     tmp_path / "w1.log", timeout=60)  # fmt: skip
        first.kill()
        first.wait(10)
        (tmp_path / "pay").touch()
        (tmp_path / "return").touch()
        second = worker(url, env, tmp_path / "w2.log")
        wait_for("the run to settle",
                 lambda: handle.status() in ("completed", "failed", "needs_attention"),
                 tmp_path / "w2.log", timeout=60)  # fmt: skip

        assert handle.status() == "completed", (tmp_path / "w2.log").read_text()[-2000:]
        assert kill_app.lines(ledger) == ["o1"]  # paid exactly once
        assert kill_app.lines(markers) == ["started:o1"] * (1 if paid else 2)
        answers = [json.loads(e.data or "{}")["answer"] for e in client.journal("r-o1")
                   if e.kind == "step.probed"]  # fmt: skip
        assert answers == ["done" if paid else "not_done"]
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(10)
        client.close()
        sys.modules.pop("probe_kill_app", None)
