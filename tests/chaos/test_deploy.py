"""A rolling deploy with real worker processes (issue 36): runs of three workflows parked
under build A; workers of build B (nap unchanged, approval changed compatibly, gate changed
incompatibly) start beside A's; A's workers stop, come back, stop for good. No run is failed
by the deploy, compatible runs upgrade and finish on B, incompatible ones finish on A while
A lives and wait with the diverging position once it is gone, `versions` says so at each
stage, and no step runs twice. Then the same with a B worker killed (-9) mid-upgrade."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import perdure
from module_files import load_file
from perdure.engine.versions import VersionsReport, versions_report

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "deploy_app.py"
deploy = load_file("perdure_deploy_app", SCRIPT)
Wait = Callable[[Callable[[], object], float, str], None]

pytestmark = pytest.mark.slow


@pytest.fixture(
    params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)],
)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh store of each kind."""
    from fresh_stores import fresh_store_url

    with fresh_store_url(request.param, tmp_path) as url:
        yield url


class Deploy:
    """The worker processes of one test, its view of the store under each build's code."""

    def __init__(self, workdir: Path, url: str) -> None:
        self.workdir, self.url = workdir, url
        self.effects = workdir / "effects.log"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.a = perdure.App(url)  # build A's code: starts runs, sends events, reads
        deploy.install(self.a, "A", self.effects)
        self.b = perdure.App(url)  # build B's code: the checkout `versions` judges
        deploy.install(self.b, "B", self.effects)

    def start(self, build: str, worker_id: str, *name: str) -> subprocess.Popen[bytes]:
        """A worker process of `build`'s code (`name`: its build name), not waited for."""
        log = self.workdir / f"{worker_id}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, str(SCRIPT), str(self.workdir), self.url, build, worker_id,
                 *name],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )  # fmt: skip
        self.procs.append(proc)
        return proc

    def spawn(self, build: str, worker_id: str) -> subprocess.Popen[bytes]:
        """A worker process of `build`'s code, once it says it is ready."""
        proc = self.start(build, worker_id)
        log = self.workdir / f"{worker_id}.log"
        deadline = time.monotonic() + 60
        while b"ready worker=" not in log.read_bytes():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"{worker_id} not ready: {log.read_text()}"
            time.sleep(0.05)
        return proc

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        self.a.close()
        self.b.close()

    def statuses(self, workflow: str) -> Counter[str]:
        return Counter(r.status for r in self.a.list_runs(workflow=workflow, limit=1000))

    def report(self) -> VersionsReport:
        return self.b.runtime.sync(versions_report(self.b.runtime), "versions")

    def effect_lines(self) -> list[dict[str, str]]:
        if not self.effects.exists():
            return []
        return [json.loads(line) for line in self.effects.read_text().splitlines()]

    def finished_by(self) -> dict[str, str]:
        return {e["run"]: e["build"] for e in self.effect_lines() if e["step"] == "finish"}

    def upgrades(self, run_id: str) -> list[dict[str, str]]:
        return [json.loads(e.data or "{}") for e in self.a.journal(run_id)
                if e.kind == "run.upgraded"]  # fmt: skip


@pytest.fixture
def rollout(tmp_path: Path, store: str) -> Iterator[Deploy]:
    d = Deploy(tmp_path, store)
    try:
        yield d
    finally:
        d.close()


def park(d: Deploy, n: int, nap: float, wait_until: Wait) -> None:
    """Start n runs of each workflow under build A, and wait until every one is parked."""
    for i in range(n):
        d.a.start("nap", f"nap-{i}", nap, run_id=f"nap-{i}")
        d.a.start("approval", f"ap-{i}", run_id=f"ap-{i}")
        d.a.start("gate", f"gate-{i}", run_id=f"gate-{i}")
    wait_until(
        lambda: d.statuses("approval")["waiting"] == n and d.statuses("gate")["waiting"] == n
        and d.statuses("nap")["sleeping"] + d.statuses("nap")["completed"] == n,
        60, "every run parked under build A",
    )  # fmt: skip


def line(report: VersionsReport, workflow: str, version: str) -> tuple[int, list[str]]:
    found = [v for v in report.lines if (v.workflow, v.version) == (workflow, version)]
    return (found[0].runs, sorted(found[0].workers)) if found else (0, [])


N = 67  # runs of each workflow (201 in all, as the issue asks)


def test_rolling_deploy(rollout: Deploy, wait_until: Wait) -> None:
    """The issue's scenario, stage by stage (see the module's docstring)."""
    d = rollout
    a1 = d.spawn("A", "a-1")
    park(d, N, nap=6.0, wait_until=wait_until)
    # before B: what B's checkout would do with the parked runs
    before = d.report()
    assert before.outlook is not None and before.outlook.upgrade == N  # approval
    assert len(before.outlook.wait) == N  # gate, at position 0
    assert {(w.workflow, w.position, w.expected, w.found) for w in before.outlook.wait} == {
        ("gate", 0, "step 'prep'", "step 'check'")
    }
    assert line(before, "gate", "gate-1") == (N, ["a-1"])
    d.spawn("B", "b-1")
    d.spawn("B", "b-2")
    # stage 1: A and B live; events for the first half
    half, quarter = N // 2, N // 4
    for i in range(half):
        d.a.send_event(f"ap-{i}", "go", "yes")
        d.a.send_event(f"gate-{i}", "approve:refund", "ok")
    first = [f"ap-{i}" for i in range(half)] + [f"gate-{i}" for i in range(half)]
    wait_until(lambda: all(d.a.get_run(r).status == "completed" for r in first), 90,
               "the first half finished")  # fmt: skip
    done = d.finished_by()
    assert {done[f"ap-{i}"] for i in range(half)} == {"B"}, "compatible: upgraded, run on B"
    assert {done[f"gate-{i}"] for i in range(half)} == {"A"}, "incompatible: run on A"
    assert all(len(d.upgrades(f"ap-{i}")) == 1 for i in range(half))
    assert d.upgrades("ap-0")[0]["from"] == "approval-1"
    assert d.upgrades("ap-0")[0]["to"] == "approval-2"
    mid = d.report()
    assert line(mid, "gate", "gate-1")[1] == ["a-1"]
    assert {b.build: b.live for b in mid.builds} == {"build-A": True, "build-B": True}
    # stage 2: A stops and comes back; a quarter more
    d.stop(a1)
    a2 = d.spawn("A", "a-2")
    for i in range(half, half + quarter):
        d.a.send_event(f"ap-{i}", "go", "yes")
        d.a.send_event(f"gate-{i}", "approve:refund", "ok")
    second = [f"gate-{i}" for i in range(half, half + quarter)]
    wait_until(lambda: all(d.a.get_run(r).status == "completed" for r in second), 90,
               "the second quarter finished")  # fmt: skip
    assert {d.finished_by()[r] for r in second} == {"A"}
    # stage 3: A gone for good; the rest
    d.stop(a2)
    for i in range(half + quarter, N):
        d.a.send_event(f"ap-{i}", "go", "yes")
        d.a.send_event(f"gate-{i}", "approve:refund", "ok")
    rest = [f"gate-{i}" for i in range(half + quarter, N)]
    wait_until(lambda: d.statuses("approval")["completed"] == N, 90, "every approval run done")
    wait_until(lambda: d.statuses("gate")["needs_attention"] == len(rest), 90,
               "the rest of the gate runs wait for gate-1")  # fmt: skip
    wait_until(lambda: d.statuses("nap")["completed"] == N, 90, "every nap run done")
    for r in rest:
        run = d.a.get_run(r)
        assert run.code_version == "gate-1"
        assert json.loads(run.error or "{}")["message"] == (
            "code changed at position 0: expected step 'prep', found step 'check'; deploy a "
            "worker of version gate-1, add patched(...), or fork"
        )
    assert {d.finished_by()[f"ap-{i}"] for i in range(N)} == {"B"}
    assert all(len(d.upgrades(f"ap-{i}")) == 1 for i in range(N))
    after = d.report()
    assert after.waiting_for_version == len(rest)
    builds = {b.build: b for b in after.builds}
    assert not builds["build-A"].live and builds["build-A"].holds == len(rest)
    assert builds["build-B"].live and builds["build-B"].drained
    # nothing failed, no step ran twice, no new step ran for an old run
    for workflow in ("nap", "approval", "gate"):
        assert d.statuses(workflow)["failed"] == 0
    runs = Counter((e["run"], e["step"]) for e in d.effect_lines())
    assert max(runs.values()) == 1, [k for k, v in runs.items() if v > 1]
    assert not [k for k in runs if k[1] in ("audit", "check")]
    # a worker of A comes back: the waiting runs finish, and build A is drained
    a3 = d.spawn("A", "a-3")
    wait_until(lambda: d.statuses("gate")["completed"] == N, 90, "the waiting gate runs done")
    assert {d.finished_by()[r] for r in rest} == {"A"}
    drained = {b.build: b.drained for b in d.report().builds}
    assert drained == {"build-A": True, "build-B": True}
    d.stop(a3)


def test_deploy_with_a_b_worker_killed_mid_upgrade(rollout: Deploy, wait_until: Wait) -> None:
    """B's first worker is killed (-9) while it upgrades the approval runs: the other B
    worker takes them over; each run is upgraded once, none fails, each finishes on B,
    and a step runs again only for a run the killed worker held (at most once more)."""
    d = rollout
    a1 = d.spawn("A", "a-1")
    park(d, N, nap=600.0, wait_until=wait_until)
    d.stop(a1)  # A gone: B's workers alone take the approval runs
    b1 = d.spawn("B", "b-1")
    for i in range(N):
        d.a.send_event(f"ap-{i}", "go", "yes")
    wait_until(lambda: any(d.upgrades(f"ap-{i}") for i in range(N)), 30, "b-1 upgrading")
    b1.kill()
    b1.wait(10)
    at_kill = d.statuses("approval")
    assert at_kill["completed"] < N, "killed mid-upgrade: some runs not upgraded or done yet"
    d.spawn("B", "b-2")
    wait_until(lambda: d.statuses("approval")["completed"] == N, 120, "every approval run done")
    assert d.statuses("approval")["failed"] == 0
    assert all(len(d.upgrades(f"ap-{i}")) == 1 for i in range(N)), "upgraded once each"
    assert {d.finished_by()[f"ap-{i}"] for i in range(N)} == {"B"}
    taken = {f"ap-{i}" for i in range(N)
             if any(e.kind == "run.recovered" for e in d.a.journal(f"ap-{i}"))}  # fmt: skip
    runs = Counter((e["run"], e["step"]) for e in d.effect_lines())
    again = {run for (run, _), count in runs.items() if count > 1}
    assert max(runs.values()) <= 2 and again <= taken, (again, taken)
    assert not [k for k in runs if k[1] in ("audit", "check")]


def test_one_build_name_with_other_code_is_refused(rollout: Deploy, wait_until: Wait) -> None:
    """A worker of B's code started as build-A while a worker of build-A lives: it exits
    with one line naming the live worker and runs nothing (the gate run stays for A)."""
    d = rollout
    d.spawn("A", "a-1")
    park(d, 2, nap=600.0, wait_until=wait_until)
    wrong = d.start("B", "b-wrong", "build-A")
    assert wrong.wait(60) == 2
    said = [x for x in (d.workdir / "b-wrong.log").read_text().splitlines() if x.strip()]
    assert said == [
        "error: build 'build-A' is run by live worker a-1 with other code: give this code "
        "another --build, or deploy the same code to both"
    ]
    d.a.send_event("gate-0", "approve:refund", "ok")
    wait_until(lambda: d.a.get_run("gate-0").status == "completed", 60, "gate-0 done on A")
    assert d.finished_by()["gate-0"] == "A"
    assert not [e for e in d.effect_lines() if e["worker"] == "b-wrong"]
