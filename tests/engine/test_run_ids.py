"""The id rule where the engine makes runs: App.start, child runs and forks refuse a bad id
with one line and create nothing; a bad child id fails its parent, not the worker."""

from __future__ import annotations

import json

import pytest

import perdure
from perdure.store.names import BadName
from perdure.testing import TestWorker


def test_start_refuses_a_bad_id_before_any_work(app: perdure.App) -> None:
    """App.start with ESC, a newline or U+202E in the id raises BadName; no run exists."""

    @app.workflow
    def noop() -> None:
        return None

    for bad in ("a\x1b[31m", "two\nlines", "x\u202eevil"):
        with pytest.raises(BadName, match=r"^run id .* has U\+"):
            app.start(noop, run_id=bad)
    assert app.list_runs() == []
    assert app.start(noop, run_id="ok:é/@ 1").id == "ok:é/@ 1"


def test_a_child_with_a_bad_id_fails_the_parent_with_the_rule_s_line(
    app: perdure.App, worker: TestWorker
) -> None:
    """`child.start(run_id=...)` with a refused id raises into the workflow: the parent fails
    (one line naming U+202E), the worker goes on, and no child run is made."""

    @app.workflow
    def child() -> str:
        return "child"

    @app.workflow
    async def parent() -> str:
        handle = await child.start(run_id="kid\u202e")
        return handle.id

    handle = app.start(parent, run_id="p")
    worker.run_until_idle()
    with pytest.raises(perdure.RunFailed):
        handle.result(timeout=5)
    row = app.get_run("p")
    error = json.loads(row.error or "{}")
    assert row.status == "failed" and error["type"].endswith("BadName")
    assert "U+202E (a format character)" in error["message"]
    assert [r.id for r in app.list_runs()] == ["p"]


def test_fork_refuses_a_bad_new_id(app: perdure.App, worker: TestWorker) -> None:
    """App.fork with a new id the rule refuses raises BadName; the original is alone."""

    @app.workflow
    def noop() -> None:
        return None

    app.start(noop, run_id="orig")
    worker.run_until_idle()
    with pytest.raises(BadName, match=r"^run id 'f\\x07'"):
        app.fork("orig", 0, new_id="f\x07")
    assert [r.id for r in app.list_runs()] == ["orig"]
