"""Real processes: a spec agent's `once` refund tool, probed by its read tool, is cut off by
`kill -9` of its `perdure worker` before or after paying; a new worker asks the probe and
settles the call (done: not paid again) or runs it again (not done). A run journaled before
tool steps were named after their tool resumes the same way. The model is the deterministic
scripted one, replayed by transcript length across processes."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import perdure
from golden_journals import seed_journal
from perdure.agent.loop import TOOL_NAMES
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


@dataclass
class Refunds:
    """The refund agent of probe_kill_app on a test's store: the app module (its App is
    the test's client), and the worker processes the test started."""

    folder: Path
    module: ModuleType
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def client(self) -> perdure.App:
        app: perdure.App = self.module.app
        return app

    def lines(self, name: str) -> list[str]:
        found: list[str] = self.module.lines(self.folder / name)
        return found

    def worker(self, log: str) -> subprocess.Popen[bytes]:
        """A `perdure worker` process of the app on the store, writing to `log`."""
        with (self.folder / log).open("ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "perdure", "--app", "probe_kill_app:app", "worker",
                 "--poll", "0.05"],
                cwd=HERE, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=out,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        self.procs.append(proc)
        return proc

    def settled(self, run_id: str, log: str) -> str:
        """The run's status once it completed, failed or parks for a person."""
        status = wait_for("the run to settle",
                          lambda: self.client.get_run(run_id).status in SETTLED,
                          self.folder / log, timeout=60)  # fmt: skip
        assert status
        return self.client.get_run(run_id).status

    def answers(self, run_id: str) -> list[dict[str, Any]]:
        """The probe answers journaled for the run."""
        return [json.loads(e.data or "{}") for e in self.client.journal(run_id)
                if e.kind == "step.probed"]  # fmt: skip


SETTLED = ("completed", "failed", "needs_attention")


@contextmanager
def refund_agent(
    folder: Path, monkeypatch: pytest.MonkeyPatch, spec: str, replies: list[Any]
) -> Iterator[Refunds]:
    """The spec and the scripted replies written to `folder`, the app imported on a store
    there (its workers get the same environment); its workers killed at the end."""
    (folder / "agent.toml").write_text(spec)
    (folder / "replies.jsonl").write_text("\n".join(json.dumps(r) for r in replies))
    env = {"PROBE_KILL_SPEC": str(folder / "agent.toml"), "PROBE_KILL_DIR": str(folder),
           "PERDURE_DB": f"sqlite:///{folder}/store.db"}  # fmt: skip
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.syspath_prepend(str(HERE))
    sys.modules.pop("probe_kill_app", None)  # its App and agent on this test's store
    refunds = Refunds(folder, importlib.import_module("probe_kill_app"))
    try:
        yield refunds
    finally:
        for proc in refunds.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        refunds.client.close()
        sys.modules.pop("probe_kill_app", None)


@pytest.mark.slow
@pytest.mark.parametrize("paid", [False, True], ids=["before-paying", "after-paying"])
def test_kill_9_inside_the_refund_is_settled_by_the_probe(
    tmp_path: Path, paid: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kill -9 while the refund waits before (or after) paying: the next worker asks
    find_refund, which journals not done (the refund runs again: one payment) or done (the
    refund is not run again: one payment, one start); the run completes, nobody resolves."""
    with refund_agent(tmp_path, monkeypatch, SPEC, REPLIES) as refunds:
        client = refunds.client
        handle = client.start(refunds.module.agent.workflow, {"prompt": "refund o1"},
                              run_id="r-o1")  # fmt: skip
        first = refunds.worker("w1.log")
        if paid:
            (tmp_path / "pay").touch()
            wait_for("the refund paid", lambda: refunds.lines("ledger") == ["o1"],
                     tmp_path / "w1.log", timeout=60)  # fmt: skip
        else:
            wait_for("the refund started", lambda: refunds.lines("markers") == ["started:o1"],
                     tmp_path / "w1.log", timeout=60)  # fmt: skip
        first.kill()
        first.wait(10)
        (tmp_path / "pay").touch()
        (tmp_path / "return").touch()
        refunds.worker("w2.log")

        status = refunds.settled(handle.id, "w2.log")
        assert status == "completed", (tmp_path / "w2.log").read_text()[-2000:]
        assert refunds.lines("ledger") == ["o1"]  # paid exactly once
        assert refunds.lines("markers") == ["started:o1"] * (1 if paid else 2)
        assert [a["answer"] for a in refunds.answers("r-o1")] == ["done" if paid else "not_done"]
        # the step is named after its tool, and so is its probe
        assert {e.name for e in client.journal("r-o1") if e.kind == "step.probed"} == {
            "agent:refunder.tool.issue_refund"
        }
        assert [a["probe"] for a in refunds.answers("r-o1")] == ["find_refund"]


@pytest.mark.slow
def test_a_run_journaled_before_tool_named_steps_resumes_across_kill_9(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run of perdure before tool steps were named after their tool (golden: its once
    tools notify and issue_refund share `agent:refunder.tool.once`, cut by kill -9 inside
    the paid refund of o1) resumes on today's code: the recorded calls are not run again,
    o1's refund is settled by the probe (done), o2's refund, cut by kill -9 before paying,
    is asked again (not done) and runs again; every call of the run keeps its effect's
    step, so the journal replays as it was written."""
    record = json.loads((HERE / "golden_tool_steps_by_effect.json").read_text())
    with refund_agent(tmp_path, monkeypatch, record["spec"], record["replies"]) as refunds:
        for name, lines in record["world"].items():  # the outside world as at the kill
            (tmp_path / name).write_text("".join(f"{line}\n" for line in lines))
        client = refunds.client
        run_id = seed_journal(client, record)
        first = refunds.worker("w1.log")
        wait_for("the refund of o2 started",
                 lambda: refunds.lines("markers") == ["started:o1", "started:o2"],
                 tmp_path / "w1.log", timeout=60)  # fmt: skip
        first.kill()  # kill -9 inside o2's refund, before it pays
        first.wait(10)
        (tmp_path / "pay-o2").touch()
        (tmp_path / "return-o2").touch()
        refunds.worker("w2.log")

        status = refunds.settled(run_id, "w2.log")
        assert status == "completed", (tmp_path / "w2.log").read_text()[-2000:]
        assert refunds.lines("notified") == ["o1"]  # the recorded once call: not run again
        assert refunds.lines("ledger") == ["o1", "o2"]  # each refund paid once
        assert refunds.lines("markers") == ["started:o1", "started:o2", "started:o2"]
        # the recorded read call is not run again: one look then, one per probe since
        assert refunds.lines("looked") == ["o1", "o1", "o2"]
        answers = refunds.answers(run_id)
        assert [(a["probe"], a["answer"]) for a in answers] == [
            ("tools.effects", "done"),
            ("tools.effects", "not_done"),
        ]
        journal = client.journal(run_id)
        tools = {e.name for e in journal if ".tool." in e.name}
        assert tools == {"agent:refunder.tool.once", "agent:refunder.tool.read"}
        assert not any(e.kind == "patch.marker" and e.name == TOOL_NAMES for e in journal)
        result = client.handle(run_id).result(timeout=5)
        assert result["status"] == "done"
