"""What started a run, as every view shows it: the trigger kind and a short source, read
from the run's origin (its journal's `run.origin` entry, `client.origin_of`)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .client import origin_of

if TYPE_CHECKING:
    from ..store.roles import Runs


def started_by(origin: dict[str, Any]) -> tuple[str, str | None]:
    """What started a run, from its origin, the same in every view: the kind (the origin's
    first key: `message`, `schedule`, `event`, `inbox`, `webhook`, `parent`, `fork`, ...;
    `client` for none) and a short name of the source (the trigger's or schedule's name,
    the parent or forked run; None for a client call)."""
    kind = next(iter(origin), "client")
    name = origin.get(kind)
    return kind, name if isinstance(name, str) else None if name is None else str(name)


async def run_origins(store: Runs, run_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The origin of each run (its journal's first entry, `run.origin` when a trigger,
    a parent or a fork started it), read concurrently: run id -> origin ({}: a client)."""
    journals = await asyncio.gather(*(store.journal(run_id, limit=1) for run_id in run_ids))
    return {run_id: origin_of(entries) for run_id, entries in zip(run_ids, journals, strict=True)}
