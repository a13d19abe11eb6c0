"""Versioning: runs record their code version; patched() lets old runs keep the old path."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

import perdure
from perdure.testing import TestClock, TestWorker


def test_explicit_code_version_recorded(app: perdure.App, worker: TestWorker) -> None:
    """A run records the version its workflow was registered with."""

    @app.workflow(version="v1")
    def wf() -> None:
        return None

    handle = app.start(wf)
    assert app.get_run(handle.id).code_version == "v1"
    worker.run_until_idle()
    assert app.get_run(handle.id).code_version == "v1"


def test_default_code_version_is_source_hash(app: perdure.App) -> None:
    """Without version=, a workflow's version is a short hash that differs when the code differs."""

    @app.workflow(name="one")
    def one() -> int:
        return 1

    @app.workflow(name="two")
    def two() -> int:
        return 2

    first = app.get_run(app.start(one).id).code_version
    second = app.get_run(app.start(two).id).code_version
    assert len(first) == 12 and int(first, 16) >= 0
    assert first != second


# -- patched() ---------------------------------------------------------------------------


def v1(app: perdure.App, calls: list[str]) -> None:
    """The first release of `ship`: pack, sleep, send."""

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


def v2(app: perdure.App, calls: list[str], where: str) -> None:
    """The second release: an insurance step guarded by patched('insure') at `where`."""

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

    @app.workflow(name="ship", version="v2")
    def ship() -> str:
        box = pack()
        if where == "before_sleep" and perdure.patched("insure"):
            box = insure(box)
        perdure.sleep(60)
        if where == "after_sleep" and perdure.patched("insure"):
            box = insure(box)
        return send(box)


def upgrade(
    db_url: str, clock: TestClock, install: Callable[[perdure.App, list[str]], None]
) -> tuple[perdure.App, str, list[str]]:
    """Start `ship` under v1 and park it on its sleep; then open the store with new code."""
    old = perdure.App(db_url, clock=clock)
    v1(old, [])
    handle = old.start("ship", run_id="ship-1")
    TestWorker(old).run_until_idle()
    assert handle.status() == "sleeping"
    old.close()
    new = perdure.App(db_url, clock=clock)
    calls: list[str] = []
    install(new, calls)
    return new, handle.id, calls


def test_patched_true_for_new_runs(app: perdure.App, worker: TestWorker, clock: TestClock) -> None:
    """A run started under the patched code takes the new path and journals a marker."""
    calls: list[str] = []
    v2(app, calls, "before_sleep")
    handle = app.start("ship")
    worker.run_until_idle()
    clock.advance(61)
    worker.run_until_idle()
    assert handle.result(timeout=5) == "sent insured box"
    assert calls == ["pack", "insure", "send"]
    markers = [e for e in app.journal(handle.id) if e.kind == "patch.marker"]
    assert [(m.name, m.position) for m in markers] == [("insure", 1)]


def test_patched_false_when_replaying_older_journal(db_url: str, clock: TestClock) -> None:
    """A run whose journal predates the patch replays the old path: patched() is False."""
    new, run_id, calls = upgrade(db_url, clock, lambda a, c: v2(a, c, "before_sleep"))
    clock.advance(61)
    TestWorker(new).run_until_idle()
    assert new.handle(run_id).result(timeout=5) == "sent box"
    assert calls == ["send"]
    assert not [e for e in new.journal(run_id) if e.kind == "patch.marker"]
    assert new.get_run(run_id).code_version == "v2", "upgraded (upgrade='auto')"
    upgraded = [json.loads(e.data or "{}") for e in new.journal(run_id) if e.kind == "run.upgraded"]
    assert [(u["from"], u["to"]) for u in upgraded] == [("v1", "v2")]
    new.close()


def test_patched_true_past_the_old_journal(db_url: str, clock: TestClock) -> None:
    """An old run that had not yet reached the patched point takes the new path there."""
    new, run_id, calls = upgrade(db_url, clock, lambda a, c: v2(a, c, "after_sleep"))
    clock.advance(61)
    TestWorker(new).run_until_idle()
    assert new.handle(run_id).result(timeout=5) == "sent insured box"
    assert calls == ["insure", "send"]
    new.close()


def test_patched_decision_replays(app: perdure.App, worker: TestWorker, clock: TestClock) -> None:
    """A run that took the patched path takes it again each time it is replayed."""
    decisions: list[bool] = []

    @app.workflow
    def wf() -> bool:
        decisions.append(perdure.patched("new-path"))
        perdure.sleep(60)
        decisions.append(perdure.patched("later"))
        perdure.sleep(60)
        return True

    handle = app.start(wf)
    for _ in range(3):
        worker.run_until_idle()
        clock.advance(61)
    assert handle.status() == "completed"
    assert decisions == [True] * 5  # first pass 1, then 2 per replay


def test_unguarded_change_fails_loudly(db_url: str, clock: TestClock) -> None:
    """Under upgrade="latest", an old run meeting new code that adds a step without
    patched() fails, not hangs (the default parks it: tests/engine/test_versions.py)."""

    def unguarded(app: perdure.App, calls: list[str]) -> None:
        @app.step(name="pack")
        def pack() -> str:
            return "box"

        @app.step(name="insure")
        def insure(box: str) -> str:
            calls.append("insure")
            return box

        @app.step(name="send")
        def send(box: str) -> str:
            calls.append("send")
            return box

        @app.workflow(name="ship", version="v2", upgrade="latest")
        def ship() -> str:
            box = insure(pack())
            perdure.sleep(60)
            return send(box)

    new, run_id, calls = upgrade(db_url, clock, unguarded)
    clock.advance(61)
    TestWorker(new).run_until_idle()
    run = new.get_run(run_id)
    assert run.status == "failed"
    error = json.loads(run.error or "{}")
    assert error["type"].endswith("NonDeterminismError")
    assert "position 1" in error["message"] and "'insure'" in error["message"]
    assert calls == []
    clock.advance(3600)
    assert TestWorker(new).run_until_idle() == 0, "a failed run is not picked up again"
    new.close()


def test_patched_outside_workflow_raises() -> None:
    """patched() outside a workflow raises a PerdureError saying where it may be called."""
    with pytest.raises(perdure.PerdureError, match="inside a workflow"):
        perdure.patched("x")
