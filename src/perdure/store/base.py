"""The rows a store moves: runs, journal entries, events, blobs (its protocol, by role, is
in roles.py; `Store` is re-exported here).

A store knows nothing of Python callables; it keeps rows and enforces the
invariants the engine relies on (gap-free journal sequence, one final entry per
position, lease fencing, status written in the same transaction as its entry).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .roles import Store as Store

# Run states (DESIGN.md "Run states"), plus the two transitional operator states.
PENDING = "pending"
RUNNING = "running"
SLEEPING = "sleeping"
WAITING = "waiting"
PAUSED = "paused"
NEEDS_ATTENTION = "needs_attention"
CANCELLING = "cancelling"
COMPLETED = "completed"
FAILED = "failed"
CANCELLED = "cancelled"
DEAD = "dead"  # recovery kept crashing its workers; parked until an operator acts

RunStatus = Literal[
    "pending", "running", "sleeping", "waiting", "paused", "needs_attention", "cancelling",
    "completed", "failed", "cancelled", "dead",
]  # fmt: skip
"""A run's status, as `RunRow.status` and every interface report it."""

FINISHED = frozenset({COMPLETED, FAILED, CANCELLED})  # can never run again
TERMINAL = FINISHED | {DEAD}  # ends every wait for the run (a dead run may still be resumed)
SUSPENDED = frozenset({SLEEPING, WAITING, PAUSED, NEEDS_ATTENTION})
ALL_STATUSES = (
    PENDING,
    RUNNING,
    SLEEPING,
    WAITING,
    PAUSED,
    NEEDS_ATTENTION,
    CANCELLING,
    COMPLETED,
    FAILED,
    CANCELLED,
    DEAD,
)


@dataclass(slots=True)
class Entry:
    """One journal entry. `seq` is assigned by the store; `final` marks a position's outcome."""

    kind: str
    name: str = ""
    position: int | None = None
    data: str | None = None  # JSON text
    attempt: int = 0
    final: bool = False
    at: float = 0.0
    seq: int = -1
    epoch: int | None = None
    worker: str | None = None


@dataclass(slots=True)
class RunRow:
    """The materialised state of one run (a fold over its journal, kept as a row)."""

    id: str
    workflow: str
    status: str
    input: str
    code_version: str = ""
    result: str | None = None
    error: str | None = None
    parent_id: str | None = None
    created_at: float = 0.0
    updated_at: float = 0.0
    wake_at: float | None = None
    deadline_at: float | None = None
    waiting_for: str | None = None
    lease_owner: str | None = None
    lease_until: float | None = None
    lease_epoch: int = 0
    recoveries: int = 0
    pause_requested: bool = False
    queue: str = "default"
    priority: int = 0
    partition_key: str | None = None
    started_at: float | None = None


@dataclass(slots=True)
class NewRun:
    """A run to create; `entries` seed its journal (used by fork)."""

    id: str
    workflow: str
    input: str
    code_version: str
    now: float
    parent_id: str | None = None
    deadline_at: float | None = None
    queue: str = "default"
    priority: int = 0
    partition_key: str | None = None
    entries: list[Entry] = field(default_factory=list)
    blobs: list[Blob] = field(default_factory=list)
    # (worker, lease_until): created claimed by that worker of the creating process, in
    # the same transaction, unless the worker or the workflow is paused (engine/worker.py)
    lease: tuple[str, float] | None = None


@dataclass(frozen=True, slots=True)
class QueueSpec:
    """Limits a claim respects for one named queue (None: no limit).

    concurrency: runs of the queue running at once, across all workers and hosts.
    per_worker: runs of the queue one worker holds at once.
    rate, period: at most `rate` runs start (first claim) per `period` seconds.
    """

    name: str
    concurrency: int | None = None
    per_worker: int | None = None
    rate: int | None = None
    period: float = 1.0


@dataclass(slots=True)
class Blob:
    """A payload stored by reference because it was over the size kept in its row."""

    key: str
    data: str


class OperatorRequest(Exception):
    """Raised by a `stop_if_requested` append when an operator asked to cancel or pause."""

    def __init__(self, cancel: bool, pause: bool) -> None:
        super().__init__("cancel" if cancel else "pause")
        self.cancel = cancel
        self.pause = pause


# A transactional step body: called with the store's own DB connection inside the
# transaction that also records the step's outcome.
TxBody = Callable[[Any], str]


@dataclass(slots=True)
class Append:
    """One atomic write for one run: entries, status and fields, fenced by lease epoch.

    `epoch=None` marks an operator/client write (not fenced). A write whose last entry a
    function computes in its transaction (a transactional step's) is `sqlops.append_with_body`,
    through the store's generic entry, `run_sql`: this row carries no function.
    """

    run_id: str
    epoch: int | None
    entries: list[Entry] = field(default_factory=list)
    status: str | None = None
    fields: dict[str, Any] = field(default_factory=dict)
    new_runs: list[NewRun] = field(default_factory=list)
    blobs: list[Blob] = field(default_factory=list)
    consume_event: int | None = None
    expect_status: Sequence[str] | None = None  # refuse unless the run is in one of these
    blob_threshold: int | None = None  # a body's entry data over this size goes to a blob
    stop_if_requested: bool = False  # refuse (OperatorRequest) if a cancel or pause is pending
    direct_ok: bool = False  # the caller is alone: a store may run this on the caller's thread
    key: str | None = None  # names this write: kept by the run when it lands (fenced writes)
    retry: bool = False  # sent again after a lost connection: if `key` landed, do nothing


@dataclass(slots=True)
class AppendResult:
    """What the store observed while appending: the status written and operator flags."""

    status: str
    cancel_requested: bool
    pause_requested: bool
    tx_data: str | None = None  # what a body (append_with_body) returned
    tx_error: Exception | None = None  # the body raised; its entry was not written


@dataclass(slots=True)
class Claim:
    """A run claimed by a worker under a fresh lease epoch."""

    run: RunRow
    recovered_from: str | None  # previous lease owner if this is a takeover
    empty_journal: bool = False  # nothing recorded yet: the worker need not read the journal


class Claims(list[Claim]):
    """The runs one claim took, and whether it left runnable runs it was not allowed to
    take (`more`; unknown counts as more): a worker with none left knows there is nothing
    more to run until new work is signalled or a timer is due."""

    def __init__(self, claims: Iterable[Claim] = (), more: bool = True) -> None:
        super().__init__(claims)
        self.more = more


@dataclass(slots=True)
class EventRow:
    """An event sent to a run, kept until a `wait_event` consumes it."""

    id: int
    run_id: str
    name: str
    payload: str
    sent_at: float
    consumed_at: int | None = None


@dataclass(slots=True, frozen=True)
class GcRule:
    """Which finished runs of one workflow to keep; the store deletes the others.

    A run is kept if it finished at or after `keep_since` or is among the
    `keep_last` most recently finished; `None` keeps nothing by that rule.
    """

    workflow: str
    keep_since: float | None = None
    keep_last: int | None = None


@dataclass(slots=True)
class GcBatch:
    """What one gc transaction deleted, and where the next batch starts (None: done)."""

    runs: int = 0
    entries: int = 0
    events: int = 0
    blobs: int = 0
    cursor: tuple[float, str] | None = None


@dataclass(slots=True)
class LeaseState:
    """Heartbeat answer for one still-held run."""

    run_id: str
    status: str
    pause_requested: bool
    hold: bool = False  # its workflow or this worker is paused: stop at the next step, release
    abort: bool = False  # paused with `now`: cut off its abortable calls in flight
