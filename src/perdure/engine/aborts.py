"""Aborting calls in flight: `pause --now` stops what a step waits on, where the step allows it.

A step body wraps what it may abandon mid-flight in `abortable(...)` (the agent does so for
model calls and for tools that declare it). When an operator pauses with `now`, the worker
holding the run learns it (at once in its own process, else at its next heartbeat: a second
at most while busy) and `request(ctx, True)` cancels every abortable call of the run. The
step body then raises `CallAborted`, carrying what the journal should say (e.g. the call's
estimated usage); the step is journaled `step.stopped` with `aborted: true`, and from there
it is recovered under its effect's rule like any step cut off while executing: `read`,
`idempotent` and `keyed` run again (keyed with the same key), `once` goes to needs_attention.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..store.base import Entry
from .context import RunContext, StepInfo, current

T = TypeVar("T")

REASON = "aborted by pause --now"


class CallAborted(BaseException):
    """Raised in a step body whose abortable call an operator's `pause --now` cut off.

    A BaseException, like RunSuspended: user code's `except Exception` must not turn it
    into an ordinary failure. `details` go into the journal entry (e.g. estimated usage);
    `sent` says whether the call had started (False: aborted before it began)."""

    def __init__(self, what: str, *, sent: bool = True, details: dict[str, Any] | None = None):
        super().__init__(f"{what}: {REASON}" if what else REASON)
        self.what, self.sent, self.details = what, sent, dict(details or {})

    def with_details(self, what: str | None = None, **details: Any) -> CallAborted:
        """The same abort with more to journal, and `what` was cut off said better (the
        caller re-raises it)."""
        return CallAborted(self.what if what is None else what, sent=self.sent,
                           details={**self.details, **details})  # fmt: skip


@dataclass
class _Aborts:
    """One run execution's abort flag and the calls it would cut off."""

    requested: bool = False
    waiting: set[asyncio.Future[None]] = field(default_factory=set)


_by_run: weakref.WeakKeyDictionary[RunContext, _Aborts] = weakref.WeakKeyDictionary()


def _of(ctx: RunContext) -> _Aborts:
    state = _by_run.get(ctx)
    if state is None:
        state = _by_run[ctx] = _Aborts()
    return state


def request(ctx: RunContext, now: bool) -> None:
    """Set (from any thread) whether the run's abortable calls are to be cut off now; when
    set, those in flight are aborted and any started later is aborted before it begins."""
    if not now:  # the common case, every heartbeat: nothing to make
        found = _by_run.get(ctx)
        if found is not None:
            found.requested = False
        return
    state = _of(ctx)
    state.requested = True

    def fire() -> None:
        for waiter in list(state.waiting):
            if not waiter.done():
                waiter.set_result(None)

    with contextlib.suppress(RuntimeError):  # its loop closed: nothing is in flight there
        ctx.loop.call_soon_threadsafe(fire)


def _asked(ctx: RunContext, state: _Aborts) -> bool:
    """An abort asked for and the pause it came with still standing (a resumed run's
    execution may be kept for its next wake-up: its old flag means nothing then)."""
    return state.requested and (ctx.state.pause or ctx.state.hold)


async def abortable(call: Awaitable[T], what: str = "") -> T:
    """Await `call`, unless the run is paused with `now` meanwhile: then it is cancelled
    (a thread the call runs on is left to finish, its result dropped) and CallAborted is
    raised. Outside a run it is a plain await."""
    ctx = current()
    if ctx is None:
        return await call
    state = _of(ctx)
    task = asyncio.ensure_future(call)
    if _asked(ctx, state):
        task.cancel()
        raise CallAborted(what, sent=False)
    waiter: asyncio.Future[None] = ctx.loop.create_future()
    state.waiting.add(waiter)
    try:
        both: list[asyncio.Future[Any]] = [task, waiter]
        await asyncio.wait(both, return_when=asyncio.FIRST_COMPLETED)
    finally:
        state.waiting.discard(waiter)
        if not task.done():
            task.cancel()  # aborted, or this step itself cancelled: the call goes with it
            task.add_done_callback(_quietly)  # however it ends, nobody waits for it now
    if task.done() and not task.cancelled():
        return task.result()
    raise CallAborted(what)


def _quietly(task: asyncio.Future[Any]) -> None:
    """Retrieve what an abandoned call ended with, so asyncio does not log it as lost."""
    if not task.cancelled():
        task.exception()


def stopped_entry(ctx: RunContext, info: StepInfo, aborted: CallAborted) -> Entry:
    """The journal entry of a step whose call was aborted: stopped while executing (so
    recovery applies its effect's rule), marked aborted, with what the step said."""
    data = {"executing": True, "effect": info.effect, "reason": str(aborted), "aborted": True,
            **aborted.details}  # fmt: skip
    return ctx.entry(
        "step.stopped", info.name, position=info.position, attempt=info.attempt, data=data
    )
