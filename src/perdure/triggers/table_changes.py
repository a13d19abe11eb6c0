"""Table changes: each committed insert, update or delete on a user's table starts one run.

    @app.workflow()
    def ship(change: dict) -> None: ...

    app.on_table_change("orders", ship, on=["insert", "update"])

A transactional outbox. perdure installs a trigger on the table (at
worker start, or `perdure triggers install`) that writes each change into
perdure's `table_changes` table inside the user's own transaction, and NOTIFYs:
a rolled-back change leaves no row, a committed one always does. Every worker
LISTENs; one takes a batch of rows (others skip them), creates one run per row
with the id `table:{name}:{row id}` and deletes the rows, in one transaction. So
the run exists if and only if the change committed, once, whichever workers
race or die; a worker that was down catches up from the table.

The workflow gets the change as its one argument: `{"id", "op", "table", "key",
"row", "old", "at"}` (`key` the primary key columns, `row` the new row, `old` the
row before an update or delete, as JSON; `at` the server time of the write). A
change that cannot become a run (the workflow's input check refuses it) is kept
in the table with the reason, shown by `perdure triggers`.

On an SQLite store the table must live in the store's own file (tables that
transactional steps write, for one): perdure installs SQLite triggers there
(one per operation) writing the same outbox rows; with no NOTIFY, workers look
every second.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..engine.client import checked_input, origin_entry
from ..engine.signal import Signal
from ..engine.triggers import TriggerStatus
from ..errors import ConfigError, PerdureError
from ..store.base import NewRun
from ..store.blobs import in_row_or_blob
from .changes_sql import OPS, ChangeNotices, ChangeRow, Outbox, TableTrigger
from .ids import check_id
from .targets import check_one_argument

if TYPE_CHECKING:
    from ..engine.handles import Workflow
    from ..engine.runtime import Runtime
    from ..engine.worker import Worker

__all__ = ["TableChange", "add_table_change"]

log = logging.getLogger("perdure.table_changes")

BATCH = 200  # changes turned into runs per transaction
POLL = 5.0  # seconds between looks at the table with LISTEN (a notification lost is late)
POLL_UNLISTENED = 1.0  # without notifications (notify=False, a transaction-mode pooler)


class TableChange:
    """One `on_table_change` trigger: a worker service installing the database trigger,
    then turning the changes it records into runs (ids `table:{name}:{change id}`)."""

    kind = "table_change"

    def __init__(
        self,
        runtime: Runtime,
        table: str,
        workflow: str,
        *,
        name: str,
        ops: Sequence[str],
        notify: bool = True,
    ) -> None:
        self.runtime = runtime
        self.workflow = workflow
        self.trigger = TableTrigger(name, table, tuple(ops), notify)
        self.name = name
        self.scope = f"table:{name}"  # the run-id prefix, also in logs
        self.wake = Signal()
        self.last_error: str | None = None  # this process's last failure, for `triggers`
        self._subscribed = False

    def __repr__(self) -> str:
        return f"TableChange({self.trigger.name!r}, {self.trigger.table!r}, {self.workflow!r})"

    def run_id(self, change_id: int) -> str:
        return f"{self.scope}:{change_id}"

    async def install(self) -> bool:
        """Put the trigger on the table, or check it is there as defined; True if changed."""
        await self.runtime.open_store()
        changed = await Outbox(self.runtime.store).install_table_trigger(self.trigger)
        if changed:
            log.info("%s: trigger installed on %s", self.scope, self.trigger.table)
        return changed

    async def statuses(self, runtime: Runtime) -> list[TriggerStatus]:
        """Installed or not (or no table), with the changes not yet turned into runs."""
        t = self.trigger
        detail = f"{t.table} on {', '.join(t.ops)}"
        error = self.last_error
        try:
            table_found, installed, enabled = await Outbox(runtime.store).table_trigger_state(t)
        except PerdureError as exc:  # e.g. a table name PostgreSQL cannot parse
            return [TriggerStatus("table_change", t.name, self.workflow, "error", None,
                                  str(exc), detail)]  # fmt: skip
        pending, oldest, refused, reason = await Outbox(runtime.store).change_counts(t.name)
        if not table_found:
            state = "error"
            error = error or f"no table {t.table!r} in the store's database"
        elif not installed:
            state = "not installed"
            error = error or "start a worker or run `perdure triggers install`"
        else:
            state = "installed" if enabled else "disabled"
        if refused:
            error = f"{refused} change(s) refused; latest: {reason}"
        lag = max(0.0, runtime.clock.now() - oldest) if oldest is not None else 0.0
        return [TriggerStatus("table_change", t.name, self.workflow, state, lag, error, detail,
                              pending)]  # fmt: skip

    # -- the service ---------------------------------------------------------------

    async def run(self, worker: Worker) -> None:
        """Install, then take changes as their notifications come, until the worker stops."""
        try:
            await self.install()
        except PerdureError as exc:
            self.last_error = str(exc)
            raise  # the supervisor logs it and tries again with a backoff
        self.last_error = None
        listening = self._subscribe()
        self.wake.listen()
        poll = POLL if listening and self.trigger.notify else POLL_UNLISTENED
        outbox = Outbox(self.runtime.store)
        while not worker.stopping.is_set():
            # a read first: an idle look takes no write lock (SQLite) and no write transaction
            if await outbox.has_changes(self.trigger.name) and await self.take() >= BATCH:
                await asyncio.sleep(0)
                continue
            await _first_of(poll, self.wake, worker.stopping)

    def _subscribe(self) -> bool:
        store = self.runtime.store
        if not isinstance(store, ChangeNotices):
            return False
        if not self._subscribed:
            self._subscribed = True
            store.subscribe_changes(self._heard)
        return True

    def _heard(self, trigger: str | None) -> None:
        if trigger is None or trigger == self.trigger.name:
            self.wake.fire()

    async def take(self) -> int:
        """Turn one batch of pending changes into runs; returns how many were taken."""
        now = self.runtime.clock.now()
        taken = await Outbox(self.runtime.store).take_changes(
            self.trigger.name, BATCH, lambda change: self._new_run(change, now), now
        )
        if taken.refused:
            log.warning("%s: %d change(s) refused (see perdure triggers)", self.scope,
                        taken.refused)  # fmt: skip
        if taken.started:
            self.runtime.notify()
        return taken.started + taken.refused

    def _new_run(self, change: ChangeRow, now: float) -> NewRun | str:
        """The run of one change, or why it cannot have one (runs on the store thread)."""
        where = f"{self.scope} change {change.id}"
        try:
            definition, encoded = checked_input(
                self.runtime, self.workflow, (change.payload(),), {}, where
            )
        except PerdureError as exc:
            return str(exc)
        text, blob = in_row_or_blob(encoded, self.runtime.blob_threshold)
        origin = {"table_change": self.trigger.name, "table": change.table, "op": change.op,
                  "id": change.id}  # fmt: skip
        return NewRun(
            id=self.run_id(change.id),
            workflow=self.workflow,
            input=text,
            code_version=definition.version,
            now=now,
            deadline_at=None if definition.deadline is None else now + definition.deadline,
            queue=definition.queue,
            entries=[origin_entry(origin, now)],
            blobs=[blob] if blob is not None else [],
        )


def add_table_change(
    runtime: Runtime,
    table: str,
    workflow: Workflow[..., Any] | str,
    *,
    on: Sequence[str] = ("insert",),
    name: str | None = None,
    notify: bool = True,
) -> TableChange:
    """Start one run of `workflow` per committed change to `table`.

    Args:
        table: the table, as `name` (found through the database's search path) or
            `schema.name`, in the store's database (on SQLite: in the store's file).
        workflow: the workflow (or its name); it gets the change as its one argument.
        on: the operations that start runs: any of "insert", "update", "delete".
        name: the trigger's name, scoping the run ids (`table:{name}:{change id}`);
            default the table's name. Two triggers of one app need different names.
        notify: the trigger NOTIFYs the workers as each transaction commits, so a run
            starts within milliseconds; False saves that NOTIFY's cost on every write
            transaction (measured in docs/how-to/table-changes.md) and workers look every
            second.

    Returns:
        The `TableChange`, kept with the runtime's triggers; every worker installs its
        database trigger (idempotently) and takes its changes.

    Raises:
        ConfigError: an unknown operation or workflow, a workflow that cannot take one
            argument, or a name already taken.
    """
    wf_name = workflow if isinstance(workflow, str) else workflow.name
    label = check_id(name or table, "table change trigger name")
    where = f"table change trigger {label!r}"
    ops = [on] if isinstance(on, str) else list(on)
    unknown = [op for op in ops if op not in OPS]
    if not ops or unknown:
        raise ConfigError(f"{where}: on={on!r}; use some of {', '.join(OPS)}")
    check_one_argument(runtime, wf_name, where, "the change")
    if runtime.triggers.find(TableChange, label) is not None:
        raise ConfigError(f"two table change triggers are named {label!r}; pass name=... to one")
    ops = sorted(set(ops), key=OPS.index)
    change = TableChange(runtime, table, wf_name, name=label, ops=ops, notify=notify)
    return runtime.triggers.add(change)


async def _first_of(timeout: float, *events: Any) -> None:
    """Wait until `wake` (a Signal) fires or an asyncio.Event is set, or `timeout` seconds."""
    waiters: list[asyncio.Future[Any]] = []
    for event in events:
        if isinstance(event, Signal):
            waiters.append(asyncio.ensure_future(event.wait(timeout)))
        else:
            waiters.append(asyncio.ensure_future(event.wait()))
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
