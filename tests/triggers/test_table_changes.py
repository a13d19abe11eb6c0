"""Table changes on PostgreSQL: a trigger on the user's table, an outbox, one run per change.

Each test runs against a database of its own on the machine's PostgreSQL (created and
dropped here), with perdure's store in the same database, as a user's app would have it.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import perdure
from perdure.engine.worker import Worker, WorkerOptions
from perdure.errors import ConfigError
from perdure.server.access_sql import Access
from perdure.testing import TestWorker
from perdure.triggers.changes_sql import Outbox
from perdure.triggers.table_changes import TableChange

pytestmark = pytest.mark.postgres


def user_sql(url: str, *statements: str) -> None:
    """The user's own writes, each statement in its own committed transaction."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        for sql in statements:
            conn.execute(sql)


def make_app(url: str, on: list[str] | None = None) -> perdure.App:
    app = perdure.App(url)

    @app.workflow(name="ship")
    def ship(change: dict[str, Any]) -> dict[str, Any]:
        return change

    app.on_table_change("orders", ship, on=on or ["insert", "update", "delete"])
    return app


def inputs(app: perdure.App) -> dict[str, dict[str, Any]]:
    """run id -> the change its run was started with."""
    return {
        r.id: json.loads(r.input)["args"][0] for r in app.list_runs(workflow="ship", limit=100_000)
    }


def take_all(app: perdure.App) -> int:
    """Install the trigger and take every pending change, as a worker's service does."""
    change = app.runtime.triggers.of(TableChange)["orders"]

    async def go() -> int:
        await change.install()
        total = 0
        while n := await change.take():  # type: ignore[attr-defined]
            total += n
        return total

    return app.runtime.sync(go(), "take")  # type: ignore[no-any-return]


def test_each_change_starts_one_run_with_its_rows(database: str) -> None:
    """An insert, an update and a delete start one run each, with key, row and old row;
    taking again starts nothing, and the outbox is empty."""
    app = make_app(database)
    try:
        take_all(app)  # installs the trigger
        user_sql(
            database,
            "INSERT INTO orders (item, qty) VALUES ('tea', 2)",
            "UPDATE orders SET qty = 3 WHERE id = 1",
            "DELETE FROM orders WHERE id = 1",
        )
        assert take_all(app) == 3
        assert take_all(app) == 0
        changes = sorted(inputs(app).values(), key=lambda c: c["id"])
        assert [c["op"] for c in changes] == ["insert", "update", "delete"]
        assert all(c["table"] == "public.orders" and c["key"] == {"id": 1} for c in changes)
        assert changes[0]["row"] == {"id": 1, "item": "tea", "qty": 2}
        assert changes[0]["old"] is None
        assert changes[1]["row"]["qty"] == 3 and changes[1]["old"]["qty"] == 2
        assert changes[2]["row"] is None and changes[2]["old"]["qty"] == 3
        assert set(inputs(app)) == {f"table:orders:{c['id']}" for c in changes}
        origin = [e for e in app.journal(f"table:orders:{changes[0]['id']}")
                  if e.kind == "run.origin"]  # fmt: skip
        assert json.loads(origin[0].data or "{}")["table_change"] == "orders"
        assert app.runtime.sync(Outbox(app.runtime.store).change_counts("orders"), "counts")[0] == 0
        TestWorker(app).run_until_idle()
        assert app.get_run(f"table:orders:{changes[0]['id']}").status == "completed"
    finally:
        app.close()


def test_install_is_idempotent_and_follows_the_declaration(database: str) -> None:
    """A second install changes nothing; a changed `on=` replaces the trigger, so deletes
    stop starting runs."""
    app = make_app(database)
    try:
        store = app.runtime.store
        change = app.runtime.triggers.of(TableChange)["orders"]
        assert app.runtime.sync(change.install(), "install") is True
        assert app.runtime.sync(change.install(), "install") is False
    finally:
        app.close()
    app = make_app(database, on=["insert"])
    try:
        assert take_all(app) == 0
        user_sql(database, "INSERT INTO orders (item, qty) VALUES ('a', 1)",
                 "DELETE FROM orders")  # fmt: skip
        assert take_all(app) == 1
        assert [c["op"] for c in inputs(app).values()] == ["insert"]
        assert store is not app.runtime.store
    finally:
        app.close()


def test_a_rolled_back_change_starts_nothing(database: str) -> None:
    """The outbox row is written in the user's transaction: a rollback takes it away."""
    import psycopg

    app = make_app(database)
    try:
        take_all(app)
        with psycopg.connect(database) as conn:
            conn.execute("INSERT INTO orders (item, qty) VALUES ('gone', 1)")
            conn.rollback()
            conn.execute("INSERT INTO orders (item, qty) VALUES ('kept', 1)")
            conn.commit()
        assert take_all(app) == 1
        (change,) = inputs(app).values()
        assert change["row"]["item"] == "kept"
    finally:
        app.close()


def test_a_missing_table_is_one_line_naming_the_trigger(database: str) -> None:
    """A trigger on a table that does not exist fails in one line naming it; the run
    recorded before is untouched and the worker goes on running runs."""
    app = perdure.App(database)

    @app.workflow(name="noop")
    def noop(change: dict[str, Any]) -> str:
        return "ok"

    change = app.on_table_change("no_such_table", noop)
    try:
        before = app.start(noop, {"x": 1}, run_id="before")
        with pytest.raises(ConfigError) as caught:
            app.runtime.sync(change.install(), "install")
        message = str(caught.value)
        assert "\n" not in message
        assert "'no_such_table'" in message and "table change trigger" in message
        assert app.get_run(before.id).status == "pending"

        async def serve() -> None:
            worker = Worker(app.runtime, WorkerOptions(poll=0.05, gc_every=None))
            task = asyncio.create_task(worker.run())
            while (
                await app.client.get("before")
            ).status != "completed" or change.last_error is None:
                await asyncio.sleep(0.02)  # the run done, and the trigger's install tried
            worker.stop()
            await task

        app.runtime.sync(asyncio.wait_for(serve(), 30), "serve")
        assert app.get_run("before").status == "completed"
        assert change.last_error is not None and "no_such_table" in change.last_error
    finally:
        app.close()


def test_a_table_name_postgresql_cannot_parse_is_one_line(database: str) -> None:
    """A table name that is not SQL is one line naming the trigger, at install and in the
    listing (state error)."""
    app = perdure.App(database)

    @app.workflow(name="noop")
    def noop(change: dict[str, Any]) -> None:
        return None

    bad = app.on_table_change("not a name!", noop, name="bad")
    try:
        with pytest.raises(ConfigError) as caught:
            app.runtime.sync(bad.install(), "install")
        assert str(caught.value).startswith("table change trigger 'bad': ")
        assert "\n" not in str(caught.value)
        (status,) = [t for t in app.triggers() if t.name == "bad"]
        assert status.state == "error" and status.last_error is not None
    finally:
        app.close()


def test_a_change_the_workflow_refuses_is_kept_with_the_reason(database: str) -> None:
    """A change whose input the workflow's check refuses starts no run and is kept,
    counted as refused with its reason; the next change is not held up."""
    app = perdure.App(database)

    @app.workflow(name="wants_int")
    def wants_int(change: int) -> int:
        return change

    app.on_table_change("orders", wants_int, name="orders")
    try:
        take_all(app)
        user_sql(database, "INSERT INTO orders (item, qty) VALUES ('a', 1)")
        assert take_all(app) == 1
        assert take_all(app) == 0
        pending, _, refused, reason = app.runtime.sync(
            Outbox(app.runtime.store).change_counts("orders"), "counts"
        )
        assert (pending, refused) == (0, 1)
        assert reason is not None and "does not fit int" in reason
        assert app.list_runs(workflow="wants_int") == []
        import subprocess
        import sys

        retried = subprocess.run(
            [sys.executable, "-m", "perdure", "--db", database, "triggers", "retry", "orders"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert retried.returncode == 0, retried.stderr
        assert "1 refused change(s) pending again" in retried.stdout
        assert app.runtime.sync(Outbox(app.runtime.store).change_counts("orders"), "counts")[
            :3:2
        ] == (1, 0)
        audit = app.runtime.sync(
            Access(app.runtime.store).audit_log(target="table_change:orders"), "audit"
        )
        assert [a.action for a in audit] == ["table_change.retry"]
    finally:
        app.close()


def test_registration_refuses_bad_input(database: str) -> None:
    """An unknown operation, an unknown workflow or a taken name: one line each."""
    app = make_app(database)
    try:
        with pytest.raises(ConfigError, match="use some of insert, update, delete"):
            app.on_table_change("orders", "ship", on=["upsert"], name="o2")
        with pytest.raises(ConfigError, match="no workflow named 'nope'"):
            app.on_table_change("orders", "nope", name="o3")
        with pytest.raises(ConfigError, match="named 'orders'"):
            app.on_table_change("orders", "ship")
    finally:
        app.close()


def test_sqlite_table_in_the_store_file_starts_runs_too(tmp_path: Path) -> None:
    """On SQLite a table in the store's own file gets SQLite triggers: a committed insert
    and update start one run each, a rolled-back insert none; a table elsewhere is one
    line naming the trigger."""
    import sqlite3

    app = perdure.App(f"sqlite:///{tmp_path}/x.db")

    @app.workflow(name="ship")
    def ship(change: dict[str, Any]) -> dict[str, Any]:
        return change

    change = app.on_table_change("orders", ship, on=["insert", "update"])
    missing = app.on_table_change("elsewhere", ship)
    try:
        app.list_runs(limit=1)  # the store file exists, migrated
        with sqlite3.connect(tmp_path / "x.db") as conn:
            conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT, img BLOB)")
        assert app.runtime.sync(change.install(), "install") is True
        assert app.runtime.sync(change.install(), "install") is False
        conn = sqlite3.connect(tmp_path / "x.db", isolation_level=None)
        conn.execute("BEGIN")
        conn.execute("INSERT INTO orders (item, img) VALUES ('gone', NULL)")
        conn.execute("ROLLBACK")
        conn.execute("INSERT INTO orders (id, item, img) VALUES (7, 'tea', x'00ff')")
        conn.execute("UPDATE orders SET item = 'green tea' WHERE id = 7")
        conn.close()
        assert app.runtime.sync(change.take(), "take") == 2
        changes = sorted(inputs(app).values(), key=lambda c: c["id"])
        assert [c["op"] for c in changes] == ["insert", "update"]
        assert changes[0]["key"] == {"id": 7} and changes[0]["table"] == "main.orders"
        assert changes[0]["row"] == {"id": 7, "item": "tea", "img": "00FF"}
        assert changes[1]["old"]["item"] == "tea" and changes[1]["row"]["item"] == "green tea"
        with pytest.raises(ConfigError, match="no table 'elsewhere'") as caught:
            app.runtime.sync(missing.install(), "install")
        assert "\n" not in str(caught.value) and "'elsewhere'" in str(caught.value)
        states = {t.name: t.state for t in app.triggers()}
        assert states == {"orders": "installed", "elsewhere": "error"}
        TestWorker(app).run_until_idle()
        assert {r.status for r in app.list_runs(workflow="ship")} == {"completed"}
    finally:
        app.close()


def write_orders(url: str, count: int, rollback_every: int = 3) -> set[int]:
    """`count` inserts, each in its own transaction; every `rollback_every`-th is rolled
    back. Returns the ids of the committed orders."""
    import psycopg

    committed: set[int] = set()
    with psycopg.connect(url) as conn:
        for i in range(count):
            row = conn.execute(
                "INSERT INTO orders (item, qty) VALUES (%s, %s) RETURNING id", (f"item-{i}", i)
            ).fetchone()
            assert row is not None
            if i % rollback_every == rollback_every - 1:
                conn.rollback()
            else:
                conn.commit()
                committed.add(int(row[0]))
    return committed


@pytest.mark.slow
def test_exactly_the_committed_changes_start_runs(database: str) -> None:
    """1,000 inserts in 1,000 transactions, a third rolled back, while a worker runs:
    exactly the committed ones started runs, one each, and each run completed."""
    app = make_app(database, on=["insert"])
    try:

        async def scenario() -> set[int]:
            change = app.runtime.triggers.of(TableChange)["orders"]
            await change.install()  # changes from now on count
            worker = Worker(app.runtime, WorkerOptions(poll=0.2, gc_every=None))
            task = asyncio.create_task(worker.run())
            committed = await asyncio.to_thread(write_orders, database, 1000)

            async def settled() -> bool:
                runs = await app.client.list_runs(workflow="ship", limit=10_000)
                return len(runs) >= len(committed) and all(r.status == "completed" for r in runs)

            while not await settled():
                await asyncio.sleep(0.05)
            worker.stop()
            await task
            return committed

        committed = app.runtime.sync(asyncio.wait_for(scenario(), 120), "scenario")
        assert len(committed) == 667
        changes = inputs(app)
        assert len(changes) == len(committed)
        assert sorted(c["key"]["id"] for c in changes.values()) == sorted(committed)
        assert app.runtime.sync(Outbox(app.runtime.store).change_counts("orders"), "counts")[
            :3:2
        ] == (0, 0)
    finally:
        app.close()


@pytest.fixture
def cli_env(database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """PERDURE_DB (the test's database) and PERDURE_APP (an app with every kind of trigger)."""
    import importlib
    import sys

    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    sys.modules.pop("triggers_cli_app", None)
    monkeypatch.setenv("PERDURE_DB", database)
    monkeypatch.setenv("PERDURE_APP", "triggers_cli_app:app")
    monkeypatch.setenv("TRIGGERS_INBOX", str(tmp_path / "inbox"))
    importlib.import_module("triggers_cli_app")
    yield
    module = sys.modules.pop("triggers_cli_app", None)
    if module is not None:
        module.app.close()


def test_perdure_triggers_lists_every_kind_and_installs(cli_env: None) -> None:
    """`perdure triggers` lists a trigger of every kind with state and error (exit 1 while
    one is in error); `install` fails in one line on the missing table, installs the
    other, and the listing then shows it installed with its pending changes."""
    from click.testing import CliRunner

    from perdure.cli.main import cli

    runner = CliRunner()
    before = runner.invoke(cli, ["triggers"])
    assert before.exit_code == 1, before.output
    lines = {line.split()[1]: line for line in before.output.splitlines()[1:]}
    assert set(lines) == {"hourly", "drop", "push", "handle", "orders", "no_table",
                          "orders-queue"}  # fmt: skip
    assert "not installed" in lines["orders"] and "error" in lines["no_table"]
    assert "consuming" in lines["orders-queue"] and "3.0s" in lines["orders-queue"]
    assert "ready" in lines["push"] and "watching" in lines["drop"]

    failed = runner.invoke(cli, ["triggers", "install"])
    assert failed.exit_code == 2
    assert failed.output.count("\n") == 1 and "'no_table'" in failed.output

    import triggers_cli_app

    app = triggers_cli_app.app
    orders = app.runtime.triggers.of(TableChange)["orders"]
    app.runtime.sync(orders.install(), "install")
    user_sql(os.environ["PERDURE_DB"], "INSERT INTO orders (item, qty) VALUES ('x', 1)")
    after = runner.invoke(cli, ["triggers"])
    row = next(line for line in after.output.splitlines() if " orders " in line)
    assert "installed" in row and "not installed" not in row and "(1 pending)" in row
    statuses = {t.name: t for t in app.triggers()}
    assert statuses["orders"].pending == 1 and statuses["orders"].lag is not None
    assert statuses["no_table"].state == "error"
    dropped = runner.invoke(cli, ["triggers", "uninstall", "orders"])
    assert dropped.exit_code == 0 and "dropped" in dropped.output
    assert {t.name: t.state for t in app.triggers()}["orders"] == "not installed"


def test_notify_false_installs_a_trigger_that_does_not_notify(database: str) -> None:
    """With notify=False the trigger still records every change (a worker finds it by
    looking) but sends no NOTIFY; switching it back reinstalls the trigger with one."""
    import psycopg

    def notifies() -> bool:
        with psycopg.connect(database) as conn:
            row = conn.execute(
                "SELECT bool_or(prosrc LIKE '%pg_notify%') FROM pg_proc "
                "WHERE proname LIKE 'table_change_%'"
            ).fetchone()
        return bool(row and row[0])

    app = perdure.App(database)

    @app.workflow(name="ship")
    def ship(change: dict[str, Any]) -> None:
        return None

    quiet = app.on_table_change("orders", ship, notify=False)
    try:
        app.runtime.sync(quiet.install(), "install")
        assert not notifies()
        user_sql(database, "INSERT INTO orders (item, qty) VALUES ('a', 1)")
        assert app.runtime.sync(quiet.take(), "take") == 1
    finally:
        app.close()
    app = make_app(database, on=["insert"])
    try:
        take_all(app)
        assert notifies()
    finally:
        app.close()
