"""`continue_as_new`: a run ends and a successor of the same workflow starts from the top with
new arguments, in one store transaction, so a run that loops forever keeps a short journal.

The runs of one lineage are `<root>`, `<root>~2`, `<root>~3`, ... The predecessor ends
`completed` with `waiting_for = "continued:<successor>"` and a `run.continued` entry naming
the successor; the successor's journal starts with a `run.origin` entry `{"continued": <old>}`.
Handles, `result()` and a parent waiting for the run follow the lineage to its last run.
"""

from __future__ import annotations

import functools
import logging
import re
import sqlite3
from typing import TYPE_CHECKING, Any

from ..errors import PerdureError
from ..store.base import COMPLETED, NewRun
from ..store.blobs import in_row_or_blob
from .client import CONTINUED, checked_input, origin_entry
from .codec import dumps_plain

if TYPE_CHECKING:
    from .context import RunContext

log = logging.getLogger("perdure.worker")

HISTORY_WARNING = 10_000  # journal entries past which a run is told about continue_as_new
_LINK = re.compile(r"^(?P<root>.+)~(?P<n>[0-9]+)$")
_warned: set[str] = set()


class ContinueAsNew(BaseException):  # a signal, like RunSuspended
    """Unwinds a workflow that called `continue_as_new`; the runner ends the run with it."""

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        super().__init__("continue_as_new")
        self.args_ = args
        self.kwargs = kwargs


def successor_id(run_id: str) -> str:
    """The next id of a lineage: `abc` -> `abc~2`, `abc~2` -> `abc~3`."""
    found = _LINK.match(run_id)
    if found is None:
        return f"{run_id}~2"
    return f"{found['root']}~{int(found['n']) + 1}"


async def finish(ctx: RunContext, signal: ContinueAsNew) -> str:
    """End the run and create its successor in one transaction; returns the successor's id."""
    runtime = ctx.runtime
    definition, encoded = checked_input(
        runtime, ctx.run.workflow, signal.args_, signal.kwargs, "continue_as_new"
    )
    new_id = successor_id(ctx.run_id)
    while await ctx.read(functools.partial(ctx.store.get_run, new_id)) is not None:
        new_id = successor_id(new_id)  # an id taken by another run (a user's choice)
    text, blob = in_row_or_blob(encoded, runtime.blob_threshold)
    now = ctx.now()
    new = NewRun(
        id=new_id,
        workflow=definition.name,
        input=text,
        code_version=definition.version,
        now=now,
        parent_id=ctx.run.parent_id,
        deadline_at=None if definition.deadline is None else now + definition.deadline,
        queue=ctx.run.queue,
        priority=ctx.run.priority,
        partition_key=ctx.run.partition_key,
        entries=[origin_entry({"continued": ctx.run_id}, now)],
        blobs=[blob] if blob is not None else [],
    )
    link = ctx.entry("run.continued", new_id)
    result = await ctx.write(
        link,
        status=COMPLETED,
        fields={
            "result": None,
            "waiting_for": CONTINUED + new_id,
            "lease_owner": None,
            "lease_until": None,
            "wake_at": None,
        },
        new_runs=[new],
        body=functools.partial(_move_events, ctx.run_id, new_id),
    )
    if result.tx_error is not None:
        raise PerdureError(
            f"run {ctx.run_id!r}: continue_as_new could not hand its pending events over "
            f"({result.tx_error})"
        )
    runtime.notify()
    return new_id


def _move_events(old: str, new: str, raw: Any) -> str:
    """Inside the ending transaction: events the old run had not consumed go to the new one
    (in order), so none sent around the hand-over is lost. Returns the link entry's data."""
    mark = "?" if isinstance(raw, sqlite3.Connection) else "%s"  # the store's own style
    cur = raw.execute(
        f"UPDATE events SET run_id = {mark} WHERE run_id = {mark} AND consumed_at IS NULL",
        (new, old),
    )
    return dumps_plain({"run_id": new, "events": max(0, cur.rowcount)})


def warn_if_long(run_id: str, entries: int) -> None:
    """Once per run and process: a journal this long makes every wake-up replay a lot."""
    if entries <= HISTORY_WARNING or run_id in _warned:
        return
    if len(_warned) > 100_000:
        _warned.clear()
    _warned.add(run_id)
    log.warning(
        "run %s has %d journal entries (more than %d): every replay reads them all; "
        "a workflow that loops forever should call perdure.continue_as_new(...) to start "
        "over with its state as arguments",
        run_id,
        entries,
        HISTORY_WARNING,
    )
