"""The store thread survives a batch that fails unexpectedly: its ops fail, later ones work."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import perdure
from perdure.store import threaded
from perdure.store.base import NewRun
from perdure.store.sqlite import SQLiteStore


def test_an_unexpected_error_fails_the_batch_not_the_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SQLiteStore(str(tmp_path / "s.db"))
    store.start()
    real = threaded.run_batch
    calls: list[int] = []

    def broken_once(db: Any, conn: Any, batch: Any, answers: Any) -> None:
        calls.append(len(batch))
        if len(calls) == 1:
            raise RuntimeError("a bug in the store")
        real(db, conn, batch, answers)

    monkeypatch.setattr(threaded, "run_batch", broken_once)
    monkeypatch.setattr(store, "_direct_connect", lambda: None)  # every call via the thread

    def new(run_id: str) -> NewRun:
        return NewRun(id=run_id, workflow="wf", input="{}", code_version="", now=1.0)

    async def main() -> None:
        with pytest.raises(perdure.StoreError, match=r"internal error \(RuntimeError: a bug"):
            await store.create_run(new("r1"))
        run, created = await store.create_run(new("r2"))  # the thread is still serving
        assert created and run.id == "r2"
        assert await store.get_run("r1") is None

    try:
        asyncio.run(main())
    finally:
        store.stop()
    assert calls == [1, 1, 1]  # the failed create, the next create, the read
