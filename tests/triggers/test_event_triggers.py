"""Event triggers: a type starts a workflow once per event id; events reach waiting runs."""

from __future__ import annotations

from typing import Any

import pytest

import perdure
from perdure.testing import TestWorker


def test_an_event_starts_one_run_however_often_it_arrives(
    app: perdure.App, worker: TestWorker
) -> None:
    seen: list[dict[str, Any]] = []

    @app.on_event("invoice.paid")
    @app.workflow(name="thank")
    async def thank(event: dict[str, Any]) -> str:
        seen.append(event)
        return str(event["invoice"])

    first = app.emit("invoice.paid", {"invoice": "A-1"}, event_id="evt_1")
    again = app.emit("invoice.paid", {"invoice": "A-1"}, event_id="evt_1")
    other = app.emit("invoice.paid", {"invoice": "A-2"}, event_id="evt_2")
    worker.run_until_idle()
    assert first == again == ["event:thank:evt_1"] and other == ["event:thank:evt_2"]
    assert sorted(e["invoice"] for e in seen) == ["A-1", "A-2"]
    assert len(app.list_runs(workflow="thank")) == 2
    assert app.handle("event:thank:evt_1").result(timeout=5) == "A-1"


def test_one_event_type_can_start_several_workflows(app: perdure.App, worker: TestWorker) -> None:
    @app.on_event("user.signed_up", name="welcome")
    @app.workflow(name="welcome_mail")
    async def welcome(event: dict[str, str]) -> str:
        return "mail " + event["user"]

    @app.on_event("user.signed_up")
    @app.workflow(name="crm")
    async def crm(event: dict[str, str]) -> str:
        return "crm " + event["user"]

    ids = app.emit("user.signed_up", {"user": "ana"}, event_id="u1")
    worker.run_until_idle()
    assert sorted(ids) == ["event:crm:u1", "event:welcome:u1"]
    assert app.handle("event:welcome:u1").result(timeout=5) == "mail ana"


def test_an_event_for_a_waiting_run_is_delivered_once(app: perdure.App, worker: TestWorker) -> None:
    @app.workflow(name="approval")
    async def approval() -> list[Any]:
        first = await perdure.wait_event("decision")
        second = await perdure.wait_event("decision", timeout=60)
        return [first, second]

    handle = app.start(approval, run_id="a1")
    worker.run_until_idle()
    assert app.emit("decision", "yes", event_id="d1", run_id="a1") == ["a1"]
    app.emit("decision", "yes", event_id="d1", run_id="a1")  # redelivered: ignored
    worker.run_until_idle()
    assert handle.status() == "waiting"  # the duplicate did not satisfy the second wait
    app.emit("decision", "and yes", event_id="d2", run_id="a1")
    worker.run_until_idle()
    assert handle.result(timeout=5) == ["yes", "and yes"]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda a: a.emit("nobody.listens", {}, event_id="e1"), "no trigger listens"),
        (lambda a: a.emit("t", {}, event_id="has space"), "event id 'has space'"),
        (lambda a: a.emit("t", {}, event_id=""), "event id '': missing"),
        (lambda a: a.on_event("t")(a.workflow(name="none")(lambda: None)), "one argument"),
    ],
)
def test_bad_events_are_refused_in_one_line(app: perdure.App, call: Any, message: str) -> None:
    with pytest.raises(perdure.ConfigError, match=message) as info:
        call(app)
    assert "\n" not in str(info.value)
    assert app.list_runs() == []
