"""The Store protocol and the rows it moves: runs, journal entries, events and blobs.

A store knows nothing of Python callables; it keeps rows and enforces the
invariants the engine relies on (gap-free journal sequence, one final entry per
position, lease fencing, status written in the same transaction as its entry).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from .access_sql import AuditRow, SessionRow, TokenRow
    from .agent_sql import (
        Budget,
        Limit,
        MemoryRow,
        Refusal,
        Reservation,
        SharedBudget,
        UsageRow,
    )
    from .changes_sql import Build, TableTrigger, Taken
    from .dead_sql import DeadMessage
    from .stream_sql import StreamRow
    from .workers_sql import WorkerRow

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
    """A payload stored by reference because it was over the inline size limit."""

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

    `epoch=None` marks an operator/client write (not fenced). `tx_body`, when set,
    runs inside the same transaction and returns the JSON of the final entry's data.
    """

    run_id: str
    epoch: int | None
    entries: list[Entry] = field(default_factory=list)
    status: str | None = None
    fields: dict[str, Any] = field(default_factory=dict)
    new_runs: list[NewRun] = field(default_factory=list)
    blobs: list[Blob] = field(default_factory=list)
    consume_event: int | None = None
    tx_body: TxBody | None = None
    expect_status: Sequence[str] | None = None  # refuse unless the run is in one of these
    blob_threshold: int | None = None  # store tx_body data over this size as a blob
    stop_if_requested: bool = False  # refuse (OperatorRequest) if a cancel or pause is pending
    inline_ok: bool = False  # the caller is alone: a store may run this on the caller's thread
    key: str | None = None  # names this write: kept by the run when it lands (fenced writes)
    retry: bool = False  # sent again after a lost connection: if `key` landed, do nothing


@dataclass(slots=True)
class AppendResult:
    """What the store observed while appending: the status written and operator flags."""

    status: str
    cancel_requested: bool
    pause_requested: bool
    tx_data: str | None = None
    tx_error: Exception | None = None  # the transactional body raised; its entry was not written


@dataclass(slots=True)
class Claim:
    """A run claimed by a worker under a fresh lease epoch."""

    run: RunRow
    recovered_from: str | None  # previous lease owner if this is a takeover
    empty_journal: bool = False  # nothing recorded yet: the worker need not read the journal


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


@dataclass(slots=True)
class ScheduleRow:
    """A schedule as stored: what it starts, when, its policies, and its next due tick."""

    name: str
    workflow: str
    cron: str | None = None  # a cron expression in `tz`, or None with `every`
    every: float | None = None  # seconds between ticks (aligned to the Unix epoch)
    tz: str = "UTC"
    input: str = '{"args":[],"kwargs":{}}'  # the task spec every run receives (JSON)
    catchup: str = "latest"  # skip | latest | all
    catchup_limit: int = 10  # `all` fires at most this many missed ticks
    overlap: str = "skip"  # skip | queue | allow | cancel_previous
    jitter: float = 0.0  # seconds; each tick fires within [t, t + jitter)
    grace: float = 60.0  # a tick handled this late is still on time; later ones are missed
    paused: bool = False
    next_fire: float | None = None  # the first tick not handled yet
    source: str = "code"  # code (declared in the app) | api (added by CLI or API)
    created_at: float = 0.0
    updated_at: float = 0.0


@dataclass(slots=True)
class TickRow:
    """What became of one tick: fired (run_id), skipped, missed or queued, and why."""

    schedule: str
    fire_at: float
    status: str
    run_id: str | None = None
    reason: str | None = None
    at: float = 0.0


@dataclass(slots=True)
class ScheduleAdvance:
    """One scheduler step for one schedule, applied only if `next_fire` is still `expected`
    (so among many workers exactly one handles each tick): record ticks, start runs,
    cancel runs, move `next_fire` on."""

    name: str
    expected: float | None
    next_fire: float | None
    now: float
    ticks: list[TickRow] = field(default_factory=list)
    new_runs: list[NewRun] = field(default_factory=list)
    cancel: list[str] = field(default_factory=list)


class Store(Protocol):
    """Where runs, journals, events and blobs live. Every method is safe across processes."""

    url: str

    async def open(self) -> None: ...
    async def close(self) -> None: ...
    async def create_run(self, new: NewRun) -> tuple[RunRow, bool]: ...
    async def get_run(self, run_id: str) -> RunRow | None: ...
    async def list_runs(
        self,
        *,
        statuses: Sequence[str] = (),
        workflow: str | None = None,
        parent_id: str | None = None,
        limit: int = 100,
        after: tuple[float, str] | None = None,  # keyset: the last (created_at, id) seen
        ids: Sequence[str] = (),  # only these runs (unknown ids are left out)
    ) -> list[RunRow]: ...
    async def count_runs(self) -> dict[str, int]: ...
    async def journal(self, run_id: str, after: int = -1, limit: int = -1) -> list[Entry]: ...
    async def append(self, append: Append) -> AppendResult: ...
    async def claim(
        self,
        owner: str,
        now: float,
        lease_seconds: float,
        limit: int,
        workflows: Sequence[str],
        queues: Sequence[QueueSpec] = (),
        held: Mapping[str, int] | None = None,
        executing: Sequence[str] = (),
        own: bool = False,
    ) -> list[Claim]: ...
    async def heartbeat(
        self, owner: str, run_ids: Sequence[str], lease_until: float
    ) -> list[LeaseState]: ...
    async def release(self, owner: str, run_ids: Sequence[str]) -> None: ...
    async def set_pause(
        self, scope: str, name: str, paused: bool, now: float, abort: bool = False
    ) -> bool: ...
    async def list_pauses(self) -> list[tuple[str, str, float]]: ...
    async def next_wake(self, workflows: Sequence[str]) -> float | None: ...
    async def send_event(
        self, run_id: str, name: str, payload: str, now: float, key: str | None = None
    ) -> int: ...
    async def next_event(self, run_id: str, name: str) -> EventRow | None: ...
    async def cancel(self, run_id: str, now: float) -> list[str]: ...
    async def stuck(self, now: float, grace: float, limit: int = 1000) -> list[RunRow]: ...
    async def get_blob(self, key: str) -> str: ...
    async def gc(
        self, rule: GcRule, after: tuple[float, str] | None = None, limit: int = 500
    ) -> GcBatch: ...
    # schedules (perdure.triggers.schedules decides; the store keeps rows, atomically)
    async def put_schedule(self, row: ScheduleRow, *, replace_state: bool) -> ScheduleRow: ...
    async def get_schedule(self, name: str) -> ScheduleRow | None: ...
    async def list_schedules(self) -> list[ScheduleRow]: ...
    async def due_schedules(self, now: float) -> list[ScheduleRow]: ...
    async def next_schedule_fire(self) -> float | None: ...
    async def advance_schedule(self, advance: ScheduleAdvance) -> bool: ...
    async def schedule_ticks(
        self, name: str, *, statuses: Sequence[str] = (), limit: int = 50
    ) -> list[TickRow]: ...
    async def set_schedule_paused(
        self, name: str, paused: bool, now: float, next_fire: float | None
    ) -> ScheduleRow: ...
    async def delete_schedule(self, name: str) -> bool: ...
    async def active_runs(self, id_prefix: str) -> list[RunRow]: ...
    # agents: usage per model call, budgets, long-term memory, progress notes
    async def record_usage(self, row: UsageRow) -> bool: ...
    async def spent(self, agent: str, since: float) -> tuple[int, float]: ...
    async def run_spent(self, run_id: str) -> tuple[int, float]: ...
    async def usage(self, agent: str | None, since: float) -> list[UsageRow]: ...
    async def get_budget(self, agent: str) -> Budget | None: ...
    async def put_budget(self, budget: Budget, now: float) -> None: ...
    async def clear_budget(self, agent: str) -> bool: ...
    async def declare_agent(self, agent: str, spec_budget: str, now: float) -> None: ...
    async def declared_agent(self, agent: str) -> str | None: ...
    async def reserve(
        self, reservation: Reservation, limits: list[Limit], now: float
    ) -> Refusal | None: ...
    async def settle(self, reservation: Reservation, usage: UsageRow | None) -> bool: ...
    async def release_reservation(self, reservation: Reservation, state: str | None) -> None: ...
    async def reservations(self, agent: str | None, since: float) -> list[Reservation]: ...
    async def budget_parked(self, agent: str) -> list[tuple[str, int, float]]: ...
    async def budget_unpark(self, run_id: str) -> None: ...
    async def pool_spent(self, pool: str, since: float) -> tuple[int, float]: ...
    async def get_shared_budget(self, name: str) -> SharedBudget | None: ...
    async def put_shared_budget(self, budget: SharedBudget, now: float) -> None: ...
    async def clear_shared_budget(self, name: str) -> bool: ...
    async def declared_agents(self) -> list[tuple[str, str]]: ...
    async def remember(
        self, agent: str, text: str, tags: str, run_id: str | None, now: float
    ) -> int: ...
    async def recall(self, agent: str, query: str, limit: int) -> list[MemoryRow]: ...
    async def get_notes(self, agent: str) -> str: ...
    async def put_notes(self, agent: str, notes: str, run_id: str | None, now: float) -> None: ...
    async def add_note(
        self, agent: str, line: str, run_id: str | None, now: float, keep: int = 50
    ) -> str: ...
    # the worker registry: who and where workers are, when last alive
    async def worker_beat(self, row: WorkerRow) -> None: ...
    async def worker_register(
        self, row: WorkerRow, reusable: Callable[[WorkerRow], bool]
    ) -> WorkerRow | None: ...
    async def worker_stopped(self, worker_id: str, now: float) -> None: ...
    async def list_workers(self, since: float) -> list[WorkerRow]: ...
    # proof of death: leases of a dead worker's life handed back (if the registry still
    # shows that life); a session lock held for a worker's life, and the workers whose
    # session lock is free (PostgreSQL; elsewhere False and [])
    async def release_worker(self, row: WorkerRow, now: float) -> int: ...
    async def worker_session(self, row: WorkerRow) -> bool: ...
    async def sessions_gone(self, me: str, since: float) -> list[WorkerRow]: ...
    # access control: API tokens (hashed) and the append-only audit log
    async def add_token(
        self, token_id: str, name: str, digest: str, scopes: str, now: float
    ) -> None: ...
    async def find_token(self, digest: str) -> TokenRow | None: ...
    async def list_tokens(self) -> list[TokenRow]: ...
    async def revoke_token(self, token_id: str, now: float) -> bool: ...
    # dead messages: broker messages that could start no run, once per (trigger, id)
    async def add_dead_message(self, row: DeadMessage) -> bool: ...
    async def dead_messages(
        self, trigger: str | None = None, limit: int = 100
    ) -> list[DeadMessage]: ...
    async def forget_dead_message(self, trigger: str, message_id: str) -> bool: ...
    # run streams: what steps write while they run (never needed for replay)
    async def append_stream(
        self, run_id: str, rows: Sequence[tuple[str, str, str | None, float]], keep: int
    ) -> int: ...
    async def read_stream(
        self, run_id: str, after: int = -1, limit: int = 500
    ) -> list[StreamRow]: ...
    async def stream_last(self, run_id: str) -> int: ...
    # table changes: the outbox rows triggers on users' tables write, and the triggers
    # (on SQLite, on a table in the store's own file)
    async def take_changes(self, trigger: str, limit: int, build: Build, now: float) -> Taken: ...
    async def change_counts(self, trigger: str) -> tuple[int, float | None, int, str | None]: ...
    async def has_changes(self, trigger: str) -> bool: ...
    async def retry_changes(self, trigger: str) -> int: ...
    async def install_table_trigger(self, trigger: TableTrigger) -> bool: ...
    async def table_trigger_state(self, trigger: TableTrigger) -> tuple[bool, bool, bool]: ...
    async def uninstall_table_trigger(self, trigger: str) -> int: ...
    # the server's own clock, in epoch seconds (None: the store has no server, e.g. SQLite)
    async def server_time(self) -> float | None: ...
    # dashboard sessions (hashed ids); found only while unended and their token unrevoked
    async def add_session(
        self, digest: str, token_id: str, now: float, forget_before: float
    ) -> None: ...
    async def find_session(self, digest: str) -> SessionRow | None: ...
    async def touch_session(self, digest: str, now: float) -> None: ...
    async def end_session(self, digest: str, now: float) -> bool: ...
    async def audit(
        self, at: float, actor: str, action: str, target: str, detail: str,
        outcome: str = "ok", reason: str = "",
    ) -> int: ...  # fmt: skip
    async def audit_log(
        self, target: str | None = None, limit: int = 100, before: int | None = None,
        *, actor: str | None = None, since: float | None = None,
    ) -> list[AuditRow]: ...  # fmt: skip
    # agent sessions: a framework's conversation history (JSON items) under a session id
    async def agent_session_items(self, session_id: str, limit: int | None = None) -> list[str]: ...
    async def agent_session_add(self, session_id: str, items: list[str], now: float) -> None: ...
    async def agent_session_pop(self, session_id: str) -> str | None: ...
    async def agent_session_clear(self, session_id: str) -> int: ...
