"""Graceful stop with real signals: no new step after SIGTERM/SIGINT, runs handed back at a step
boundary, and a once step cut off by the end of the grace is journaled as stopped, not crashed.

Each test starts `perdure worker` processes on the stop_app shop, signals one with os.kill at
a chosen moment (told by the steps' ledger, written from inside the step bodies), lets a
second worker finish the run and then reads the journal, the run's status and the ledger.
Workers run with a 30 s lease: a run that goes on at once elsewhere was released.
"""

from __future__ import annotations

import json
import signal
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from shop import PG_URL, Shop

from perdure.cli.main import cli
from perdure.store.base import COMPLETED, NEEDS_ATTENTION
from waits import wait_for

# SIGINT in the fast runs, SIGTERM too in the slow ones: both mean the same
SIGNALS = [
    pytest.param(signal.SIGINT, id="INT"),
    pytest.param(signal.SIGTERM, id="TERM", marks=pytest.mark.slow),
]


def _drop_schema(schema: str) -> None:
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True, connect_timeout=10) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture(
    params=["sqlite", pytest.param("postgres", marks=[pytest.mark.postgres, pytest.mark.slow])]
)
def shop(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Shop]:
    """The shop on a fresh store of each kind; every worker process is killed at the end."""
    schema = f"gstop_{uuid.uuid4().hex[:10]}"
    url = (
        f"sqlite:///{tmp_path}/shop.db"
        if request.param == "sqlite"
        else f"{PG_URL}?schema={schema}"
    )
    made = Shop(url, tmp_path)
    try:
        yield made
    finally:
        made.reap()
        if request.param == "postgres":
            _drop_schema(schema)


def kinds(shop: Shop, run_id: str) -> list[tuple[str, str]]:
    return [(e.kind, e.name) for e in shop.journal(run_id)]


def assert_no_attention(shop: Shop, run_id: str) -> None:
    """Nothing parked and no body cut off. A stop that lands while a once step's intent is
    being committed is journaled `step.stopped` with `executing: false` (its body never
    started; recovery simply runs it): that one is a boundary too."""
    cut = [
        (e.kind, e.name)
        for e in shop.journal(run_id)
        if e.kind == "step.needs_attention"
        or (e.kind == "step.stopped" and json.loads(e.data or "{}").get("executing") is not False)
    ]
    assert not cut


def once_starts(shop: Shop, step: str = "charge") -> Counter[int]:
    """How many times each position of a once step started its body, in any process."""
    return Counter(e["pos"] for e in shop.started(step))


@pytest.mark.parametrize("sig", SIGNALS)
def test_the_reviewed_case_hands_back_after_the_idempotent_step(shop: Shop, sig: int) -> None:
    """`--grace 3`, risky(2, 2), a signal 0.7 s in: the once step never starts in the stopping
    worker, which exits when the idempotent step ends; the next worker finishes the run."""
    first = shop.spawn(grace=3)
    first.wait_ready()
    run_id = shop.app.start("risky", 2.0, 2.0).id
    shop.wait_started("prepare")
    time.sleep(0.7)
    first.signal(sig)
    code, took = first.wait()
    assert code == 0
    assert took < 2.5  # the end of the step (1.3 s later), not the grace (3 s), ended it
    assert shop.started("charge", first.pid) == []
    assert [e["phase"] for e in shop.ledger() if e["pid"] == first.pid] == ["start", "end"]
    assert "waiting up to 3s for 1 run(s)" in first.stderr()
    assert "handed back" in first.stderr() and "lost" not in first.stderr()
    began = time.monotonic()
    assert shop.settle(run_id) == COMPLETED
    assert time.monotonic() - began < 15  # released, not left to its 30 s lease
    assert once_starts(shop) == {1: 1}
    assert len(shop.started("prepare")) == 1  # its outcome was committed before the hand-back
    assert_no_attention(shop, run_id)


def test_a_signal_before_the_first_step_starts_nothing(shop: Shop) -> None:
    """A signal while the run sleeps in process before its first step: the stopping worker
    starts no step at all and hands the run back when the sleep ends."""
    first = shop.spawn(grace=5)
    first.wait_ready()
    run_id = shop.app.start("risky", 0.2, 0.2, 0.8).id
    wait_for("the run to be claimed", lambda: shop.app.get_run(run_id).lease_owner, timeout=10)
    first.signal(signal.SIGINT)
    code, took = first.wait()
    assert code == 0 and took < 2.0
    assert [e for e in shop.ledger() if e["pid"] == first.pid] == []
    assert shop.settle(run_id) == COMPLETED
    assert once_starts(shop) == {2: 1}  # the sleep took position 0
    assert_no_attention(shop, run_id)


@pytest.mark.parametrize("workflow", ["risky", pytest.param("risky_async", marks=pytest.mark.slow)])
def test_a_once_step_cut_off_by_the_grace_is_stopped_not_crashed(shop: Shop, workflow: str) -> None:
    """Grace 0.5 s, a 3 s once step: the worker exits when the grace ends (not when the step
    would), the journal says `step.stopped`, and recovery and `perdure explain` say stopped."""
    first = shop.spawn(grace=0.5)
    first.wait_ready()
    run_id = shop.app.start(workflow, 0.1, 3.0).id
    shop.wait_started("charge")
    time.sleep(0.2)
    first.signal(signal.SIGINT)
    code, took = first.wait()
    assert code == 0 and took < 2.0
    assert "grace of 0.5s ended: 1 step(s) executing left to recovery" in first.stderr()
    stopped = [e for e in shop.journal(run_id) if e.kind == "step.stopped"]
    assert len(stopped) == 1 and json.loads(stopped[0].data or "{}")["executing"] is True
    assert shop.settle(run_id) == NEEDS_ATTENTION
    (stuck,) = [e for e in shop.journal(run_id) if e.kind == "step.needs_attention"]
    reason = json.loads(stuck.data or "{}")["reason"]
    assert reason.startswith("stopped while executing a once step")
    assert "grace of 0.5s ended" in reason and "crashed" not in reason
    shown = CliRunner().invoke(cli, ["--db", shop.url, "explain", run_id])
    assert shown.exit_code == 0, shown.output
    assert "stopped while executing a once step" in shown.output
    assert "crashed" not in shown.output
    assert once_starts(shop) == {1: 1}  # never re-run


@pytest.mark.parametrize("sig", SIGNALS)
def test_a_second_signal_stops_now(shop: Shop, sig: int) -> None:
    """A second signal during a once step with a long grace: the worker says so, exits at
    once, and recovery names the second signal."""
    first = shop.spawn(grace=30)
    first.wait_ready()
    run_id = shop.app.start("risky", 0.1, 4.0).id
    shop.wait_started("charge")
    time.sleep(0.2)
    first.signal(signal.SIGINT)
    time.sleep(0.3)
    first.signal(sig)
    code, took = first.wait()
    assert code == 0 and took < 2.5
    assert "second signal: stopping now, 1 step(s) executing left to recovery" in first.stderr()
    assert shop.settle(run_id) == NEEDS_ATTENTION
    (stuck,) = [e for e in shop.journal(run_id) if e.kind == "step.needs_attention"]
    assert "second signal" in json.loads(stuck.data or "{}")["reason"]
    assert once_starts(shop) == {1: 1}


@pytest.mark.slow
def test_a_once_step_that_ends_within_the_grace_is_kept_and_the_next_is_not_started(
    shop: Shop,
) -> None:
    """A signal during a once step that ends within the grace: its outcome is committed, the
    following step never starts there, and the next worker finishes without re-running it."""
    first = shop.spawn(grace=5)
    first.wait_ready()
    run_id = shop.app.start("risky", 0.1, 1.0).id
    shop.wait_started("charge")
    time.sleep(0.3)
    first.signal(signal.SIGTERM)
    code, took = first.wait()
    assert code == 0 and took < 2.5
    assert [e["phase"] for e in shop.ledger() if e["step"] == "charge"] == ["start", "end"]
    assert shop.started("receipt", first.pid) == []
    assert shop.settle(run_id) == COMPLETED
    assert once_starts(shop) == {1: 1}
    assert_no_attention(shop, run_id)


@pytest.mark.slow
def test_the_idempotent_step_cut_off_by_the_grace_reruns_elsewhere(shop: Shop) -> None:
    """Grace 0.3 s during a 3 s idempotent step: it is abandoned (journaled as stopped), the
    run released, and the next worker re-runs it and goes on: nobody's problem."""
    first = shop.spawn(grace=0.3)
    first.wait_ready()
    run_id = shop.app.start("risky", 3.0, 0.1).id
    shop.wait_started("prepare")
    time.sleep(0.2)
    first.signal(signal.SIGINT)
    code, took = first.wait()
    assert code == 0 and took < 2.0
    began = time.monotonic()
    assert shop.settle(run_id) == COMPLETED
    assert time.monotonic() - began < 15  # released, not left to its 30 s lease
    assert len(shop.started("prepare")) == 2
    assert once_starts(shop) == {1: 1}
    assert ("step.stopped", "prepare") in kinds(shop, run_id)
    assert not [k for k in kinds(shop, run_id) if k[0] == "step.needs_attention"]


@pytest.mark.slow
def test_signals_at_step_boundaries_never_run_a_once_step_twice(shop: Shop) -> None:
    """Thirty 50 ms once steps, stopped twice at arbitrary moments by two workers in turn:
    every step runs exactly once, each worker stops well within its grace, nothing parks."""
    run_id = shop.app.start("ticks", 30, 0.05).id
    for delay in (0.33, 0.41):
        proc = shop.spawn(grace=5)
        proc.wait_ready()
        before = len(shop.started("tick"))
        shop.wait_started("tick", before + 1)
        time.sleep(delay)
        proc.signal(signal.SIGINT)
        code, took = proc.wait()
        assert code == 0 and took < 3.0  # the grace is 5 s: the next boundary ended it
        assert shop.status(run_id) != COMPLETED  # it was handed back, not run to the end
    assert shop.settle(run_id) == COMPLETED
    starts = once_starts(shop, "tick")
    assert sorted(starts) == list(range(30)) and set(starts.values()) == {1}
    assert_no_attention(shop, run_id)
