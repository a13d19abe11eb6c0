"""`GET /api/v1/events/stream?run=ID`: a run's status changes and new journal entries as SSE.

Each connection reads the store every `POLL` seconds, sooner when this process
changes something (`App.notify`): first the journal entries it has not sent
(`event: journal`, data masked by `observe.redact`; `id:` their sequence number, so a
reconnecting client's `Last-Event-ID` resumes after them), then the run's status when it changed
(`event: status`). A comment line goes out after `HEARTBEAT` seconds of silence.
The stream ends with `event: end` once the run is finished and everything was
sent, after `MAX_AGE` seconds (the client reconnects), or when the client leaves; and
with `event: end` and a reason once its credential no longer holds (checked again every
`RECHECK` seconds: a revoked token or an ended session stops receiving at once).
At most `MAX_STREAMS` streams (`perdure serve --max-streams`) are open per server; more
are refused with 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeAlias

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from ..engine.streams import StreamChunk, follow
from ..errors import PerdureError
from ..observe.redact import Redactor
from ..store.base import FINISHED, RunRow
from .answers import entry_json

if TYPE_CHECKING:
    from ..app import App

POLL = 0.5  # seconds between reads of the store
HEARTBEAT = 15.0  # seconds of silence before a comment line keeps proxies from closing
MAX_AGE = 3600.0  # seconds a stream lasts; the client reconnects with Last-Event-ID
MAX_STREAMS = 100  # open streams per server
BATCH = 500  # journal entries read per poll
MIN_GAP = 0.05  # seconds between reads however often this process notifies
RECHECK = 3.0  # seconds between checks that the stream's credential still holds


def _frame(event: str, data: Any, event_id: int | None = None) -> str:
    head = f"event: {event}\n" + (f"id: {event_id}\n" if event_id is not None else "")
    return f"{head}data: {json.dumps(data, separators=(',', ':'), default=str)}\n\n"


def _status(run: RunRow) -> dict[str, Any]:
    return {
        "run_id": run.id,
        "status": run.status,
        "updated_at": run.updated_at,
        "waiting_for": run.waiting_for,
    }


class Recheck:
    """Asks `allowed` again once `RECHECK` seconds have passed since it last said yes."""

    def __init__(self, allowed: Callable[[], Awaitable[bool]], every: float = RECHECK) -> None:
        self.allowed, self.every = allowed, every
        self.last = asyncio.get_running_loop().time()

    async def still(self) -> bool:
        now = asyncio.get_running_loop().time()
        if now - self.last < self.every:
            return True
        self.last = now
        try:
            return await self.allowed()
        except PerdureError:  # held back, or the store is away: stop, the client retries
            return False


async def events(
    app: App, run_id: str, after: int, allowed: Callable[[], Awaitable[bool]]
) -> AsyncGenerator[str, None]:
    """The stream's text, frame by frame, until the run is done, MAX_AGE passes, the
    credential stops being `allowed` or the client leaves."""
    loop = asyncio.get_running_loop()
    wake = asyncio.Event()

    def listener() -> None:  # called from any thread by App.notify
        with contextlib.suppress(RuntimeError):  # the loop closed: the stream is over
            loop.call_soon_threadsafe(wake.set)

    app.runtime.on_notify.append(listener)
    redactor = Redactor()
    try:
        started = last_sent = loop.time()
        shown: tuple[str, str | None] | None = None
        check = Recheck(allowed)
        yield "retry: 2000\n\n"
        while True:
            if not await check.still():
                yield _frame("end", {"run_id": run_id, "status": None, "reason": REVOKED})
                return
            wake.clear()
            # the run first: a status read after the journal could be an end whose entries
            # that read missed (they land in one transaction), and the stream would end
            # without them
            run = await app.runtime.store.get_run(run_id)
            entries = await app.runtime.store.journal(run_id, after=after, limit=BATCH)
            if run is None:  # deleted (gc) while watched
                yield _frame("end", {"run_id": run_id, "status": None})
                return
            sent = bool(entries)
            for entry in entries:
                yield _frame("journal", entry_json(entry, redactor), entry.seq)
                after = entry.seq
            if (run.status, run.waiting_for) != shown:
                shown = (run.status, run.waiting_for)
                yield _frame("status", _status(run))
                sent = True
            now = loop.time()
            if sent:
                last_sent = now
            if len(entries) == BATCH:
                continue  # more to send at once
            if run.status in FINISHED:
                yield _frame("end", {"run_id": run_id, "status": run.status})
                return
            if now - started >= MAX_AGE:
                return
            if now - last_sent >= HEARTBEAT:
                yield ": heartbeat\n\n"
                last_sent = now
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), POLL)
                await asyncio.sleep(MIN_GAP)  # woken early: many changes still cost one read
    finally:
        app.runtime.on_notify.remove(listener)


class Slots:
    """The open event streams of one server, at most `most`, and of one token (its own and
    its dashboard sessions') at most a quarter of them: a slot is taken when the response
    is made (never after an await, so two requests cannot both take the last one) and given
    back when the response ends, however it ends."""

    def __init__(self, most: int) -> None:
        self.most = most
        self.per_owner = max(1, most // 4)
        self.open = 0
        self.owners: dict[str, int] = {}

    def take(self, owner: str = "") -> bool:
        if self.open >= self.most or self.owners.get(owner, 0) >= self.per_owner:
            return False
        self.open += 1
        self.owners[owner] = self.owners.get(owner, 0) + 1
        return True

    def give(self, owner: str = "") -> None:
        self.open -= 1
        left = self.owners.get(owner, 1) - 1
        if left > 0:
            self.owners[owner] = left
        else:
            self.owners.pop(owner, None)


class SlotStream(StreamingResponse):
    """A streaming response that gives its slot back when it ends (the client left, the
    stream finished, or it failed), even if its body never started."""

    def __init__(
        self, content: AsyncIterator[str], slots: Slots, owner: str = "", **options: Any
    ) -> None:
        super().__init__(content, **options)
        self.slots, self.owner = slots, owner

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.slots.give(self.owner)


def slots_of(request: Request) -> Slots:
    """The server's stream slots (`create_app` makes them; the API's and the dashboard's
    streams share them)."""
    slots: Slots = request.app.state.sse_slots
    return slots


REVOKED = "the credential was revoked or expired"


Source: TypeAlias = "Callable[[App, str, int, Callable[[], Awaitable[bool]]], AsyncIterator[str]]"


def response(
    request: Request,
    app: App,
    run_id: str,
    after: int,
    allowed: Callable[[], Awaitable[bool]],
    source: Source | None = None,
    owner: str = "",
) -> Response:
    """The streaming response for one client (503 if MAX_STREAMS are already open) of the
    run's status and journal (`events`), or of another `source` (`stream_chunks`);
    `allowed` says whether its credential still holds."""
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    if request.method == "HEAD":
        return Response(media_type="text/event-stream", headers=headers)
    slots = slots_of(request)
    if not slots.take(owner):
        return JSONResponse({"error": busy(slots, owner)}, 503)
    body = (source or events)(app, run_id, after, allowed)
    return SlotStream(body, slots, owner, media_type="text/event-stream", headers=headers)


def busy(slots: Slots, owner: str) -> str:
    """Why a stream was refused: the server's streams, or this token's share, are taken."""
    if slots.open >= slots.most:
        return f"{slots.most} streams are open; try again later"
    return f"this token has {slots.per_owner} streams open (its share); close one first"


def _chunk_frame(chunk: StreamChunk, redactor: Redactor) -> str:
    body = {"seq": chunk.seq, "topic": chunk.topic, "data": redactor.value(chunk.data),
            "at": chunk.at}  # fmt: skip
    return _frame(chunk.kind, body, chunk.seq)


async def stream_chunks(
    app: App, run_id: str, after: int, allowed: Callable[[], Awaitable[bool]]
) -> AsyncGenerator[str, None]:
    """A run's stream (`perdure.stream`) as SSE: one event per row (masked by the
    redactor), its kind as the event name (`chunk`, `attempt`, `retry`, `dropped`), `id:`
    its offset for Last-Event-ID; `end` once the run is finished and all was sent, after
    MAX_AGE seconds (the client reconnects), or once the credential no longer holds, which
    is asked every RECHECK seconds whether rows come or not."""
    loop = asyncio.get_running_loop()
    check = Recheck(allowed)
    redactor = Redactor()
    rows = follow(app.client, run_id, after)
    started = loop.time()
    pending: asyncio.Future[StreamChunk] | None = None
    yield "retry: 2000\n\n"
    try:
        while True:
            if not await check.still():
                yield _frame("end", {"run_id": run_id, "status": None, "reason": REVOKED})
                return
            if loop.time() - started > MAX_AGE:
                yield _frame("end", {"run_id": run_id, "status": None, "reason": "max age"})
                return
            if pending is None:
                pending = asyncio.ensure_future(anext(rows))
            done, _ = await asyncio.wait({pending}, timeout=RECHECK)
            if not done:
                continue  # nothing new: ask about the credential again
            try:
                chunk = pending.result()
            except StopAsyncIteration:
                break
            pending = None
            yield _chunk_frame(chunk, redactor)
    finally:
        if pending is not None and not pending.done():
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                await pending
    run = await app.runtime.store.get_run(run_id)
    yield _frame("end", {"run_id": run_id, "status": run.status if run else None})
