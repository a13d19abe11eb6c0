"""Deploys that never strand or break a parked run (issue 36): a claimed run of another
version is checked against the code first, then upgraded, left for a worker of its version,
or parked with the diverging position; builds; routing by version; `versions_report`."""

from __future__ import annotations

import asyncio
import json
import os
import socket

import pytest

import perdure
from perdure.engine.versions import record_build, versions_report
from perdure.store.names import BadName
from perdure.store.versions_sql import Routed, Routing
from perdure.store.workers_sql import WorkerRow
from perdure.testing import TestClock, TestWorker


def ship_v1(app: perdure.App, calls: list[str]) -> None:
    """Release 1 of `ship`: pack, sleep, send."""

    @app.step(name="pack")
    def pack() -> str:
        calls.append("pack")
        return "box"

    @app.step(name="send")
    def send(box: str) -> str:
        calls.append("send")
        return f"sent {box}"

    @app.workflow(name="ship", version="v1")
    def ship() -> str:
        box = pack()
        perdure.sleep(60)
        return send(box)


def ship_v2(app: perdure.App, calls: list[str], upgrade: str = "auto") -> None:
    """Release 2, incompatible: an unguarded `insure` step before the sleep."""

    @app.step(name="pack")
    def pack() -> str:
        calls.append("pack")
        return "box"

    @app.step(name="insure")
    def insure(box: str) -> str:
        calls.append("insure")
        return f"insured {box}"

    @app.step(name="send")
    def send(box: str) -> str:
        calls.append("send")
        return f"sent {box}"

    @app.workflow(name="ship", version="v2", upgrade=upgrade)
    def ship() -> str:
        box = insure(pack())
        perdure.sleep(60)
        return send(box)


def ship_v3(app: perdure.App, calls: list[str]) -> None:
    """Release 3, compatible: the insure step guarded by patched()."""

    @app.step(name="pack")
    def pack() -> str:
        calls.append("pack")
        return "box"

    @app.step(name="insure")
    def insure(box: str) -> str:
        calls.append("insure")
        return f"insured {box}"

    @app.step(name="send")
    def send(box: str) -> str:
        calls.append("send")
        return f"sent {box}"

    @app.workflow(name="ship", version="v3")
    def ship() -> str:
        box = pack()
        if perdure.patched("insure"):
            box = insure(box)
        perdure.sleep(60)
        return send(box)


def parked_under_v1(db_url: str, clock: TestClock, n: int = 1) -> list[str]:
    """Start `n` ship runs under v1 and park them on their sleep."""
    old = perdure.App(db_url, clock=clock)
    ship_v1(old, [])
    ids = [old.start("ship", run_id=f"ship-{i}").id for i in range(n)]
    TestWorker(old).run_until_idle()
    assert {old.get_run(i).status for i in ids} == {"sleeping"}
    old.close()
    return ids


def live_worker(app: perdure.App, worker_id: str, build: str, versions: dict[str, str]) -> None:
    """Record a live worker holding `versions` (its presence record, as a worker writes it)."""
    now = app.clock.now()
    store = app.runtime.store
    row = WorkerRow(worker_id, socket.gethostname(), os.getpid(), now, now, 4, 0)

    async def record() -> None:
        await app.runtime.open_store()
        await store.worker_beat(row)
        _, other = await record_build(store, worker_id, build, versions, now, now - 30)
        assert other is None

    app.runtime.sync(record(), "test")


def test_incompatible_run_waits_with_the_diverging_position(db_url: str, clock: TestClock) -> None:
    """No worker of v1 alive: new incompatible code parks the run as needs_attention saying
    where the code changed and what to do; it executes nothing and never fails the run."""
    (run_id,) = parked_under_v1(db_url, clock)
    new = perdure.App(db_url, clock=clock)
    calls: list[str] = []
    ship_v2(new, calls)
    clock.advance(61)
    TestWorker(new).run_until_idle()
    run = new.get_run(run_id)
    assert run.status == "needs_attention"
    message = json.loads(run.error or "{}")["message"]
    assert message == (
        "code changed at position 1: expected sleep 'sleep', found step 'insure'; deploy a "
        "worker of version v1, add patched(...), or fork"
    )
    assert calls == []
    waits = [e for e in new.journal(run_id) if e.kind == "run.version_wait"]
    assert len(waits) == 1 and json.loads(waits[0].data or "{}")["position"] == 1
    assert TestWorker(new).run_until_idle() == 0, "the same code does not check it again"
    ((stuck, why),) = new.runtime.sync(new.client.stuck(), "stuck")
    assert stuck.id == run_id and why == f"waits for its code version for 0s: {message}"
    new.close()
    # a worker of v1 comes back: it takes the parked run up and finishes it
    old = perdure.App(db_url, clock=clock)
    old_calls: list[str] = []
    ship_v1(old, old_calls)
    TestWorker(old).run_until_idle()
    assert old.get_run(run_id).status == "completed"
    assert old.handle(run_id).result(timeout=5) == "sent box"
    assert old_calls == ["send"]
    old.close()


def test_compatible_run_upgrades_and_goes_on(db_url: str, clock: TestClock) -> None:
    """Code that replays the journal cleanly (a patched() branch) upgrades the run: a
    `run.upgraded` entry names both versions, the run records the new one and finishes."""
    (run_id,) = parked_under_v1(db_url, clock)
    new = perdure.App(db_url, clock=clock)
    calls: list[str] = []
    ship_v3(new, calls)
    clock.advance(61)
    TestWorker(new).run_until_idle()
    assert new.handle(run_id).result(timeout=5) == "sent box"
    assert calls == ["send"]
    upgraded = [json.loads(e.data or "{}") for e in new.journal(run_id) if e.kind == "run.upgraded"]
    assert [(u["from"], u["to"]) for u in upgraded] == [("v1", "v3")]
    assert new.get_run(run_id).code_version == "v3"
    new.close()


def test_left_for_a_live_worker_of_its_version(db_url: str, clock: TestClock) -> None:
    """With a live worker holding v1, incompatible v2 code hands the run back (pending, not
    parked), does not claim it again, and a v1 worker finishes it."""
    (run_id,) = parked_under_v1(db_url, clock)
    new = perdure.App(db_url, clock=clock)
    calls: list[str] = []
    ship_v2(new, calls)
    clock.advance(61)
    live_worker(new, "old-1", "build-a", {"ship": "v1"})
    assert TestWorker(new).run_until_idle() == 1
    run = new.get_run(run_id)
    assert run.status == "pending" and run.code_version == "v1"
    assert [e.kind for e in new.journal(run_id)][-1] == "run.left"
    assert TestWorker(new).run_until_idle() == 0, "left for v1: not claimed again"
    assert calls == []
    old = perdure.App(db_url, clock=clock)
    ship_v1(old, [])
    TestWorker(old).run_until_idle()
    assert old.handle(run_id).result(timeout=5) == "sent box"
    old.close()
    new.close()


def test_pinned_runs_are_never_upgraded(db_url: str, clock: TestClock) -> None:
    """upgrade="pinned": even compatible code does not take a run of another version while a
    worker of it lives, and without one the run waits saying it is pinned."""
    (run_id,) = parked_under_v1(db_url, clock)
    new = perdure.App(db_url, clock=clock)

    @new.workflow(name="ship", version="v9", upgrade="pinned")
    def ship() -> str:  # the same steps: it would replay cleanly
        perdure.sleep(60)
        return "x"

    clock.advance(61)
    live_worker(new, "old-1", "build-a", {"ship": "v1"})
    assert TestWorker(new).run_until_idle() == 0, "a live v1 worker holds it"
    clock.advance(3600)  # that worker is silent now
    TestWorker(new).run_until_idle()
    run = new.get_run(run_id)
    assert run.status == "needs_attention" and run.code_version == "v1"
    assert "pinned to version v1" in json.loads(run.error or "{}")["message"]
    new.close()


def test_latest_policy_is_checked_nowhere(db_url: str, clock: TestClock) -> None:
    """upgrade="latest" keeps the old behaviour: no check, the divergence fails the run."""
    (run_id,) = parked_under_v1(db_url, clock)
    new = perdure.App(db_url, clock=clock)
    ship_v2(new, [], upgrade="latest")
    clock.advance(61)
    TestWorker(new).run_until_idle()
    assert new.get_run(run_id).status == "failed"
    new.close()


def test_a_newer_live_version_checks_runs_first(db_url: str, clock: TestClock) -> None:
    """The claim leaves a run of the claimer's own (older) version to a live worker of a
    newer version until that one checked it; then the older claims it (the store's routing)."""
    (run_id,) = parked_under_v1(db_url, clock)
    app = perdure.App(db_url, clock=clock)
    ship_v1(app, [])
    clock.advance(61)
    live_worker(app, "old-1", "build-a", {"ship": "v1"})
    clock.advance(5)
    live_worker(app, "new-1", "build-b", {"ship": "v2"})
    store, now = app.runtime.store, clock.now()
    old_since = {"ship": now - 5}

    async def claim() -> int:
        routing = Routing({"ship": Routed("v1", old_since["ship"])}, now - 30)
        claims = await store.claim("old-1", now, 30.0, 10, ["ship"], routing=routing)
        return len(claims)

    assert app.runtime.sync(claim(), "test") == 0, "new-1 (v2) has not checked it yet"
    # new-1 checked it: incompatible, left for v1
    from perdure.store.base import Append

    app.runtime.sync(store.append(Append(run_id, None, fields={"version_checked": "v2"})), "test")
    assert app.runtime.sync(claim(), "test") == 1
    app.close()


def test_versions_report_counts_serving_and_outlook(db_url: str, clock: TestClock) -> None:
    """versions_report: unfinished runs by workflow and version, the live workers of each,
    what this checkout would do (upgrade or wait at a position), and drained builds."""
    parked_under_v1(db_url, clock, n=3)
    app = perdure.App(db_url, clock=clock)
    ship_v2(app, [])
    live_worker(app, "old-1", "build-a", {"ship": "v1"})
    report = app.runtime.sync(versions_report(app.runtime), "test")
    (line,) = report.lines
    assert (line.workflow, line.version, line.runs, line.statuses) == (
        "ship", "v1", 3, {"sleeping": 3},
    )  # fmt: skip
    assert line.workers == ["old-1"] and line.builds == ["build-a"] and not line.current
    assert report.outlook is not None and report.outlook.upgrade == 0
    assert sorted(d.run_id for d in report.outlook.wait) == ["ship-0", "ship-1", "ship-2"]
    assert {d.position for d in report.outlook.wait} == {1}
    (build,) = report.builds
    assert (build.build, build.holds, build.drained) == ("build-a", 3, False)
    app.close()
    later = perdure.App(db_url, clock=clock)
    ship_v3(later, [])
    clock.advance(61)
    TestWorker(later).run_until_idle()  # all three upgrade to v3 and finish
    report = later.runtime.sync(versions_report(later.runtime), "test")
    assert report.lines == [] and [(b.build, b.drained) for b in report.builds] == [
        ("build-a", True)
    ]
    later.close()


def test_bad_build_name_is_one_line(app: perdure.App) -> None:
    """A build name breaking the id rule is refused in one line, before anything runs."""
    with pytest.raises(BadName, match="build name 'bad\\\\x0aname' has U\\+000A") as caught:
        app.worker(build="bad\nname")
    assert "\n" not in str(caught.value)


def test_one_build_with_other_code_is_refused(db_url: str, clock: TestClock) -> None:
    """A worker whose build name a live worker runs with other code refuses to start in one
    line and claims nothing: the run stays for the right code."""
    (run_id,) = parked_under_v1(db_url, clock)
    app = perdure.App(db_url)  # the real clock: the worker really runs
    calls: list[str] = []
    ship_v2(app, calls)
    live_worker(app, "old-1", "build-a", {"ship": "v1"})

    async def start() -> None:
        await app.worker(build="build-a", poll=0.01).run()

    with pytest.raises(perdure.PerdureError) as caught:
        app.runtime.sync(asyncio.wait_for(start(), 30), "test")
    assert str(caught.value) == (
        "build 'build-a' is run by live worker old-1 with other code: give this code another "
        "--build, or deploy the same code to both"
    )
    assert calls == [] and app.get_run(run_id).status == "sleeping"
    app.close()


def test_a_later_compatible_deploy_takes_up_a_waiting_run(db_url: str, clock: TestClock) -> None:
    """A run parked by incompatible v2 is taken up by v3 (the fix: patched()), which has not
    checked it yet: upgraded from v1 to v3 and finished, its wait's error cleared."""
    (run_id,) = parked_under_v1(db_url, clock)
    broken = perdure.App(db_url, clock=clock)
    ship_v2(broken, [])
    clock.advance(61)
    TestWorker(broken).run_until_idle()
    assert broken.get_run(run_id).status == "needs_attention"
    broken.close()
    fixed = perdure.App(db_url, clock=clock)
    calls: list[str] = []
    ship_v3(fixed, calls)
    assert TestWorker(fixed).run_until_idle() == 1
    run = fixed.get_run(run_id)
    assert (run.status, run.code_version, run.error) == ("completed", "v3", None)
    assert calls == ["send"]
    upgraded = [json.loads(e.data or "{}") for e in fixed.journal(run_id)
                if e.kind == "run.upgraded"]  # fmt: skip
    assert [(u["from"], u["to"]) for u in upgraded] == [("v1", "v3")]
    fixed.close()
