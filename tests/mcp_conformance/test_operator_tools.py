"""An MCP client works a parked run to completion through `perdure mcp --operator`: real
processes (`perdure mcp --http`, two `perdure worker`s), the official SDK's client, a worker
killed with SIGKILL inside a `once` step; a read token's resolve is refused and audited."""

from __future__ import annotations

import asyncio
import json
import time
import warnings
from typing import Any

import pytest

from extras_needed import needs

pytest.importorskip("mcp", reason=needs("mcp"))

from mcp import ClientSession
from mcp import types as t
from serving import Store, sdk_session

from perdure import App
from perdure.server.access_sql import Access

APP = "operator_app:app"


async def call(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    """The structured answer of an operator tool that must succeed."""
    result = await session.call_tool(tool, arguments)
    assert not result.isError, result.content
    assert result.structuredContent is not None
    return result.structuredContent


async def parked(session: ClientSession, run_id: str, within: float = 60) -> dict[str, Any]:
    """perdure_stuck until it lists `run_id` (the dead worker's lease runs out first)."""
    deadline = time.monotonic() + within
    while True:
        runs = {r["run_id"]: r for r in (await call(session, "perdure_stuck"))["runs"]}
        if run_id in runs:
            return runs[run_id]
        assert time.monotonic() < deadline, f"{run_id} never listed as stuck"
        await asyncio.sleep(0.2)


@pytest.mark.slow
def test_a_client_works_a_run_parked_by_a_killed_worker_to_completion(store: Store) -> None:
    """The pay step wrote the payment, then its worker got SIGKILL: the next worker parks the
    run (needs_attention, interrupted). A read token sees it but its resolve is refused, in one
    line naming the scope; the operator token explains it, resolves the step with the payment
    the ledger shows, and the task's result is the receipt, paid once; then a fork from the
    receipt step completes without paying again. Every action is audited under the token's
    name, as from the CLI."""
    folder = str(store.folder)
    operator = store.token("operator", ("read", "operate"))
    reader = store.token("reader", ("read",))
    server = store.serve("--operator", worker=False, app=APP)
    dying = store.worker("--lease", "2", "--poll", "0.1", app=APP, HANG="1", OPERATOR_DIR=folder)
    ledger = store.folder / "ledger.txt"

    async def main() -> str:
        async with sdk_session(server.url, operator) as session:
            tools = {tool.name for tool in (await session.list_tools()).tools}
            assert {"charge", "perdure_stuck", "perdure_resolve", "perdure_fork"} <= tools
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                tasks = session.experimental
            run_id = (await tasks.call_tool_as_task("charge", {"order": "o1"})).task.taskId
            deadline = time.monotonic() + 60
            while not (ledger.exists() and ledger.read_text() == "o1\n"):
                assert time.monotonic() < deadline, "the pay step never ran"
                await asyncio.sleep(0.05)
            dying.kill()  # SIGKILL: paid, no outcome journaled
            dying.wait()
            store.worker("--lease", "2", "--poll", "0.1", app=APP, OPERATOR_DIR=folder)
            stuck = await parked(session, run_id)
            assert (stuck["status"], stuck["cause"]) == ("needs_attention", "interrupted")

            async with sdk_session(server.url, reader) as looking:
                assert (await parked(looking, run_id))["run_id"] == run_id
                refused = await looking.call_tool(
                    "perdure_resolve", {"run_id": run_id, "step": 0, "how": "retry"}
                )
                assert refused.isError
                assert refused.content[0].text == (  # type: ignore[union-attr]
                    "perdure_resolve refused: run.resolve needs the 'operate' scope; 'reader' "
                    "has ['read']"
                )

            explained = await call(session, "perdure_explain", run_id=run_id)
            [step] = [s for s in explained["steps"] if s["state"] == "needs_attention"]
            assert (step["name"], step["effect"]) == ("pay", "once")
            await call(session, "perdure_resolve", run_id=run_id, step=step["position"],
                       how="value", value="paid-o1", comment="ledger.txt shows o1")  # fmt: skip
            result = await tasks.get_task_result(run_id, t.CallToolResult)
            assert result.structuredContent == {"result": "receipt for paid-o1"}
            forked = await call(session, "perdure_fork", run_id=run_id, from_step=1)
            deadline = time.monotonic() + 60
            while (await call(session, "perdure_explain", run_id=forked["run_id"]))[
                "status"
            ] != "completed":
                assert time.monotonic() < deadline, "the fork never completed"
                await asyncio.sleep(0.1)
            return run_id

    run_id = asyncio.run(main())
    assert ledger.read_text() == "o1\n"  # paid once, through the kill, the resolve and the fork
    observer = App(store.db)
    try:
        rows = observer.runtime.sync(
            Access(observer.runtime.store).audit_log(target=f"run:{run_id}"), "audit"
        )
    finally:
        observer.close()
    done = {(r.actor, r.action, r.outcome) for r in rows}
    assert {("operator", "run.start", "ok"), ("reader", "run.resolve", "refused"),
            ("operator", "run.resolve", "ok"), ("operator", "run.fork", "ok")} <= done  # fmt: skip
    [resolved] = [r for r in rows if (r.actor, r.action) == ("operator", "run.resolve")]
    assert json.loads(resolved.detail)["comment"] == "ledger.txt shows o1"
