"""The deterministic calls a workflow may make; each takes a journal position.

`now()`, `uuid()`, `random()` and `patched()` return values directly; `sleep()`
and `wait_event()` return awaitables in async workflows and values in sync ones.
What each records:

- `now()`, `uuid()`, `random()`: the value produced, returned unchanged on replay.
- `current_run()`: the run's recoveries so far (the rest of what it returns is fixed
  when the run is created).
- `sleep(d)`: the wake-up time; the run is parked on a timer in the store.
- `wait_event(name, timeout)`: the event's payload (or that it timed out).
- `patched(name)`: a marker that this run took the new code path.
- `steering()`: each steering message taken (in the transaction that consumes it), and,
  at the first call, that the run takes steering (an entry at no position).
- `continue_as_new(*args)`: nothing for this run to replay: it ends, `run.continued`
  naming its successor, in the transaction that creates the successor.
"""

from __future__ import annotations

import functools
import random as _random
import uuid as _uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from ..errors import PerdureError, RunFailed, WaitTimeout
from ..store.base import COMPLETED, SLEEPING, TERMINAL, WAITING, Entry
from . import continuation, sticky
from . import steering as steer
from .client import checked_input, continued_as
from .codec import from_json
from .context import RunContext, require
from .origins import started_by
from .retry import seconds
from .state import Phase


def now() -> datetime:
    """The current UTC time, journaled so replay sees the same instant."""
    return _datetime(_value("now", lambda ctx: ctx.now()))


def uuid() -> _uuid.UUID:
    """A random UUID4, journaled."""
    return _uuid.UUID(_value("uuid", lambda ctx: str(_uuid.uuid4())))


def random() -> float:
    """A random float in [0, 1), journaled."""
    return float(_value("random", lambda ctx: _random.random()))


@dataclass(frozen=True, slots=True)
class RunInfo:
    """The calling run: its id, workflow, parent, what started it, and its recoveries.

    `trigger` is what started the run, the first key of its `origin`: `schedule`,
    `event`, `webhook`, `inbox`, `table_change`, `message`, `plan`, `fork`, `parent` (a
    child run), `continued`, `mcp`; or `client` (no origin: started by a call such as
    `App.start`, the CLI or the API). `origin` holds the details: e.g.
    `{"schedule": "nightly", "tick": "2026-12-01T02:00:00Z"}`,
    `{"event": "on_paid", "type": "invoice.paid", "id": "evt_1"}`,
    `{"webhook": "github", "delivery": "..."}`,
    `{"inbox": "docs", "path": ..., "sha256": ..., "folder": ...}`.
    """

    id: str
    workflow: str
    parent_id: str | None
    trigger: str
    origin: dict[str, Any] = field(default_factory=dict)
    recoveries: int = 0  # times another worker took the run over after a crash or a stop
    code_version: str = ""


def current_run() -> RunInfo:
    """The run the calling workflow (or step) belongs to.

    In a workflow, `recoveries` is journaled like `now()`: replay sees the count the
    first execution saw, so branching on it is deterministic. In a step (never replayed)
    it is the live count. Raises `PerdureError` outside a run.
    """
    from .steps import _step_info

    ctx = require("current_run")
    if _step_info.get() is not None:
        recoveries = ctx.run.recoveries
    else:
        recoveries = int(_value("current_run", lambda c: c.run.recoveries))
    origin = dict(ctx.origin)
    trigger, _ = started_by(origin)  # its first key names what started the run
    return RunInfo(
        id=ctx.run_id,
        workflow=ctx.run.workflow,
        parent_id=ctx.run.parent_id,
        trigger=trigger,
        origin=origin,
        recoveries=recoveries,
        code_version=ctx.run.code_version,
    )


def _datetime(value: float) -> datetime:
    return datetime.fromtimestamp(value, UTC)


def _value(name: str, make: Any) -> Any:
    ctx = require(name)
    pos = ctx.next_position()
    entries = ctx.recorded(pos, "value", name)
    final = ctx.final(entries)
    if final is not None:
        return ctx.data(final)
    value = make(ctx)
    ctx.buffer_entry(ctx.entry("value.recorded", name, position=pos, data=value, final=True))
    return value


def sleep(duration: float | timedelta) -> Any:
    """Sleep durably: the wake-up time is journaled and the run is parked on a store timer.

    A sleeping run holds no worker slot and no memory; it wakes after a restart too.
    """
    ctx = require("sleep")
    pos = ctx.next_position()
    return ctx.call(_sleep(ctx, pos, seconds(duration) or 0.0))


async def _sleep(ctx: RunContext, pos: int, duration: float) -> None:
    entries = ctx.recorded(pos, "sleep", "sleep")
    final = ctx.final(entries)
    if final is None:
        await ctx.checkpoint()
        wake_at = ctx.now() + duration
        final = ctx.entry("sleep.until", "sleep", position=pos, data=wake_at, final=True)
        ctx.buffer_entry(final)
    wake_at = float(ctx.data(final))
    while True:
        remaining = wake_at - ctx.now()
        if remaining <= 0:
            return
        if remaining <= ctx.inline_sleep and not ctx.state.hold:  # stopping: park it instead
            import asyncio

            await ctx.flush()
            await asyncio.sleep(remaining)
            return
        fields = {"wake_at": wake_at, "waiting_for": "timer"}
        signal = await ctx.suspend(SLEEPING, "sleep", fields=fields)
        if not await sticky.park(ctx, wake_at):  # woken in memory, or replayed from the top
            raise signal
        await ctx.checkpoint()


def wait_event(name: str, timeout: float | timedelta | None = None, *, type: Any = None) -> Any:
    """Wait durably for an event sent to this run with `send_event(run_id, name, payload)`.

    Events sent before the wait are kept and delivered in order. Returns the
    payload (validated as `type` if given); raises `WaitTimeout` after `timeout`.
    """
    ctx = require("wait_event")
    pos = ctx.next_position()
    return ctx.call(_wait_event(ctx, pos, name, seconds(timeout), type))


async def _wait_event(
    ctx: RunContext, pos: int, name: str, timeout: float | None, hint: Any
) -> Any:
    entries = ctx.recorded(pos, "event", name)
    final = ctx.final(entries)
    while final is None:
        await ctx.checkpoint()
        waiting = next((e for e in ctx.by_position.get(pos, []) if e.kind == "event.wait"), None)
        event = await ctx.read(lambda: ctx.store.next_event(ctx.run_id, name))
        if event is not None:
            final = ctx.entry(
                "event.received",
                name,
                position=pos,
                final=True,
                data_json=f'{{"payload":{event.payload},"event_id":{event.id}}}',
            )
            await ctx.write(final, consume_event=event.id)
        else:
            timeout_at = (ctx.data(waiting) or {}).get("timeout_at") if waiting else None
            if waiting is None and timeout is not None:
                timeout_at = ctx.now() + timeout
            if timeout_at is not None and ctx.now() >= timeout_at:
                final = ctx.entry(
                    "event.timeout", name, position=pos, final=True, data={"timed_out": True}
                )
                ctx.buffer_entry(final)
            else:
                marker = (
                    []
                    if waiting
                    else [
                        ctx.entry("event.wait", name, position=pos, data={"timeout_at": timeout_at})
                    ]
                )
                signal = await ctx.suspend(
                    WAITING,
                    f"event {name}",
                    *marker,
                    fields={"wake_at": timeout_at, "waiting_for": f"event:{name}"},
                )
                if not await sticky.park(ctx):
                    raise signal
    data = ctx.data(final)
    if data.get("timed_out"):
        raise WaitTimeout(f"run {ctx.run_id!r}: no event {name!r} arrived before the timeout")
    return from_json(data["payload"], hint, f"event {name!r}")


def steering() -> Any:
    """The steering messages sent to this run (`perdure steer RUN TEXT`) and not taken yet,
    oldest first, as `Steer` values (text, by, sent_at); [] when there are none. Never
    waits (to wait for the next one: `wait_event("steer")`). Returns an awaitable in async
    workflows, a value in sync ones.

    Each message taken is journaled in the transaction that consumes it, so it is given
    to this run once, and replay returns it at the same place. The first call records that
    the run takes steering: until then an operator's steer is refused (a spec agent's run
    takes it from its start). Await it on its own, not alongside other journaled calls.
    """
    from .steps import _step_info

    ctx = require("steering")
    if _step_info.get() is not None:
        raise PerdureError("perdure.steering() takes journal positions: call it in the "
                           "workflow, not inside a step")  # fmt: skip
    ctx.guard()
    return ctx.call(_steering(ctx))


async def _steering(ctx: RunContext) -> list[steer.Steer]:
    """Walk the positions this call took when it first ran (one per message); at the
    journal's end take what the store holds, one position and one write per message. A
    position holding another call's entries means this call took nothing there."""
    if not ctx.steering_asked and ctx.state.phase is not Phase.CHECKING:
        ctx.steering_asked = True  # at no position: the run's steps keep theirs
        ctx.buffer_entry(ctx.entry(steer.ASKED))
    taken: list[steer.Steer] = []
    while True:
        pos = ctx.position
        entries = ctx.by_position.get(pos, [])
        final = next((e for e in entries if e.kind == steer.RECEIVED), None)
        if final is not None:
            ctx.position += 1
            taken.append(steer.received(final))
            continue
        if entries:
            return taken
        await ctx.checkpoint()  # the journal's end (a replay check stops here)
        event = await ctx.read(lambda: ctx.store.next_event(ctx.run_id, steer.STEER))
        if ctx.position != pos:  # another call took this position meanwhile
            raise PerdureError("perdure.steering() ran alongside another journaled call "
                               "(asyncio.gather?): await it on its own")  # fmt: skip
        if event is None:
            return taken
        ctx.position += 1
        data = f'{{"payload":{event.payload},"event_id":{event.id},"sent_at":{event.sent_at!r}}}'
        entry = ctx.entry(steer.RECEIVED, steer.STEER, position=pos, final=True, data_json=data)
        await ctx.write(entry, consume_event=event.id)
        taken.append(steer.received(entry))


def continue_as_new(*args: Any, **kwargs: Any) -> Any:
    """End this run and start its successor from the top with `args` and `kwargs`, atomically.

    The successor is a run of the same workflow with the lineage's next id (`<root>~N`),
    the current code version and the workflow's own deadline; it does not inherit the
    journal, so state to carry over goes in the arguments; events sent to this run and
    not consumed yet go to the successor. Handles and `result()` follow the lineage.
    Never returns.

    Raises:
        ConfigError: the arguments do not fit the workflow (checked before anything ends).
    """
    from .steps import _step_info

    ctx = require("continue_as_new")
    if _step_info.get() is not None:
        raise PerdureError("perdure.continue_as_new() ends a run: call it in the workflow, "
                           "not inside a step")  # fmt: skip
    ctx.guard()
    checked_input(ctx.runtime, ctx.run.workflow, args, kwargs, "continue_as_new")
    raise continuation.ContinueAsNew(args, kwargs)


INTERNAL = "perdure."  # the prefix of the patch markers perdure records for itself


def internal(entry: Entry) -> bool:
    """Is `entry` a marker perdure records for itself (a `patched` name under `perdure.`,
    e.g. an agent run's `perdure.agent.tool_names`, or that the run takes steering)?
    Timelines hide it; `perdure show --all` and the API's journal keep it."""
    return (entry.kind == "patch.marker" and entry.name.startswith(INTERNAL)) or (
        entry.kind == steer.ASKED
    )


def patched(name: str) -> bool:
    """True if this run takes the code path guarded by `name`, False for runs that predate it.

    New runs (and runs that had not reached this point) record a marker and take
    the new path; runs whose journal has another call here replay the old one.
    """
    ctx = require("patched")
    ctx.guard()
    pos = ctx.position
    entries = ctx.by_position.get(pos, [])
    if entries:
        if any(e.kind == "patch.marker" and e.name == name for e in entries):
            ctx.position += 1
            return True
        return False
    ctx.position += 1
    if ctx.state.phase is not Phase.CHECKING:
        ctx.buffer_entry(ctx.entry("patch.marker", name, position=pos, final=True))
    return True


async def child_result(ctx: RunContext, pos: int, child_id: str, hint: Any) -> Any:
    """Durably wait for a child run's outcome and journal it at `pos`."""
    entries = ctx.recorded(pos, "child", child_id)
    final = ctx.final(entries)
    waited = child_id  # the lineage's last run, if the child continued as new
    while final is None:
        await ctx.checkpoint()
        child = await ctx.read(functools.partial(ctx.store.get_run, waited))
        if child is not None and continued_as(child) is not None:
            waited = continued_as(child) or waited
            continue
        if child is None or child.status not in TERMINAL:
            signal = await ctx.suspend(
                WAITING,
                f"child {waited}",
                fields={"wake_at": None, "waiting_for": f"child:{waited}"},
            )
            if not await sticky.park(ctx):
                raise signal
            continue
        from .client import run_outcome_json

        data = await ctx.read(functools.partial(run_outcome_json, ctx.store, child))
        final = ctx.entry("child.result", child_id, position=pos, final=True, data_json=data)
        ctx.buffer_entry(final)
    data = ctx.data(final)
    if data["status"] != COMPLETED:
        raise RunFailed(child_id, data["status"], data.get("error"))
    return from_json(data.get("result"), hint, f"child run {child_id!r}")
