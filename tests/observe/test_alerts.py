"""A run that starts waiting for a person is told once, without polling (a callback or a POST
to a URL), and counted by cause in `perdure_runs_waiting_for_person`."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

import perdure
from perdure.engine.observers import ParkEvent
from perdure.observe import alert_on_park
from perdure.observe.metrics import RunsCollector
from perdure.testing import SimulatedCrash, TestClock, TestWorker
from waits import wait_for

LEASE = 30.0


def park_a_once_step(app: perdure.App, clock: TestClock, run_id: str) -> None:
    """A once step cut off by its worker's death: the next worker parks the run."""

    @app.step(effect="once", name="charge")
    def charge(order: str) -> str:
        return f"charged {order}"

    @app.workflow(name="checkout")
    async def checkout(order: str) -> str:
        return str(await charge(order))

    app.start(checkout, "o1", run_id=run_id)
    dying = TestWorker(app, lease=LEASE)
    dying.crash_after_intent("charge")
    with pytest.raises(SimulatedCrash):
        dying.run_until_idle()
    clock.advance(LEASE + 1)
    TestWorker(app, lease=LEASE).run_until_idle()
    assert app.get_run(run_id).status == "needs_attention"


def test_a_callback_is_told_once_when_a_run_parks(app: perdure.App, clock: TestClock) -> None:
    """The callback gets one event: the run, why in one line, and the command that settles
    it; a later pass of a worker tells it nothing more."""
    told: list[ParkEvent] = []
    alert_on_park(told.append)
    park_a_once_step(app, clock, "a1")
    TestWorker(app, lease=LEASE).run_until_idle()
    [event] = told
    assert (event.run_id, event.workflow, event.status) == ("a1", "checkout", "needs_attention")
    assert (event.cause, event.step, event.position) == ("interrupted", "charge", 0)
    assert "between intent and outcome of a once step" in event.reason
    assert event.fix == "perdure resolve a1 0 --value JSON | --retry | --fail"


def test_a_url_receives_the_alert_as_json(
    app: perdure.App, clock: TestClock, receiver: tuple[str, list[dict[str, Any]]]
) -> None:
    """A URL target gets the same event POSTed as JSON, once."""
    url, bodies = receiver
    alert_on_park(url)
    park_a_once_step(app, clock, "a2")
    wait_for("the alert", lambda: bool(bodies), timeout=10)
    [body] = bodies
    assert body["run_id"] == "a2" and body["status"] == "needs_attention"
    assert body["fix"].startswith("perdure resolve a2 0")


def test_an_alert_url_must_be_http() -> None:
    """A target that is no http(s) URL is refused in one line when installed."""
    with pytest.raises(perdure.ConfigError, match="give an http:// or https:// URL"):
        alert_on_park("mailto:ops@example.com")


def test_runs_waiting_for_a_person_are_counted_by_cause(app: perdure.App, clock: TestClock) -> None:
    """perdure_runs_waiting_for_person counts the parked run under its cause, 0 elsewhere,
    and 0 again once it is resolved."""
    park_a_once_step(app, clock, "a3")

    def gauge() -> dict[str, float]:
        registry = CollectorRegistry()
        registry.register(RunsCollector(app.runtime))
        from prometheus_client import generate_latest

        text = generate_latest(registry).decode()
        family = next(
            f
            for f in text_string_to_metric_families(text)
            if f.name == "perdure_runs_waiting_for_person"
        )
        return {s.labels["cause"]: s.value for s in family.samples}

    assert gauge() == {"interrupted": 1, "stopped": 0, "probe": 0, "version": 0, "dead": 0,
                       "parked": 0}  # fmt: skip
    app.resolve("a3", "charge", retry=True)
    TestWorker(app, lease=LEASE).run_until_idle()
    assert app.get_run("a3").status == "completed"
    assert set(gauge().values()) == {0}
