"""A run's own identity (`perdure.current_run()`), run lookups by id, and an App whose store
is chosen after its workflows are defined."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

import perdure
from perdure.testing import SimulatedCrash, TestClock, TestWorker


def info_dict(info: perdure.RunInfo) -> dict[str, Any]:
    return {
        "id": info.id,
        "workflow": info.workflow,
        "parent_id": info.parent_id,
        "trigger": info.trigger,
        "origin": info.origin,
        "recoveries": info.recoveries,
    }


def test_a_client_started_run_knows_its_id_and_workflow(
    app: perdure.App, worker: TestWorker
) -> None:
    @app.workflow(name="who")
    def who() -> dict[str, Any]:
        return info_dict(perdure.current_run())

    handle = app.start(who, run_id="r-1")
    worker.run_until_idle()
    assert handle.result(timeout=5) == {
        "id": "r-1",
        "workflow": "who",
        "parent_id": None,
        "trigger": "client",
        "origin": {},
        "recoveries": 0,
    }


def test_current_run_outside_a_run_is_a_clear_error() -> None:
    with pytest.raises(perdure.PerdureError, match=r"current_run\(\) can only be called inside"):
        perdure.current_run()


def test_child_event_fork_and_plan_runs_name_what_started_them(
    app: perdure.App, worker: TestWorker
) -> None:
    seen: dict[str, dict[str, Any]] = {}

    @app.workflow(name="child")
    def child(tag: str) -> str:
        seen[tag] = info_dict(perdure.current_run())
        return tag

    @app.workflow(name="parent")
    def parent() -> str:
        return str(child("from-parent"))

    @app.workflow(name="on_paid")
    def on_paid(payload: dict[str, Any]) -> None:
        seen["event"] = info_dict(perdure.current_run())

    app.on_event("invoice.paid")(on_paid)
    app.start(parent, run_id="p")
    app.emit("invoice.paid", {"n": 1}, event_id="evt_7")
    app.plan("nightly", [[(child, ("from-plan",))]])
    worker.run_until_idle()

    assert seen["from-parent"]["trigger"] == "parent"
    assert seen["from-parent"]["parent_id"] == "p"
    assert seen["from-parent"]["origin"] == {"parent": "p", "position": 0}
    assert seen["event"]["trigger"] == "event"
    assert seen["event"]["origin"] == {"event": "on_paid", "type": "invoice.paid", "id": "evt_7"}
    assert seen["from-plan"]["trigger"] == "parent"  # a plan's batch runs are its children
    assert seen["from-plan"]["parent_id"] == "plan:nightly"
    plan_origin = [e for e in app.journal("plan:nightly") if e.kind == "run.origin"]
    assert [json.loads(e.data or "") for e in plan_origin] == [{"plan": "nightly"}]

    forked = app.fork("p", 0, new_id="p2")
    worker.run_until_idle()
    assert forked.result(timeout=5) == "from-parent"
    origins = [json.loads(e.data or "") for e in app.journal("p2") if e.kind == "run.origin"]
    assert origins == [{"fork": "p", "from_step": 0}]


def test_recoveries_are_journaled_so_replay_sees_the_first_count(
    app: perdure.App, clock: TestClock
) -> None:
    """The count is recorded when first read: a run that read 0 (committed with the next
    step's outcome), then crashed, still sees 0 at that position on replay, while a read
    made after the recovery sees 1."""
    calls: list[str] = []

    @app.step(name="commit_point", effect="idempotent", commit=True)
    def commit_point() -> None: ...

    @app.step(name="effect", effect="idempotent")
    def effect() -> None:
        calls.append("effect")
        if len(calls) == 1:
            raise SimulatedCrash("killed mid-step")

    @app.workflow(name="counts")
    def counts() -> list[int]:
        before = perdure.current_run().recoveries
        commit_point()
        effect()
        after = perdure.current_run().recoveries
        return [before, after]

    handle = app.start(counts)
    dead = TestWorker(app)
    with pytest.raises(SimulatedCrash):
        dead.run_until_idle()
    clock.advance(dead.lease + 1)
    TestWorker(app).run_until_idle()
    assert handle.result(timeout=5) == [0, 1]
    assert app.get_run(handle.id).recoveries == 1


def test_list_runs_by_ids_and_bulk_statuses(app: perdure.App, worker: TestWorker) -> None:
    @app.workflow(name="wait")
    async def wait() -> Any:
        return await perdure.wait_event("go")

    @app.workflow(name="done")
    def done() -> int:
        return 1

    app.start(wait, run_id="a")
    app.start(done, run_id="b")
    app.start(done, run_id="c")
    worker.run_until_idle()

    rows = app.list_runs(ids=["c", "a", "missing"])
    assert sorted(r.id for r in rows) == ["a", "c"]
    assert [r.id for r in app.list_runs(ids=["a", "b", "c"], statuses=["completed"])] == [
        r.id for r in app.list_runs(statuses=["completed"]) if r.id in {"b", "c"}
    ]
    assert app.statuses(["b", "a", "nope"]) == {"b": "completed", "a": "waiting", "nope": None}
    with pytest.raises(perdure.ConfigError, match="list of run ids"):
        app.list_runs(ids="abc")


def test_many_ids_are_looked_up_in_chunks(app: perdure.App) -> None:
    """More ids than one SQL statement takes (SQLite's parameter limit) still work."""

    @app.workflow(name="noop")
    def noop() -> None: ...

    for i in range(3):
        app.start(noop, run_id=f"n{i}")
    ids = [f"n{i}" for i in range(3)] + [f"x{i}" for i in range(40_000)]
    statuses = app.statuses(ids)
    assert len(statuses) == len(ids)
    assert [statuses[f"n{i}"] for i in range(3)] == ["pending"] * 3
    assert statuses["x39999"] is None


def test_an_app_built_without_a_store_opens_the_url_given_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One module's workflows serve whichever store is chosen when the app is first used:
    `PERDURE_DB` read at first use, or `open(url)`; moving a store in use is refused."""
    monkeypatch.delenv("PERDURE_DB", raising=False)
    app = perdure.App()

    @app.workflow(name="hello")
    def hello() -> str:
        return "hi"

    first = f"sqlite:///{tmp_path}/one.db"
    monkeypatch.setenv("PERDURE_DB", first)  # set after the App was built
    try:
        handle = app.start(hello)
        TestWorker(app).run_until_idle()
        assert handle.result(timeout=5) == "hi"
        assert app.url == first
        assert (tmp_path / "one.db").exists()
        with pytest.raises(perdure.ConfigError, match="already uses the store"):
            app.open(f"sqlite:///{tmp_path}/two.db")
    finally:
        app.close()

    other = perdure.App()
    other.workflow(name="hello")(hello.definition.fn)
    try:
        other.open(f"sqlite:///{tmp_path}/two.db")
        other.start("hello", run_id="t")
        TestWorker(other).run_until_idle()
        assert other.get_run("t").status == "completed"
        assert (tmp_path / "two.db").exists()
    finally:
        other.close()


def test_an_explicit_bad_url_is_still_refused_at_once() -> None:
    with pytest.raises(perdure.ConfigError, match="unknown scheme"):
        perdure.App("nosuch://x")


def test_the_async_client_starts_waits_and_lists_in_the_callers_loop(
    app: perdure.App, worker: TestWorker
) -> None:
    """`perdure.Client` is the public async client: its coroutines run in the caller's
    event loop, take a Workflow or its name, and see what the App sees."""

    @app.workflow(name="double")
    def double(x: int) -> int:
        return 2 * x

    client = perdure.Client(app)

    async def start() -> list[str]:
        a = await client.start(double, (21,), run_id="d1")
        b = await client.start("double", (1,), run_id="d2")
        return [a.id, b.id]

    assert asyncio.run(start()) == ["d1", "d2"]
    worker.run_until_idle()

    async def inspect() -> tuple[Any, dict[str, str | None], list[str]]:
        result = await client.result("d1", timeout=5)
        statuses = await client.statuses(["d1", "d2", "d3"])
        rows = await client.list_runs(ids=["d2"])
        return result, statuses, [r.id for r in rows]

    assert asyncio.run(inspect()) == (
        42,
        {"d1": "completed", "d2": "completed", "d3": None},
        ["d2"],
    )


def test_a_child_start_with_run_options_is_refused_not_dropped(
    app: perdure.App, worker: TestWorker
) -> None:
    """`deadline=`, `queue=`, `priority=` belong to a top-level start; a child run would
    silently lose them, so asking for them inside a workflow fails the run clearly."""

    @app.workflow(name="leaf")
    def leaf() -> int:
        return 1

    @app.workflow(name="root")
    async def root() -> Any:
        return await leaf.start(priority=5)

    handle = app.start(root)
    worker.run_until_idle()
    with pytest.raises(perdure.RunFailed, match="takes run_id= only"):
        handle.result(timeout=5)
