"""PerdureDurability: perdure as a pydantic-ai durability backend. A real pydantic-ai Agent
built with `capabilities=[PerdureDurability(app)]` (models: pydantic-ai's TestModel and
FunctionModel, scripted) run inside perdure workflows: its model requests, tool calls and
hook-made model calls are journaled steps that recovery treats by effect."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from extras_needed import needs

pytest.importorskip("pydantic_ai", reason=needs("pydantic-ai"))

from crashes import app_module, kill_all, worker_process
from pydantic_ai import Agent, RunContext
from pydantic_ai.capabilities import AbstractCapability, durable_operation
from pydantic_ai.exceptions import CallDeferred
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    UserPromptPart,
)
from pydantic_ai.models import ModelRequestContext, ModelRequestParameters
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel
from pydantic_ai.toolsets import FunctionToolset

import perdure
from crash_steps import crash_after, recover
from perdure.agent.budget_sql import Budgets
from perdure.errors import ConfigError
from perdure.integrations.pydantic_ai import perdure_tool
from perdure.integrations.pydantic_durability import PerdureDurability
from perdure.integrations.streaming import ModelEvents
from perdure.testing import TestClock, TestWorker
from waits import wait_for

MODEL = "shop__model.request"
TOOLS = "shop__function_toolset__<agent>.call_tool"


def outcomes(app: perdure.App, run_id: str) -> list[tuple[int, str]]:
    """(position, step name) of each step the run finished, in order."""
    return sorted((e.position or 0, e.name) for e in app.journal(run_id)
                  if e.kind == "step.outcome")  # fmt: skip


class Scripted:
    """A FunctionModel script: call `tool` once, then answer with its result; counts calls."""

    def __init__(self, tool: str, args: dict[str, Any] | None = None) -> None:
        self.tool, self.args = tool, args or {"order": "42"}
        self.calls = 0

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.calls += 1
        returns = [p for m in messages for p in getattr(m, "parts", [])
                   if p.part_kind == "tool-return"]  # fmt: skip
        if not returns:
            return ModelResponse(parts=[ToolCallPart(self.tool, self.args, "c1")])
        return ModelResponse(parts=[TextPart(f"done: {returns[0].content}")])


def agent_workflow(app: perdure.App, agent: Agent[Any, Any], name: str = "shop") -> Any:
    """The workflow every test runs: the agent's own `run`, inside a perdure run."""

    @app.workflow(name=name)
    async def run_agent(prompt: str) -> Any:
        return (await agent.run(prompt)).output

    return run_agent


def test_result_equals_the_plain_agents_and_each_request_and_call_is_a_step(
    app: perdure.App, worker: TestWorker
) -> None:
    """Inside a workflow the agent answers what it answers outside one; each model request
    and each tool call is one step, with the tool's declared effect (mapping, decorator,
    tool metadata); outside a workflow it journals nothing."""
    orders: list[str] = []
    durability = PerdureDurability(app, tool_effects={"send_email": "keyed"})
    agent = Agent(TestModel(), name="shop", capabilities=[durability])

    @agent.tool_plain
    @perdure_tool(effect="read")
    def lookup_order(order: str) -> str:
        orders.append(order)
        return f"order {order}: shipped"

    @agent.tool_plain
    def send_email(to: str) -> str:
        return f"sent to {to}"

    @agent.tool_plain(metadata={"perdure": {"effect": "idempotent"}})
    def tag(label: str) -> str:
        return f"tagged {label}"

    plain = agent.run_sync("where is my order?")  # no workflow: a plain agent run
    handle = app.start(agent_workflow(app, agent), "where is my order?")
    worker.run_until_idle()
    assert handle.result(1) == plain.output
    names = [name for _, name in outcomes(app, handle.id)]
    assert names[0] == names[-1] == MODEL
    assert sorted(names[1:-1]) == [f"{TOOLS}:lookup_order", f"{TOOLS}:send_email",
                                   f"{TOOLS}:tag"]  # fmt: skip
    steps = app.runtime.steps
    assert steps[f"{TOOLS}:lookup_order"].effect == "read"
    assert steps[f"{TOOLS}:send_email"].effect == "keyed"
    assert steps[f"{TOOLS}:tag"].effect == "idempotent"
    assert steps[MODEL].effect == "keyed" and steps[MODEL].commit
    assert orders == ["a", "a"]  # once by the plain run, once by the durable one


def test_a_crash_in_a_once_tool_replays_the_model_and_parks_without_rerunning(
    app: perdure.App, clock: TestClock
) -> None:
    """A crash inside a `once` tool: recovery replays the recorded model response without
    calling the model, does not re-run the tool, parks the run in needs_attention; the
    operator's value (the tool's output, as it is) lets it finish with one more request."""
    script, refunds = Scripted("issue_refund"), []
    agent = Agent(FunctionModel(script), name="shop", capabilities=[PerdureDurability(app)])

    @agent.tool_plain
    def issue_refund(order: str) -> str:
        refunds.append(order)
        return f"refunded {order}"

    handle = app.start(agent_workflow(app, agent), "refund order 42")
    dead = crash_after(app, f"{TOOLS}:issue_refund")
    assert script.calls == 1 and refunds == []
    recover(app, clock, dead)
    assert app.get_run(handle.id).status == "needs_attention"
    assert script.calls == 1 and refunds == []

    app.resolve(handle.id, 2, value="refunded 42 (by hand)")
    TestWorker(app).run_until_idle()
    assert handle.result(1) == "done: refunded 42 (by hand)"
    assert script.calls == 2 and refunds == []


@dataclass(kw_only=True)
class Reminder(AbstractCapability[Any]):
    """A capability whose hook asks a model of its own (a reminder before each request)."""

    model: Any = None

    async def before_model_request(
        self, ctx: RunContext[Any], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        await self.remind(ctx, len(request_context.messages))
        return request_context

    @durable_operation(name="remind")
    async def remind(self, ctx: RunContext[Any], seen: int) -> str:
        ask = [ModelRequest(parts=[UserPromptPart(f"remind me ({seen} messages)")])]
        response = await self.model.request(ask, None, ModelRequestParameters())
        return str(response.parts[0].content) if response.parts else ""  # type: ignore[union-attr]


def test_a_model_call_made_by_a_hook_is_replayed_not_called_again(
    app: perdure.App, clock: TestClock
) -> None:
    """A capability's hook that calls a model (`@durable_operation`) is a step of the run:
    after a crash, recovery replays its answer instead of calling that model again."""
    script, refunds, reminders = Scripted("issue_refund"), [], []

    def remind(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        reminders.append(len(messages))
        return ModelResponse(parts=[TextPart("be kind")])

    hook = Reminder(id="reminder", model=FunctionModel(remind))
    agent = Agent(FunctionModel(script), name="shop",
                  capabilities=[hook, PerdureDurability(app, default_effect="keyed")])  # fmt: skip

    @agent.tool_plain
    def issue_refund(order: str) -> str:
        refunds.append(order)
        return f"refunded {order}"

    handle = app.start(agent_workflow(app, agent), "refund order 42")
    dead = crash_after(app, f"{TOOLS}:issue_refund")
    assert (script.calls, len(reminders)) == (1, 1)
    recover(app, clock, dead)
    assert handle.result(1) == "done: refunded 42"
    assert (script.calls, len(reminders)) == (2, 2)  # one each per request, none again
    assert refunds == ["42"]  # keyed: run again after the crash, with its key
    names = [name for _, name in outcomes(app, handle.id)]
    assert names.count("shop__capability__reminder.remind") == 2


def test_a_tool_that_requires_approval_waits_at_a_perdure_gate(
    app: perdure.App, worker: TestWorker
) -> None:
    """`requires_approval=True`: the run waits at a perdure gate (`approve:{call}`); the
    answer lets it go on and the tool runs once; a deferred question is answered at one."""
    script, refunds = Scripted("issue_refund"), []
    agent = Agent(FunctionModel(script), name="shop", capabilities=[PerdureDurability(app)])

    @agent.tool_plain(requires_approval=True)
    def issue_refund(order: str) -> str:
        refunds.append(order)
        return f"refunded {order}"

    handle = app.start(agent_workflow(app, agent), "refund 42", run_id="gate-1")
    worker.run_until_idle()
    assert handle.status() == "waiting" and refunds == []
    app.send_event("gate-1", "approve:c1", {"approve": True})
    worker.run_until_idle()
    assert handle.result(1) == "done: refunded 42"
    assert refunds == ["42"] and script.calls == 2


def test_a_steer_sent_while_the_agent_waits_is_in_its_next_request_once(
    app: perdure.App, worker: TestWorker
) -> None:
    """The run takes steering from its first request; a steer sent while it waits at a gate
    is in the next request the model gets, once, as user content."""
    seen: list[list[ModelMessage]] = []
    script = Scripted("issue_refund")

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(list(messages))
        return script(messages, info)

    agent = Agent(FunctionModel(model), name="shop", capabilities=[PerdureDurability(app)])

    @agent.tool_plain(requires_approval=True)
    def issue_refund(order: str) -> str:
        return f"refunded {order}"

    handle = app.start(agent_workflow(app, agent), "refund 42", run_id="steer-1")
    worker.run_until_idle()
    assert handle.status() == "waiting"
    app.runtime.sync(app.client.steer("steer-1", "say it in French", by="ana"), "steer")
    app.send_event("steer-1", "approve:c1", {"approve": True})
    worker.run_until_idle()
    assert handle.result(1) == "done: refunded 42"

    def carried(messages: list[ModelMessage]) -> int:
        return sum("say it in French" in str(p.content) for m in messages for p in m.parts
                   if p.part_kind == "user-prompt")  # fmt: skip

    assert [carried(m) for m in seen] == [0, 1]
    assert sum(e.kind == "steer.received" for e in app.journal("steer-1")) == 1


def test_a_deferred_question_is_answered_at_a_gate(app: perdure.App, worker: TestWorker) -> None:
    """A tool raising CallDeferred waits for a person's answer (`human:{call}`), which the
    model then reads as the tool's result."""
    agent = Agent(FunctionModel(Scripted("ask_customer", {"question": "which order?"})),
                  name="shop", capabilities=[PerdureDurability(app)])  # fmt: skip

    @agent.tool_plain
    def ask_customer(question: str) -> str:
        raise CallDeferred()

    handle = app.start(agent_workflow(app, agent), "refund", run_id="ask-1")
    worker.run_until_idle()
    assert handle.status() == "waiting"
    app.send_event("ask-1", "human:c1", "order 42")
    worker.run_until_idle()
    assert handle.result(1) == "done: order 42"


def test_usage_is_recorded_once_per_request_and_a_run_limit_fails_in_one_line(
    app: perdure.App, worker: TestWorker
) -> None:
    """Each model request is reserved against the agent's budget inside its step and its
    tokens recorded once (what `perdure usage` shows); a run over `max_tokens` fails."""
    agent = Agent(TestModel(), name="shop", capabilities=[PerdureDurability(app)])

    @agent.tool_plain
    @perdure_tool(effect="read")
    def lookup_order(order: str) -> str:
        return "shipped"

    handle = app.start(agent_workflow(app, agent), "where?")
    worker.run_until_idle()
    rows = app.runtime.sync(Budgets(app.runtime.store).usage("pydantic_ai:shop", 0.0), "usage")
    assert [(r.run_id, r.position) for r in rows] == [(handle.id, 1), (handle.id, 3)]
    assert all(r.input_tokens > 0 and r.model == "test" for r in rows)

    tight = Agent(TestModel(), name="tight",
                  capabilities=[PerdureDurability(app, max_tokens=10)])  # fmt: skip
    limited = app.start(agent_workflow(app, tight, "tight"), "where?")
    worker.run_until_idle()
    run = app.get_run(limited.id)
    assert run.status == "failed" and "run limit" in (run.error or "")


def test_durable_sleep_is_perdures_timer(
    app: perdure.App, clock: TestClock, worker: TestWorker
) -> None:
    """The capability's `durable_sleep` parks the run on a store timer (no process held);
    it goes on once the clock has passed the wake-up time."""
    durability = PerdureDurability(app)
    Agent(TestModel(), name="shop", capabilities=[durability])

    @app.workflow(name="nap")
    async def nap() -> str:
        await durability.durable_sleep(600)
        return "awake"

    handle = app.start(nap)
    worker.run_until_idle()
    assert handle.status() == "sleeping"
    clock.advance(601)
    worker.run_until_idle()
    assert handle.result(1) == "awake"
    assert [e.kind for e in app.journal(handle.id)].count("sleep.until") == 1


def test_bad_input_is_one_line(app: perdure.App) -> None:
    """An unknown effect, or an agent without a name, is refused in one line."""
    with pytest.raises(ConfigError, match="effect"):
        PerdureDurability(app, tool_effects={"x": "twice"})  # type: ignore[dict-item]
    with pytest.raises(Exception, match="name"):
        Agent(TestModel(), capabilities=[PerdureDurability(app)])


@pytest.mark.slow
def test_a_worker_killed_mid_conversation_reruns_no_model_call_and_no_tool(
    tmp_path: Path, store_url: str
) -> None:
    """`kill -9` of a real `perdure worker` while the refund tool (once) runs, after a
    recorded model call and a recorded lookup: a new worker requests no recorded model
    response again and re-runs neither tool; the run parks, and resolved it finishes with
    one more model request."""
    mod = app_module("pydantic_durability_app")
    url, ledger, log = store_url, tmp_path / "ledger", tmp_path / "log"
    ledger.touch()
    env = {"PAI_LEDGER": str(ledger)}
    client = perdure.App(url)
    workflow = mod.register(client)
    lines = lambda: ledger.read_text().split()  # noqa: E731
    first = worker_process("pydantic_durability_app:app", url, env, log)
    second: subprocess.Popen[bytes] | None = None
    try:
        handle = client.start(workflow, "refund order 42", run_id="refund-42")
        # a worker importing pydantic-ai on a loaded machine can take a while to start
        wait_for("the refund to start", lambda: "refund-started" in lines(), log, timeout=120)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        before = ["model", "lookup", "model", "refund-started"]
        assert lines() == before  # killed inside the refund
        second = worker_process("pydantic_durability_app:app", url, env, log)
        wait_for("needs_attention", lambda: client.get_run(handle.id).status == "needs_attention",
                 log, timeout=120)  # fmt: skip
        time.sleep(mod.HOLD + 0.5)  # a re-run refund would have logged by now
        assert lines() == before
        refund = max(e.position or 0 for e in client.journal(handle.id)
                     if e.name.endswith("call_tool:issue_refund"))  # fmt: skip
        client.resolve(handle.id, refund, value="refunded 42 (checked by hand)")
        assert handle.result(30) == "done: refunded 42 (checked by hand)"
        assert lines() == [*before, "model"]
    finally:
        kill_all(first, second)
        client.close()


def test_stream_writes_the_models_tokens_to_the_runs_stream(
    app: perdure.App, worker: TestWorker
) -> None:
    """`stream=True`: each model step streams its events to the run's durable stream as
    they come (read back after the run ends, from offset -1), and journals the whole
    response once; the run's answer is the plain agent's."""
    agent = Agent(TestModel(custom_output_text="all done here"), name="shop",
                  capabilities=[PerdureDurability(app, stream=True)])  # fmt: skip
    handle = app.start(agent_workflow(app, agent), "hello")
    worker.run_until_idle()
    assert handle.result(1) == "all done here"
    assert [name for _, name in outcomes(app, handle.id)] == ["shop__model.request_stream"]

    async def read() -> str:
        text = ""
        async for item in ModelEvents(app.client, handle.id):
            event = item.event
            if event.get("event_kind") == "part_start" and event["part"].get("content"):
                text += event["part"]["content"]
            elif event.get("event_kind") == "part_delta":
                text += event["delta"].get("content_delta") or ""
        return text

    assert asyncio.run(read()) == "all done here"
    with pytest.raises(ConfigError, match="not both"):
        PerdureDurability(app, stream=True, event_stream_handler=lambda ctx, events: None)  # type: ignore[arg-type,return-value]


def test_a_toolset_passed_at_run_time_is_refused_in_a_workflow(
    app: perdure.App, worker: TestWorker
) -> None:
    """Tools given to `agent.run(toolsets=...)` would run unjournaled: inside a workflow
    the run fails naming them, before any model call; outside one they work as usual."""
    script = Scripted("extra_tool")
    agent = Agent(FunctionModel(script), name="shop", capabilities=[PerdureDurability(app)])
    extra = FunctionToolset[Any](id="extra")

    @extra.tool_plain
    def extra_tool(order: str) -> str:
        return "extra"

    @app.workflow(name="shop")
    async def shop(prompt: str) -> str:
        return (await agent.run(prompt, toolsets=[extra])).output

    handle = app.start(shop, "go")
    worker.run_until_idle()
    run = app.get_run(handle.id)
    assert run.status == "failed" and "toolset" in (run.error or "").lower(), run.error
    assert script.calls == 0
    assert agent.run_sync("go", toolsets=[extra]).output == "done: extra"
