"""kill -9 while `once` payments are made by a payment system without keys, their probe
asking it by the step's key: no payment twice and no run waiting for a person; with a probe
that sometimes cannot tell, exactly the runs it could not tell about wait, saying so."""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from fresh_stores import fresh_store_url
from perdure.store.base import NEEDS_ATTENTION, TERMINAL

RUNS = 50
PAYS = 3  # payments per run
KILLS = 20


def settled(app: Any, runs: list[str]) -> bool:
    return all(app.get_run(r).status in (*TERMINAL, NEEDS_ATTENTION) for r in runs)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("doubt", [False, True], ids=["probe", "sometimes_cannot_tell"])
@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_kill_minus_nine_with_probes_pays_once_and_asks_nobody(
    kind: str,
    doubt: bool,
    tmp_path: Path,
    chaos_app: ModuleType,
    worker_pool: Any,
    chaos_seed: int,
    wait_until: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Fifty runs of three payments, their workers killed twenty times at random moments:
    every payment is made exactly once, every interrupted payment's probe answer is in the
    journal, and no run waits for a person; with the probe unable to tell for some runs,
    exactly those of them that were interrupted wait, their reason giving its answer."""
    rng = random.Random(chaos_seed)
    workdir = tmp_path / "probes"
    with fresh_store_url(kind, tmp_path) as url:
        if kind == "postgres":
            monkeypatch.setenv(chaos_app.STORE_URL_ENV, url)
        if doubt:
            monkeypatch.setenv(chaos_app.DOUBT_ENV, "1")
        chaos_app.prepare(workdir)
        pool = worker_pool(workdir, concurrency=6, lease=30.0)
        app = chaos_app.build_app(workdir)
        runs = [f"p{i:02d}" for i in range(RUNS)]
        try:
            for run_id in runs:
                app.start("payments", run_id, run_id=run_id)
            for _ in range(KILLS):
                if settled(app, runs):
                    break
                paid = len(chaos_app.read_payments(workdir))
                proc = pool.spawn()
                wait_until(
                    lambda paid=paid: len(chaos_app.read_payments(workdir)) > paid
                    or settled(app, runs),
                    60, "a payment",
                )  # fmt: skip
                time.sleep(rng.uniform(0.0, 0.3))
                pool.kill(proc)
            proc = pool.spawn()
            wait_until(lambda: settled(app, runs), 120, "every run to settle")
            pool.kill(proc)

            payments = chaos_app.read_payments(workdir)
            made = Counter((run, pos) for _, run, pos, _ in payments)
            assert all(n == 1 for n in made.values()), [k for k, n in made.items() if n > 1]
            waiting = {r for r in runs if app.get_run(r).status == NEEDS_ATTENTION}
            told: dict[str, list[dict[str, Any]]] = {}
            for run_id in runs:
                entries = app.journal(run_id)
                answers = [json.loads(e.data or "{}") for e in entries if e.kind == "step.probed"]
                told[run_id] = answers
                # every interrupted attempt (an intent with no outcome of its own) was probed
                intents = {(e.position, e.attempt) for e in entries if e.kind == "step.intent"}
                outcomes = {(e.position, e.attempt) for e in entries if e.kind == "step.outcome"}
                asked = {(e.position, e.attempt) for e in entries if e.kind == "step.probed"}
                assert intents - outcomes <= asked, (run_id, intents - outcomes - asked)
                for answer in answers:  # a done answer is the payment's own token
                    if answer["answer"] == "done":
                        assert answer["value"] in {t for _, r, _, t in payments if r == run_id}
            cannot = {r for r, answers in told.items()
                      if any(a["answer"] == "cannot_tell" for a in answers)}  # fmt: skip
            assert waiting == cannot
            assert all(chaos_app.in_doubt(r) for r in cannot) and (doubt or not cannot)
            for run_id in waiting:
                reason = json.loads(app.get_run(run_id).error or "{}")["message"]
                assert "cannot tell (the payment system did not answer (by design))" in reason
            for run_id in set(runs) - waiting:
                assert app.get_run(run_id).status == "completed", run_id
                tokens = app.handle(run_id).result(timeout=5)
                assert sorted(tokens) == sorted(t for _, r, _, t in payments if r == run_id)
            probed = sum(len(a) for a in told.values())
            print(f"{len(payments)} payments, {probed} probe answers, {len(waiting)} waiting")
            assert probed >= 3, "too few kills landed mid-payment"
        finally:
            app.close()
