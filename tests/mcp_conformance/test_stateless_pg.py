"""Stateless for real: two `perdure mcp --http` processes on one PostgreSQL store, no affinity.
A task made through A is read, answered, cancelled and fetched through B, in both revisions;
A is killed with SIGKILL mid-task and B answers everything."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from extras_needed import needs

pytest.importorskip("mcp", reason=needs("mcp"))

from legacy import Session
from serving import Raw, Store, postgres_store


@pytest.fixture
def pg(tmp_path: Path) -> Iterator[Store]:
    with postgres_store(tmp_path) as made:
        yield made


@pytest.mark.slow
def test_a_task_made_through_a_is_answered_by_b_after_a_is_killed(pg: Store) -> None:
    a = pg.serve(worker=False)
    b = pg.serve()  # only B runs workflows: A holds nothing when it dies
    token = pg.token("client")
    via_a, via_b = Raw(a.url, token), Raw(b.url, token)
    asked = via_a.call("tools/call", {"name": "ask", "arguments": {}})["taskId"]
    held = via_a.call("tools/call", {"name": "hold", "arguments": {}})["taskId"]
    napping = via_a.call("tools/call", {"name": "nap", "arguments": {"x": 5, "pause": 1}})["taskId"]
    legacy = Session(a.url, token).call("tools/call", {"name": "hold", "arguments": {}, "task": {}})
    legacy_id = legacy["result"]["task"]["taskId"]
    waiting = via_b.until(asked, lambda t: t["status"] == "input_required")
    a.proc.send_signal(signal.SIGKILL)  # mid-task: every task still runs or waits
    a.proc.wait()
    [key] = waiting["inputRequests"]
    via_b.call("tasks/update", {"taskId": asked, "inputResponses": {
        key: {"action": "accept", "content": {"answer": "teal"}}}})  # fmt: skip
    done = via_b.until(asked, lambda t: t["status"] == "completed")
    assert done["result"]["structuredContent"] == {"result": "teal"}
    via_b.call("tasks/cancel", {"taskId": held})
    assert via_b.until(held, lambda t: t["status"] == "cancelled")["taskId"] == held
    napped = via_b.until(napping, lambda t: t["status"] == "completed")
    assert napped["result"]["structuredContent"] == {"result": 10}
    session = Session(b.url, token)  # a 2025-11-25 client, reconnected to B
    got = session.call("tasks/get", {"taskId": legacy_id})["result"]
    assert got["status"] == "working"
    listed = session.call("tasks/list")["result"]["tasks"]
    assert {t["taskId"] for t in listed} == {asked, held, napping, legacy_id}
    cancelled = session.call("tasks/cancel", {"taskId": legacy_id})["result"]
    assert cancelled["status"] == "cancelled"
    result = session.call("tasks/result", {"taskId": legacy_id})["result"]
    assert result["isError"] is True and result["structuredContent"]["status"] == "cancelled"
    other = Raw(b.url, pg.token("other"))  # another token, on B too: none of them exists
    assert other.error("tasks/get", {"taskId": asked})["message"] == f"Task not found: {asked}"
