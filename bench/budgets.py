"""Figure B1: budgets under concurrency. 10, 50 and 200 concurrent agent runs against a
budget B, on SQLite and PostgreSQL, each run one model call to a counting OpenAI-compatible
server on 127.0.0.1 that bills the prompt and the full max_tokens (the worst case).

Printed per store and N: spent/B (goal <= 1.00), requests served vs recorded (settled usage
rows plus calls held at their estimate; goal equal), runs woken when B is doubled and
spent/2B after, and the cost of a reservation (reserve + settle) per model call, measured
alone on the store (goal < 1 ms on SQLite). Figure B2: the same for a budget B shared by two
agents (`[budget] shared = "team"`), N/2 runs of each at once: spent/B of the shared budget.

    .venv/bin/python -m bench.budgets [--no-pg]
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from perdure.agent.budget_sql import Budgets

from .common import ROOT, Table

sys.path.insert(0, str(ROOT / "tests" / "agent"))  # the counting server the tests use

PG_URL = os.environ.get("PERDURE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")
COUNTS = (10, 50, 200)
PER_CALL = 1200  # about what one call may take (prompt + max_tokens 1000)


def _store_url(kind: str, folder: Path) -> tuple[str, str | None]:
    if kind == "sqlite":
        return f"sqlite:///{folder}/b-{uuid.uuid4().hex[:6]}.db", None
    schema = f"perdure_bench_budgets_{uuid.uuid4().hex[:8]}"
    return f"{PG_URL}?schema={schema}", schema


def _drop(schema: str | None) -> None:
    if schema is None:
        return
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def measure(kind: str, runs: int, folder: Path) -> dict[str, Any]:
    """One row: N runs against B = 40% of what they would spend, then B doubled."""
    from wire_servers import COUNTING_SPEC, CountingServer

    import perdure
    from perdure.agent.budget_sql import Budget
    from perdure.agent.loop import Agent, raise_budget
    from perdure.agent.spec import load_spec
    from perdure.testing import TestWorker

    server = CountingServer(latency=0.05).start()
    url, schema = _store_url(kind, folder)
    budget = int(runs * PER_CALL * 0.4)
    spec = folder / f"bench-{kind}-{runs}.toml"
    text = COUNTING_SPEC.format(
        name="bench", base=server.origin, key_env="PERDURE_BENCH_KEY",
        budget=f"tokens_per_day = {budget}",
    )  # fmt: skip
    spec.write_text(text)
    app = perdure.App(url)
    try:
        agent = Agent(app.runtime, load_spec(spec))
        for i in range(runs):
            app.start(agent.workflow, {"prompt": f"question {i}"}, run_id=f"b{i}")
        TestWorker(app, concurrency=runs).run_until_idle()
        spent = sum(s.total for s in server.served)
        raised = Budget("bench", tokens_per_day=2 * budget)
        woken = app.runtime.sync(raise_budget(app.runtime, "bench", raised), "raise")
        TestWorker(app, concurrency=runs).run_until_idle()
        spent2 = sum(s.total for s in server.served)
        usage = app.runtime.sync(Budgets(app.runtime.store).usage("bench", 0.0), "usage")
        held = app.runtime.sync(Budgets(app.runtime.store).reservations("bench", 0.0), "held")
        return {"store": kind, "runs": runs, "B": budget, "spent/B": spent / budget,
                "served": len(server.served), "recorded": len(usage) + len(held),
                "woken": woken, "spent/2B": spent2 / (2 * budget)}  # fmt: skip
    finally:
        app.close()
        server.stop()
        _drop(schema)


def measure_shared(kind: str, runs: int, folder: Path) -> dict[str, Any]:
    """One row: N/2 runs of each of two agents sharing B = 40% of what they would spend,
    all at once, then B doubled."""
    from wire_servers import COUNTING_SPEC, CountingServer

    import perdure
    from perdure.agent import budgets
    from perdure.agent.budget_sql import SharedBudget
    from perdure.agent.loop import Agent
    from perdure.agent.spec import load_spec
    from perdure.testing import TestWorker

    server = CountingServer(latency=0.05).start()
    url, schema = _store_url(kind, folder)
    budget = int(runs * PER_CALL * 0.4)
    app = perdure.App(url)
    try:
        agents = []
        for name in ("alpha", "beta"):
            spec = folder / f"bench-{kind}-{runs}-{name}.toml"
            spec.write_text(COUNTING_SPEC.format(
                name=name, base=server.origin, key_env="PERDURE_BENCH_KEY",
                budget='shared = "team"',
            ))  # fmt: skip
            agent = Agent(app.runtime, load_spec(spec))
            app.runtime.sync(budgets.declare(app.runtime, agent.spec), "declare")
            agents.append(agent)
        limit = SharedBudget("team", tokens_per_day=budget)
        app.runtime.sync(budgets.set_shared(app.runtime, "team", limit), "shared")
        for i in range(runs):
            agent = agents[i % 2]
            app.start(agent.workflow, {"prompt": f"question {i}"}, run_id=f"s{i}")
        TestWorker(app, concurrency=runs).run_until_idle()
        spent = sum(s.total for s in server.served)
        doubled = SharedBudget("team", tokens_per_day=2 * budget)
        woken = app.runtime.sync(budgets.set_shared(app.runtime, "team", doubled), "raise")
        TestWorker(app, concurrency=runs).run_until_idle()
        spent2 = sum(s.total for s in server.served)
        usage = app.runtime.sync(Budgets(app.runtime.store).usage(None, 0.0), "usage")
        held = app.runtime.sync(Budgets(app.runtime.store).reservations(None, 0.0), "held")
        per_agent = {a.spec.name: sum(u.input_tokens + u.output_tokens for u in usage
                                      if u.agent == a.spec.name) for a in agents}  # fmt: skip
        return {"store": kind, "runs": runs, "B": budget, "spent/B": spent / budget,
                "served": len(server.served), "recorded": len(usage) + len(held),
                "woken": woken, "spent/2B": spent2 / (2 * budget),
                "split": f"{per_agent['alpha']}/{per_agent['beta']}"}  # fmt: skip
    finally:
        app.close()
        server.stop()
        _drop(schema)


def reservation_cost(kind: str, folder: Path, calls: int = 300) -> float:
    """Milliseconds of one reserve + settle, on the store alone (one caller)."""
    import perdure
    from perdure.agent.budget_sql import Limit, Reservation, UsageRow

    url, schema = _store_url(kind, folder)
    app = perdure.App(url)

    async def loop() -> float:
        await app.runtime.open_store()
        store = app.runtime.store
        limits = [Limit("this day", 86400.0, 10**12, None), Limit("this hour", 3600.0, 10**12)]
        began = time.perf_counter()
        for i in range(calls):
            held = Reservation(f"r{i}", 1, 0, "bench", "fast", "m", 1200, 0.001, "open", 0.0)
            now = time.time()
            assert await Budgets(store).reserve(held, limits, now) is None
            used = UsageRow(f"r{i}", 1, "bench", "m", 100, 900, 0.001, now)
            await Budgets(store).settle(held, used)
        return (time.perf_counter() - began) * 1000 / calls

    try:
        return float(app.runtime.sync(loop(), "bench"))
    finally:
        app.close()
        _drop(schema)


def main() -> None:
    os.environ.setdefault("PERDURE_BENCH_KEY", "k")
    kinds = ["sqlite"] if "--no-pg" in sys.argv else ["sqlite", "postgres"]
    with tempfile.TemporaryDirectory(prefix="perdure-bench-budgets-") as tmp:
        folder = Path(tmp)
        table = Table(
            "B1. Budgets under concurrency (one call per run, the worst case billed; served "
            "and recorded: both phases)",
            ["store", "runs", "B", "spent/B", "woken at 2B", "spent/2B", "served", "recorded"],
        )
        for kind in kinds:
            for runs in COUNTS:
                row = measure(kind, runs, folder)
                table.rows.append([
                    row["store"], str(row["runs"]), str(row["B"]), f"{row['spent/B']:.3f}",
                    str(row["woken"]), f"{row['spent/2B']:.3f}", str(row["served"]),
                    str(row["recorded"]),
                ])  # fmt: skip
                print(table.rows[-1], flush=True)
        print(table.render())
        shared = Table(
            "B2. A budget shared by two agents (N/2 runs of each at once; spent/B of the "
            "shared budget; tokens alpha/beta)",
            ["store", "runs", "B", "spent/B", "woken at 2B", "spent/2B", "served", "recorded",
             "alpha/beta"],
        )  # fmt: skip
        for kind in kinds:
            for runs in COUNTS:
                row = measure_shared(kind, runs, folder)
                shared.rows.append([
                    row["store"], str(row["runs"]), str(row["B"]), f"{row['spent/B']:.3f}",
                    str(row["woken"]), f"{row['spent/2B']:.3f}", str(row["served"]),
                    str(row["recorded"]), row["split"],
                ])  # fmt: skip
                print(shared.rows[-1], flush=True)
        print(shared.render())
        for kind in kinds:
            print(f"reservation (reserve + settle) on {kind}: "
                  f"{reservation_cost(kind, folder):.3f} ms per model call")  # fmt: skip


if __name__ == "__main__":
    main()
