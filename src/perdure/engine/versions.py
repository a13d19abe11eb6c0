"""Code versions across deploys: a worker's build, the check a run of another version passes
before this code executes it (upgraded, left for a worker of its version, or parked with the
diverging position), and what `perdure versions` reports.

A run records the version of its workflow it started on. A worker claiming a run of
another version first replays its journal against its own code without executing
anything (replay-check's machinery). Per workflow, `upgrade=`:

- "auto" (default): a run that replays cleanly is upgraded (a journaled `run.upgraded`
  naming both versions) and goes on; one that does not is left for a live worker of its
  version, or, with none, waits as `needs_attention` saying where the code changed;
- "pinned": never upgraded: only a worker of its version runs it (else it waits);
- "latest": no check (a divergence fails the run, as before).

A deploy never fails a parked run under "auto" or "pinned". Which runs a claim may take is
the store's routing (store/versions_sql.py); what happens once claimed is `admit`.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import ConfigError, NonDeterminismError
from ..store import versions_sql
from ..store.base import (
    CANCELLING,
    NEEDS_ATTENTION,
    PENDING,
    Append,
    Claim,
    Entry,
    RunRow,
)
from ..store.names import check
from ..store.versions_sql import Routed, Routing, ServedRow
from . import observers
from .context import ReplayEnd, RunContext
from .state import Phase

if TYPE_CHECKING:
    from ..store.roles import Store
    from .registry import WorkflowDef
    from .runtime import Runtime

UPGRADES = ("auto", "pinned", "latest")
DAY = 86_400.0


def check_upgrade(value: object, workflow: str) -> str:
    """`value` if it is an upgrade policy, else a ConfigError in one line."""
    if value not in UPGRADES:
        raise ConfigError(
            f"workflow {workflow!r}: upgrade={value!r}; use 'auto' (upgrade runs that replay "
            "cleanly), 'pinned' (only their own version) or 'latest' (no check)"
        )
    return str(value)


def check_build(name: object) -> str:
    """`name` if it may name a build (the id rule of store/names.py), else BadName."""
    return check(name, "build name")


def held_versions(workflows: Mapping[str, WorkflowDef]) -> dict[str, str]:
    """The version of each workflow this code holds."""
    return {name: definition.version for name, definition in sorted(workflows.items())}


def default_build(workflows: Mapping[str, WorkflowDef]) -> str:
    """A build name from the code: a short hash of every workflow's name and version."""
    text = "\n".join(f"{name}={version}" for name, version in held_versions(workflows).items())
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def routing(
    workflows: Mapping[str, WorkflowDef], since: Mapping[str, float], live_since: float
) -> Routing:
    """How this code's claims route runs by version; `since`: when each of its versions was
    first deployed (as the store recorded it when the worker registered)."""
    return Routing(
        {
            name: Routed(d.version, since.get(name), d.upgrade == "pinned")
            for name, d in workflows.items()
            if d.upgrade != "latest"
        },
        live_since,
    )


async def record_build(
    store: Store,
    worker_id: str,
    build: str,
    versions: Mapping[str, str],
    now: float,
    since: float,
) -> tuple[dict[str, float], str | None]:
    """Keep a worker's build and workflow versions with its presence record: when each of
    its versions was first deployed, or (nothing kept) a live worker running `build` with
    other code (seen since `since`)."""
    return await store.run_sql(
        functools.partial(versions_sql.record_build, worker_id=worker_id, build=build,
                          versions=versions, now=now, since=since),
        write=True,
    )  # fmt: skip


async def served_versions(store: Store, live_since: float, since: float) -> list[ServedRow]:
    """The workflow versions of the workers heard of since `since`, live ones marked."""
    return await store.run_sql(
        functools.partial(versions_sql.served_versions, live_since=live_since, since=since),
        write=False,
    )


@dataclass(slots=True)
class Divergence:
    """Where a run's journal and the code part: the position (None: before any), what the
    journal holds there and what the code called, and both versions."""

    run_id: str
    workflow: str
    position: int | None
    expected: str
    found: str
    run_version: str
    code_version: str

    def said(self) -> str:
        """One line: where the code changed, and what to do."""
        where = "" if self.position is None else f" at position {self.position}"
        return (
            f"code changed{where}: expected {self.expected}, found {self.found}; deploy a "
            f"worker of version {self.run_version}, add patched(...), or fork"
        )


async def check_journal(
    runtime: Runtime, run: RunRow, definition: WorkflowDef | None, entries: list[Entry]
) -> Divergence | None:
    """Replay `run`'s journal (`entries`, blobs resolved) against this code, executing
    nothing; where they part, or None if the code walks the whole journal."""
    from .runner import call_workflow, decode_input

    if definition is None:
        return Divergence(run.id, run.workflow, None, f"workflow {run.workflow!r}",
                          "no such workflow", run.code_version, "")  # fmt: skip
    ctx = RunContext(
        runtime,
        run,
        entries,
        worker_id="replay-check",
        clock=runtime.clock,
        loop=asyncio.get_running_loop(),
        sync_mode=not definition.is_async,
        inline_sleep=0.0,
    )
    ctx.update(phase=Phase.CHECKING)

    def parted(position: int | None, expected: str, found: str) -> Divergence:
        return Divergence(run.id, run.workflow, position, expected, found, run.code_version,
                          definition.version)  # fmt: skip

    try:
        args, kwargs = await decode_input(runtime, run, definition)
        await call_workflow(ctx, definition, args, kwargs, None)
    except ReplayEnd:
        return None
    except NonDeterminismError as exc:
        return parted(exc.position, exc.expected, exc.found)
    except BaseException as exc:  # anything else the replay hit is a divergence too
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return parted(ctx.position, "the recorded path", f"{type(exc).__name__}: {exc}")
    if any(e.position is not None and e.position >= ctx.position for e in entries):
        return parted(ctx.position, "more recorded calls", "workflow returned")
    return None


async def admit(runtime: Runtime, claim: Claim, *, worker_id: str, now: float) -> RunRow | None:
    """Before this code executes a claimed run of another version: the run to execute
    (upgraded, with `run.upgraded` journaled), or None if it was left for a worker of its
    version (handed back) or parked waiting for one. Runs of this version, of a workflow
    whose policy is "latest", or ending a cancel pass unchanged."""
    from .runner import load_entries

    run = claim.run
    definition = runtime.workflows[run.workflow]
    mine = definition.version
    if run.code_version == mine or definition.upgrade == "latest" or run.status == CANCELLING:
        return run
    served = await _served(runtime, run, now)
    if definition.upgrade == "pinned":
        await _leave(runtime, run, worker_id, now, None, served, "pinned")
        return None
    parted = None
    if not claim.empty_journal:
        parted = await check_journal(runtime, run, definition, await load_entries(runtime, run.id))
    if parted is not None:
        await _leave(runtime, run, worker_id, now, parted, served, "auto")
        return None
    record = {"from": run.code_version, "to": mine, "worker": worker_id}
    await runtime.store.append(Append(
        run.id, run.lease_epoch,
        [Entry(kind="run.upgraded", data=json.dumps(record), at=now, worker=worker_id)],
        fields={"code_version": mine, "version_checked": None},
    ))  # fmt: skip
    run.code_version = mine
    return run


async def _served(runtime: Runtime, run: RunRow, now: float) -> bool:
    """Whether a live worker (but this one) holds the run's version of its workflow."""
    from .peers import SILENT_AFTER

    rows = await served_versions(runtime.store, now - SILENT_AFTER, now - SILENT_AFTER)
    return any(
        r.live and r.workflow == run.workflow and r.version == run.code_version for r in rows
    )


async def _leave(
    runtime: Runtime,
    run: RunRow,
    worker_id: str,
    now: float,
    parted: Divergence | None,
    served: bool,
    policy: str,
) -> None:
    """Hand the run back for a live worker of its version (`served`), else park it as
    needs_attention saying why; either way this version is recorded as having checked it."""
    mine = runtime.workflows[run.workflow].version
    if parted is not None:
        why = parted.said()
    else:
        why = (f"pinned to version {run.code_version} (this code is {mine}); deploy a worker "
               f"of version {run.code_version}, or fork")  # fmt: skip
    data: dict[str, object] = {
        "version": run.code_version,
        "checked_by": mine,
        "policy": policy,
        "reason": why,
    }
    if parted is not None:
        data.update(position=parted.position, expected=parted.expected, found=parted.found)
    unleased = {"lease_owner": None, "lease_until": None, "wake_at": None}
    if served:
        entry = Entry(kind="run.left", data=json.dumps(data), at=now, worker=worker_id)
        await runtime.store.append(Append(
            run.id, run.lease_epoch, [entry], status=PENDING,
            fields={"version_checked": mine, "updated_at": now, **unleased},
        ))  # fmt: skip
        runtime.notify()
        return
    position = None if parted is None else parted.position
    record = {"type": "perdure.NeedsAttention", "message": why, "step": None,
              "position": position, "cause": "version"}  # fmt: skip
    entry = Entry(kind="run.version_wait", data=json.dumps(data), at=now, worker=worker_id)
    await runtime.store.append(Append(
        run.id, run.lease_epoch, [entry], status=NEEDS_ATTENTION,
        fields={"version_checked": mine, "error": json.dumps(record), "updated_at": now,
                **unleased},
    ))  # fmt: skip
    observers.run_parked(observers.ParkEvent(
        run.id, run.workflow, NEEDS_ATTENTION, "version", why,
        f"deploy a worker of version {run.code_version}, or perdure fork {run.id}",
    ))  # fmt: skip


# -- what `perdure versions` reports -----------------------------------------------------------


@dataclass(slots=True)
class VersionLine:
    """Unfinished runs of one workflow version: how many in each status, how many wait for a
    worker of it, which live workers (and builds) hold it, and whether this code has it."""

    workflow: str
    version: str
    runs: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    waiting: int = 0
    workers: list[str] = field(default_factory=list)
    builds: list[str] = field(default_factory=list)
    first_deployed: float | None = None
    current: bool = False


@dataclass(slots=True)
class BuildLine:
    """A build seen lately: its live workers, and how many unfinished runs of its versions
    no other live build holds (0: drained, its last worker may stop)."""

    build: str
    workers: list[str]
    live: bool
    versions: dict[str, str]
    holds: int = 0
    drained: bool = True


@dataclass(slots=True)
class Outlook:
    """For this checkout: runs of other versions that would upgrade, and those that would
    wait (each with where its code changed)."""

    upgrade: int = 0
    wait: list[Divergence] = field(default_factory=list)
    pinned: int = 0  # runs of other versions of pinned workflows: they wait for their own


@dataclass(slots=True)
class VersionsReport:
    lines: list[VersionLine]
    builds: list[BuildLine]
    outlook: Outlook | None
    waiting_for_version: int


async def versions_report(
    runtime: Runtime, *, check_code: bool = True, since: float = DAY, limit: int = 100_000
) -> VersionsReport:
    """Unfinished runs by workflow and version, the workers and builds serving each, which
    builds drained, and (`check_code`) what this checkout would do with runs of other
    versions: each such run's journal replayed against it, executing nothing."""
    from .peers import SILENT_AFTER

    await runtime.open_store()
    store = runtime.store
    now = runtime.clock.now()
    served = await served_versions(store, now - SILENT_AFTER, now - since)
    counts = await store.run_sql(versions_sql.runs_by_version, write=False)
    firsts = await store.run_sql(versions_sql.first_deployed, write=False)
    lines: dict[tuple[str, str], VersionLine] = {}

    def line(workflow: str, version: str) -> VersionLine:
        key = (workflow, version)
        if key not in lines:
            here = runtime.workflows.get(workflow)
            ours = here is not None and here.version == version
            lines[key] = VersionLine(workflow, version, first_deployed=firsts.get(key),
                                     current=ours)  # fmt: skip
        return lines[key]

    for c in counts:
        found = line(c.workflow, c.version)
        found.runs += c.count
        found.statuses[c.status] = found.statuses.get(c.status, 0) + c.count
        if c.status == NEEDS_ATTENTION and c.checked:
            found.waiting += c.count
    builds: dict[str, BuildLine] = {}
    for r in served:
        if r.live:
            held = line(r.workflow, r.version)
            if r.worker_id not in held.workers:
                held.workers.append(r.worker_id)
            if r.build not in held.builds:
                held.builds.append(r.build)
        b = builds.setdefault(r.build, BuildLine(r.build, [], False, {}))
        b.versions[r.workflow] = r.version
        b.live = b.live or r.live
        if r.live and r.worker_id not in b.workers:
            b.workers.append(r.worker_id)
    for b in builds.values():
        for workflow, version in b.versions.items():
            holding = lines.get((workflow, version))
            if holding is None or not holding.runs:
                continue
            others = [x for x in holding.builds if x != b.build]
            if not others:
                b.holds += holding.runs
        b.drained = b.holds == 0
    outlook = None
    if check_code:
        from .inspection import replay_check

        outlook = (await replay_check(runtime, limit)).outlook
    ordered = sorted(lines.values(), key=lambda v: (v.workflow, v.first_deployed or 0, v.version))
    waiting = sum(v.waiting for v in ordered)
    return VersionsReport(ordered, sorted(builds.values(), key=lambda b: b.build), outlook,
                          waiting)  # fmt: skip


def summary(outlook: Outlook) -> str:
    """One line: what this checkout would do with runs of other versions."""
    parts = [f"{outlook.upgrade} run(s) of other versions would upgrade",
             f"{len(outlook.wait)} would wait for a worker of their version"]  # fmt: skip
    if outlook.pinned:
        parts.append(f"{outlook.pinned} pinned to their version")
    return ", ".join(parts)


def divergences_by_workflow(wait: Iterable[Divergence]) -> dict[tuple[str, str], list[Divergence]]:
    """The waiting runs grouped by workflow and recorded version."""
    grouped: dict[tuple[str, str], list[Divergence]] = {}
    for d in wait:
        grouped.setdefault((d.workflow, d.run_version), []).append(d)
    return grouped


def report_json(report: VersionsReport) -> dict[str, object]:
    """The report as JSON-ready data (the CLI's --json, the API)."""
    from dataclasses import asdict

    outlook = report.outlook
    return {
        "versions": [asdict(line) for line in report.lines],
        "builds": [asdict(b) for b in report.builds],
        "waiting_for_version": report.waiting_for_version,
        "checkout": None
        if outlook is None
        else {
            "upgrade": outlook.upgrade,
            "pinned": outlook.pinned,
            "wait": [{**asdict(d), "reason": d.said()} for d in outlook.wait],
            "summary": summary(outlook),
        },
    }
