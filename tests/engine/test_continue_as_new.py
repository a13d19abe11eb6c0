"""continue_as_new: a run ends and its successor starts from the top, in one transaction;
handles, results, events, parents, `perdure show` and the API follow the lineage."""

from __future__ import annotations

import logging
import sqlite3
from typing import Any

import pytest
from click.testing import CliRunner

import perdure
from extras_needed import require
from perdure.cli.main import cli
from perdure.engine import continuation
from perdure.engine.client import continued_as, origin_of
from perdure.observe.redact import Redactor
from perdure.testing import TestClock, TestWorker


def lineage(app: perdure.App) -> dict[str, tuple[str, str | None]]:
    """Every run's status and the run it continued as."""
    return {r.id: (r.status, continued_as(r)) for r in app.list_runs(limit=1000)}


def counter_app(app: perdure.App) -> Any:
    @app.step(effect="keyed")
    def add(a: int, b: int) -> int:
        return a + b

    @app.workflow()
    async def counter(total: int, rounds: int) -> int:
        total = await add(total, 1)
        if rounds > 1:
            perdure.continue_as_new(total, rounds - 1)
        return total

    return counter


def test_a_run_continues_as_new_runs_and_its_handle_follows(
    app: perdure.App, worker: TestWorker
) -> None:
    """Each continue ends the run and starts `<root>~N` with the new arguments; the first
    handle's status and result are the lineage's last run's."""
    counter = counter_app(app)
    handle = app.start(counter, 0, 3, run_id="c")
    worker.run_until_idle()
    assert handle.result(timeout=5) == 3
    assert handle.status() == "completed"
    assert handle.latest() == "c~3"
    assert lineage(app) == {
        "c": ("completed", "c~2"),
        "c~2": ("completed", "c~3"),
        "c~3": ("completed", None),
    }
    assert origin_of(app.journal("c~3")) == {"continued": "c~2"}
    [link] = [e for e in app.journal("c") if e.kind == "run.continued"]
    assert link.name == "c~2"
    assert app.get_run("c").result is None  # the value lives at the lineage's end
    assert app.handle("c~2").result(timeout=5) == 3


def test_the_successor_exists_if_and_only_if_the_predecessor_ended(
    app: perdure.App, worker: TestWorker, clock: TestClock, db_url: str
) -> None:
    """A continue whose write is refused (another worker took the lease) leaves no successor
    and the run unfinished; once it lands, both changes are there together."""
    path = db_url.removeprefix("sqlite:///")
    taken: list[int] = []

    @app.step(effect="keyed")
    def steal() -> None:
        if not taken:  # as if another worker claimed the run right now
            taken.append(1)
            with sqlite3.connect(path) as conn:
                conn.execute("UPDATE runs SET lease_epoch = lease_epoch + 1 WHERE id = 'r'")

    @app.workflow()
    async def once_more(n: int) -> int:
        await steal()
        if n == 0:
            perdure.continue_as_new(1)
        return n

    handle = app.start(once_more, 0, run_id="r")
    worker.run_until_idle()
    assert lineage(app) == {"r": ("running", None)}  # refused: not ended, and no successor
    clock.advance(worker.lease + 1)
    worker.run_until_idle()  # taken over after the lease: replayed, and this time it lands
    assert lineage(app) == {"r": ("completed", "r~2"), "r~2": ("completed", None)}
    assert handle.result(timeout=5) == 1
    for run in app.list_runs(limit=100):  # the invariant, checked both ways
        successor = continued_as(run)
        if successor is not None:
            assert origin_of(app.journal(successor)) == {"continued": run.id}
        previous = origin_of(app.journal(run.id)).get("continued")
        if previous is not None:
            assert continued_as(app.get_run(previous)) == run.id


def test_events_reach_the_lineage_and_none_is_lost_at_the_hand_over(
    app: perdure.App, worker: TestWorker
) -> None:
    """Events sent to the first run's id reach the live run; those not consumed when a run
    continues are handed to its successor, in order."""
    seen: list[str] = []

    @app.step(effect="keyed")
    def handle_event(payload: str) -> None:
        seen.append(payload)

    @app.workflow()
    async def agent(handled: int) -> int:
        payload = await perdure.wait_event("msg")
        await handle_event(payload)
        if payload == "stop":
            return handled + 1
        perdure.continue_as_new(handled + 1)

    handle = app.start(agent, 0, run_id="a")
    worker.run_until_idle()
    for text in ("one", "two", "three"):
        handle.send_event("msg", text)  # all queued on run a before it handles any
    worker.run_until_idle()
    assert seen == ["one", "two", "three"]
    assert handle.status() == "waiting" and handle.latest() == "a~4"
    app.send_event("a", "msg", "stop")  # by the root id: reaches a~4
    worker.run_until_idle()
    assert handle.result(timeout=5) == 4
    assert seen == ["one", "two", "three", "stop"]


def test_a_parent_waiting_for_a_child_gets_the_lineage_result(
    app: perdure.App, worker: TestWorker
) -> None:
    """A child that continues as new is followed by its parent to the last run's result."""
    counter = counter_app(app)

    @app.workflow()
    async def parent() -> int:
        return await counter(10, 3) * 2  # type: ignore[no-any-return]

    handle = app.start(parent, run_id="p")
    worker.run_until_idle()
    assert handle.result(timeout=5) == 26
    assert lineage(app)["p.0"] == ("completed", "p.0~2")
    assert app.get_run("p.0~3").parent_id == "p"


def test_current_run_says_what_it_continued_from(app: perdure.App, worker: TestWorker) -> None:
    """The successor's trigger is `continued` and its origin names the predecessor."""
    seen: list[perdure.RunInfo] = []

    @app.workflow()
    async def twice(first: bool) -> None:
        seen.append(perdure.current_run())
        if first:
            perdure.continue_as_new(False)

    app.start(twice, True, run_id="t")
    worker.run_until_idle()
    assert [(i.id, i.trigger, i.origin) for i in seen] == [
        ("t", "client", {}),
        ("t~2", "continued", {"continued": "t"}),
    ]


def test_bad_arguments_fail_before_anything_ends(app: perdure.App, worker: TestWorker) -> None:
    """Arguments that do not fit the workflow are refused at the call: no successor."""

    @app.workflow()
    async def typed(n: int) -> int:
        if n == 0:
            perdure.continue_as_new("not a number", 2)
        return n

    handle = app.start(typed, 0, run_id="b")
    worker.run_until_idle()
    with pytest.raises(perdure.RunFailed, match="continue_as_new"):
        handle.result(timeout=5)
    assert lineage(app) == {"b": ("failed", None)}


def test_continue_as_new_outside_a_workflow_is_a_clear_error() -> None:
    """Called outside a workflow it says so in one line."""
    with pytest.raises(perdure.PerdureError, match="only be called inside a workflow"):
        perdure.continue_as_new(1)


def test_sync_workflows_continue_as_new_too(app: perdure.App, worker: TestWorker) -> None:
    """A `def` workflow (run on a thread) continues the same way."""

    @app.workflow()
    def countdown(n: int) -> str:
        if n > 0:
            perdure.continue_as_new(n - 1)
        return "done"

    handle = app.start(countdown, 2, run_id="s")
    worker.run_until_idle()
    assert handle.result(timeout=5) == "done"
    assert handle.latest() == "s~3"


def test_show_names_the_link(app: perdure.App, worker: TestWorker, db_url: str) -> None:
    """`perdure show` prints both directions of the link, `perdure explain` the next run."""
    counter = counter_app(app)
    app.start(counter, 0, 3, run_id="c")
    worker.run_until_idle()
    shown = CliRunner().invoke(cli, ["--db", db_url, "show", "c~2"])
    assert shown.exit_code == 0, shown.output
    assert "continued from c  (continue_as_new)" in shown.output
    assert "continued as   c~3" in shown.output
    assert "run.continued" in shown.output
    explained = CliRunner().invoke(cli, ["--db", db_url, "explain", "c"])
    assert "continued as   c~2" in explained.output


def test_the_api_names_the_link(app: perdure.App, worker: TestWorker) -> None:
    """The API's run JSON has continued_as: the next run's id, or None for the last."""
    require("server")
    from perdure.server.api import run_summary

    counter = counter_app(app)
    app.start(counter, 0, 3, run_id="c")
    worker.run_until_idle()
    assert run_summary(app.get_run("c"), Redactor(), app.clock.now(), {})["continued_as"] == "c~2"
    assert run_summary(app.get_run("c~3"), Redactor(), app.clock.now(), {})["continued_as"] is None


def test_a_long_journal_logs_one_warning_naming_continue_as_new(
    app: perdure.App,
    worker: TestWorker,
    clock: TestClock,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past the size (10,000 entries by default; 20 here) the run is told, once."""
    monkeypatch.setattr(continuation, "HISTORY_WARNING", 20)

    @app.step(effect="keyed")
    def tick(i: int) -> int:
        return i

    @app.workflow()
    async def loop(rounds: int) -> None:
        for _ in range(rounds):
            for i in range(15):
                await tick(i)
            await perdure.sleep(10)

    app.start(loop, 3, run_id="long")
    caplog.set_level(logging.WARNING, "perdure.worker")
    for _ in range(4):
        worker.run_until_idle()
        clock.advance(11)
    warned = [r.getMessage() for r in caplog.records if "continue_as_new" in r.getMessage()]
    assert len(warned) == 1
    assert "run long has" in warned[0] and "perdure.continue_as_new(" in warned[0]


def test_continue_as_new_inside_a_step_is_refused(app: perdure.App, worker: TestWorker) -> None:
    """Only the workflow may end its run: from a step it is a one-line error, not an end."""

    @app.step(effect="read", retry=perdure.Retry(max_attempts=1))
    def sneaky() -> None:
        perdure.continue_as_new()

    @app.workflow()
    async def wf() -> None:
        await sneaky()

    handle = app.start(wf, run_id="x")
    worker.run_until_idle()
    with pytest.raises(perdure.RunFailed, match="call it in the workflow, not inside a step"):
        handle.result(timeout=5)
    assert lineage(app) == {"x": ("failed", None)}
