"""Steering a plain workflow: `perdure.steering()` takes the messages `Client.steer` sent,
once, journaled; a run that never asked, or a finished one, is refused."""

from __future__ import annotations

import json

import pytest

import perdure
from crash_steps import crash_after, recover
from perdure.testing import TestClock, TestWorker


def steer(app: perdure.App, run_id: str, text: str) -> int:
    return int(app.runtime.sync(app.client.steer(run_id, text, by="ana"), "steer"))


def test_a_workflow_that_asks_takes_each_message_once_and_replays_it(
    app: perdure.App, worker: TestWorker, clock: TestClock
) -> None:
    """Before its first `steering()` call the run is refused; after, a message waited for
    (`wait_event("steer")`) and one taken by `steering()` each arrive once, and a crash
    after them replays both from the journal."""

    @app.step(name="note", effect="read")
    def note(texts: list[str]) -> str:
        return " ".join(texts)

    @app.workflow
    async def editor() -> list[str]:
        first = await perdure.steering()  # nothing sent yet: it only says the run takes it
        waited = await perdure.wait_event("steer")
        more = await perdure.steering()
        texts = [s.text for s in first] + [waited["text"]] + [f"{s.text}/{s.by}" for s in more]
        await note(texts)
        return texts

    handle = app.start(editor, run_id="ed")
    with pytest.raises(perdure.PerdureError, match="does not take steering"):
        steer(app, "ed", "too early")
    worker.run_until_idle()
    assert app.get_run("ed").waiting_for == "event:steer"
    steer(app, "ed", "shorter")
    steer(app, "ed", "in French")
    recover(app, clock, crash_after(app, "note"))  # replays both messages from the journal
    assert handle.result(timeout=5) == ["shorter", "in French/ana"]
    journal = app.journal("ed")
    [taken] = [e for e in journal if e.kind == "steer.received"]
    assert json.loads(taken.data or "{}")["payload"] == {"text": "in French", "by": "ana"}
    assert app.runtime.sync(app.runtime.store.next_event("ed", "steer"), "events") is None
    with pytest.raises(perdure.PerdureError, match="completed: a finished run cannot be steered"):
        steer(app, "ed", "too late")


def test_a_workflow_that_never_asks_is_refused_and_keeps_nothing(
    app: perdure.App, worker: TestWorker
) -> None:
    """A run whose workflow never called `steering()` is refused in one line, nothing kept."""

    @app.workflow
    async def plain() -> str:
        return str(await perdure.wait_event("go"))

    app.start(plain, run_id="p")
    worker.run_until_idle()
    with pytest.raises(perdure.PerdureError) as refused:
        steer(app, "p", "faster")
    assert "\n" not in str(refused.value) and "perdure.steering()" in str(refused.value)
    assert app.runtime.sync(app.runtime.store.next_event("p", "steer"), "events") is None
    with pytest.raises(perdure.ConfigError, match="non-empty"):
        app.runtime.sync(app.client.steer("p", "  "), "steer")


def test_steering_inside_a_step_is_refused_in_one_line(
    app: perdure.App, worker: TestWorker
) -> None:
    """A step that calls `perdure.steering()` fails saying to call it in the workflow."""

    @app.step(name="peek", effect="read", retry=perdure.Retry(max_attempts=1))
    async def peek() -> str:
        return str(await perdure.steering())

    @app.workflow
    async def wrong() -> str:
        return await peek()

    handle = app.start(wrong, run_id="bad")
    worker.run_until_idle()
    with pytest.raises(perdure.RunFailed, match="call it in the workflow, not inside a step"):
        handle.result(timeout=5)
