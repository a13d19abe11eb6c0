"""Probes of framework tools: `tool_effect("once", probe=...)` (OpenAI Agents SDK) and
`perdure_tool(effect="once", probe=...)` / `tool_probes=` (pydantic-ai). Recovery of an
interrupted `once` tool call asks the probe with the call's own arguments: done settles the
call with the probe's value (the tool is not called again), not done calls it again, cannot
tell parks the run with the probe's answer in the reason."""

from __future__ import annotations

import json
from typing import Any

import pytest

import perdure
from crash_steps import crash_after, recover
from extras_needed import needs
from perdure import ProbeAnswer
from perdure.errors import ConfigError
from perdure.testing import SimulatedCrash, TestClock, TestWorker


class Ledger:
    """The payment system the tools act on and the probes read: refunds by order."""

    def __init__(self) -> None:
        self.refunds: dict[str, list[str]] = {}
        self.calls = 0  # how often the refund tool's body ran
        self.die_after_paying = False
        self.asked: list[dict[str, Any]] = []  # each probe call's arguments
        self.cannot_tell = False

    def refund(self, order: str, amount: float) -> str:
        self.calls += 1
        refund_id = f"rf-{order}-{self.calls}"
        self.refunds.setdefault(order, []).append(refund_id)
        if self.die_after_paying:
            self.die_after_paying = False
            raise SimulatedCrash("killed after paying, before the outcome was journaled")
        return f"refunded {amount:g} as {refund_id}"

    def find(self, order: str, amount: float) -> ProbeAnswer:
        self.asked.append({"order": order, "amount": amount})
        if self.cannot_tell:
            return ProbeAnswer.cannot_tell("the payment API answers 503")
        found = self.refunds.get(order)
        if found:
            return ProbeAnswer.done(f"refunded {amount:g} as {found[0]}")
        return ProbeAnswer.not_done()


def reason(app: perdure.App, run_id: str) -> str:
    """The reason the run's last parked step gives."""
    parked = [e for e in app.journal(run_id) if e.kind == "step.needs_attention"]
    return str(json.loads(parked[-1].data or "{}")["reason"])


def tool_message(request: Any, call_id: str) -> str:
    """The tool result the SDK sent the model for `call_id`."""
    for message in request.body["messages"]:
        if message.get("role") == "tool" and message.get("tool_call_id") == call_id:
            return str(message["content"])
    raise AssertionError(f"no tool result for {call_id}")


# -- OpenAI Agents SDK ---------------------------------------------------------------------


@pytest.fixture
def sdk() -> Any:
    pytest.importorskip("agents", reason=needs("openai-agents"))
    import agents

    agents.set_tracing_disabled(True)
    return agents


def sdk_agent(sdk: Any, server: Any, ledger: Ledger, *, marked: bool = True) -> Any:
    """A refund agent whose `once` refund tool names its probe with `@tool_effect`."""
    from openai import AsyncOpenAI

    from perdure.integrations.openai_agents import tool_effect

    async def find_refund(order: str, amount: float) -> ProbeAnswer:
        return ledger.find(order, amount)

    @sdk.function_tool
    def issue_refund(order: str, amount: float) -> str:
        """Refund an order."""
        return ledger.refund(order, amount)

    if marked:
        issue_refund = tool_effect("once", probe=find_refund)(issue_refund)
    client = AsyncOpenAI(base_url=server.origin + "/v1", api_key="dummy", max_retries=0)
    model = sdk.OpenAIChatCompletionsModel(model="scripted", openai_client=client)
    return sdk.Agent(name="refunds", instructions="Refund.", tools=[issue_refund], model=model)


def sdk_script(server: Any) -> None:
    server.reply(tool_calls=[("c1", "issue_refund", {"order": "o7", "amount": 30})])
    server.reply("Refunded.")


def sdk_run(app: perdure.App, sdk: Any, server: Any, ledger: Ledger, run_id: str) -> Any:
    from perdure.integrations.openai_agents import Runner

    workflow = Runner(app).workflow(sdk_agent(sdk, server, ledger))
    sdk_script(server)
    return app.start(workflow, "refund o7", run_id=run_id)


def test_sdk_refund_paid_before_the_kill_is_settled_by_its_probe(
    app: perdure.App, clock: TestClock, server: Any, sdk: Any
) -> None:
    """The refund pays, the worker dies before its outcome: recovery asks the probe with the
    call's arguments, which finds the refund; the tool is not called again, the model reads
    the probe's value as the tool's output and the run completes with one refund."""
    ledger = Ledger()
    ledger.die_after_paying = True
    handle = sdk_run(app, sdk, server, ledger, "p1")
    dead = TestWorker(app)
    with pytest.raises(SimulatedCrash):
        dead.run_until_idle()

    recover(app, clock, dead)

    assert handle.result() == "Refunded."
    assert ledger.calls == 1 and ledger.refunds == {"o7": ["rf-o7-1"]}
    assert ledger.asked == [{"order": "o7", "amount": 30.0}]
    assert tool_message(server.requests[-1], "c1") == "refunded 30 as rf-o7-1"
    probed = [e for e in app.journal("p1") if e.kind == "step.probed"]
    assert [json.loads(e.data or "{}")["answer"] for e in probed] == ["done"]
    assert json.loads(probed[0].data or "{}")["probe"].endswith("find_refund")


def test_sdk_refund_cut_before_paying_runs_again(
    app: perdure.App, clock: TestClock, server: Any, sdk: Any
) -> None:
    """Cut off after its intent, before paying: the probe says not done, the refund runs
    again (once) and the run completes with exactly one refund."""
    ledger = Ledger()
    handle = sdk_run(app, sdk, server, ledger, "p2")
    recover(app, clock, crash_after(app, "agents.refunds.tool.issue_refund"))

    assert handle.result() == "Refunded."
    assert ledger.calls == 1 and len(ledger.refunds["o7"]) == 1
    assert len(ledger.asked) == 1


def test_sdk_probe_that_cannot_tell_parks_with_its_answer(
    app: perdure.App, clock: TestClock, server: Any, sdk: Any
) -> None:
    """A probe that cannot tell parks the run in needs_attention, its answer in the reason;
    the refund is not run again."""
    ledger = Ledger()
    ledger.cannot_tell = True
    handle = sdk_run(app, sdk, server, ledger, "p3")
    recover(app, clock, crash_after(app, "agents.refunds.tool.issue_refund"))

    assert handle.status() == "needs_attention"
    assert ledger.calls == 0
    assert "find_refund: cannot tell (the payment API answers 503)" in reason(app, "p3")


def test_sdk_tool_probes_mapping_and_bad_declarations(
    app: perdure.App, server: Any, sdk: Any
) -> None:
    """`Runner(tool_probes=...)` gives an unmarked tool its probe; a probe on a tool that is
    not `once`, or a probe that is not a function, is one clear ConfigError."""
    from perdure.integrations.openai_agents import Runner, tool_effect

    ledger = Ledger()
    runner = Runner(app, tool_effects={"issue_refund": "once"},
                    tool_probes={"issue_refund": ledger.find})  # fmt: skip
    runner.workflow(sdk_agent(sdk, server, ledger, marked=False))
    probe = app.runtime.steps["agents.refunds.tool.issue_refund"].probe
    assert probe is not None and probe.name == "Ledger.find"

    with pytest.raises(ConfigError, match="a probe is for once tools"):
        tool_effect("keyed", probe=ledger.find)
    bad = Runner(app, tool_effects={"issue_refund": "keyed"},
                 tool_probes={"issue_refund": ledger.find})  # fmt: skip
    with pytest.raises(ConfigError, match="probe= is for once steps"):
        bad.workflow(sdk_agent(sdk, server, ledger, marked=False).clone(name="other"))
    with pytest.raises(ConfigError, match="is not a function"):
        Runner(app, tool_probes={"issue_refund": "find"}).workflow(  # type: ignore[dict-item]
            sdk_agent(sdk, server, ledger, marked=False).clone(name="third")
        )


# -- pydantic-ai -------------------------------------------------------------------------------


class Script:
    """A FunctionModel script: refund order 42 once, then answer with the tool's result."""

    def __call__(self, messages: list[Any], info: Any) -> Any:
        from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart

        returns = [
            p for m in messages for p in getattr(m, "parts", []) if p.part_kind == "tool-return"
        ]
        if not returns:
            part = ToolCallPart("issue_refund", {"order": "o42", "amount": 12.5}, "c1")
            return ModelResponse(parts=[part])
        return ModelResponse(parts=[TextPart(f"done: {returns[0].content}")])


def pai_agent(app: perdure.App, ledger: Ledger, *, mapping: bool = False) -> Any:
    pytest.importorskip("pydantic_ai", reason=needs("pydantic-ai"))
    from pydantic_ai import Agent
    from pydantic_ai.models.function import FunctionModel

    from perdure.integrations.pydantic_ai import PerdureAgent, perdure_tool

    agent: Any = Agent(FunctionModel(Script()), name="shop")

    def issue_refund(order: str, amount: float) -> str:
        return ledger.refund(order, amount)

    if mapping:
        agent.tool_plain(issue_refund)
        return PerdureAgent(agent, app, tool_probes={"issue_refund": ledger.find})
    agent.tool_plain(perdure_tool(effect="once", probe=ledger.find)(issue_refund))
    return PerdureAgent(agent, app)


@pytest.mark.parametrize("mapping", [False, True], ids=["perdure_tool", "tool_probes"])
def test_pydantic_ai_refund_paid_before_the_kill_is_settled_by_its_probe(
    app: perdure.App, clock: TestClock, mapping: bool
) -> None:
    """The same for pydantic-ai, with the probe declared on the tool or in `tool_probes`:
    the paid refund is found by the probe, not run again, and its value is the tool's
    output the model reads."""
    ledger = Ledger()
    ledger.die_after_paying = True
    durable = pai_agent(app, ledger, mapping=mapping)
    handle = durable.start("refund order 42")
    dead = TestWorker(app)
    with pytest.raises(SimulatedCrash):
        dead.run_until_idle()

    recover(app, clock, dead)

    assert durable.result(handle).output == "done: refunded 12.5 as rf-o42-1"
    assert ledger.calls == 1 and ledger.asked == [{"order": "o42", "amount": 12.5}]


def test_pydantic_ai_not_done_runs_again_and_cannot_tell_parks(
    app: perdure.App, clock: TestClock
) -> None:
    """Not done: the refund runs again and the run completes with one refund. Cannot tell:
    the run parks with the probe's answer in its reason, the refund not run."""
    ledger = Ledger()
    durable = pai_agent(app, ledger)
    first = durable.start("refund order 42", run_id="again")
    recover(app, clock, crash_after(app, "pydantic_ai:shop.tool.issue_refund"))
    assert durable.result(first).output == "done: refunded 12.5 as rf-o42-1"
    assert ledger.calls == 1

    ledger.cannot_tell = True
    second = durable.start("refund order 42", run_id="parks")
    recover(app, clock, crash_after(app, "pydantic_ai:shop.tool.issue_refund"))
    assert second.status() == "needs_attention"
    assert ledger.calls == 1
    assert "cannot tell (the payment API answers 503)" in reason(app, "parks")


def test_pydantic_ai_probe_on_a_tool_that_is_not_once_is_refused() -> None:
    """`perdure_tool(effect="read", probe=...)` is one clear ConfigError."""
    pytest.importorskip("pydantic_ai", reason=needs("pydantic-ai"))
    from perdure.integrations.pydantic_ai import perdure_tool

    with pytest.raises(ConfigError, match="a probe is for once tools"):
        perdure_tool(effect="read", probe=Ledger().find)


def test_sdk_tell_model_settles_the_cut_call_with_an_interrupted_result(
    app: perdure.App, clock: TestClock, server: Any, sdk: Any
) -> None:
    """`tool_probes={"issue_refund": "tell_model"}` (opt-in): the refund cut off after its
    intent is not run again and the run does not park; the model reads a tool result saying
    the call was cut off and its outcome is unknown."""
    from perdure.agent.tool_probes import INTERRUPTED
    from perdure.integrations.openai_agents import Runner

    ledger = Ledger()
    runner = Runner(app, tool_effects={"issue_refund": "once"},
                    tool_probes={"issue_refund": "tell_model"})  # fmt: skip
    workflow = runner.workflow(sdk_agent(sdk, server, ledger, marked=False))
    sdk_script(server)
    handle = app.start(workflow, "refund o7", run_id="told")
    recover(app, clock, crash_after(app, "agents.refunds.tool.issue_refund"))

    assert handle.result() == "Refunded."
    assert ledger.calls == 0
    assert tool_message(server.requests[-1], "c1") == INTERRUPTED.format(tool="issue_refund")
    [answer] = [json.loads(e.data or "{}") for e in app.journal("told") if e.kind == "step.probed"]
    assert answer["probe"] == "tell_model" and "outcome unknown" in answer["reason"]


def test_pydantic_ai_tell_model_on_the_tool_mark(app: perdure.App, clock: TestClock) -> None:
    """`@perdure_tool(effect="once", probe="tell_model")`: the cut-off refund is settled with
    the interrupted result, which the model reads as the tool's output; not run again."""
    pytest.importorskip("pydantic_ai", reason=needs("pydantic-ai"))
    from pydantic_ai import Agent
    from pydantic_ai.models.function import FunctionModel

    from perdure.agent.tool_probes import INTERRUPTED
    from perdure.integrations.pydantic_ai import PerdureAgent, perdure_tool

    ledger = Ledger()
    agent: Any = Agent(FunctionModel(Script()), name="shop")

    @agent.tool_plain
    @perdure_tool(effect="once", probe="tell_model")
    def issue_refund(order: str, amount: float) -> str:
        return ledger.refund(order, amount)

    durable = PerdureAgent(agent, app)
    handle = durable.start("refund order 42")
    recover(app, clock, crash_after(app, "pydantic_ai:shop.tool.issue_refund"))

    assert durable.result(handle).output == "done: " + INTERRUPTED.format(tool="issue_refund")
    assert ledger.calls == 0
