"""The SQL of code versions: which build and workflow versions each worker holds, when each
version was first deployed, how a claim routes runs by version, and what `perdure versions`
reads.

A claim routes with `Routing`: per workflow whose runs are routed (policy `auto` or
`pinned`), the claimer's version and when that version was first deployed. The rules,
written once in `routing_clause`:

- a run of the claimer's version is its own, except (auto) while a live worker of a
  newer version has not yet checked it: the newer one gets to upgrade it first;
- a run of another version (auto) is claimed to be checked, unless the claimer checked it
  already (`runs.version_checked`) and a live worker of its version exists: it is left
  for that one; (pinned) only when no live worker of its version exists (then it is
  parked, never upgraded);
- a run parked for a version (`needs_attention` with `version_checked` set) is claimable
  by a worker of its version, or (auto) by one of a version that has not checked it yet.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .dialect import Db

UNFINISHED = ("pending", "running", "sleeping", "waiting", "paused", "needs_attention",
              "cancelling", "dead")  # fmt: skip


@dataclass(frozen=True, slots=True)
class Routed:
    """One routed workflow of a claimer: its version, when that version was first deployed
    (None: not recorded, so no newer version defers to it), and whether it is pinned."""

    version: str
    since: float | None
    pinned: bool = False


@dataclass(frozen=True, slots=True)
class Routing:
    """How a claim routes runs by version: the claimer's routed workflows, and since when a
    worker's last sign of life makes it live."""

    workflows: Mapping[str, Routed] = field(default_factory=dict)
    live_since: float = 0.0


# a live worker holding version `runs.code_version` of the run's workflow (but the claimer)
_LIVE = "w.stopped_at IS NULL AND w.heartbeat_at >= ?"
_SERVED = (
    "EXISTS (SELECT 1 FROM worker_versions v JOIN workers w ON w.id = v.worker_id "
    f"WHERE v.workflow = runs.workflow AND v.version = runs.code_version AND {_LIVE})"
)
# a live worker of a newer version of the run's workflow that has not checked the run yet
_NEWER = (
    "EXISTS (SELECT 1 FROM worker_versions v JOIN workers w ON w.id = v.worker_id "
    "WHERE v.workflow = runs.workflow AND v.version <> runs.code_version AND v.since > ? "
    f"AND {_LIVE} AND COALESCE(runs.version_checked, '') <> v.version)"
)
PARKED_FOR_VERSION = "status = 'needs_attention' AND version_checked IS NOT NULL"


def newer_live(conn: Db, routing: Routing) -> set[str]:
    """The claimer's workflows of which a live worker holds a newer version (first deployed
    later): only for those must a claim look, run by run, whether that one checked it yet."""
    if not any(r.since is not None for r in routing.workflows.values()):
        return set()
    rows = conn.execute(
        "SELECT DISTINCT v.workflow, v.since FROM worker_versions v JOIN workers w "
        f"ON w.id = v.worker_id WHERE {_LIVE}",
        (routing.live_since,),
    ).fetchall()
    found = set()
    for workflow, since in rows:
        mine = routing.workflows.get(workflow)
        if mine is not None and mine.since is not None and float(since) > mine.since:
            found.add(workflow)
    return found


def routing_clause(
    routing: Routing, workflows: Sequence[str], parked: bool, newer: set[str] | None = None
) -> tuple[str, list[Any]]:
    """The condition (and its parameters) a run of `workflows` meets to be claimable by this
    claimer; `parked`: for runs parked for a version (else for runnable ones); `newer`: the
    workflows a live worker holds a newer version of (`newer_live`; None: assume any)."""
    parts: list[str] = []
    params: list[Any] = []
    plain = [name for name in workflows if name not in routing.workflows]
    if plain and not parked:
        parts.append(f"runs.workflow IN ({', '.join('?' for _ in plain)})")
        params += plain
    live = routing.live_since
    for name in workflows:
        routed = routing.workflows.get(name)
        if routed is None:
            continue
        mine = routed.version
        if parked:
            if routed.pinned:
                parts.append("(runs.workflow = ? AND code_version = ?)")
                params += [name, mine]
            else:
                parts.append("(runs.workflow = ? AND (code_version = ? OR version_checked <> ?))")
                params += [name, mine, mine]
            continue
        if routed.pinned:
            parts.append(f"(runs.workflow = ? AND (code_version = ? OR NOT {_SERVED}))")
            params += [name, mine, live]
            continue
        other = f"(code_version <> ? AND (COALESCE(version_checked, '') <> ? OR NOT {_SERVED}))"
        if newer is not None and name not in newer:  # no newer version to wait for: cheap
            parts.append(f"(runs.workflow = ? AND (code_version = ? OR {other}))")
            params += [name, mine, mine, mine, live]
            continue
        since = float("inf") if routed.since is None else routed.since
        parts.append(f"(runs.workflow = ? AND ((code_version = ? AND NOT {_NEWER}) OR {other}))")
        params += [name, mine, since, live, mine, mine, live]
    if not parts:
        return "1 = 0", []
    return "(" + " OR ".join(parts) + ")", params


def record_build(
    conn: Db, worker_id: str, build: str, versions: Mapping[str, str], now: float, since: float
) -> tuple[dict[str, float], str | None]:
    """Record that worker `worker_id` (registered) runs `build` holding `versions` (workflow:
    version); each version's first deployment (kept at its first sight). Returns when each
    of its versions was first deployed, and (nothing recorded then) the id of a live worker
    (seen since `since`) that runs `build` with other code."""
    rows = conn.execute(
        "SELECT w.id, v.workflow, v.version FROM workers w LEFT JOIN worker_versions v "
        "ON v.worker_id = w.id WHERE w.build = ? AND w.id <> ? AND w.stopped_at IS NULL "
        "AND w.heartbeat_at >= ?",
        (build, worker_id, since),
    ).fetchall()
    held: dict[str, dict[str, str]] = {}
    for other, workflow, version in rows:
        held.setdefault(other, {})
        if workflow is not None:
            held[other][workflow] = version
    for other, theirs in sorted(held.items()):
        if theirs != dict(versions):
            return {}, other
    for workflow, version in versions.items():
        conn.execute(
            "INSERT INTO code_versions (workflow, version, first_seen) VALUES (?, ?, ?) "
            "ON CONFLICT (workflow, version) DO NOTHING",
            (workflow, version, now),
        )
    firsts: dict[str, float] = {}
    for workflow, version in versions.items():
        row = conn.execute(
            "SELECT first_seen FROM code_versions WHERE workflow = ? AND version = ?",
            (workflow, version),
        ).fetchone()
        firsts[workflow] = float(row[0])
    conn.execute("UPDATE workers SET build = ? WHERE id = ?", (build, worker_id))
    conn.execute("DELETE FROM worker_versions WHERE worker_id = ?", (worker_id,))
    for workflow, version in sorted(versions.items()):
        conn.execute(
            "INSERT INTO worker_versions (worker_id, workflow, version, since) VALUES (?, ?, ?, ?)",
            (worker_id, workflow, version, firsts[workflow]),
        )
    return firsts, None


@dataclass(slots=True)
class ServedRow:
    """One workflow version a worker holds, with the worker's build and liveness."""

    worker_id: str
    build: str
    host: str
    workflow: str
    version: str
    first_seen: float
    live: bool


def served_versions(conn: Db, live_since: float, since: float) -> list[ServedRow]:
    """The workflow versions of every worker heard of since `since`, live ones marked."""
    rows = conn.execute(
        "SELECT w.id, COALESCE(w.build, ''), w.host, v.workflow, v.version, v.since, "
        "CASE WHEN w.stopped_at IS NULL AND w.heartbeat_at >= ? THEN 1 ELSE 0 END "
        "FROM worker_versions v JOIN workers w ON w.id = v.worker_id "
        "WHERE w.heartbeat_at >= ? OR w.stopped_at >= ? ORDER BY v.workflow, v.since, w.id",
        (live_since, since, since),
    ).fetchall()
    return [ServedRow(r[0], r[1], r[2], r[3], r[4], float(r[5]), bool(r[6])) for r in rows]


@dataclass(slots=True)
class VersionCount:
    """Unfinished runs of one workflow version in one status; `checked`: the version whose
    check found them incompatible ('' if none did)."""

    workflow: str
    version: str
    status: str
    checked: str
    count: int


def runs_by_version(conn: Db) -> list[VersionCount]:
    """Unfinished runs counted by workflow, version, status and failed check."""
    marks = ", ".join("?" for _ in UNFINISHED)
    rows = conn.execute(
        "SELECT workflow, code_version, status, COALESCE(version_checked, ''), COUNT(*) "
        f"FROM runs WHERE status IN ({marks}) "
        "GROUP BY workflow, code_version, status, COALESCE(version_checked, '') "
        "ORDER BY workflow, code_version, status",
        UNFINISHED,
    ).fetchall()
    return [VersionCount(r[0], r[1], r[2], r[3], int(r[4])) for r in rows]


def first_deployed(conn: Db) -> dict[tuple[str, str], float]:
    """When each workflow version was first deployed by a worker."""
    rows = conn.execute("SELECT workflow, version, first_seen FROM code_versions").fetchall()
    return {(r[0], r[1]): float(r[2]) for r in rows}


def waiting_for_version(conn: Db) -> int:
    """Runs parked until a worker of their version (or a compatible one) comes."""
    row = conn.execute(f"SELECT COUNT(*) FROM runs WHERE {PARKED_FOR_VERSION}").fetchone()
    return int(row[0]) if row else 0
