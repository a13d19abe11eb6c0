"""A `once` step cut off between intent and outcome asks its probe before a person: done
records the probe's value, not done runs the step again, and anything else (cannot tell,
an error, a timeout, a wrong answer) parks the run with the probe's answer in the reason."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

import perdure
from perdure import ProbeAnswer
from perdure.engine.context import SimulatedCrash
from perdure.testing import TestWorker


class Payments:
    """The outside world: refunds by key, and how often each was asked for or made."""

    def __init__(self) -> None:
        self.refunds: dict[str, str] = {}
        self.made: list[str] = []
        self.asked: list[str] = []
        self.crash_after_effect = False  # the worker dies right after the refund is made

    def refund(self, order: str) -> str:
        key = perdure.current_step().idempotency_key
        receipt = f"re-{order}-{len(self.made)}"
        self.refunds[key] = receipt
        self.made.append(order)
        if self.crash_after_effect:
            self.crash_after_effect = False
            raise SimulatedCrash("killed after the refund, before its outcome")
        return receipt

    def find(self, order: str) -> ProbeAnswer:
        key = perdure.current_step().idempotency_key
        self.asked.append(order)
        found = self.refunds.get(key)
        return ProbeAnswer.done(found) if found else ProbeAnswer.not_done()


def refund_app(app: perdure.App, payments: Payments, probe: Any, **options: Any) -> Any:
    @app.step(effect="once", name="refund", probe=probe, **options)
    def refund(order: str) -> str:
        return payments.refund(order)

    @app.workflow(name="return_order")
    async def return_order(order: str) -> str:
        return str(await refund(order))

    return return_order


def reasons(app: perdure.App, run_id: str) -> list[str]:
    return [
        json.loads(e.data or "{}")["reason"]
        for e in app.journal(run_id)
        if e.kind == "step.needs_attention"
    ]


def probed(app: perdure.App, run_id: str) -> list[dict[str, Any]]:
    return [json.loads(e.data or "{}") for e in app.journal(run_id) if e.kind == "step.probed"]


def crashed(app: perdure.App, worker: TestWorker, run_id: str) -> None:
    """Run until the worker dies; its lease is handed back as a dead worker's would be."""
    with pytest.raises(SimulatedCrash):
        worker.run_until_idle()
    run = app.get_run(run_id)
    app.runtime.sync(app.runtime.store.release(run.lease_owner or "", [run_id]), "release")


def test_an_effect_that_happened_is_recorded_from_the_probe(
    app: perdure.App, worker: TestWorker
) -> None:
    """The refund was made, then the worker died: the probe finds it, its value is the
    step's outcome, the refund is not made again and no person is asked."""
    payments = Payments()
    wf = refund_app(app, payments, payments.find)
    payments.crash_after_effect = True
    handle = app.start(wf, "o1", run_id="r1")
    crashed(app, worker, "r1")
    worker.run_until_idle()
    assert handle.result(timeout=5) == "re-o1-0"
    assert payments.made == ["o1"] and payments.asked == ["o1"]
    [answer] = probed(app, "r1")
    assert answer["answer"] == "done" and answer["value"] == "re-o1-0"
    assert answer["probe"].endswith("find")
    assert reasons(app, "r1") == []


def test_an_effect_that_did_not_happen_runs_again(app: perdure.App, worker: TestWorker) -> None:
    """Cut off before the refund was made: the probe says not done and the step runs again,
    once, as a new attempt with the same key; a replay never asks the probe again."""
    payments = Payments()
    wf = refund_app(app, payments, payments.find)
    handle = app.start(wf, "o2", run_id="r2")
    worker.crash_after_intent("refund")
    crashed(app, worker, "r2")
    worker.run_until_idle()
    assert handle.result(timeout=5) == "re-o2-0"
    assert payments.made == ["o2"] and payments.asked == ["o2"]
    kinds = [(e.kind, e.attempt) for e in app.journal("r2") if e.name == "refund"]
    assert kinds == [("step.intent", 1), ("step.probed", 1), ("step.intent", 2),
                     ("step.outcome", 2)]  # fmt: skip
    app.fork("r2", 1, "r2-again")  # replays the recorded step: no probe, no refund
    worker.run_until_idle()
    assert app.handle("r2-again").result(timeout=5) == "re-o2-0"
    assert payments.asked == ["o2"] and payments.made == ["o2"]


def test_a_second_interruption_asks_the_probe_again(app: perdure.App, worker: TestWorker) -> None:
    """Still `once` after a not-done answer: cut off again, the probe is asked again."""
    payments = Payments()
    wf = refund_app(app, payments, payments.find)
    handle = app.start(wf, "o3", run_id="r3")
    worker.crash_after_intent("refund")
    crashed(app, worker, "r3")
    worker.crash_after_intent("refund")
    crashed(app, worker, "r3")
    worker.run_until_idle()
    assert handle.result(timeout=5) == "re-o3-0"
    assert payments.asked == ["o3", "o3"] and payments.made == ["o3"]
    assert [a["answer"] for a in probed(app, "r3")] == ["not_done", "not_done"]


def cannot(order: str) -> ProbeAnswer:
    return ProbeAnswer.cannot_tell("the payment provider is down")


def raises(order: str) -> ProbeAnswer:
    raise ConnectionError("payments.example: connection refused\nmore detail")


def hangs(order: str) -> ProbeAnswer:
    time.sleep(3)
    return ProbeAnswer.not_done()


def wrong(order: str) -> Any:
    return {"found": False}


def misfit(order: str) -> ProbeAnswer:
    return ProbeAnswer.done({"receipt": 1})  # the step returns a str


@pytest.mark.parametrize(
    ("probe", "options", "said"),
    [
        (cannot, {}, "cannot tell (the payment provider is down)"),
        (raises, {}, "cannot tell (raised ConnectionError: payments.example: connection refused)"),
        (hangs, {"probe_timeout": 0.2}, "cannot tell (no answer within 0.2s)"),
        (wrong, {}, "cannot tell (returned dict, not a ProbeAnswer"),
        (misfit, {}, "cannot tell (said done with a value that does not fit"),
    ],
    ids=["cannot_tell", "raises", "hangs", "wrong_answer", "bad_value"],
)
def test_a_probe_that_cannot_tell_parks_the_run_with_its_answer(
    app: perdure.App, worker: TestWorker, probe: Any, options: dict[str, Any], said: str
) -> None:
    """Whatever keeps the probe from answering parks the run as before, the reason saying
    how the step was cut off and what the probe said, in one line; nothing is lost."""
    payments = Payments()
    wf = refund_app(app, payments, probe, **options)
    app.start(wf, "o4", run_id="r4")
    worker.crash_after_intent("refund")
    crashed(app, worker, "r4")
    worker.run_until_idle()
    assert app.get_run("r4").status == "needs_attention"
    [reason] = reasons(app, "r4")
    assert "between intent and outcome of a once step" in reason
    assert said in reason and "\n" not in reason
    assert payments.made == []
    [answer] = probed(app, "r4")
    assert answer["answer"] == "cannot_tell"
    app.resolve("r4", "refund", retry=True)
    worker.run_until_idle()
    assert app.handle("r4").result(timeout=5) == "re-o4-0"


def test_an_operator_asks_the_probe_again(app: perdure.App, worker: TestWorker) -> None:
    """`resolve --probe` after the world came back: the worker asks again and goes on."""
    payments = Payments()
    down = [True]

    def find(order: str) -> ProbeAnswer:
        if down[0]:
            return ProbeAnswer.cannot_tell("the payment provider is down")
        return payments.find(order)

    wf = refund_app(app, payments, find)
    payments.crash_after_effect = True
    handle = app.start(wf, "o5", run_id="r5")
    crashed(app, worker, "r5")
    worker.run_until_idle()
    assert handle.status() == "needs_attention"
    down[0] = False
    assert app.resolve("r5", "refund", probe=True) == "pending"
    worker.run_until_idle()
    assert handle.result(timeout=5) == "re-o5-0"
    assert payments.made == ["o5"]
    assert [a["answer"] for a in probed(app, "r5")] == ["cannot_tell", "done"]


def test_a_sync_workflow_asks_its_probe_too(app: perdure.App, worker: TestWorker) -> None:
    """The same recovery from a sync workflow's own thread."""
    payments = Payments()

    @app.step(effect="once", name="refund", probe=payments.find)
    def refund(order: str) -> str:
        return payments.refund(order)

    @app.workflow(name="return_sync")
    def return_sync(order: str) -> str:
        return str(refund(order))

    payments.crash_after_effect = True
    handle = app.start(return_sync, "o6", run_id="r6")
    crashed(app, worker, "r6")
    worker.run_until_idle()
    assert handle.result(timeout=5) == "re-o6-0"
    assert payments.made == ["o6"]


def test_a_probe_is_declared_where_it_can_be_used(app: perdure.App) -> None:
    """Only a `once` step has a probe, and a probe that is a registered step is `read`."""

    @app.step(effect="keyed")
    def lookup(order: str) -> ProbeAnswer:
        return ProbeAnswer.not_done()

    @app.step(effect="read")
    def look(order: str) -> ProbeAnswer:
        return ProbeAnswer.not_done()

    with pytest.raises(perdure.ConfigError, match="probe= is for once steps"):
        app.step(effect="keyed", probe=look)(lambda order: order)
    with pytest.raises(perdure.ConfigError, match="declare it effect='read'"):
        app.step(effect="once", probe=lookup)(lambda order: order)
    with pytest.raises(perdure.ConfigError, match="probe_timeout= without a probe"):
        app.step(effect="once", probe_timeout=3)(lambda order: order)
    with pytest.raises(perdure.ConfigError, match="is not a function"):
        app.step(effect="once", probe="find")(lambda order: order)  # type: ignore[call-overload]
    app.step(effect="once", name="fine", probe=look)(lambda order: order)


def test_resolve_probe_needs_a_probe(app: perdure.App, worker: TestWorker) -> None:
    """Asking again for a step without a probe is one clear line, and changes nothing."""

    @app.step(effect="once", name="pay")
    def pay() -> str:
        return "paid"

    @app.workflow(name="plain")
    async def plain() -> str:
        return str(await pay())

    app.start(plain, run_id="r7")
    worker.crash_after_intent("pay")
    crashed(app, worker, "r7")
    worker.run_until_idle()
    with pytest.raises(perdure.ConfigError, match="has no probe"):
        app.resolve("r7", "pay", probe=True)
    assert app.get_run("r7").status == "needs_attention"


def test_explain_says_what_the_probe_did_and_will_do(app: perdure.App, worker: TestWorker) -> None:
    """Before recovery, explain says the probe will be asked; after, that it settled the
    step, with the value."""
    from perdure.engine.inspection import explain

    payments = Payments()
    wf = refund_app(app, payments, payments.find)
    payments.crash_after_effect = True
    app.start(wf, "o8", run_id="r8")
    crashed(app, worker, "r8")
    [before] = explain(app.runtime, app.get_run("r8"), app.journal("r8"))
    assert before.recovery.startswith("asks probe") and "find" in before.recovery
    worker.run_until_idle()
    [after] = explain(app.runtime, app.get_run("r8"), app.journal("r8"))
    assert after.state == "done"
    assert '"re-o8-0"' in after.detail and "settled by probe" in after.detail


def test_a_probe_with_nothing_to_ask_parks_as_without_one(
    app: perdure.App, worker: TestWorker
) -> None:
    """A probe serving many calls (an agent's, for its tools) that has no question for this
    one: the run parks as a step without a probe does, and nothing of a probe is journaled."""
    payments = Payments()
    wf = refund_app(app, payments, lambda order: ProbeAnswer.not_asked())
    app.start(wf, "o9", run_id="r9")
    worker.crash_after_intent("refund")
    crashed(app, worker, "r9")
    worker.run_until_idle()
    assert app.get_run("r9").status == "needs_attention"
    [reason] = reasons(app, "r9")
    assert "probe" not in reason
    assert probed(app, "r9") == []
    assert json.loads(app.get_run("r9").error or "{}")["cause"] == "interrupted"
