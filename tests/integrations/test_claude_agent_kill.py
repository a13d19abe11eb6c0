"""The Claude Agent SDK made durable, against `kill -9`: a real `perdure worker` process runs
the refund agent (its bundled CLI on the scripted Anthropic-compatible server) and is
killed inside a tool; a restarted worker resumes the conversation from the journal, on
SQLite and PostgreSQL. Also: the transcripts' `SessionStore` on both stores."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from extras_needed import needs

pytest.importorskip("claude_agent_sdk", reason=needs("claude-agent"))

from crashes import app_module, kill_all, worker_process
from test_claude_agent import TOOL, ClaudeServer, script

import perdure
from perdure.integrations.claude_agent import PerdureSessionStore
from waits import wait_for


@pytest.fixture
def claude(tmp_path: Path) -> Iterator[Any]:
    """The scripted server and the environment the test app reads (workers inherit it)."""
    server = ClaudeServer().start()
    (tmp_path / "ledger").touch()
    (tmp_path / "config").mkdir()
    env = {"CLAUDE_BASE_URL": server.origin, "CLAUDE_LEDGER": str(tmp_path / "ledger"),
           "CLAUDE_CONFIG": str(tmp_path / "config")}  # fmt: skip
    os.environ.update(env)
    server.env = env
    server.module = app_module("claude_agent_app")
    yield server
    server.stop()
    for key in env:
        os.environ.pop(key, None)


def children(pid: int) -> list[int]:
    """The child processes of `pid` (Linux /proc)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def gone(pids: list[int]) -> bool:
    """Whether none of `pids` is a live process (a zombie counts as gone)."""
    for pid in pids:
        stat = Path(f"/proc/{pid}/stat")
        if stat.exists() and stat.read_text().split(") ")[-1][:1] != "Z":
            return False
    return True


def posted(server: Any) -> int:
    """Model requests the server answered (the CLI's conversation turns)."""
    return sum(1 for r in server.requests if r.body.get("tools"))


@pytest.mark.slow
def test_kill_9_inside_a_once_tool_parks_and_nothing_recorded_runs_again(
    tmp_path: Path, store_url: str, claude: Any
) -> None:
    """`kill -9` of a real worker while the e-mail (`once`, no probe) is being sent: the
    restarted worker's CLI gets its three recorded model answers from the journal (the
    server sees none again), the lookup and refund are not run again, the e-mail is not
    re-sent; the run is in needs_attention, and resolved it finishes with one more call."""
    log = tmp_path / "log"
    client = perdure.App(store_url)
    workflow = claude.module.register(client).workflow()
    script(claude)
    first = worker_process("claude_agent_app:app", store_url, claude.env, log)
    second: subprocess.Popen[bytes] | None = None
    ledger = claude.module.ledger
    try:
        handle = client.start(workflow, "refund o42", run_id="k-42")
        wait_for("the e-mail to start", lambda: "email-started" in ledger(), log, timeout=120)
        clis = children(first.pid)
        assert clis  # the worker's Claude Code CLI
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        wait_for("the CLI to die with its worker", lambda: gone(clis), log, timeout=10)
        before = ["lookup", "refund-started", "refund-paid", "email-started"]
        assert ledger() == before and posted(claude) == 3
        second = worker_process("claude_agent_app:app", store_url, claude.env, log)
        wait_for("needs_attention", lambda: handle.status() == "needs_attention", log, 120)
        time.sleep(claude.module.HOLD + 0.5)  # a re-sent e-mail would have logged by now
        assert ledger() == before and posted(claude) == 3
        client.resolve("k-42", "refunds.tool.email", value="sent")
        assert handle.result(timeout=120) == "Order o42 was refunded."
        assert ledger() == before and posted(claude) == 4
    finally:
        kill_all(first, second)
        client.close()


@pytest.mark.slow
def test_kill_9_after_the_refund_paid_asks_its_probe_not_the_payment(
    tmp_path: Path, store_url: str, claude: Any
) -> None:
    """`kill -9` after the refund paid but before its outcome was journaled: the restarted
    worker asks the refund's probe (the ledger says paid), journals its answer as the
    outcome and goes on; the refund is paid once."""
    log = tmp_path / "log"
    client = perdure.App(store_url)
    workflow = claude.module.register(client).workflow()
    claude.reply(tool_calls=[("t2", TOOL + "refund", {"order": "o42"})])
    claude.reply("Refunded.")
    first = worker_process("claude_agent_app:app", store_url, claude.env, log)
    second: subprocess.Popen[bytes] | None = None
    ledger = claude.module.ledger
    try:
        handle = client.start(workflow, "refund o42", run_id="k-43")
        ended = ("completed", "failed", "needs_attention")
        paid = lambda: "refund-paid" in ledger() or handle.status() in ended  # noqa: E731
        wait_for("the refund to pay", paid, log, timeout=120)
        assert "refund-paid" in ledger(), [
            (r.path, r.body.get("messages")) for r in claude.requests
        ]
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        second = worker_process("claude_agent_app:app", store_url, claude.env, log)
        assert handle.result(timeout=120) == "Refunded."
        assert ledger() == ["refund-started", "refund-paid"] and posted(claude) == 2
        probed = [e for e in client.journal("k-43") if e.kind == "step.probed"]
        assert len(probed) == 1 and '"done"' in (probed[0].data or "")
        last = claude.requests[-1].body["messages"][-1]["content"][-1]
        assert last["content"][0]["text"].strip() == "refunded o42"
    finally:
        kill_all(first, second)
        client.close()


def test_the_session_store_keeps_transcripts_in_either_store(store_url: str) -> None:
    """The SDK's SessionStore protocol on SQLite and PostgreSQL: a batch retried adds no
    entry twice (uuid), entries without a uuid are kept as they come, write times only
    grow, summaries are folded, subagent transcripts are listed and deleted with their
    session."""
    app = perdure.App(store_url)
    store = PerdureSessionStore(app)
    key = {"project_key": "p", "session_id": "s1"}
    sub = {**key, "subpath": "subagents/agent-1"}
    user = {"type": "user", "uuid": "u1", "timestamp": "2026-12-07T06:00:00.000Z",
            "sessionId": "s1", "message": {"role": "user", "content": "refund o42"}}  # fmt: skip

    async def scenario() -> list[Any]:
        seen: list[Any] = [await store.load(key)]  # type: ignore[arg-type]
        await store.append(key, [user, {"type": "custom-title", "title": "refunds"}])  # type: ignore[arg-type, list-item]
        first = (await store.list_sessions("p"))[0]["mtime"]
        await store.append(key, [user])  # type: ignore[arg-type, list-item]  # retried batch
        await store.append(sub, [{"type": "assistant", "uuid": "a1"}])  # type: ignore[arg-type]
        seen.append(await store.load(key))  # type: ignore[arg-type]
        listed = await store.list_sessions("p")
        seen.append((listed[0]["mtime"] > first, [s["session_id"] for s in listed]))
        seen.append(
            [s["data"].get("first_prompt") for s in await store.list_session_summaries("p")]
        )
        seen.append(await store.list_subkeys(key))  # type: ignore[arg-type]
        await store.delete(key)  # type: ignore[arg-type]
        seen.append((await store.load(key), await store.load(sub), await store.list_subkeys(key)))  # type: ignore[arg-type]
        return seen

    try:
        missing, entries, listed, prompts, subkeys, gone = app.runtime.sync(scenario(), "store")
    finally:
        app.close()
    assert missing is None
    assert entries == [user, {"type": "custom-title", "title": "refunds"}]
    assert listed == (True, ["s1"])
    assert prompts == ["refund o42"]
    assert subkeys == ["subagents/agent-1"]
    assert gone == (None, None, [])
