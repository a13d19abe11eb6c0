"""Workers on this host that are provably dead lose their leases at once, not after expiry.

A lease owner is `host:pid:random`, or a chosen id whose host and pid the worker
registry knows. On the same host, a pid that no longer exists (or
is a zombie) cannot be executing anything, so its runs are handed back for immediate
recovery: a restart after `kill -9` resumes in well under a second. A frozen or
stopped process is alive: only its lease, and the epoch fence, decide for it. A reused
pid looks alive, so the lease decides then too; waiting is always the safe answer.
"""

from __future__ import annotations

import collections
import logging
import os
import socket
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..store.base import Store

log = logging.getLogger("perdure.worker")
RUNNING = ("running", "cancelling")
PRESENCE = 10.0  # seconds between a worker's registry updates (less with a short lease)
SILENT_AFTER = 3 * PRESENCE  # seconds without a sign of life before a worker counts as silent


def pid_gone(pid: int) -> bool:
    """True only if no live process of this host has `pid` (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # someone else's live process
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rsplit(")", 1)[-1].split()[0] == "Z"
    except OSError:
        return False  # no /proc (not Linux): alive as far as we can tell


def dead_owner(
    owner: str, me: str, host: str, registry: dict[str, tuple[str, int]] | None = None
) -> bool:
    """Is `owner` a lease owner of this host whose process is gone? A chosen id is looked
    up in `registry` (worker id -> host, pid)."""
    if owner == me:
        return False
    parts = owner.split(":", 2)
    if len(parts) == 3 and parts[1].isdigit():
        where = (parts[0], int(parts[1]))
    elif registry is not None and owner in registry:
        where = registry[owner]
    else:
        return False
    return where[0] == host and where[1] != os.getpid() and pid_gone(where[1])


async def release_dead_peers(store: Store, me: str, now: float) -> int:
    """Hand back every live lease held by a dead worker of this host; how many runs."""
    host = socket.gethostname()
    held: dict[str, list[str]] = collections.defaultdict(list)
    for run in await store.list_runs(statuses=RUNNING, limit=100_000):
        if run.lease_owner and (run.lease_until or 0) > now:
            held[run.lease_owner].append(run.id)
    registry: dict[str, tuple[str, int]] = {}
    if any(o.count(":") != 2 for o in held):  # chosen ids: where they run is registered
        registry = {w.id: (w.host, w.pid) for w in await store.list_workers(now - 86_400 * 30)}
    released = 0
    for owner, run_ids in held.items():
        if dead_owner(owner, me, host, registry):
            log.info("worker %s: %s is gone; recovering its %d run(s) now", me, owner,
                     len(run_ids))  # fmt: skip
            await store.release(owner, run_ids)
            released += len(run_ids)
    return released


async def how_lost(store: Store, owner: str | None, now: float, silent_after: float) -> str:
    """How the previous holder of a run left it, as far as this host can tell: its
    process is gone (died), it stopped, or it is alive yet lost its lease (cut off from
    the store, or frozen, for longer than the lease); for another host, whether it still
    reports to the registry."""
    if not owner:
        return "its worker was lost"
    rows = {w.id: w for w in await store.list_workers(now - 86_400 * 30)}
    row = rows.get(owner)
    if row is not None and row.stopped_at is not None:
        return f"its worker {owner} stopped"
    parts = owner.split(":", 2)
    if len(parts) == 3 and parts[1].isdigit():
        host, pid = parts[0], int(parts[1])
    elif row is not None:
        host, pid = row.host, row.pid
    else:
        return f"its worker {owner} was lost (died, or cut off from the store)"
    if host == socket.gethostname() and pid != os.getpid():
        if pid_gone(pid):
            return f"its worker {owner} died (process {pid} is gone)"
        return (f"its worker {owner} is alive but lost its lease (cut off from the store, "
                "or frozen, for longer than the lease)")  # fmt: skip
    if row is not None and now - row.heartbeat_at <= silent_after:
        return (f"its worker {owner} on {host} still reports but lost its lease (cut off "
                "from the store for longer than the lease)")  # fmt: skip
    return f"its worker {owner} on {host} went silent (died, or cut off from the store)"
