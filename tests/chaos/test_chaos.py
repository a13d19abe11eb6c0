"""kill -9 chaos: real worker processes die at random moments; every effect keeps its promise."""

from __future__ import annotations

import json
import random
import signal
import time
from collections import Counter, defaultdict
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from perdure.store.base import NEEDS_ATTENTION, TERMINAL, Entry

N_RUNS = 320  # started up front; more are added if everything settles before enough kills
EXTRA_BATCH = 20
WORKERS = 3
CONCURRENCY = 6
LEASE = 1.0
MIN_KILLS = 50
MIN_BUSY_KILLS = 35  # kills of a worker that held at least one run
FREEZE_CHANCE = 0.25  # some events SIGSTOP a busy worker past its lease instead: a zombie
CHAOS_SECONDS = 150.0  # phase 1 must settle within this
RESOLVE_SECONDS = 60.0  # phase 2 (resolve needs_attention, no kills) must finish within this


class Chaos:
    """The state of one chaos session: the app, the worker pool and what was done to them."""

    def __init__(self, workdir: Path, chaos_app: ModuleType, pool: Any, rng: random.Random):
        self.workdir = workdir
        self.mod = chaos_app
        self.app = chaos_app.build_app(workdir)
        self.pool = pool
        self.rng = rng
        self.plans: dict[str, dict[str, Any]] = {}
        self.killed: set[int] = set()
        self.frozen: dict[int, tuple[Any, float]] = {}  # pid -> (process, when to SIGCONT it)
        self.freezes = 0
        self.kills = 0
        self.busy_kills = 0
        self.extra_runs = 0
        self.cancel_at: dict[str, float] = {}
        self.cancelled: set[str] = set()
        self.stuck: list[dict[str, Any]] = []  # every needs_attention we found, with evidence
        self.spared: set[int] = set()  # pids no strike may kill or freeze (a test's witness)
        self.resolved_value = 0
        self.resolved_retry = 0

    # -- runs -------------------------------------------------------------------------

    def start_runs(self, count: int) -> None:
        for _ in range(count):
            i = len(self.plans)
            run_id = f"c{i:03d}"
            sleeps = [self._sleep(), self._sleep()]
            fail = self.rng.random() < 0.1
            workflow = "chaos_async" if i % 2 else "chaos"
            self.plans[run_id] = {"workflow": workflow, "fail": fail, "sleeps": sleeps}
            self.app.start(workflow, i, sleeps, fail, run_id=run_id)

    def _sleep(self) -> float:
        # Short sleeps stay in the worker; longer ones park the run on a store timer.
        if self.rng.random() < 0.5:
            return round(self.rng.uniform(0.05, 0.6), 3)
        return round(self.rng.uniform(1.1, 2.0), 3)

    def runs(self) -> dict[str, Any]:
        return {r.id: r for r in self.app.list_runs(limit=100_000)}

    # -- workers ----------------------------------------------------------------------

    def check_no_unexpected_deaths(self) -> None:
        for proc in self.pool.procs:
            if proc.pid not in self.killed and proc.poll() is not None:
                pytest.fail(
                    f"worker {proc.pid} exited by itself with {proc.returncode}:\n"
                    + self.pool.log_text(proc)[-4000:]
                )

    def holding(self, runs: dict[str, Any]) -> dict[int, int]:
        """How many runs each live worker holds a lease on."""
        return {
            p.pid: sum(
                1
                for r in runs.values()
                if r.status in ("running", "cancelling") and f":{p.pid}:" in (r.lease_owner or "")
            )
            for p in self.pool.alive()
        }

    def strike(self, runs: dict[str, Any]) -> None:
        """One chaos event: usually kill -9 a worker, sometimes freeze one past its lease."""
        holding = self.holding(runs)
        busy = [
            p
            for p in self.pool.alive()
            if holding[p.pid] and p.pid not in self.frozen and p.pid not in self.spared
        ]
        if busy and not self.frozen and self.rng.random() < FREEZE_CHANCE:
            victim = self.rng.choice(busy)
            victim.send_signal(signal.SIGSTOP)
            self.frozen[victim.pid] = (
                victim,
                time.monotonic() + self.rng.uniform(1.3, 2.5) * LEASE,
            )
            self.freezes += 1
        else:
            self.kill_one(holding)

    def thaw(self, everyone: bool = False) -> None:
        """SIGCONT frozen workers whose time is up (or all): they wake as zombies."""
        for pid, (proc, when) in list(self.frozen.items()):
            if everyone or time.monotonic() >= when:
                proc.send_signal(signal.SIGCONT)
                del self.frozen[pid]

    def kill_one(self, holding: dict[int, int]) -> None:
        """kill -9 a worker (frozen ones too), preferring one that holds runs; start another."""
        alive = [p for p in self.pool.alive() if p.pid not in self.spared]
        if not alive:
            return
        busy = [p for p in alive if holding[p.pid]]
        victim = self.rng.choice(busy if busy and self.rng.random() < 0.8 else alive)
        held = holding[victim.pid]
        self.killed.add(victim.pid)
        self.frozen.pop(victim.pid, None)
        self.pool.kill(victim)
        self.kills += 1
        self.busy_kills += held > 0
        if self.rng.random() < 0.3:
            time.sleep(self.rng.uniform(0.0, 0.5))  # sometimes run one worker short for a while
        self.pool.spawn()

    # -- needs_attention ----------------------------------------------------------------

    def examine_stuck(self, run_id: str) -> dict[str, Any]:
        """Prove a needs_attention run is parked on a once step that crashed mid-flight."""
        entries = self.app.journal(run_id)
        marks = [e for e in entries if e.kind == "step.needs_attention"]
        assert marks, f"{run_id} is needs_attention without a step.needs_attention entry"
        mark = marks[-1]
        assert self.mod.STEP_EFFECTS.get(mark.name) == "once", (
            f"{run_id}: needs_attention on {mark.name!r}, which is not a once step"
        )
        at_pos = [e for e in entries if e.position == mark.position]
        assert any(e.kind == "step.intent" and e.seq < mark.seq for e in at_pos), (
            f"{run_id}: needs_attention at position {mark.position} without a journaled intent"
        )
        assert not any(e.final for e in at_pos), (
            f"{run_id}: needs_attention at position {mark.position}, which has an outcome "
            f"(written before the run was parked, or by a zombie after): {at_pos}"
        )
        done = [
            r
            for r in self.mod.read_ledger(self.workdir)
            if r["run"] == run_id and r["pos"] == mark.position and r["effect"] == "once"
        ]
        assert len(done) <= 1, f"{run_id}: once step at {mark.position} ran {len(done)} times"
        evidence = {"run": run_id, "pos": mark.position, "step": mark.name, "effect_done": done}
        self.stuck.append(evidence)
        return evidence

    def resolve(self, run_id: str) -> None:
        """Act as the operator: the effect happened → mark it done; it did not → retry it."""
        evidence = self.examine_stuck(run_id)
        pos = evidence["pos"]
        if evidence["effect_done"]:
            status = self.app.resolve(run_id, pos, value=self.mod.once_value(run_id, pos))
            self.resolved_value += 1
        else:
            status = self.app.resolve(run_id, pos, retry=True)
            self.resolved_retry += 1
        assert status == "pending"


@pytest.mark.slow
@pytest.mark.timeout(290)
def test_kill_minus_nine_chaos(
    tmp_path: Path,
    chaos_app: ModuleType,
    worker_pool: Any,
    capsys: pytest.CaptureFixture[str],
    chaos_seed: int,
) -> None:
    """Random kill -9s never repeat a once, keyed or transactional effect nor corrupt a journal."""
    seed, rng = chaos_seed, random.Random(chaos_seed)
    workdir = tmp_path / "chaos"
    chaos_app.prepare(workdir)
    pool = worker_pool(workdir, concurrency=CONCURRENCY, lease=LEASE)
    chaos = Chaos(workdir, chaos_app, pool, rng)
    t0 = time.monotonic()
    try:
        for _ in range(WORKERS):
            pool.spawn()
        chaos.start_runs(N_RUNS)
        for run_id in rng.sample(sorted(chaos.plans), 10):
            chaos.cancel_at[run_id] = rng.uniform(1.0, 10.0)

        # Phase 1: kill -9 a random worker at random moments until every run has settled.
        deadline = t0 + CHAOS_SECONDS
        while True:
            time.sleep(rng.uniform(0.1, 0.7))
            chaos.check_no_unexpected_deaths()
            chaos.thaw()
            elapsed = time.monotonic() - t0
            for run_id, when in list(chaos.cancel_at.items()):
                # A frozen worker may hold SQLite's write lock: write only when none is frozen.
                if elapsed >= when and not chaos.frozen:
                    chaos.app.cancel(run_id)
                    chaos.cancelled.add(run_id)
                    del chaos.cancel_at[run_id]
            runs = chaos.runs()
            settled = all(
                r.status in TERMINAL or r.status == NEEDS_ATTENTION for r in runs.values()
            )
            if settled and chaos.frozen:
                # Wake the zombies and give them time to finish whatever step they were in
                # (and be refused) before declaring the runs settled.
                chaos.thaw(everyone=True)
                time.sleep(2 * LEASE)
                continue
            if settled and not chaos.cancel_at:
                if chaos.kills >= MIN_KILLS and chaos.busy_kills >= MIN_BUSY_KILLS:
                    break
                chaos.start_runs(EXTRA_BATCH)  # not enough kills yet: give them work to land in
                chaos.extra_runs += EXTRA_BATCH
                continue
            if time.monotonic() > deadline:
                pending = Counter(r.status for r in runs.values())
                pytest.fail(f"runs did not settle in {CHAOS_SECONDS}s under chaos: {pending}")
            chaos.strike(runs)
        t_chaos = time.monotonic() - t0

        attention_after_chaos = sorted(
            r.id for r in chaos.runs().values() if r.status == NEEDS_ATTENTION
        )

        # Phase 2: no more kills; the operator resolves every needs_attention run.
        t1 = time.monotonic()
        while True:
            chaos.check_no_unexpected_deaths()
            runs = chaos.runs()
            for run in runs.values():
                if run.status == NEEDS_ATTENTION:
                    chaos.resolve(run.id)
            if all(r.status in TERMINAL for r in runs.values()):
                break
            if time.monotonic() - t1 > RESOLVE_SECONDS:
                pending = {r.id: r.status for r in runs.values() if r.status not in TERMINAL}
                pytest.fail(f"resolved runs did not finish in {RESOLVE_SECONDS}s: {pending}")
            time.sleep(0.1)
        t_resolve = time.monotonic() - t1

        for proc in pool.alive():
            assert pool.stop(proc) == 0, pool.log_text(proc)[-4000:]
        logs = "\n".join(pool.log_text(proc) for proc in pool.procs)
        bad = [line for line in logs.splitlines() if " ERROR " in line or "Traceback" in line]
        assert not bad, "worker logs show errors:\n" + "\n".join(bad[:20])
        lease_warnings = sum(
            "refused" in line or "lost the lease" in line for line in logs.splitlines()
        )

        report = verify(chaos, attention_after_chaos)
        report.update(
            seed=seed,
            kills=chaos.kills,
            kills_of_busy_workers=chaos.busy_kills,
            freezes=chaos.freezes,
            worker_processes=len(pool.procs),
            extra_runs=chaos.extra_runs,
            resolved_with_value=chaos.resolved_value,
            resolved_by_retry=chaos.resolved_retry,
            lease_lost_warnings=lease_warnings,
            chaos_seconds=round(t_chaos, 1),
            resolve_seconds=round(t_resolve, 1),
        )
        summary = "chaos summary: " + json.dumps(report, sort_keys=True)
        print(summary)
        with capsys.disabled():
            print("\n" + summary)
        assert chaos.kills >= MIN_KILLS and chaos.busy_kills >= MIN_BUSY_KILLS, summary
        assert report["recoveries"] > 0, summary
    finally:
        pool.reap()  # first: a frozen worker holding the write lock would block close()
        chaos.app.close()


def verify(chaos: Chaos, attention_after_chaos: list[str]) -> dict[str, Any]:
    """Check every invariant on the final store, ledger, service and user table; return counts."""
    mod, workdir = chaos.mod, chaos.workdir
    runs = chaos.runs()
    assert len(runs) == len(chaos.plans)
    ledger = mod.read_ledger(workdir)
    execs: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for line in ledger:
        execs[(line["run"], line["pos"])].append(line)
    service: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
    for key, run_id, pos, token in mod.read_service(workdir):
        service[key].append((run_id, pos, token))
    tx_rows: dict[tuple[str, int], list[int]] = defaultdict(list)
    for row_id, run_id, pos, _, _ in mod.read_tx_rows(workdir):  # from the store's database
        tx_rows[(run_id, pos)].append(row_id)

    # A keyed effect happens once per key, whatever the engine re-ran.
    for key, effects in service.items():
        assert len(effects) == 1, f"key {key}: {len(effects)} effects {effects}"
        run_id, pos, _ = effects[0]
        assert key == f"{run_id}:{pos}"

    statuses: Counter[str] = Counter()
    recovered_entries = 0
    attention_marks = 0
    outcome_keys: set[tuple[str, int]] = set()
    for run_id, run in runs.items():
        plan = chaos.plans[run_id]
        statuses[run.status] += 1
        entries = chaos.app.journal(run_id)
        where = f"run {run_id} ({plan})"
        check_journal(entries, where)
        recovered_entries += sum(e.kind == "run.recovered" for e in entries)

        # The run ended as its plan says (a cancel may lose the race to the end of the run).
        if run_id in chaos.cancelled:
            assert run.status in TERMINAL, where
        elif plan["fail"]:
            assert run.status == "failed", f"{where}: {run.status} {run.error}"
            assert "flaky_step fails by design" in (run.error or ""), run.error
        else:
            assert run.status == "completed", f"{where}: {run.status} {run.error}"

        # Every needs_attention ever recorded was a once step that crashed mid-flight.
        for mark in (e for e in entries if e.kind == "step.needs_attention"):
            attention_marks += 1
            assert mod.STEP_EFFECTS.get(mark.name) == "once", f"{where}: {mark}"
            before = [e for e in entries if e.position == mark.position and e.seq < mark.seq]
            assert any(e.kind == "step.intent" for e in before), f"{where}: {mark}"
            assert not any(e.final for e in before), f"{where}: {mark}"
            # Once parked, only the operator moves the step on: no worker writes there first.
            after = [e for e in entries if e.position == mark.position and e.seq > mark.seq]
            if after:
                first = after[0]
                assert first.worker is None and first.kind in ("step.outcome", "step.retry"), (
                    f"{where}: after needs_attention at {mark.position}, {first} came first"
                )
                if first.kind == "step.outcome":
                    assert json.loads(first.data or "{}").get("resolved_by") == "operator"

        by_pos: dict[int, list[Entry]] = defaultdict(list)
        for e in entries:
            if e.position is not None:
                by_pos[e.position].append(e)
        values: dict[int, Any] = {}
        for pos, at in by_pos.items():
            name = at[0].name
            effect = mod.STEP_EFFECTS.get(name)
            if effect is None:
                continue  # sleep, values
            final = next((e for e in at if e.final), None)
            data = json.loads(final.data or "null") if final else None
            ok = final is not None and isinstance(data, dict) and "value" in data
            value = data["value"] if ok else None
            values[pos] = value
            key = f"{run_id}:{pos}"
            lines = execs.get((run_id, pos), [])
            assert all(line["key"] == key and line["step"] == name for line in lines), lines
            if ok:
                outcome_keys.add((run_id, pos))
            if effect == "once":
                assert len(lines) <= 1, f"{where}: once step at {pos} ran {len(lines)} times"
                if ok:
                    assert len(lines) == 1, f"{where}: once step at {pos} done but never ran"
                    assert value == mod.once_value(run_id, pos)
            elif effect == "keyed":
                if ok:
                    assert len(service[key]) == 1, f"{where}: keyed {key} has no effect"
                    assert value == {"key": key, "token": service[key][0][2]}, (value, service[key])
            elif effect == "transactional":
                rows = tx_rows.get((run_id, pos), [])
                if ok:
                    assert rows == [value["row"]], f"{where}: tx at {pos}: rows {rows}, {value}"
                else:
                    assert rows == [], f"{where}: tx at {pos} has rows {rows} but no outcome"
            elif effect == "idempotent" and ok:
                assert value.startswith(f"idem:{key}:")
                assert (workdir / "idem" / f"{run_id}_{pos}.txt").read_text() == value
            if ok and effect != "once":
                assert lines or effect == "transactional", f"{where}: {name} at {pos} never ran"

        # A completed run's result is exactly the outcomes its journal recorded.
        if run.status == "completed":
            result = json.loads(run.result or "null")
            recorded = {json.dumps(v, sort_keys=True) for v in values.values()}
            for label, value in result.items():
                if label != "n":
                    assert json.dumps(value, sort_keys=True) in recorded, (where, label, value)

    # Nothing happened outside that the journal does not account for.
    for (run_id, pos), lines in execs.items():
        if lines[0]["effect"] == "once":
            entries = [e for e in chaos.app.journal(run_id) if e.position == pos]
            assert any(e.kind == "step.intent" for e in entries), (
                f"once step {run_id}:{pos} ran without a journaled intent"
            )
    for (run_id, pos), rows in tx_rows.items():
        assert (run_id, pos) in outcome_keys, f"tx row {rows} for {run_id}:{pos} without outcome"

    per_effect = Counter(line["effect"] for line in ledger)
    distinct = Counter(lines[0]["effect"] for lines in execs.values())
    re_runs = {k: per_effect[k] - distinct[k] for k in per_effect}
    return {
        "runs": len(runs),
        "final_statuses": dict(statuses),
        "needs_attention_after_chaos": len(attention_after_chaos),
        "needs_attention_total": len(chaos.stuck),
        "needs_attention_marks": attention_marks,
        "needs_attention_with_effect_done": sum(bool(s["effect_done"]) for s in chaos.stuck),
        "recoveries": sum(r.recoveries for r in runs.values()),
        "recovered_entries": recovered_entries,
        "executions_per_effect": dict(per_effect),
        "re_executions_per_effect": re_runs,
        "keyed_effects": len(service),
        "transactional_rows": sum(len(v) for v in tx_rows.values()),
        "transactional_attempts_rolled_back": per_effect["transactional"]
        - sum(len(v) for v in tx_rows.values()),
        "cancel_requests": len(chaos.cancelled),
    }


def check_journal(entries: list[Entry], where: str) -> None:
    """Gap-free seq, one final entry per position, and epochs that only move forward."""
    assert [e.seq for e in entries] == list(range(len(entries))), f"{where}: seq gap"
    finals = Counter(e.position for e in entries if e.final and e.position is not None)
    assert all(n == 1 for n in finals.values()), f"{where}: positions with 2 outcomes {finals}"
    epochs = [e.epoch for e in entries if e.epoch is not None]
    assert epochs == sorted(epochs), f"{where}: a write landed under an older epoch {epochs}"
    owners: dict[int, set[str | None]] = defaultdict(set)
    for e in entries:
        if e.epoch is not None:
            owners[e.epoch].add(e.worker)
    assert all(len(w) == 1 for w in owners.values()), f"{where}: two workers in one epoch {owners}"
