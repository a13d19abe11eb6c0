"""A run's stream: what its steps (and its workflow) write while they run — model tokens, tool
calls, "12 of 40 files done" — for people and programs to watch live, across crashes.

`perdure.stream.write(data, topic="out")` buffers the chunk; the run's writer commits its
chunks in groups (`FLUSH_EVERY` seconds or `FLUSH_AT` chunks), as store writes of their
own: never one commit per chunk, never ahead of a `once` intent. The first chunk of each
step attempt is preceded by a marker naming the step, its position and attempt; the
marker is a `retry` when that step wrote to the stream before (an earlier attempt, or an
execution a crash cut off), so a reader drops the partial output it had of that step.
A workflow writes outside steps only when it runs new code, never while it replays.
Nothing in a stream is needed for replay.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import PayloadError, PerdureError, StoreError
from ..store.base import FINISHED
from ..store.stream_sql import ATTEMPT, CHUNK, StreamRow
from .codec import dumps
from .context import RunContext, current, to_loop
from .steps import current_step

if TYPE_CHECKING:
    from .client import Client

log = logging.getLogger("perdure.stream")
MAX_CHUNK = 64 * 1024  # bytes of JSON in one chunk
KEEP = 10_000  # rows a run's stream keeps; older ones are dropped and the drop recorded
FLUSH_EVERY = 0.005  # seconds a chunk may wait for the rest of its group
FLUSH_AT = 256  # chunks that make a group at once
MAX_TOPIC = 100
BATCH = 500  # rows a reader reads at a time
# A reader wakes at once on this process's writes and (PostgreSQL) on NOTIFY from others;
# for other processes on SQLite it looks again after a wait that is short while chunks
# keep coming and grows to READ_WAIT while none do.
READ_WAIT = 0.25
READ_SOON = 0.005


@dataclass(frozen=True, slots=True)
class StreamChunk:
    """What a reader sees: the stream's offset, what it is (`chunk`, or the markers
    `attempt`, `retry`, `dropped`), its topic, its data (decoded JSON) and when."""

    seq: int
    kind: str
    topic: str
    data: Any
    at: float


def chunk_of(row: StreamRow) -> StreamChunk:
    return StreamChunk(row.seq, row.kind, row.topic, json.loads(row.data or "null"), row.at)


class _Writer:
    """One run's buffered stream, flushed on its worker's event loop (any thread may write)."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.lock = threading.Lock()
        self.rows: list[tuple[str, str, str | None, float]] = []
        self.marked: set[tuple[int, int]] = set()  # (position, attempt) already marked
        self.armed = False
        self.flushing: asyncio.Future[None] | None = None

    def add(self, data: Any, topic: str) -> None:
        text = dumps(data, f"stream chunk of run {self.ctx.run_id!r}")
        if len(text.encode()) > MAX_CHUNK:
            raise PayloadError(
                f"stream chunk of {len(text.encode()):,} bytes is over the {MAX_CHUNK:,} limit: "
                "split it"
            )
        now = self.ctx.now()
        try:
            step = current_step()
        except PerdureError:
            step = None
        with self.lock:
            if step is not None and (step.position, step.attempt) not in self.marked:
                self.marked.add((step.position, step.attempt))
                marker = {"step": step.name, "position": step.position, "attempt": step.attempt}
                self.rows.append((ATTEMPT, f"step:{step.position}", json.dumps(marker), now))
            self.rows.append((CHUNK, topic, text, now))
            full = len(self.rows) >= FLUSH_AT
            arm = not self.armed
            self.armed = True
        if full or arm:
            self.ctx.loop.call_soon_threadsafe(self._schedule, 0.0 if full else FLUSH_EVERY)

    def _schedule(self, delay: float) -> None:
        self.ctx.loop.call_later(delay, self._start_flush)

    def _start_flush(self) -> None:
        task = self.ctx.loop.create_task(self.flush())
        self.ctx.background.add(task)  # held until done (the run's background tasks)
        task.add_done_callback(self.ctx.background.discard)

    async def flush(self) -> None:
        """Commit what is buffered (one store write); a failed write keeps the chunks for the
        next flush, so an outage delays them but loses none while the run lives."""
        await to_loop()  # a sync workflow's thread (a step's write) hands it to the loop
        while self.flushing is not None:
            await self.flushing
        with self.lock:
            rows, self.rows, self.armed = self.rows, [], False
        if not rows:
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.flushing = done
        try:
            await self.ctx.store.append_stream(self.ctx.run_id, rows, KEEP)
        except StoreError as exc:
            log.warning("run %s: %d stream chunk(s) not written yet (%s)", self.ctx.run_id,
                        len(rows), exc)  # fmt: skip
            with self.lock:
                self.rows[:0] = rows
                if not self.armed:
                    self.armed = True
                    self._schedule(0.5)
        finally:
            self.flushing = None
            done.set_result(None)

    async def flush_or_keep(self) -> None:
        """`flush`, a store that cannot take it now keeping the rows for later: before a
        journal write, so what a step streamed is never lost once its outcome is kept."""
        with contextlib.suppress(StoreError):
            await self.flush()


_writers: weakref.WeakKeyDictionary[RunContext, _Writer] = weakref.WeakKeyDictionary()
_writers_lock = threading.Lock()


def _writer(ctx: RunContext) -> _Writer:
    with _writers_lock:
        found = _writers.get(ctx)
        if found is None:
            found = _writers[ctx] = ctx.stream = _Writer(ctx)
        return found


async def flush(ctx: RunContext) -> None:
    """Commit the run's buffered chunks now (before the run ends, so readers see them all)."""
    writer = _writers.get(ctx)
    if writer is not None:
        await writer.flush_or_keep()


class Stream:
    """`perdure.stream`: write to the current run's stream from a step or a workflow."""

    def write(self, data: Any, *, topic: str = "out") -> None:
        """Append `data` (JSON) to the run's stream under `topic`; returns at once."""
        ctx = current()
        if ctx is None:
            raise PerdureError("perdure.stream.write() can only be called inside a run")
        if not topic or len(topic) > MAX_TOPIC or topic.startswith("step:"):
            raise PayloadError(f"stream topic {topic!r}: 1 to {MAX_TOPIC} characters, "
                               "not starting with 'step:'")  # fmt: skip
        try:
            current_step()
        except PerdureError:  # in workflow code: only new code writes, never a replay
            if max(ctx.by_position, default=-1) >= ctx.position:
                return
        _writer(ctx).add(data, topic)


stream = Stream()


async def follow(client: Client, run_id: str, after: int = -1) -> AsyncGenerator[StreamChunk, None]:
    """The run's stream after offset `after`, live: it follows the run across workers and
    crashes and ends once the run is finished and everything was read."""
    await client.get(run_id)  # RunNotFound for an unknown run
    wait = READ_SOON
    while True:
        rows = await client.store.read_stream(run_id, after, BATCH)
        for row in rows:
            after = row.seq
            yield chunk_of(row)
        if len(rows) == BATCH:
            continue
        run = await client.get(run_id)
        if run.status in FINISHED:
            rest = await client.store.read_stream(run_id, after, BATCH)
            if not rest:
                return
            continue
        wait = READ_SOON if rows else min(wait * 2, READ_WAIT)
        await client.runtime.wait_change(wait)


def follow_sync(client: Client, run_id: str, after: int = -1) -> Iterator[StreamChunk]:
    """`follow` for sync code: the same reader, stepped through the runtime's portal (one
    loop, so its waits and the store's wake-ups are the async reader's)."""
    runtime = client.runtime
    reader = follow(client, run_id, after)
    try:
        while True:
            try:
                yield runtime.sync(_next(reader), "RunHandle.stream()")
            except StopAsyncIteration:
                return
    finally:
        runtime.sync(reader.aclose(), "RunHandle.stream()")


async def _next(reader: AsyncIterator[StreamChunk]) -> StreamChunk:
    return await reader.__anext__()
