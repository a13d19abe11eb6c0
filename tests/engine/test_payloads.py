"""Payloads: typed values round-trip through the journal as JSON; bad values are named."""

from __future__ import annotations

import json
import math
import sqlite3
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

import perdure
from perdure.engine import codec
from perdure.testing import TestClock, TestWorker


class Order(BaseModel):
    id: str
    total: float
    placed: datetime
    tags: list[str] = []


@dataclass
class Point:
    x: int
    y: int


WHEN = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)


def resume(worker: TestWorker, clock: TestClock) -> None:
    """Run until parked, pass the workflow's sleep, run again (so everything is replayed)."""
    worker.run_until_idle()
    clock.advance(3600)
    worker.run_until_idle()


def test_pydantic_step_result_round_trips(
    app: perdure.App, worker: TestWorker, clock: TestClock
) -> None:
    """A step returning a pydantic model gives the same model, typed, live and on replay."""
    seen: list[Any] = []

    @app.step
    def load() -> Order:
        return Order(id="o1", total=9.5, placed=WHEN, tags=["a"])

    @app.workflow
    def wf() -> str:
        order = load()
        seen.append(order)
        perdure.sleep(60)
        return order.id

    handle = app.start(wf)
    resume(worker, clock)
    assert handle.result(timeout=5) == "o1"
    assert len(seen) == 2
    assert all(isinstance(o, Order) for o in seen)
    assert seen[0] == seen[1] == Order(id="o1", total=9.5, placed=WHEN, tags=["a"])


def test_dataclass_and_datetime_step_results_round_trip(
    app: perdure.App, worker: TestWorker, clock: TestClock
) -> None:
    """Dataclasses, datetimes, dates and timedeltas come back as their annotated types on replay."""
    seen: list[tuple[Any, ...]] = []

    @app.step
    def point() -> Point:
        return Point(1, 2)

    @app.step
    def when() -> datetime:
        return WHEN

    @app.step
    def day() -> date:
        return WHEN.date()

    @app.step
    def span() -> timedelta:
        return timedelta(minutes=90)

    @app.workflow
    def wf() -> None:
        seen.append((point(), when(), day(), span()))
        perdure.sleep(60)

    handle = app.start(wf)
    resume(worker, clock)
    assert handle.status() == "completed"
    assert seen[0] == seen[1] == (Point(1, 2), WHEN, WHEN.date(), timedelta(minutes=90))
    assert isinstance(seen[1][0], Point)
    assert seen[1][1].tzinfo is not None


def test_typed_workflow_input_and_result(app: perdure.App, worker: TestWorker) -> None:
    """Workflow parameters and results are rebuilt as their annotated types."""
    seen: list[tuple[type, ...]] = []

    @app.workflow
    def wf(order: Order, where: Point, at: datetime, *, note: str = "") -> Order:
        seen.append((type(order), type(where), type(at)))
        return order.model_copy(update={"tags": [note, f"{where.x},{where.y}", at.isoformat()]})

    order = Order(id="o2", total=1.0, placed=WHEN)
    handle = app.start(wf, order, Point(3, 4), WHEN, note="hi")
    worker.run_until_idle()
    result = handle.result(timeout=5)
    assert seen == [(Order, Point, datetime)]
    assert isinstance(result, Order)
    assert result.tags == ["hi", "3,4", WHEN.isoformat()]


def test_list_of_models_round_trips(app: perdure.App, worker: TestWorker, clock: TestClock) -> None:
    """A step annotated list[Model] replays as a list of model instances."""
    seen: list[list[Point]] = []

    @app.step
    def points() -> list[Point]:
        return [Point(i, -i) for i in range(3)]

    @app.workflow
    def wf() -> int:
        got = points()
        seen.append(got)
        perdure.sleep(60)
        return sum(p.x for p in got)

    handle = app.start(wf)
    resume(worker, clock)
    assert handle.result(timeout=5) == 3
    assert seen[1] == [Point(0, 0), Point(1, -1), Point(2, -2)]


# -- values that are not JSON ------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "path", "what"),
    [
        ({"items": [{"x": 1}, {"x": math.nan}]}, "$.items[1].x", "nan"),
        ({"items": [{"x": 1}, {"x": object()}]}, "$.items[1].x", "object"),
        ({"a": {(1, 2): "tuple key"}}, "$.a", "key"),
        ([math.inf], "$[0]", "inf"),
    ],
)
def test_non_json_step_result_fails_step(
    app: perdure.App, worker: TestWorker, value: Any, path: str, what: str
) -> None:
    """A step returning a non-JSON value fails with a PayloadError naming the step and the path."""
    calls: list[int] = []

    @app.step(name="produce", effect="read")
    def produce() -> Any:
        calls.append(1)
        return value

    @app.workflow
    def wf() -> list[str]:
        try:
            produce()
        except perdure.StepError as exc:
            return [exc.error_type, exc.message]
        return []

    handle = app.start(wf)
    worker.run_until_idle()
    error_type, message = handle.result(timeout=5)
    assert error_type.endswith("PayloadError")
    assert "'produce'" in message
    assert path in message
    assert what in message
    assert calls == [1], "a payload error is not retried"


def test_non_json_workflow_input_refused_at_start(app: perdure.App) -> None:
    """Starting a run with a non-JSON argument raises PayloadError naming the argument's path."""

    @app.workflow(name="takes")
    def takes(data: Any) -> None:
        return None

    with pytest.raises(perdure.PayloadError, match=r"takes.*\$\.args\[0\]\.bad"):
        app.start(takes, {"bad": {1, 2, object()}})
    assert app.list_runs() == []


def test_non_json_workflow_result_fails_run(app: perdure.App, worker: TestWorker) -> None:
    """A workflow returning a non-JSON value ends failed with a PayloadError."""

    @app.workflow(name="returns_junk")
    def returns_junk() -> Any:
        return {"when": object()}

    handle = app.start(returns_junk)
    worker.run_until_idle()
    run = app.get_run(handle.id)
    assert run.status == "failed"
    error = json.loads(run.error or "{}")
    assert error["type"] == "perdure.PayloadError"
    assert "returns_junk" in error["message"] and "$.when" in error["message"]


def test_payload_error_message() -> None:
    """codec.to_json names where the value came from and the path of the first bad value."""
    with pytest.raises(perdure.PayloadError) as info:
        codec.to_json({"ok": [1, 2], "items": [{"x": 1}, {"x": math.nan}]}, "step 's' result")
    assert str(info.value).startswith("step 's' result: ")
    assert "$.items[1].x" in str(info.value)


# -- blobs -------------------------------------------------------------------------------


@pytest.fixture
def small_blobs(db_url: str, clock: TestClock) -> Any:
    """An App whose payloads over 1000 bytes of JSON are stored in the blob table."""
    app = perdure.App(db_url, clock=clock, blob_threshold=1000)
    yield app
    app.close()


def blob_keys(app: perdure.App) -> set[str]:
    with sqlite3.connect(Path(app.url.removeprefix("sqlite:///"))) as conn:
        return {r[0] for r in conn.execute("SELECT key FROM blobs")}


def blob_key(text: str | None) -> str:
    """The key of a blob reference (fails if `text` is an inline value)."""
    value = json.loads(text or "null")
    assert isinstance(value, dict) and list(value) == ["$perdure_blob"], text
    return str(value["$perdure_blob"])


def test_large_step_result_stored_as_blob(small_blobs: perdure.App, clock: TestClock) -> None:
    """A step result over the threshold is journaled as a blob reference and still round-trips."""
    app = small_blobs
    big = "x" * 5000
    seen: list[str] = []

    @app.step(name="big")
    def make_big() -> str:
        return big

    @app.workflow
    def wf() -> int:
        value = make_big()
        seen.append(value)
        perdure.sleep(60)
        return len(value)

    handle = app.start(wf)
    resume(TestWorker(app), clock)
    assert handle.result(timeout=5) == 5000
    assert seen == [big, big]
    outcome = next(e for e in app.journal(handle.id) if e.kind == "step.outcome")
    assert len(outcome.data or "") < 200
    assert blob_key(outcome.data) in blob_keys(app)


def test_large_input_and_result_stored_as_blobs(small_blobs: perdure.App, clock: TestClock) -> None:
    """Workflow input and result over the threshold are stored by reference and round-trip."""
    app = small_blobs

    @app.workflow
    def wf(items: list[Point]) -> list[Point]:
        return [Point(p.y, p.x) for p in items]

    items = [Point(i, i + 1) for i in range(200)]
    handle = app.start(wf, items)
    TestWorker(app).run_until_idle()
    assert handle.result(timeout=5) == [Point(i + 1, i) for i in range(200)]
    run = app.get_run(handle.id)
    assert {blob_key(run.input), blob_key(run.result)} <= blob_keys(app)


def test_large_recorded_error_replays(small_blobs: perdure.App, clock: TestClock) -> None:
    """A step failure whose record is over the threshold is stored by reference and replays."""
    app = small_blobs
    seen: list[str] = []

    @app.step(name="loud")
    def loud() -> None:
        raise ValueError("e" * 3000)

    @app.workflow
    def wf() -> int:
        try:
            loud()
        except perdure.StepError as exc:
            seen.append(exc.message)
        perdure.sleep(60)
        return len(seen[-1])

    handle = app.start(wf)
    resume(TestWorker(app), clock)
    assert handle.result(timeout=5) == 3000
    assert seen == ["e" * 3000] * 2
    outcome = next(e for e in app.journal(handle.id) if e.kind == "step.outcome")
    assert blob_key(outcome.data) in blob_keys(app)


def test_large_transactional_result_stored_as_blob(small_blobs: perdure.App) -> None:
    """A transactional step's large result is stored by reference like any other step's."""
    app = small_blobs

    @app.step(name="record", effect="transactional")
    def record() -> str:
        return "y" * 5000

    @app.workflow
    def wf() -> int:
        return len(record())

    handle = app.start(wf)
    TestWorker(app).run_until_idle()
    assert handle.result(timeout=5) == 5000
    outcome = next(e for e in app.journal(handle.id) if e.kind == "step.outcome")
    assert blob_key(outcome.data) in blob_keys(app)


def test_small_payload_stays_inline(small_blobs: perdure.App, worker: TestWorker) -> None:
    """A payload under the threshold is kept inline in the journal."""
    app = small_blobs

    @app.step(name="small")
    def small() -> str:
        return "tiny"

    @app.workflow
    def wf() -> str:
        return small()

    handle = app.start(wf)
    TestWorker(app).run_until_idle()
    assert handle.result(timeout=5) == "tiny"
    outcome = next(e for e in app.journal(handle.id) if e.kind == "step.outcome")
    assert json.loads(outcome.data or "{}")["value"] == "tiny"
    assert blob_keys(app) == set()


# -- the codec ---------------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=30,
)


@given(json_values)
def test_codec_round_trips_json_values(value: Any) -> None:
    """Any JSON-like value survives to_json, JSON text and from_json unchanged."""
    encoded = codec.to_json(value, "test")
    assert encoded == value
    text = codec.dumps(value, "test")
    assert codec.from_json(json.loads(text), None, "test") == value
    assert codec.from_json(codec.loads(text), Any, "test") == value


@given(st.lists(st.builds(Point, st.integers(), st.integers())))
def test_codec_round_trips_dataclasses(points: list[Point]) -> None:
    """Lists of dataclasses are rebuilt from their JSON with the type hint."""
    text = codec.dumps(points, "test")
    assert codec.from_json(json.loads(text), list[Point], "test") == points


def test_codec_encodes_extra_types() -> None:
    """Tuples, sets, enums, UUIDs and Decimals are encoded as plain JSON."""
    import enum
    import uuid
    from decimal import Decimal

    class Color(enum.Enum):
        RED = "red"

    ident = uuid.UUID(int=1)
    value = {"t": (1, 2), "s": {3, 1, 2}, "c": Color.RED, "u": ident, "d": Decimal("1.5")}
    assert codec.to_json(value, "test") == {
        "t": [1, 2],
        "s": [1, 2, 3],
        "c": "red",
        "u": str(ident),
        "d": "1.5",
    }


def test_codec_refuses_mismatched_journal_value() -> None:
    """Decoding a journal value that does not fit the hint raises PayloadError naming where."""
    with pytest.raises(perdure.PayloadError, match="step 'p'"):
        codec.from_json({"x": "not a number", "y": 1}, Point, "step 'p'")
