"""Workers that are provably dead lose their leases at once, not after expiry.

Proof comes two ways. On this host (same name, kernel boot and pid namespace) a
worker's process is dead if its pid is gone (or a zombie), or now names a process
that started later (the pid was reused): the registry keeps each worker's boot
id, pid namespace and start time (field 22 of /proc/PID/stat). On PostgreSQL, on
any host, each worker holds a session lock for its life: a free lock means its
session ended (the process died, or the server cut it off); since a live worker
takes a new lock as soon as it reconnects, a lock counts as free only when seen
free twice, CONFIRM seconds apart, and only if taken since the server last
started (a restart frees every lock). A frozen (SIGSTOP) or partitioned worker
is alive: its pid and its session remain, and only its lease, and the epoch
fence, decide. Waiting is always the safe answer to what cannot be proven.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..store.roles import Leases, Runs, Workers
    from ..store.workers_sql import WorkerRow

    class _Releasing(Runs, Workers, Leases, Protocol):
        """What handing back dead workers' runs takes: runs, the registry, releases."""


log = logging.getLogger("perdure.worker")
RUNNING = ("running", "cancelling")
PRESENCE = 10.0  # seconds between a worker's registry updates (less with a short lease)
SILENT_AFTER = 3 * PRESENCE  # seconds without a sign of life before a worker counts as silent
PEERS_EVERY = 0.25  # seconds between checks of the registry for dead workers
# seconds a session lock must stay free before its worker counts as dead: longer than a live
# worker takes to reconnect and lock anew (~0.1 s: a 50 ms pause, a connect, two queries); a
# worker that takes longer loses its runs to recovery, fenced by the epoch, never duplicated
CONFIRM = 0.3
RECENT = 3600.0  # registry rows checked that often: workers seen within this many seconds
Life = tuple[str, int, float, "int | None"]  # one life of a worker: id, pid, start, lock key


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


def start_ticks(pid: int) -> str | None:
    """When process `pid` started, in clock ticks since boot (/proc/PID/stat field 22)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rsplit(")", 1)[-1].split()[19]  # fields from 3 on, after comm
    except (OSError, IndexError):
        return None


@functools.cache
def _machine() -> tuple[str, str] | None:
    """This kernel's boot id and this process's pid namespace (None: not Linux)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as boot:
            return boot.read().strip(), os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def this_process() -> str | None:
    """This process as the registry records it: "boot id/pid namespace/start ticks"."""
    machine, start = _machine(), start_ticks(os.getpid())
    return None if machine is None or start is None else f"{machine[0]}/{machine[1]}/{start}"


def process_dead(row: WorkerRow, host: str) -> bool:
    """Is the registered worker `row` of this host provably dead: its pid gone, or naming a
    process other than the one it registered? A worker of another machine or container
    (another boot or pid namespace) that bears this host's name cannot be judged here."""
    if row.host != host:
        return False
    if row.proc is None:  # registered by a perdure that did not record its process
        return row.pid != os.getpid() and pid_gone(row.pid)
    boot, _, rest = row.proc.partition("/")
    namespace, _, start = rest.rpartition("/")
    if _machine() != (boot, namespace):
        return False
    if row.pid == os.getpid():
        return start != start_ticks(row.pid)  # an earlier process under this pid is gone
    return pid_gone(row.pid) or start_ticks(row.pid) not in (None, start)


def dead_owner(
    owner: str, me: str, host: str, registry: dict[str, tuple[str, int]] | None = None
) -> bool:
    """Is `owner` a lease owner of this host whose process is gone? A chosen id is looked
    up in `registry` (worker id -> host, pid)."""
    if owner == me:
        return False
    where = where_of(owner, registry)
    return where is not None and where[0] == host and where[1] != os.getpid() and pid_gone(where[1])


def where_of(
    owner: str, registry: dict[str, tuple[str, int]] | None = None
) -> tuple[str, int] | None:
    """The (host, pid) a lease owner runs at: read from a `host:pid:random` id, else looked
    up in `registry` (worker id -> host, pid) for a chosen one; None if unknown."""
    parts = owner.split(":", 2)
    if len(parts) == 3 and parts[1].isascii() and parts[1].isdigit():
        return parts[0], int(parts[1])
    return registry.get(owner) if registry is not None else None


async def release_dead_peers(store: _Releasing, me: str, now: float) -> int:
    """Hand back every live lease held by a dead worker of this host; how many runs.

    The thorough pass (every lease it finds): owners the registry knows are judged by
    their registered process, unregistered `host:pid:random` owners by their pid.
    """
    host = socket.gethostname()
    held: dict[str, list[str]] = collections.defaultdict(list)
    for run in await store.list_runs(statuses=RUNNING, limit=100_000):
        if run.lease_owner and (run.lease_until or 0) > now:
            held[run.lease_owner].append(run.id)
    if not held:
        return 0
    registry = {w.id: w for w in await store.list_workers(now - 86_400 * 30)}
    released = 0
    for owner, run_ids in held.items():
        row = registry.get(owner)
        if owner == me or (row.stopped_at is not None if row else False):
            continue
        if row is not None and process_dead(row, host):
            log.info("worker %s: %s is gone; recovering its %d run(s) now", me, owner,
                     len(run_ids))  # fmt: skip
            released += await store.release_worker(row, now)
        elif row is None and dead_owner(owner, me, host):
            log.info("worker %s: %s is gone; recovering its %d run(s) now", me, owner,
                     len(run_ids))  # fmt: skip
            await store.release(owner, run_ids)
            released += len(run_ids)
    return released


def _life(row: WorkerRow) -> Life:
    return (row.id, row.pid, row.started_at, row.lock_key)


class PeerWatch:
    """One worker's watch over the registry: every PEERS_EVERY seconds, the workers whose
    process is gone (this host) or whose session ended (PostgreSQL) lose their leases."""

    def __init__(self, store: Workers, me: str, *, sessions: bool) -> None:
        self.store = store
        self.me = me
        self.sessions = sessions  # the store proves sessions (PostgreSQL)
        self.suspects: dict[Life, float] = {}  # session seen free, since (monotonic)
        self.handled: set[Life] = set()  # lives whose leases were handed back already

    def next_check_in(self) -> float:
        """Seconds until the next check: sooner while a free lock awaits confirmation."""
        if not self.suspects:
            return PEERS_EVERY
        due = min(self.suspects.values()) + CONFIRM - time.monotonic()
        return max(0.01, min(PEERS_EVERY, due))

    async def check(self, now: float) -> int:
        """Hand back the leases of every worker proven dead since the last check; how many."""
        host = socket.gethostname()
        rows = await self.store.list_workers(now - RECENT)
        dead = {
            _life(r): (r, "its process is gone")
            for r in rows
            if r.id != self.me and r.stopped_at is None and process_dead(r, host)
        }
        seen = {_life(r) for r in rows}
        if self.sessions:
            at = time.monotonic()
            free = {_life(r): r for r in await self.store.sessions_gone(self.me, now - RECENT)}
            seen |= free.keys()
            for life, row in free.items():
                if at - self.suspects.setdefault(life, at) >= CONFIRM:
                    dead.setdefault(life, (row, "its session ended"))  # free twice: no reconnect
            self.suspects = {life: since for life, since in self.suspects.items() if life in free}
        self.handled &= seen  # forget lives that left the registry's recent rows
        released = 0
        for life, (row, how) in dead.items():
            if life in self.handled:
                continue
            count = await self.store.release_worker(row, now)
            self.handled.add(life)
            if count:
                log.info("worker %s: %s is dead (%s); recovering its %d run(s) now",
                         self.me, row.id, how, count)  # fmt: skip
            released += count
        return released


async def how_lost(
    store: Workers,
    owner: str | None,
    now: float,
    silent_after: float,
    *,
    me: str | None = None,
    written_at: float | None = None,
) -> str:
    """How the previous holder of a run left it, as far as this host can tell: its
    process is gone (died), it stopped, or it is alive yet lost its lease (cut off from
    the store, or frozen, for longer than the lease); for another host, whether it still
    reports to the registry. `me`: the asking worker, `written_at`: when the holder wrote
    its last entry. A holder bearing the asker's id is the asker itself when that entry is
    no older than the asker's start (it was cut off, and took its own run back), else an
    earlier process restarted with `--id`, which had stopped, died or gone silent before
    `me` could take the id (engine/worker.py `id_reusable`)."""
    if not owner:
        return "its worker was lost"
    rows = {w.id: w for w in await store.list_workers(now - 86_400 * 30)}
    row = rows.get(owner)
    if owner == me:
        if row is not None and written_at is not None and written_at >= row.started_at:
            return (f"its worker {owner} (this one) is alive but lost its lease (cut off "
                    "from the store, or frozen, for longer than the lease)")  # fmt: skip
        return (f"its worker {owner} was restarted under the same id (the earlier process "
                "had died, stopped or gone silent)")  # fmt: skip
    if row is not None and row.stopped_at is not None:
        return f"its worker {owner} stopped"
    where = where_of(owner, {owner: (row.host, row.pid)} if row is not None else None)
    if where is None:
        return f"its worker {owner} was lost (died, or cut off from the store)"
    host, pid = where
    if host == socket.gethostname() and pid != os.getpid():
        if pid_gone(pid) or (row is not None and process_dead(row, host)):
            return f"its worker {owner} died (process {pid} is gone)"
        return (f"its worker {owner} is alive but lost its lease (cut off from the store, "
                "or frozen, for longer than the lease)")  # fmt: skip
    if row is not None and now - row.heartbeat_at <= silent_after:
        return (f"its worker {owner} on {host} still reports but lost its lease (cut off "
                "from the store for longer than the lease)")  # fmt: skip
    return f"its worker {owner} on {host} went silent (died, or cut off from the store)"


@dataclass(frozen=True, slots=True)
class WorkerState:
    """A worker's state, the same in every view (`perdure workers`, `top`, the API, the
    dashboard): `alive` (busy or idle), `stopped`, `dead` (with the proof) or `silent` (no
    sign of life for SILENT_AFTER seconds, and no proof either way: crashed, frozen or cut
    off from the store)."""

    state: str  # alive | stopped | dead | silent
    busy: bool  # alive and holding runs
    why: str  # the proof of death, how long silent, since when stopped; "" for alive

    @property
    def live(self) -> bool:
        return self.state == "alive"

    @property
    def label(self) -> str:
        """One short phrase: `alive (busy)`, `alive (idle)`, `stopped`, `dead: ...`,
        `silent: ...`."""
        if self.state == "alive":
            return "alive (busy)" if self.busy else "alive (idle)"
        return f"{self.state}: {self.why}" if self.why else self.state

    def as_dict(self) -> dict[str, object]:
        return {"state": self.state, "busy": self.busy, "why": self.why, "label": self.label}


def worker_state(
    row: WorkerRow, now: float, *, host: str | None = None, session_ended: bool = False
) -> WorkerState:
    """The one judgement of a registered worker's state at `now`: stopped if it said so;
    dead if its process is provably gone (this host: the pid is gone or names a later
    process) or, `session_ended`, its PostgreSQL session lock is free; silent if it has not
    reported for SILENT_AFTER seconds; else alive, busy while it holds runs."""
    if row.stopped_at is not None:
        return WorkerState("stopped", False, "")
    here = socket.gethostname() if host is None else host
    if process_dead(row, here):
        return WorkerState("dead", False, f"process {row.pid} is gone on this host ({here})")
    if session_ended:
        return WorkerState("dead", False, "its database session ended")
    quiet = now - row.heartbeat_at
    if quiet > SILENT_AFTER:
        return WorkerState(
            "silent", False, f"no heartbeat for {quiet:.0f}s (crashed, frozen or cut off)"
        )
    return WorkerState("alive", row.running > 0, "")


async def worker_states(
    store: Workers, now: float, since: float
) -> list[tuple[WorkerRow, WorkerState]]:
    """Every worker the registry heard of since `since`, with its `worker_state`. On
    PostgreSQL a session lock counts as ended only if seen free twice, CONFIRM seconds
    apart (a live worker that reconnects takes a new one at once)."""
    rows = await store.list_workers(since)
    free = {_life(r) for r in await store.sessions_gone("", since)}
    if free:
        await asyncio.sleep(CONFIRM)
        free &= {_life(r) for r in await store.sessions_gone("", since)}
    return [(r, worker_state(r, now, session_ended=_life(r) in free)) for r in rows]
