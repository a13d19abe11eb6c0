"""Waiting for SQLite's write lock, on real files: a waiter warns naming the holder, a bounded
operation gives up with nothing written, opening a current store never waits, and a held
lock is reported only while it is really held."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
import socket
import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from perdure.errors import StoreUnavailable
from perdure.store import sqlite, sqlops, waits
from perdure.store.base import Append, Entry, NewRun
from perdure.store.dialect import Db
from perdure.store.lockholder import HolderFile
from perdure.store.sqlite import SQLiteStore
from perdure.store.workers_sql import WorkerRow


def _new(run_id: str) -> NewRun:
    return NewRun(id=run_id, workflow="w", input="{}", code_version="1", now=1.0)


class Held:
    """Store A in a write transaction (one op that blocks) until `release()`."""

    def __init__(self, path: str) -> None:
        self.store = SQLiteStore(path)
        self.store.start()
        self.inside = threading.Event()
        self.go = threading.Event()

        def block(conn: Db) -> None:
            self.inside.set()
            self.go.wait(30)

        self.done = self.store.submit(block, write=True)
        assert self.inside.wait(10)

    def release(self) -> None:
        self.go.set()
        self.done.result(10)
        self.store.stop()


@pytest.fixture
def held(tmp_path: Path) -> Iterator[Held]:
    """A migrated store file whose write lock a first store holds."""
    path = str(tmp_path / "s.db")
    SQLiteStore(path).start()  # migrated, so the holder below is an ordinary write
    lock = Held(path)
    try:
        yield lock
    finally:
        lock.go.set()
        lock.store.stop()


def test_a_waiting_writer_warns_naming_the_holder(
    held: Held, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A second store's write waits; past WARN_AFTER it logs one warning naming this pid,
    and a line when the lock came; the write then lands."""
    monkeypatch.setattr(sqlite, "WARN_AFTER", 0.3)
    waiter = SQLiteStore(held.store.path)
    waiter.start()
    caplog.set_level(logging.WARNING, "perdure.store")
    writing = waiter.submit(lambda c: c.execute("DELETE FROM pauses"), write=True)
    try:
        warned = [r.getMessage() for r in _until(caplog, lambda r: "waiting" in r.getMessage(), 10)]
        assert len(warned) == 1
        assert f"held by pid {os.getpid()} on host" in warned[0] and "write" in warned[0]
        held.release()
        writing.result(10)
        assert any("got the write lock after" in r.getMessage() for r in caplog.records)
    finally:
        waiter.stop()


def test_a_bounded_write_gives_up_and_never_lands(held: Held) -> None:
    """Under a 0.5 s bound a create_run fails naming the holder; once the lock frees, the run
    was not created (the store never began it)."""
    waiter = SQLiteStore(held.store.path)

    async def bounded() -> None:
        await waiter.open()
        with waits.bounded(0.5):
            await waiter.create_run(_new("r-refused"))

    try:
        with pytest.raises(StoreUnavailable) as refused:
            asyncio.run(bounded())
        assert "locked for more than 0.5s" in str(refused.value)
        assert f"pid {os.getpid()}" in str(refused.value)
        assert "nothing was written" in str(refused.value)
        held.release()
        assert asyncio.run(waiter.get_run("r-refused")) is None
        asyncio.run(waiter.create_run(_new("r-later")))  # the store goes on
        assert asyncio.run(waiter.get_run("r-later")) is not None
    finally:
        waiter.stop()


def test_opening_a_current_store_and_reading_never_wait(held: Held) -> None:
    """While another connection holds the write lock, a new store opens (no migration write)
    and answers a read under a 2 s bound."""
    reader = SQLiteStore(held.store.path)

    async def read() -> int:
        with waits.bounded(2.0):
            await reader.open()
            return len(await reader.list_runs())

    try:
        assert asyncio.run(read()) == 0
    finally:
        reader.stop()


def test_a_stall_is_reported_only_while_the_lock_is_held(held: Held) -> None:
    """write_lock_stall names the holder while the lock is held past the bound, and says
    nothing once it is free, even if a record is left behind."""
    line = held.store.write_lock_stall(older_than=0.0)
    assert line is not None and f"pid {os.getpid()}" in line and "PostgreSQL" in line
    assert held.store.write_lock_stall(older_than=3600.0) is None  # not held that long
    held.release()
    assert held.store.write_lock_stall(older_than=0.0) is None
    HolderFile(held.store.path).hold("write")  # a record without the lock
    assert held.store.write_lock_stall(older_than=0.0) is None


def _until(
    caplog: pytest.LogCaptureFixture, match: Callable[[logging.LogRecord], bool], timeout: float
) -> list[logging.LogRecord]:
    """The log records `match` accepts, once there is one (and half a second later)."""
    limit = time.monotonic() + timeout
    while time.monotonic() < limit:
        if any(match(r) for r in caplog.records):
            time.sleep(0.5)  # a second warning would come now if it were going to
            return [r for r in caplog.records if match(r)]
        time.sleep(0.02)
    raise AssertionError(f"no matching log line within {timeout}s")


def test_a_holder_that_left_no_record_is_unknown_but_stopped_workers_are_named(
    tmp_path: Path,
) -> None:
    """A connection of another program holds the lock: a bounded write names nobody ("pid
    unknown") but lists the registered worker whose process is stopped."""
    path = str(tmp_path / "s.db")
    store = SQLiteStore(path)
    store.start()
    child = subprocess.Popen(["sleep", "30"])
    other = sqlite3.connect(path, isolation_level=None)
    try:
        row = WorkerRow("w-frozen", socket.gethostname(), child.pid, 1.0, 1.0, 1, 0)
        asyncio.run(store.worker_beat(row))
        os.kill(child.pid, signal.SIGSTOP)
        os.waitpid(child.pid, os.WUNTRACED)
        other.execute("BEGIN IMMEDIATE")  # another program: no holder record

        async def bounded() -> None:
            with waits.bounded(0.3):
                await store.create_run(_new("r"))

        with pytest.raises(StoreUnavailable) as refused:
            asyncio.run(bounded())
        text = str(refused.value)
        assert "by another process (pid unknown)" in text
        assert f"pid {child.pid} (worker w-frozen) is stopped (SIGSTOP)" in text
        assert store.write_lock_stall(older_than=0.0) is None  # no record: no age to tell
    finally:
        other.close()
        os.kill(child.pid, signal.SIGCONT)
        child.kill()
        child.wait()
        store.stop()


def test_a_transactional_body_in_a_shared_batch_is_named(tmp_path: Path) -> None:
    """A transactional step's body running on the store thread holds the lock; the stall
    line names the step and its run."""
    store = SQLiteStore(str(tmp_path / "s.db"))
    store.start()
    asyncio.run(store.create_run(_new("r-tx")))
    inside, go = threading.Event(), threading.Event()

    def body(conn: object) -> str:
        inside.set()
        go.wait(30)
        return '{"value": 1}'

    entry = Entry(kind="step.outcome", name="charge", position=0, final=True, at=1.0)
    write = Append(run_id="r-tx", epoch=None, entries=[entry])
    with_body = functools.partial(sqlops.append_with_body, append=write, body=body)
    done = store.submit(with_body, write=True)
    try:
        assert inside.wait(10)
        line = store.write_lock_stall(older_than=0.0)
        assert line is not None and "transactional step 'charge' of run r-tx" in line
    finally:
        go.set()
        done.result(10)
        store.stop()
    assert store.write_lock_stall(older_than=0.0) is None


def test_stopping_a_store_that_waits_for_the_lock_does_not_hang(held: Held) -> None:
    """stop() while the store thread waits for a held lock returns once the wait is
    WARN_AFTER old, and the waiting write is told it was not written (a graceful worker
    stop is not held up for ever by a frozen peer)."""
    waiter = SQLiteStore(held.store.path)
    waiter.start()
    writing = waiter.submit(lambda c: c.execute("DELETE FROM pauses"), write=True)
    time.sleep(0.3)  # let it reach the wait
    stopper = threading.Thread(target=waiter.stop)
    stopper.start()
    stopper.join(10)
    assert not stopper.is_alive()
    with pytest.raises(StoreUnavailable, match="stopped while waiting for the write lock"):
        writing.result(1)
