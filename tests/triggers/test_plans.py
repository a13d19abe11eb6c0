"""Plans: ordered batches of runs, checks, failure policies, and surviving a crash."""

from __future__ import annotations

from typing import Any

import pytest

import perdure
from perdure.testing import SimulatedCrash, TestWorker


def _items(app: perdure.App, log: list[str], fail: frozenset[str] = frozenset()) -> Any:
    @app.step(name="do", effect="idempotent", retry=perdure.Retry(max_attempts=1))
    def do(item: str) -> str:
        log.append(item)
        if item in fail:
            raise ValueError(f"{item} broke")
        return item.upper()

    @app.workflow(name="item")
    async def item(name: str) -> str:
        return await do(name)

    return item


def test_batches_run_in_order_each_after_the_previous_finished(
    app: perdure.App, worker: TestWorker
) -> None:
    log: list[str] = []
    item = _items(app, log)
    batches = [
        [(item, ["a1"]), (item, ["a2"])],
        [(item, ["b1"])],
        [{"workflow": "item", "args": ["c1"]}],
    ]
    handle = app.plan("migrate", batches)
    assert handle.id == "plan:migrate"
    worker.run_until_idle()
    report = handle.result(timeout=5)
    assert report["status"] == "completed"
    assert [len(b["runs"]) for b in report["batches"]] == [2, 1, 1]
    assert sorted(log[:2]) == ["a1", "a2"] and log[2:] == ["b1", "c1"]
    runs = {r.id: r for r in app.list_runs(workflow="item")}
    first = max(runs[i].updated_at for i in report["batches"][0]["runs"])
    assert all(runs[i].created_at >= first for i in report["batches"][1]["runs"])
    again = app.plan("migrate", [[(item, ["zz"])]])  # the same plan name: the same run
    assert again.id == handle.id and len(runs) == 4


@pytest.mark.parametrize("policy", ["stop", "continue"])
def test_a_failed_batch_stops_or_continues(
    app: perdure.App, worker: TestWorker, policy: str
) -> None:
    log: list[str] = []
    item = _items(app, log, frozenset({"b2"}))
    handle = app.plan(
        "p", [[(item, ["a1"])], [(item, ["b1"]), (item, ["b2"])], [(item, ["c1"])]],
        on_failure=policy,
    )  # fmt: skip
    worker.run_until_idle()
    if policy == "stop":
        with pytest.raises(perdure.RunFailed, match=r"plan stopped at batch 1 of 3: 1 run\(s\)"):
            handle.result(timeout=5)
        assert "c1" not in log
    else:
        report = handle.result(timeout=5)
        assert report["status"] == "completed_with_failures"
        assert [len(b["failed"]) for b in report["batches"]] == [0, 1, 0]
        assert log[-1] == "c1"


def test_a_check_that_fails_stops_the_plan(app: perdure.App, worker: TestWorker) -> None:
    log: list[str] = []
    item = _items(app, log)
    seen: list[tuple[int, list[Any]]] = []

    @app.workflow(name="check")
    async def check(index: int, results: list[Any]) -> bool:
        seen.append((index, results))
        return index == 0

    handle = app.plan("checked", [[(item, ["a"])], [(item, ["b"])], [(item, ["c"])]], check=check)
    worker.run_until_idle()
    with pytest.raises(perdure.RunFailed, match="check 'check' returned false"):
        handle.result(timeout=5)
    assert seen == [(0, ["A"]), (1, ["B"])] and log == ["a", "b"]


def test_a_plan_survives_its_worker_crashing(app: perdure.App, worker: TestWorker) -> None:
    """The worker dies inside batch 2; a new worker finishes the plan, and batch 1's runs
    are not started again."""
    log: list[str] = []
    item = _items(app, log)

    @app.step(name="risky", effect="once")
    def risky(x: str) -> str:
        log.append(x)
        return x

    @app.workflow(name="fragile")
    async def fragile(x: str) -> str:
        return await risky(x)

    handle = app.plan("survivor", [[(item, ["a1"]), (item, ["a2"])], [(fragile, ["b"])]])
    worker.crash_after_intent("risky")
    with pytest.raises(SimulatedCrash):
        worker.run_until_idle()
    app.clock.advance(worker.lease + 1)  # type: ignore[attr-defined]
    worker.run_until_idle()
    [fragile_run] = app.list_runs(workflow="fragile")
    assert fragile_run.status == "needs_attention"  # a once step cut short is never repeated
    app.resolve(fragile_run.id, "risky", value="b")
    worker.run_until_idle()
    assert handle.result(timeout=5)["status"] == "completed"
    assert sorted(log) == ["a1", "a2"] and len(app.list_runs(workflow="item")) == 2


@pytest.mark.parametrize(
    ("batches", "options", "message"),
    [
        ([], {}, "at least one batch"),
        ([[]], {}, "at least one run"),
        ([[("nope", [])]], {}, "no workflow named 'nope'"),
        ([[("item", [])]], {}, "missing a required argument"),
        ([[("item", ["x"])]], {"on_failure": "shrug"}, "on_failure='shrug'"),
        ([[("item", ["x"])]], {"check": "item"}, "must take"),
    ],
)
def test_a_bad_plan_is_refused_before_anything_starts(
    app: perdure.App, batches: Any, options: dict[str, Any], message: str
) -> None:
    _items(app, [])
    with pytest.raises(perdure.ConfigError, match=message) as info:
        app.plan("bad", batches, **options)
    assert "\n" not in str(info.value) and app.list_runs() == []
