"""Probes of tools run through PerdureDurability: `tool_probes=`, `@perdure_tool(effect=
"once", probe=...)` and tool metadata `{"perdure": {"probe": ...}}`. A real pydantic-ai Agent
(FunctionModel, scripted) with `capabilities=[PerdureDurability(app)]` in a perdure
workflow; a crash inside the once refund tool: recovery asks the probe with the call's own
arguments: done settles the call with the probe's value (the tool not run again), not done
runs it again, cannot tell parks the run with the probe's answer in the reason."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from extras_needed import needs

pytest.importorskip("pydantic_ai", reason=needs("pydantic-ai"))

from crashes import app_module, kill_all, worker_process
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import perdure
from crash_steps import crash_after, recover
from perdure import ProbeAnswer
from perdure.agent.tool_probes import INTERRUPTED
from perdure.errors import ConfigError
from perdure.integrations.pydantic_ai import perdure_tool
from perdure.integrations.pydantic_durability import PerdureDurability
from perdure.testing import TestClock, TestWorker
from waits import wait_for

REFUND = "shop__function_toolset__<agent>.call_tool:issue_refund"


class Ledger:
    """The payment system the refund tool pays through and the probe reads."""

    def __init__(self) -> None:
        self.refunds: dict[str, list[str]] = {}
        self.calls = 0  # how often the refund tool's body ran
        self.asked: list[dict[str, Any]] = []  # each probe call's arguments
        self.cannot_tell = False

    def refund(self, order: str, amount: float) -> str:
        self.calls += 1
        refund_id = f"rf-{order}-{self.calls}"
        self.refunds.setdefault(order, []).append(refund_id)
        return f"refunded {amount:g} as {refund_id}"

    async def find(self, order: str, amount: float) -> ProbeAnswer:
        self.asked.append({"order": order, "amount": amount})
        if self.cannot_tell:
            return ProbeAnswer.cannot_tell("the payment API answers 503")
        found = self.refunds.get(order)
        if found:
            return ProbeAnswer.done(f"refunded {amount:g} as {found[0]}")
        return ProbeAnswer.not_done()


class Script:
    """A FunctionModel script: refund order o42 once, then answer with the tool's result."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.calls += 1
        returns = [p for m in messages for p in getattr(m, "parts", [])
                   if p.part_kind == "tool-return"]  # fmt: skip
        if not returns:
            part = ToolCallPart("issue_refund", {"order": "o42", "amount": 12.5}, "c1")
            return ModelResponse(parts=[part])
        return ModelResponse(parts=[TextPart(f"done: {returns[0].content}")])


def shop(
    app: perdure.App,
    ledger: Ledger,
    *,
    declare: str = "perdure_tool",
    pays_before_the_crash: bool = False,
    probe: Any = None,
) -> Any:
    """The refund agent's workflow; the refund's probe declared by `declare`: on the tool
    (`perdure_tool`), in `tool_probes`, or in the tool's metadata. `pays_before_the_crash`:
    the refund pays before crash_after kills the worker."""
    probe = probe if probe is not None else ledger.find
    mapping = {"issue_refund": probe} if declare == "tool_probes" else None
    durability = PerdureDurability(app, tool_probes=mapping)
    agent: Any = Agent(FunctionModel(Script()), name="shop", capabilities=[durability])

    def issue_refund(order: str, amount: float) -> str:
        """Refund an order."""
        return ledger.refund(order, amount)

    if declare == "perdure_tool":
        agent.tool_plain(perdure_tool(effect="once", probe=probe)(issue_refund))
    elif declare == "metadata":
        agent.tool_plain(metadata={"perdure": {"effect": "once", "probe": probe}})(issue_refund)
    else:
        agent.tool_plain(issue_refund)
    if pays_before_the_crash:
        ledger.refund("o42", 12.5)  # the world as the killed attempt left it: paid

    @app.workflow(name="shop")
    async def run_agent(prompt: str) -> Any:
        return (await agent.run(prompt)).output

    return run_agent


def probed(app: perdure.App, run_id: str) -> list[dict[str, Any]]:
    """The journaled probe answers of the run."""
    return [json.loads(e.data or "{}") for e in app.journal(run_id) if e.kind == "step.probed"]


def reason(app: perdure.App, run_id: str) -> str:
    """The reason the run's last parked step gives."""
    parked = [e for e in app.journal(run_id) if e.kind == "step.needs_attention"]
    return str(json.loads(parked[-1].data or "{}")["reason"])


@pytest.mark.parametrize("declare", ["perdure_tool", "tool_probes", "metadata"])
def test_a_refund_paid_before_the_crash_is_settled_by_its_probe(
    app: perdure.App, clock: TestClock, declare: str
) -> None:
    """The refund paid, the worker killed before its outcome was journaled: recovery asks
    the probe with the call's arguments, which finds the refund; the tool is not run again,
    the probe's value is recorded as the call's outcome and the model reads it; the call's
    arguments reach the probe but are not journaled with the tool's step."""
    ledger = Ledger()
    workflow = shop(app, ledger, declare=declare, pays_before_the_crash=True)
    handle = app.start(workflow, "refund order o42", run_id="paid")
    recover(app, clock, crash_after(app, REFUND))

    assert handle.result(1) == "done: refunded 12.5 as rf-o42-1"
    assert ledger.calls == 1 and ledger.refunds == {"o42": ["rf-o42-1"]}
    assert ledger.asked == [{"order": "o42", "amount": 12.5}]
    [answer] = probed(app, "paid")
    assert answer["answer"] == "done" and answer["probe"].endswith("Ledger.find")
    [outcome] = [e for e in app.journal("paid") if e.kind == "step.outcome" and e.name == REFUND]
    assert json.loads(outcome.data or "{}")["value"] == {
        "kind": "tool_return", "result": "refunded 12.5 as rf-o42-1"
    }  # fmt: skip
    assert not [e for e in app.journal("paid") if e.name == REFUND and "amount" in (e.data or "")]


def test_a_refund_cut_before_paying_runs_again(app: perdure.App, clock: TestClock) -> None:
    """Cut off before paying: the probe says not done, the refund runs again (once) and the
    run completes with exactly one refund."""
    ledger = Ledger()
    handle = app.start(shop(app, ledger), "refund order o42", run_id="again")
    recover(app, clock, crash_after(app, REFUND))

    assert handle.result(1) == "done: refunded 12.5 as rf-o42-1"
    assert ledger.calls == 1 and ledger.refunds == {"o42": ["rf-o42-1"]}
    assert [a["answer"] for a in probed(app, "again")] == ["not_done"]


def test_a_probe_that_cannot_tell_parks_with_its_answer(app: perdure.App, clock: TestClock) -> None:
    """A probe that cannot tell parks the run in needs_attention with its answer in the
    reason; the refund is not run."""
    ledger = Ledger()
    ledger.cannot_tell = True
    handle = app.start(shop(app, ledger, declare="tool_probes"), "refund order o42", run_id="p")
    recover(app, clock, crash_after(app, REFUND))

    assert app.get_run(handle.id).status == "needs_attention"
    assert ledger.calls == 0 and ledger.asked == [{"order": "o42", "amount": 12.5}]
    assert "cannot tell (the payment API answers 503)" in reason(app, "p")


@pytest.mark.parametrize("declare", ["perdure_tool", "tool_probes"])
def test_tell_model_settles_the_cut_call_with_an_interrupted_result(
    app: perdure.App, clock: TestClock, declare: str
) -> None:
    """`probe="tell_model"` (opt-in): the cut-off refund is not run again and the run does
    not park; the model reads a tool result saying the call was cut off, outcome unknown."""
    ledger = Ledger()
    workflow = shop(app, ledger, declare=declare, probe="tell_model")
    handle = app.start(workflow, "refund order o42", run_id="told")
    recover(app, clock, crash_after(app, REFUND))

    assert handle.result(1) == "done: " + INTERRUPTED.format(tool="issue_refund")
    assert ledger.calls == 0
    [answer] = probed(app, "told")
    assert answer["probe"] == "tell_model" and "outcome unknown" in answer["reason"]


def test_a_probe_on_a_tool_that_is_not_once_is_one_config_error(app: perdure.App) -> None:
    """A probe in `tool_probes` for a tool declared `read`, or one that is not a function
    nor "tell_model", is one ConfigError when the capability is built."""
    ledger = Ledger()
    with pytest.raises(ConfigError, match="a probe is for once tools, this one is 'read'"):
        PerdureDurability(
            app, tool_effects={"issue_refund": "read"}, tool_probes={"issue_refund": ledger.find}
        )
    with pytest.raises(ConfigError, match="is not a function"):
        PerdureDurability(app, tool_probes={"issue_refund": "find"})  # type: ignore[dict-item]


def test_a_metadata_probe_on_a_read_tool_is_one_config_error(app: perdure.App) -> None:
    """Tool metadata `{"perdure": {"effect": "read", "probe": ...}}` is one ConfigError
    naming the tool, the refund not run."""
    ledger = Ledger()
    agent: Any = Agent(FunctionModel(Script()), name="shop", capabilities=[PerdureDurability(app)])

    @agent.tool_plain(metadata={"perdure": {"effect": "read", "probe": ledger.find}})
    def issue_refund(order: str, amount: float) -> str:
        """Refund an order."""
        return ledger.refund(order, amount)

    @app.workflow(name="shop")
    async def run_agent(prompt: str) -> Any:
        return (await agent.run(prompt)).output

    handle = app.start(run_agent, "refund order o42")
    TestWorker(app).run_until_idle()
    run = app.get_run(handle.id)
    assert run.status == "failed", run.status
    assert "tool 'issue_refund': a probe is for once tools, this one is 'read'" in str(run.error)
    assert ledger.calls == 0


@pytest.mark.slow
def test_a_worker_killed_after_the_refund_paid_is_settled_by_the_probe(
    tmp_path: Path, store_url: str
) -> None:
    """`kill -9` of a real `perdure worker` after the once refund paid, before its outcome:
    a new worker asks the probe (which finds the payment in the ledger), records its value
    as the tool's output and finishes the run; the refund is paid once, the recorded model
    response not requested again."""
    mod = app_module("pydantic_durability_probes_app")
    url, ledger, log = store_url, tmp_path / "ledger", tmp_path / "log"
    ledger.touch()
    env = {"PAI_LEDGER": str(ledger)}
    client = perdure.App(url)
    workflow = mod.register(client)
    lines = lambda: ledger.read_text().split()  # noqa: E731
    first = worker_process("pydantic_durability_probes_app:app", url, env, log)
    second: subprocess.Popen[bytes] | None = None
    try:
        handle = client.start(workflow, "refund order 42", run_id="refund-42")
        wait_for("the refund to pay", lambda: "paid-42" in lines(), log, timeout=120)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        assert lines() == ["model", "paid-42"]  # killed inside the refund, after paying
        second = worker_process("pydantic_durability_probes_app:app", url, env, log)
        assert handle.result(120) == "done: refunded 42 (found by the probe)"
        assert lines() == ["model", "paid-42", "probe", "model"]
        [answer] = probed(client, handle.id)
        assert answer["answer"] == "done"
    finally:
        kill_all(first, second)
        client.close()
