"""Network partitions between workers' hosts and the database, made for real (Jepsen-style):
three workers each in a network namespace of their own, reaching a PostgreSQL server of
the test's own over a veth link; partitions longer than the lease, both ways of loss
(the host cannot reach the server; the server cannot answer), a link taken down and a
flapping link, then healed. A partitioned worker's runs are taken over after its lease;
when it heals, every late write it tries is refused by the epoch fence and it says so;
no once body runs twice and no keyed effect happens twice.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from netns import KINDS, Host, Hosts
from private_pg import PrivateServer, served_hosts
from test_chaos import Chaos, verify
from test_chaos_postgres import through_outage

from perdure.store.base import NEEDS_ATTENTION, TERMINAL

N_RUNS = 200
WORKERS = 3
CONCURRENCY = 6
LEASE = 2.0
MIN_PARTITIONS = 10
PARTITION_SECONDS = (LEASE * 1.5, LEASE * 3)  # always longer than the lease
STALL_SECONDS = 90.0


@pytest.fixture
def hosts_and_server(tmp_path: Path) -> Iterator[tuple[Hosts, PrivateServer]]:
    """The namespaces, then a server listening on their links' host ends."""
    with served_hosts(WORKERS, tmp_path / "postgresql.log") as made:
        yield made


def cut(hosts: Hosts, host: Host, kind: str, seconds: float, rng: random.Random) -> None:
    """One partition of `kind` for about `seconds`, then healed."""
    if kind == "flapping link":
        ends = time.monotonic() + seconds
        while time.monotonic() < ends:
            hosts.partition(host, "link down")
            time.sleep(rng.uniform(0.1, 0.6))
            hosts.heal(host)
            time.sleep(rng.uniform(0.05, 0.3))
        return
    hosts.partition(host, kind)
    time.sleep(seconds)
    hosts.heal(host)


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.timeout(900)
def test_partitions_never_run_a_once_body_twice(
    hosts_and_server: tuple[Hosts, PrivateServer],
    tmp_path: Path,
    chaos_app: ModuleType,
    worker_pool: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    chaos_seed: int,
) -> None:
    hosts, server = hosts_and_server
    seed, rng = chaos_seed, random.Random(chaos_seed)
    schema = f"part_{rng.randrange(1 << 40):x}"
    monkeypatch.setenv(chaos_app.STORE_URL_ENV, f"{server.url}?schema={schema}")
    workdir = tmp_path / "chaos"
    chaos_app.prepare(workdir)
    pool = worker_pool(workdir, concurrency=CONCURRENCY, lease=LEASE)
    chaos = Chaos(workdir, chaos_app, pool, rng)
    by_pid: dict[int, Host] = {}
    done_partitions: list[dict[str, Any]] = []
    t0 = time.monotonic()
    try:
        for host in hosts.hosts:
            url = f"postgresql://postgres@{host.server}:{server.port}/postgres?schema={schema}"
            proc = pool.spawn(prefix=host.run, env={chaos_app.STORE_URL_ENV: url})
            by_pid[proc.pid] = host
        chaos.start_runs(N_RUNS)
        progress = (-1, time.monotonic())
        while True:
            time.sleep(rng.uniform(0.2, 0.8))
            chaos.check_no_unexpected_deaths()
            runs = through_outage(chaos.runs)
            done = sum(r.status in TERMINAL or r.status == NEEDS_ATTENTION for r in runs.values())
            if done > progress[0]:
                progress = (done, time.monotonic())
            busy = [h for pid, h in by_pid.items()
                    if any(f":{pid}:" in (r.lease_owner or "") and r.status == "running"
                           for r in runs.values())]  # fmt: skip
            if len(done_partitions) < MIN_PARTITIONS and busy:
                host = rng.choice(busy)
                kind = KINDS[len(done_partitions) % len(KINDS)]
                seconds = rng.uniform(*PARTITION_SECONDS)
                cut(hosts, host, kind, seconds, rng)
                done_partitions.append({"host": host.namespace, "kind": kind,
                                        "seconds": round(seconds, 1), "done": done})  # fmt: skip
                progress = (done, time.monotonic())
                continue
            if done == len(runs):
                if len(done_partitions) >= MIN_PARTITIONS:
                    break
                chaos.start_runs(30)
                chaos.extra_runs += 30
            if time.monotonic() - progress[1] > STALL_SECONDS:
                pytest.fail(f"no run settled for {STALL_SECONDS}s: "
                            f"{Counter(r.status for r in runs.values())}")  # fmt: skip
        attention = sorted(r.id for r in chaos.runs().values() if r.status == NEEDS_ATTENTION)
        # The operator resolves what needs attention (a once step cut off mid-flight).
        deadline = time.monotonic() + STALL_SECONDS
        while True:
            runs = chaos.runs()
            for run in runs.values():
                if run.status == NEEDS_ATTENTION:
                    chaos.resolve(run.id)
            if all(r.status in TERMINAL for r in runs.values()):
                break
            assert time.monotonic() < deadline, Counter(r.status for r in runs.values())
            time.sleep(0.1)
        reasons = Counter(
            # the reason up to its closing explanation: "its worker W (this one) is alive
            # but lost its lease" is a worker cut off that took its own run back
            json.loads(e.data or "{}").get("reason", "").split(" (cut off")[0]
            for run_id in attention for e in chaos.app.journal(run_id)
            if e.kind == "step.needs_attention"
        )  # fmt: skip
        for proc in pool.alive():
            assert pool.stop(proc) == 0, pool.log_text(proc)[-4000:]
        lines = "\n".join(pool.log_text(p) for p in pool.procs).splitlines()
        report = verify(chaos, attention)
        report.update(
            seed=seed,
            partitions=done_partitions,
            kinds=dict(Counter(p["kind"] for p in done_partitions)),
            needs_attention_reasons=dict(reasons),
            late_writes_refused=sum("was taken over" in x for x in lines),
            leases_lost=sum("lost the lease" in x for x in lines),
            held_through_partition=sum("holding them until it is back" in x for x in lines),
            extra_runs=chaos.extra_runs,
            seconds=round(time.monotonic() - t0, 1),
        )
        summary = "partition summary: " + json.dumps(report, sort_keys=True)
        print(summary)
        with capsys.disabled():
            print("\n" + summary)
        bad = [x for x in lines if " ERROR " in x or "Traceback" in x]
        assert not bad, "worker logs show errors:\n" + "\n".join(bad[:20])
        assert len(done_partitions) >= MIN_PARTITIONS, summary
        assert report["recoveries"] > 0, f"no partition led to a takeover: {summary}"
        assert report["late_writes_refused"] + report["leases_lost"] > 0, summary
        # nothing died: each once step cut off says its worker lived but lost the lease
        assert all("is alive but lost its lease" in why for why in reasons), reasons
    except BaseException:
        print(f"partition test failed after {time.monotonic() - t0:.1f}s; {done_partitions}; "
              f"worker logs in {workdir}")  # fmt: skip
        raise
    finally:
        pool.reap()
        chaos.app.close()
