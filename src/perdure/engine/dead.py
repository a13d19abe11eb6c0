"""Dead-lettering: a run whose recoveries keep crashing their workers is parked as `dead`.

Every takeover of a lost lease journals `run.recovered`. Counted back to the
run's last progress (a final entry) or an operator's resume, they name the
workers that died holding the run without moving it. When more recoveries in
a row than the worker's `max_recoveries` have died, the run is not replayed
again: it becomes `dead`, with a `run.dead` entry holding that evidence.
`dead` ends every wait for the run; `perdure resume` replays it from its
journal again (after a fix), `perdure cancel` ends it for good.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import LeaseLost
from ..store.base import CANCELLING, DEAD, Append, Claim, Entry
from . import observers

if TYPE_CHECKING:
    from .runtime import Runtime

log = logging.getLogger("perdure.worker")


def lost_holders(entries: Sequence[Entry]) -> list[str]:
    """The workers that lost the run in a row since it last moved, oldest first.

    A lease handed back by a stopping worker is not a loss.
    """
    lost: list[str] = []
    for entry in reversed(entries):
        if entry.final or entry.kind == "run.resumed":
            break
        if entry.kind == "run.recovered":
            data = json.loads(entry.data or "{}")
            if not data.get("released"):
                lost.append(str(data.get("from")))
    lost.reverse()
    return lost


async def bury_if_poison(
    runtime: Runtime,
    claim: Claim,
    entries: Sequence[Entry],
    *,
    max_recoveries: int | None,
    now: float,
    worker_id: str,
) -> bool:
    """Make a just-recovered run `dead` if its recoveries keep dying; True if it did."""
    run = claim.run
    if max_recoveries is None or claim.recovered_from is None or run.status == CANCELLING:
        return False
    lost = lost_holders(entries)
    recoveries = len(lost) - 1  # the first loss was the run itself, not a recovery of it
    if recoveries < max_recoveries:
        return False
    last = next((e for e in reversed(entries) if e.position is not None), None)
    evidence: dict[str, Any] = {
        "recoveries": recoveries,
        "max_recoveries": max_recoveries,
        "workers": lost,
        "total_recoveries": run.recoveries,
        "last": None
        if last is None
        else {"position": last.position, "kind": last.kind, "name": last.name},
    }
    where = "" if last is None else f", last at position {last.position} ({last.kind} {last.name})"
    message = (
        f"run {run.id!r}: {recoveries} recoveries in a row crashed their workers "
        f"({', '.join(lost[-3:])}{where}); fix the cause, then `perdure resume {run.id}` "
        f"or `perdure cancel {run.id}`"
    )
    try:
        await runtime.store.append(
            Append(
                run_id=run.id,
                epoch=run.lease_epoch,
                entries=[
                    Entry(kind="run.dead", data=json.dumps(evidence), at=now, worker=worker_id)
                ],
                status=DEAD,
                fields={
                    "error": json.dumps({"type": "perdure.RunDead", "message": message}),
                    "lease_owner": None,
                    "lease_until": None,
                    "wake_at": None,
                    "updated_at": now,
                },
            )
        )
    except LeaseLost:
        return True  # another worker holds it now and will judge it itself
    log.error("%s", message)
    observers.run_parked(observers.ParkEvent(
        run.id, run.workflow, DEAD, "dead", message, f"perdure resume {run.id}",
        None if last is None else last.name, None if last is None else last.position,
    ))  # fmt: skip
    runtime.notify_change()
    return True
