"""`perdure top`'s view: workers (from their leases), queues and running runs, as rich tables.

Read from the store only, so it shows every worker on every host: the workers the
registry heard of in the last hour (idle ones too) but those that stopped, each with
its state as every view judges it (`engine.peers.worker_state`) and, live, its
message-trigger consumers (`triggers.health_sql`), and any other lease owner, and
a run's current step is the last position its journal holds (steps whose
entries are still buffered by their worker show a moment later).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..engine.peers import worker_states
from ..store.base import CANCELLING, PENDING, RUNNING
from ..triggers.health_sql import consumers_by_worker, consumers_said

if TYPE_CHECKING:
    from ..engine.runtime import Runtime
    from ..store.base import QueueSpec, RunRow

SCAN_LIMIT = 10_000  # running and pending runs read per frame


@dataclass(frozen=True)
class WorkerLine:
    id: str
    runs: int
    lease_left: float | None  # seconds until its newest lease expires (negative: expired)
    heartbeat_ago: float | None = None  # seconds since it last told the registry it is alive
    state: str = "not registered"  # its WorkerState label: alive (busy), dead: ..., ...
    triggers: str = "-"  # a live worker's message-trigger consumers: `orders consuming`
    triggers_failing: bool = False  # one of them is refused or down


@dataclass(frozen=True)
class QueueLine:
    name: str
    running: int
    pending: int
    limits: str


@dataclass(frozen=True)
class RunLine:
    id: str
    workflow: str
    queue: str
    worker: str
    age: float
    step: str


@dataclass
class Snapshot:
    """One frame: what the store says at `now`."""

    now: float
    counts: dict[str, int]
    workers: list[WorkerLine] = field(default_factory=list)
    queues: list[QueueLine] = field(default_factory=list)
    runs: list[RunLine] = field(default_factory=list)
    more_runs: int = 0  # running runs not listed


def _limits(spec: QueueSpec | None) -> str:
    if spec is None:
        return "-"
    parts = []
    if spec.concurrency is not None:
        parts.append(f"{spec.concurrency} at once")
    if spec.per_worker is not None:
        parts.append(f"{spec.per_worker} per worker")
    if spec.rate is not None:
        parts.append(f"{spec.rate}/{spec.period:g}s")
    return ", ".join(parts) or "-"


async def _current_step(runtime: Runtime, run: RunRow) -> str:
    """The step at the journal's last position: `name #position` (and its attempt if > 1)."""
    entries = await runtime.store.journal(run.id)
    last = next((e for e in reversed(entries) if e.position is not None), None)
    if last is None:
        return "-"
    text = f"{last.name or last.kind} #{last.position}"
    if last.attempt > 1:
        text += f" (attempt {last.attempt})"
    return text if not last.final else text + " done"


async def snapshot(runtime: Runtime, *, limit: int = 30) -> Snapshot:
    """Read one frame from `app`'s store; at most `limit` running runs are listed."""
    await runtime.open_store()
    now = runtime.clock.now()
    counts = await runtime.store.count_runs()
    running = await runtime.store.list_runs(statuses=[RUNNING, CANCELLING], limit=SCAN_LIMIT)
    pending = await runtime.store.list_runs(statuses=[PENDING], limit=SCAN_LIMIT)
    frame = Snapshot(now=now, counts=counts)
    held: dict[str, list[RunRow]] = {}
    for run in running:
        if run.lease_owner:
            held.setdefault(run.lease_owner, []).append(run)
    judged = {
        row.id: (row, state)
        for row, state in await worker_states(runtime.store, now, now - 3600)
        if state.state != "stopped"
    }
    live = {owner for owner, (_, state) in judged.items() if state.live}
    consumers = await consumers_by_worker(runtime.store, live)
    for owner in sorted(set(held) | set(judged)):  # idle workers too, from the registry
        runs = held.get(owner, [])
        lease = max(r.lease_until or now for r in runs) - now if runs else None
        if owner in judged:
            row, state = judged[owner]
            mine = consumers.get(owner, [])
            line = WorkerLine(owner, len(runs), lease, now - row.heartbeat_at, state.label,
                              consumers_said(mine), any(c.failing for c in mine))  # fmt: skip
        else:
            line = WorkerLine(owner, len(runs), lease)
        frame.workers.append(line)
    names = sorted({r.queue for r in running} | {r.queue for r in pending} | set(runtime.queues))
    frame.queues = [
        QueueLine(
            name,
            sum(r.queue == name for r in running),
            sum(r.queue == name for r in pending),
            _limits(runtime.queues.get(name)),
        )
        for name in names
    ]
    oldest = sorted(running, key=lambda r: r.started_at or r.created_at)
    for run in oldest[:limit]:
        frame.runs.append(
            RunLine(
                run.id, run.workflow, run.queue, run.lease_owner or "-",
                now - (run.started_at or run.created_at), await _current_step(runtime, run),
            )
        )  # fmt: skip
    frame.more_runs = max(0, len(running) - limit)
    return frame


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def render(frame: Snapshot, title: str = "perdure") -> Any:
    """The frame as a rich renderable (needs rich, the `observe` extra)."""
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from ..store.names import escape

    def cell(value: str) -> Text:  # stored text: no markup, no control or format characters
        return Text(escape(value))

    states = "  ".join(f"{k} {v}" for k, v in sorted(frame.counts.items()) if v) or "no runs"
    header = Text.assemble((title, "bold"), "  ", states)

    workers = Table(title="workers", title_justify="left", box=box.SIMPLE_HEAD)
    for name in ("WORKER", "STATE", "RUNS", "LEASE", "HEARTBEAT", "TRIGGERS"):
        workers.add_column(name, no_wrap=True)
    for w in frame.workers:
        if w.lease_left is None:
            lease = Text("-")
        elif w.lease_left >= 0:
            lease = Text(f"expires in {_ago(w.lease_left)}")
        else:
            lease = Text(f"expired {_ago(-w.lease_left)} ago", style="red")
        beat = "-" if w.heartbeat_ago is None else f"{_ago(w.heartbeat_ago)} ago"
        style = "green" if w.state.startswith("alive") else "red"
        workers.add_row(
            cell(w.id),
            Text(w.state, style=style),
            str(w.runs),
            lease,
            beat,
            Text(escape(w.triggers), style="red" if w.triggers_failing else ""),
        )
    if not frame.workers:
        workers.add_row("(no worker seen)", "", "", "", "", "")

    queues = Table(title="queues", title_justify="left", box=box.SIMPLE_HEAD)
    for name in ("QUEUE", "RUNNING", "PENDING", "LIMITS"):
        queues.add_column(name, no_wrap=True)
    for q in frame.queues:
        queues.add_row(cell(q.name), str(q.running), str(q.pending), q.limits)

    runs = Table(title="running", title_justify="left", box=box.SIMPLE_HEAD)
    for name in ("RUN", "WORKFLOW", "QUEUE", "WORKER", "AGE", "STEP"):
        runs.add_column(name, no_wrap=True, overflow="ellipsis")
    for r in frame.runs:
        runs.add_row(*map(cell, (r.id, r.workflow, r.queue, r.worker)), _ago(r.age), cell(r.step))
    parts: list[Any] = [header, workers, queues, runs]
    if frame.more_runs:
        parts.append(Text(f"... and {frame.more_runs} more running"))
    return Group(*parts)
