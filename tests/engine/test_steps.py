"""Steps and workflows, sync and async in every combination, inside and outside a run."""

from __future__ import annotations

import asyncio
import json

import pytest

import perdure
import perdure.engine.context
import perdure.engine.steps
from perdure.testing import TestWorker


def finish(worker: TestWorker, handle: perdure.RunHandle) -> object:
    """Run everything runnable, then return the run's result."""
    worker.run_until_idle()
    return handle.result(timeout=5)


def test_sync_workflow_sync_step(app: perdure.App, worker: TestWorker) -> None:
    """A sync workflow calling a sync step gets the step's return value."""

    @app.step
    def double(x: int) -> int:
        return x * 2

    @app.workflow
    def wf(x: int) -> int:
        return double(x) + 1

    assert finish(worker, app.start(wf, 20)) == 41


def test_async_workflow_async_step(app: perdure.App, worker: TestWorker) -> None:
    """An async workflow awaits an async step and gets its value."""

    @app.step
    async def double(x: int) -> int:
        await asyncio.sleep(0)
        return x * 2

    @app.workflow
    async def wf(x: int) -> int:
        return await double(x) + 1

    assert finish(worker, app.start(wf, 5)) == 11


def test_async_workflow_sync_step(app: perdure.App, worker: TestWorker) -> None:
    """A sync step awaited from an async workflow runs (off the event loop) and returns."""
    import threading

    seen: list[str] = []

    @app.step
    def where() -> str:
        seen.append(threading.current_thread().name)
        return "ok"

    @app.workflow
    async def wf() -> str:
        return await where()

    assert finish(worker, app.start(wf)) == "ok"
    assert seen[0].startswith("perdure-step"), "a sync step must not block the event loop"


def test_sync_workflow_async_step(app: perdure.App, worker: TestWorker) -> None:
    """An async step called from a sync workflow returns its value directly, not a coroutine."""

    @app.step
    async def greet(name: str) -> str:
        await asyncio.sleep(0)
        return f"hi {name}"

    @app.workflow
    def wf(name: str) -> str:
        value = greet(name)
        assert isinstance(value, str)
        return value

    assert finish(worker, app.start(wf, "ada")) == "hi ada"


def test_workflow_keyword_arguments(app: perdure.App, worker: TestWorker) -> None:
    """Keyword arguments given to start reach the workflow."""

    @app.workflow
    def wf(a: int, *, b: int = 0) -> list[int]:
        return [a, b]

    assert finish(worker, app.start(wf, 1, b=2)) == [1, 2]


def test_step_outside_workflow_is_plain_call(app: perdure.App) -> None:
    """Calling a step outside a workflow just calls the function and journals nothing."""
    calls: list[int] = []

    @app.step
    def add(x: int, y: int) -> int:
        calls.append(x)
        return x + y

    assert add(2, 3) == 5
    assert calls == [2]
    assert app.list_runs() == []


def test_async_step_outside_workflow_is_plain_coroutine(app: perdure.App) -> None:
    """An async step called outside a workflow returns the function's own coroutine."""

    @app.step
    async def add(x: int, y: int) -> int:
        return x + y

    assert asyncio.run(add(2, 3)) == 5


def test_step_keeps_function_metadata(app: perdure.App) -> None:
    """A registered step keeps the wrapped function's name and docstring."""

    @app.step
    def fetch_page(url: str) -> str:
        """Fetch one page."""
        return url

    assert fetch_page.__name__ == "fetch_page"
    assert fetch_page.__doc__ == "Fetch one page."
    assert fetch_page.name.endswith("fetch_page")


def test_steps_journaled_in_call_order(app: perdure.App, worker: TestWorker) -> None:
    """Each step call takes the next journal position, named after the step."""

    @app.step(name="first")
    def first() -> int:
        return 1

    @app.step(name="second")
    def second() -> int:
        return 2

    @app.workflow
    def wf() -> int:
        return first() + second() + first()

    handle = app.start(wf)
    assert finish(worker, handle) == 4
    outcomes = [e for e in app.journal(handle.id) if e.kind == "step.outcome"]
    assert [(e.position, e.name) for e in outcomes] == [(0, "first"), (1, "second"), (2, "first")]
    assert [json.loads(e.data or "null")["value"] for e in outcomes] == [1, 2, 1]


def test_gathered_async_steps(app: perdure.App, worker: TestWorker) -> None:
    """Async steps run concurrently with asyncio.gather each get their own journal outcome."""

    @app.step
    async def square(x: int) -> int:
        await asyncio.sleep(0.01)
        return x * x

    @app.workflow
    async def wf(n: int) -> list[int]:
        return list(await asyncio.gather(*(square(i) for i in range(n))))

    handle = app.start(wf, 5)
    assert finish(worker, handle) == [0, 1, 4, 9, 16]
    outcomes = [e for e in app.journal(handle.id) if e.kind == "step.outcome"]
    assert sorted(e.position for e in outcomes if e.position is not None) == [0, 1, 2, 3, 4]


def test_step_failure_fails_run(app: perdure.App, worker: TestWorker) -> None:
    """An uncaught step error fails the run, and result() raises RunFailed naming the step."""

    @app.step(name="explode")
    def explode() -> None:
        raise ValueError("boom")

    @app.workflow
    def wf() -> None:
        explode()

    handle = app.start(wf)
    worker.run_until_idle()
    assert handle.status() == "failed"
    with pytest.raises(perdure.RunFailed) as info:
        handle.result(timeout=5)
    assert "explode" in str(info.value)
    assert "boom" in str(info.value)


def test_current_step_inside_step(app: perdure.App, worker: TestWorker) -> None:
    """perdure.current_step() gives the running step's run id, name, position and attempt."""
    seen: list[perdure.StepInfo] = []

    @app.step(name="noop")
    def noop() -> None:
        return None

    @app.step(name="inspect")
    def inspect_me() -> None:
        seen.append(perdure.current_step())

    @app.workflow
    def wf() -> None:
        noop()
        inspect_me()

    handle = app.start(wf)
    finish(worker, handle)
    (info,) = seen
    assert (info.run_id, info.name, info.position, info.attempt) == (handle.id, "inspect", 1, 1)
    assert info.idempotency_key == f"{handle.id}:1"


def test_current_step_outside_step_raises() -> None:
    """perdure.current_step() outside a running step raises a PerdureError."""
    with pytest.raises(perdure.PerdureError, match="inside a running step"):
        perdure.current_step()


def test_idempotent_start_returns_same_run(app: perdure.App, worker: TestWorker) -> None:
    """Starting the same run id twice returns the existing run, which runs once."""
    calls: list[int] = []

    @app.step
    def work(x: int) -> int:
        calls.append(x)
        return x

    @app.workflow
    def wf(x: int) -> int:
        return work(x)

    first = app.start(wf, 1, run_id="order-1")
    second = app.start(wf, 1, run_id="order-1")
    assert first.id == second.id == "order-1"
    assert finish(worker, second) == 1
    assert calls == [1]
    assert len(app.list_runs()) == 1


def test_duplicate_step_name_rejected(app: perdure.App) -> None:
    """Two different functions registered under one step name raise ConfigError."""

    @app.step(name="dup")
    def one() -> None:
        return None

    with pytest.raises(perdure.ConfigError, match="dup"):

        @app.step(name="dup")
        def two() -> None:
            return None


def test_unknown_effect_rejected(app: perdure.App) -> None:
    """An effect that is not one of the five raises ConfigError naming the step."""
    with pytest.raises(perdure.ConfigError, match="sometimes"):

        @app.step(name="odd", effect="sometimes")  # type: ignore[call-overload]
        def odd() -> None:
            return None


def test_start_unknown_workflow_rejected(app: perdure.App) -> None:
    """Starting a workflow name that is not registered raises ConfigError."""
    with pytest.raises(perdure.ConfigError, match="nope"):
        app.start("nope")


def test_start_with_wrong_arguments_rejected(app: perdure.App) -> None:
    """Arguments that do not fit the workflow's signature are refused at start."""

    @app.workflow
    def wf(a: int) -> int:
        return a

    with pytest.raises(perdure.ConfigError):
        app.start(wf, 1, 2)


def test_commit_true_commits_a_rerunnable_outcome_before_the_next_step(
    app: perdure.App, worker: TestWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A keyed step's outcome may wait in the buffer (recovery could re-run it); with
    commit=True it is in the store before the next step runs (a billed call is never
    bought twice). The linger that commits any buffered outcome soon is off here: the
    guarantee must not depend on it."""
    monkeypatch.setattr(perdure.engine.steps, "LINGER", 3600.0)
    monkeypatch.setattr(perdure.engine.context, "LINGER", 3600.0)
    seen: list[list[str]] = []

    @app.step(name="pay", effect="keyed", commit=True)
    def pay() -> int:
        return 1

    @app.step(name="cheap", effect="keyed")
    def cheap() -> int:
        return 2

    @app.step(name="look", effect="read")
    def look() -> None:
        run_id = perdure.current_step().run_id
        seen.append([e.name for e in app.journal(run_id) if e.kind == "step.outcome"])

    @app.workflow(name="buying")
    async def buying() -> int:
        total = await pay()
        await look()
        total += await cheap()
        await look()
        return total

    handle = app.start(buying)
    worker.run_until_idle()
    assert handle.result(timeout=5) == 3
    assert "pay" in seen[0]
    assert "cheap" not in seen[1]  # a plain keyed outcome is not forced to disk first
