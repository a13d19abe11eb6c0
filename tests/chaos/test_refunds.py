"""The refund crash bench as a test: the refund agent of examples/refund_agent, written with
pydantic-ai (made durable by PerdureAgent or by the PerdureDurability capability) and with
the Agents SDK, and bench/refunds_claude's with the Claude Agent SDK, runs 30 conversations
on two real `perdure worker` processes while one of them is `kill -9`ed and restarted 6
times; on SQLite and PostgreSQL.

The payments and mail stubs and the scripted model server (bench/refunds_world.py) count
what happened outside: no refund or e-mail twice, none missing, every `once` tool a kill
cut short parked (never re-run unasked) and then resolved, and no model call billed again
once its response was journaled. The harness is bench/refunds.py; its counting is tested
here too, on effects made by hand.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import httpx
import pytest
from test_refunds_example import FRAMEWORK_EXTRAS

from extras_needed import require

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # bench/ is a top-level package beside src/, not installed

from bench.refunds_world import World  # noqa: E402

from bench import refunds  # noqa: E402

CONVERSATIONS = 30
KILLS = 6
CONCURRENCY = 4


def test_a_tool_steps_tool_is_read_from_every_integrations_step_name() -> None:
    """The parked or probed step's tool, whatever integration named the step (a capability
    name read as `call_tool:send_email` credited a probe's `not done` to no tool, and a
    parked refund was looked up at the mail provider)."""
    names = ["pydantic_ai:refunds.tool.send_email", "agents.refunds_once.tool.send_email",
             "refunds_once__function_toolset__<agent>.call_tool:send_email",
             "refunds.tool.send_email"]  # fmt: skip
    assert {refunds.tool_of(n) for n in names} == {"send_email"}


@pytest.mark.slow
@pytest.mark.parametrize("framework", refunds.FRAMEWORKS)
@pytest.mark.parametrize("store", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_kill_9_every_second_or_so_duplicates_nothing_and_loses_nothing(
    framework: str, store: str, tmp_path: Path, chaos_seed: int
) -> None:
    """30 refund conversations under 6 kill -9s: every one finishes (the parked ones once
    resolved), each order refunded and e-mailed exactly once, no `once` tool re-run
    unasked, and the only model calls sent again are ones a kill cut off."""
    for extra in FRAMEWORK_EXTRAS[framework]:
        require(extra)
    options = refunds.Options(
        conversations=CONVERSATIONS, concurrency=CONCURRENCY, kills_wanted=KILLS,
        seed=chaos_seed, timeout=300.0,
    )  # fmt: skip
    result = refunds.perdure_trial(framework, store, options, tmp_path)
    summary = refunds.report([result], options)
    assert result.settled, summary
    assert result.kills == KILLS, summary
    assert result.notes == [], summary
    assert (result.final_finished, result.final_needs_attention) == (CONVERSATIONS, 0), summary
    assert (result.refunds_twice, result.emails_twice, result.missing_refunds) == (0, 0, 0)
    assert result.once_rerun == 0, summary  # an interrupted once tool waited for the operator
    assert result.parked is not None and result.parked >= result.once_cut, summary
    assert result.rebilled_recorded == 0, summary
    # the Claude CLI's requests reach the model through the run's endpoint: no sender pid
    assert result.resent_not_cut == (None if framework == refunds.CLAUDE else 0), summary
    # a kill cuts off at most the one call in flight of each run the worker held
    assert 0 <= result.beyond_min <= KILLS * CONCURRENCY, summary


def test_the_counting_sees_duplicates_misses_and_once_reruns() -> None:
    """Effects made by hand against the stubs: a refund applied twice (no key), one
    deduplicated by its key, a missing one, an e-mail sent twice and a once tool begun twice
    are each counted as such."""
    world = World()
    try:
        pay, mail = world.payments.url, world.mail.url
        for _ in range(2):
            httpx.post(f"{pay}/refunds", json={"order": "o0001", "amount": 1.0})
            httpx.post(f"{pay}/refunds", json={"order": "o0002", "amount": 2.0},
                       headers={"Idempotency-Key": "refund-o0002:3"})  # fmt: skip
            httpx.post(f"{mail}/send", json={"to": "a", "order": "o0001", "body": "hi"})
            httpx.post(f"{mail}/probe", json={"tool": "send_email", "order": "o0001",
                                              "stage": "begin", "pid": 1})  # fmt: skip
        httpx.post(f"{mail}/send", json={"to": "b", "order": "o0002", "body": "hi"})
        result = refunds.Result("pydantic-ai", "plain", "-", 3)
        names = ["o0001", "o0002", "o0003"]
        variants = {o: refunds.variant(i) for i, o in enumerate(names)}
        refunds.count_outside(result, world, names, variants, Counter())
        assert (result.refunds_twice, result.emails_twice, result.missing_refunds) == (1, 1, 1)
        assert world.payments.deduplicated == 1
        assert result.once_rerun == 1
        assert result.beyond_min == -3 * refunds.TURNS  # no model call was made
        retried = Counter({("send_email", "o0001"): 1})  # the operator asked for the second
        again = refunds.Result("pydantic-ai", "perdure", "-", 3)
        refunds.count_outside(again, world, names, variants, retried)
        assert again.once_rerun == 0
    finally:
        world.stop()


@pytest.mark.slow
@pytest.mark.parametrize("framework", refunds.FRAMEWORKS)
@pytest.mark.parametrize("store", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_with_probes_no_run_waits_for_a_person(
    framework: str, store: str, tmp_path: Path, chaos_seed: int
) -> None:
    """The same under 6 kill -9s with the example's probes on the `once` tools (the payment
    ledger and the mail provider looked up by order): no run parks, every one finishes on
    its own, nothing is refunded or e-mailed twice or missing, and a `once` tool runs again
    only where its probe said not done."""
    for extra in FRAMEWORK_EXTRAS[framework]:
        require(extra)
    options = refunds.Options(
        conversations=CONVERSATIONS, concurrency=CONCURRENCY, kills_wanted=KILLS,
        seed=chaos_seed, timeout=300.0, probes=True,
    )  # fmt: skip
    result = refunds.perdure_trial(framework, store, options, tmp_path)
    summary = refunds.report([result], options)
    assert result.settled and result.kills == KILLS and result.notes == [], summary
    assert result.parked == 0 and result.resolved == "0 value, 0 retry", summary
    assert (result.final_finished, result.final_needs_attention) == (CONVERSATIONS, 0), summary
    assert (result.refunds_twice, result.emails_twice, result.missing_refunds) == (0, 0, 0)
    assert result.once_rerun == 0, summary  # each re-run was a probe's "not done"
    assert result.probe_answers.endswith("0 cannot tell"), summary
    assert result.rebilled_recorded == 0, summary
