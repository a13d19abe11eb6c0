"""Starting runs and waiting on them: idempotent start, handles, result(timeout), status."""

from __future__ import annotations

import threading
import time

import pytest

import perdure
from perdure.testing import TestClock, TestWorker


def test_start_with_same_run_id_twice_returns_the_same_run(app: perdure.App) -> None:
    """Starting one run id twice gives the same run: one row, the first input kept."""

    @app.workflow
    async def greet(name: str) -> str:
        return f"hi {name}"

    first = app.start(greet, "ana", run_id="x")
    second = app.start(greet, "bob", run_id="x")
    assert first.id == second.id == "x"
    rows = app.list_runs()
    assert [r.id for r in rows] == ["x"]
    assert '"ana"' in rows[0].input and '"bob"' not in rows[0].input


def test_restart_of_a_finished_run_does_not_run_it_again(
    app: perdure.App, worker: TestWorker
) -> None:
    """Starting the id of a completed run returns that run; the workflow is not executed again."""
    calls: list[str] = []

    @app.workflow
    def once(name: str) -> str:
        calls.append(name)
        return name.upper()

    app.start(once, "a", run_id="only")
    worker.run_until_idle()
    again = app.start(once, "a", run_id="only")
    assert worker.run_until_idle() == 0
    assert again.status() == "completed"
    assert again.result(timeout=5) == "A"
    assert calls == ["a"]


def test_same_run_id_for_another_workflow_is_refused(app: perdure.App) -> None:
    """Reusing a run id for a different workflow raises PerdureError naming both workflows."""

    @app.workflow(name="alpha")
    async def alpha() -> None:
        return None

    @app.workflow(name="beta")
    async def beta() -> None:
        return None

    app.start(alpha, run_id="shared")
    with pytest.raises(perdure.PerdureError, match="alpha") as info:
        app.start(beta, run_id="shared")
    assert "beta" in str(info.value)
    assert app.get_run("shared").workflow == "alpha"


def test_generated_run_ids_are_unique(app: perdure.App) -> None:
    """Without run_id each start creates a new run with its own id."""

    @app.workflow
    async def noop() -> None:
        return None

    ids = {app.start(noop).id for _ in range(20)}
    assert len(ids) == 20
    assert len(app.list_runs()) == 20


def test_start_by_name(app: perdure.App, worker: TestWorker) -> None:
    """A workflow may be started by its registered name."""

    @app.workflow(name="adder")
    async def add(a: int, b: int) -> int:
        return a + b

    handle = app.start("adder", 2, b=3)
    worker.run_until_idle()
    assert handle.result(timeout=5) == 5


def test_start_unknown_workflow_is_a_config_error(app: perdure.App) -> None:
    """Starting a workflow name that is not registered raises ConfigError listing known names."""

    @app.workflow(name="known")
    async def known() -> None:
        return None

    with pytest.raises(perdure.ConfigError, match="known"):
        app.start("unknown")
    assert app.list_runs() == []


def test_start_with_wrong_arguments_is_a_config_error(app: perdure.App) -> None:
    """Arguments that do not fit the workflow's signature are refused before any run exists."""

    @app.workflow
    async def one(x: int) -> int:
        return x

    with pytest.raises(perdure.ConfigError):
        app.start(one, 1, 2)
    with pytest.raises(perdure.ConfigError):
        app.start(one, y=1)
    assert app.list_runs() == []


def test_status_follows_the_run(app: perdure.App, clock: TestClock, worker: TestWorker) -> None:
    """handle.status() reports pending, then sleeping, then completed."""

    @app.workflow
    async def nap() -> None:
        await perdure.sleep(10)

    handle = app.start(nap)
    assert handle.status() == "pending"
    worker.run_until_idle()
    assert handle.status() == "sleeping"
    clock.advance(10)
    worker.run_until_idle()
    assert handle.status() == "completed"


def test_result_returns_the_value(app: perdure.App, worker: TestWorker) -> None:
    """handle.result(timeout) returns the workflow's return value once the run is done."""

    @app.workflow
    async def compute(x: int) -> dict[str, int]:
        return {"x": x, "sq": x * x}

    handle = app.start(compute, 9)
    worker.run_until_idle()
    assert handle.result(timeout=5) == {"x": 9, "sq": 81}
    assert app.handle(handle.id).result() == {"x": 9, "sq": 81}


def test_result_times_out_with_wait_timeout(app: perdure.App) -> None:
    """result(timeout) raises WaitTimeout once the timeout passes and the run is not done."""

    @app.workflow
    async def never_run() -> None:
        return None

    handle = app.start(never_run)
    began = time.monotonic()
    with pytest.raises(perdure.WaitTimeout, match=handle.id):
        handle.result(timeout=0.2)
    elapsed = time.monotonic() - began
    assert 0.15 <= elapsed < 2.0
    assert handle.status() == "pending"


def test_result_waits_for_a_worker_in_another_thread(app: perdure.App) -> None:
    """result() blocks until a worker elsewhere finishes the run, then returns its value."""

    @app.workflow
    async def slow() -> str:
        return "finally"

    handle = app.start(slow)
    worker = TestWorker(app)
    timer = threading.Timer(0.2, worker.run_until_idle)
    timer.start()
    try:
        began = time.monotonic()
        assert handle.result(timeout=10) == "finally"
        assert time.monotonic() - began >= 0.15
    finally:
        timer.join()


def test_result_of_failed_run_raises_run_failed(app: perdure.App, worker: TestWorker) -> None:
    """result() of a failed run raises RunFailed with the status and the workflow's error."""

    @app.workflow
    def broken() -> None:
        raise ValueError("bad input 17")

    handle = app.start(broken, run_id="broken-1")
    worker.run_until_idle()
    assert handle.status() == "failed"
    with pytest.raises(perdure.RunFailed) as info:
        handle.result(timeout=5)
    assert info.value.run_id == "broken-1"
    assert info.value.status == "failed"
    assert info.value.error == "bad input 17"


def test_result_of_cancelled_run_raises_run_failed(app: perdure.App, worker: TestWorker) -> None:
    """result() of a cancelled run raises RunFailed with status `cancelled`."""

    @app.workflow
    async def waits() -> None:
        await perdure.wait_event("never")

    handle = app.start(waits)
    worker.run_until_idle()
    app.cancel(handle.id)
    with pytest.raises(perdure.RunFailed) as info:
        handle.result(timeout=5)
    assert info.value.status == "cancelled"


def test_unknown_run_id_raises_run_not_found(app: perdure.App) -> None:
    """Every operation on a run id that names no run raises RunNotFound naming the id."""
    handle = app.handle("ghost")
    for call in (
        handle.status,
        lambda: handle.result(timeout=1),
        lambda: app.get_run("ghost"),
        lambda: app.journal("ghost"),
        lambda: app.cancel("ghost"),
        lambda: app.pause("ghost"),
        lambda: app.resume("ghost"),
    ):
        with pytest.raises(perdure.RunNotFound) as info:
            call()
        assert info.value.run_id == "ghost"
        assert "ghost" in str(info.value)


def test_start_outside_a_workflow_via_workflow_start(app: perdure.App, worker: TestWorker) -> None:
    """`wf.start(x, run_id=...)` outside a workflow starts a top-level run (idempotent too)."""

    @app.workflow
    async def echo(x: str) -> str:
        return x

    handle = echo.start("a", run_id="e1")
    assert isinstance(handle, perdure.RunHandle)
    assert echo.start("b", run_id="e1").id == "e1"
    worker.run_until_idle()
    assert handle.result(timeout=5) == "a"
    assert app.get_run("e1").parent_id is None


def test_ill_typed_input_is_refused_at_start(app: perdure.App) -> None:
    """An argument that does not fit the workflow's annotation is refused before any run exists."""

    @app.workflow
    async def greet(name: str, times: int) -> str:
        return name * times

    with pytest.raises(perdure.PayloadError) as info:
        app.start(greet, "ana", "three", run_id="typed")
    message = str(info.value)
    assert "argument times" in message and "'three'" not in message.split(":")[0]
    assert "\n" not in message
    assert app.list_runs() == []
