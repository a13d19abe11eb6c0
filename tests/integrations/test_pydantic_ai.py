"""PerdureAgent: a real pydantic-ai Agent (TestModel / FunctionModel) run as a perdure workflow,
its model requests and tool calls journaled steps that recovery treats by effect."""

from __future__ import annotations

import asyncio
import json
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
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

import perdure
from perdure.agent.budget_sql import Budgets
from perdure.errors import ConfigError
from perdure.integrations.pydantic_ai import PerdureAgent, perdure_tool
from perdure.testing import SimulatedCrash, TestClock, TestWorker
from waits import wait_for

NAME = "pydantic_ai:shop"


def steps_of(app: perdure.App, run_id: str) -> list[tuple[int, str]]:
    """(position, step name) of each step the run finished, in order."""
    done = [(e.position, e.name) for e in app.journal(run_id) if e.kind == "step.outcome"]
    return sorted(done)  # parallel tool calls may finish in any order


class Scripted:
    """A FunctionModel script: call `tool` once, then answer with its result; counts calls."""

    def __init__(self, tool: str) -> None:
        self.tool = tool
        self.calls = 0

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.calls += 1
        returns = [
            p for m in messages for p in getattr(m, "parts", []) if p.part_kind == "tool-return"
        ]
        if not returns:
            return ModelResponse(parts=[ToolCallPart(self.tool, {"order": "42"}, "c1")])
        return ModelResponse(parts=[TextPart(f"done: {returns[0].content}")])


def test_result_equals_the_plain_agents_and_each_request_and_call_is_a_step(
    app: perdure.App, worker: TestWorker
) -> None:
    """The durable run answers what the plain agent answers; the journal holds one model
    step per request and one tool step per call, each with its declared effect."""
    agent = Agent(TestModel(), name="shop")
    orders: list[str] = []

    @agent.tool_plain
    @perdure_tool(effect="read")
    def lookup_order(order: str) -> str:
        orders.append(order)
        return f"order {order}: shipped"

    @agent.tool_plain
    def send_email(to: str) -> str:
        return f"sent to {to}"

    plain = agent.run_sync("where is my order?")
    durable = PerdureAgent(agent, app, tool_effects={"send_email": "keyed"})
    handle = durable.start("where is my order?")
    worker.run_until_idle()
    result = durable.result(handle)

    assert result.output == plain.output
    assert [type(m) for m in result.all_messages()] == [type(m) for m in plain.all_messages()]
    assert steps_of(app, handle.id) == [
        (0, f"{NAME}.model"),
        (1, f"{NAME}.tool.lookup_order"),
        (2, f"{NAME}.tool.send_email"),
        (3, f"{NAME}.model"),
    ]
    assert app.runtime.steps[f"{NAME}.model"].effect == "keyed"
    assert app.runtime.steps[f"{NAME}.tool.lookup_order"].effect == "read"
    assert app.runtime.steps[f"{NAME}.tool.send_email"].effect == "keyed"
    assert len(orders) == 2  # the plain run and the durable one, nothing more


def test_model_response_is_not_requested_again_and_an_interrupted_once_tool_parks(
    app: perdure.App, clock: TestClock, worker: TestWorker
) -> None:
    """A crash inside a `once` tool: recovery replays the recorded model response without
    calling the model, does not re-run the tool, and parks the run in needs_attention; the
    operator's value lets it finish with one more model request only."""
    script = Scripted("issue_refund")
    agent = Agent(FunctionModel(script), name="shop")
    refunds: list[str] = []

    @agent.tool_plain
    def issue_refund(order: str) -> str:
        refunds.append(order)
        return f"refunded {order}"

    durable = PerdureAgent(agent, app)
    handle = durable.start("refund order 42")
    worker.crash_after_intent(f"{NAME}.tool.issue_refund")
    with pytest.raises(SimulatedCrash):
        worker.run_until_idle()
    assert script.calls == 1 and refunds == []

    clock.advance(worker.lease + 1)
    TestWorker(app).run_until_idle()
    assert app.get_run(handle.id).status == "needs_attention"
    assert script.calls == 1  # the recorded response was replayed, not requested
    assert refunds == []  # a once tool cut off is never re-run by itself

    app.resolve(handle.id, 1, value="refunded 42 (by hand)")  # the tool's output, as it is
    TestWorker(app).run_until_idle()
    assert durable.result(handle).output == "done: refunded 42 (by hand)"
    assert script.calls == 2 and refunds == []


def test_a_keyed_tool_is_rerun_with_the_same_idempotency_key(
    app: perdure.App, clock: TestClock, worker: TestWorker
) -> None:
    """A `keyed` tool cut off by a crash runs again on recovery, seeing the same
    `current_step().idempotency_key` both times."""
    script = Scripted("issue_refund")
    agent = Agent(FunctionModel(script), name="shop")
    keys: list[str] = []

    @agent.tool_plain
    @perdure_tool(effect="keyed")
    def issue_refund(order: str) -> str:
        keys.append(perdure.current_step().idempotency_key)
        return f"refunded {order}"

    durable = PerdureAgent(agent, app)
    handle = durable.start("refund order 42")
    worker.crash_after_intent(f"{NAME}.tool.issue_refund")
    with pytest.raises(SimulatedCrash):
        worker.run_until_idle()
    clock.advance(worker.lease + 1)
    TestWorker(app).run_until_idle()

    assert durable.result(handle).output == "done: refunded 42"
    assert keys == [f"{handle.id}:1"]  # the crash came before the body; the rerun has the key
    assert script.calls == 2


def test_a_model_retry_from_a_tool_is_journaled_and_the_run_completes(
    app: perdure.App, worker: TestWorker
) -> None:
    """A tool raising ModelRetry is an outcome like any other: the model is asked again."""
    from pydantic_ai import ModelRetry

    agent = Agent(TestModel(), name="shop")
    tries: list[int] = []

    @agent.tool_plain
    @perdure_tool(effect="read")
    def lookup_order(order: str) -> str:
        tries.append(1)
        if len(tries) == 1:
            raise ModelRetry("order not found, try again")
        return "shipped"

    durable = PerdureAgent(agent, app)
    handle = durable.start("where?")
    worker.run_until_idle()
    assert app.get_run(handle.id).status == "completed"
    assert [n for _, n in steps_of(app, handle.id)].count(f"{NAME}.tool.lookup_order") == 2


@dataclass
class Shop:
    region: str


def test_deps_are_rebuilt_from_json_and_usage_is_recorded_once_per_request(
    app: perdure.App, worker: TestWorker
) -> None:
    """JSON deps reach the tools as the agent's `deps_type`; each model request's tokens
    are in the store's usage (what `perdure usage` shows), under the agent's name."""
    agent = Agent(TestModel(), name="shop", deps_type=Shop)
    seen: list[Any] = []

    @agent.tool
    @perdure_tool(effect="read")
    def lookup_order(ctx: RunContext[Shop], order: str) -> str:
        seen.append(ctx.deps)
        return f"{ctx.deps.region}: shipped"

    durable = PerdureAgent(agent, app)
    handle = durable.start("where?", deps=Shop("eu"))
    worker.run_until_idle()
    assert "eu: shipped" in durable.result(handle).output
    assert seen == [Shop("eu")]
    rows = app.runtime.sync(Budgets(app.runtime.store).usage(NAME, 0.0), "usage")
    assert [(r.run_id, r.position) for r in rows] == [(handle.id, 0), (handle.id, 2)]
    assert all(r.input_tokens > 0 and r.model == "test" for r in rows)


def test_a_failing_model_fails_the_run_naming_the_error(
    app: perdure.App, worker: TestWorker
) -> None:
    """A model that raises fails the run with its message; nothing is retried silently."""
    calls: list[int] = []

    def broken(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls.append(1)
        raise RuntimeError("provider said no")

    durable = PerdureAgent(Agent(FunctionModel(broken), name="shop"), app)
    handle = durable.start("hi")
    worker.run_until_idle()
    run = app.get_run(handle.id)
    assert run.status == "failed" and "provider said no" in (run.error or "")
    assert calls == [1]


def test_a_non_json_tool_result_fails_the_run_in_one_line(
    app: perdure.App, worker: TestWorker
) -> None:
    """A tool returning something JSON cannot hold fails the run naming the tool and the fix."""
    agent = Agent(TestModel(), name="shop")

    @agent.tool_plain
    @perdure_tool(effect="read")
    def lookup_order(order: str) -> Any:
        return object()

    durable = PerdureAgent(agent, app)
    handle = durable.start("where?")
    worker.run_until_idle()
    run = app.get_run(handle.id)
    assert run.status == "failed"
    message = json.loads(run.error or "{}")["message"]
    assert "tool 'lookup_order' returned a object, which is not JSON" in message, message


def test_a_renamed_tool_is_a_non_determinism_error_at_its_position(
    app: perdure.App, clock: TestClock, worker: TestWorker
) -> None:
    """Recovering a run with code whose tool was renamed stops at the diverging position
    instead of mixing the old journal with the new tool."""
    script = Scripted("issue_refund")
    agent = Agent(FunctionModel(script), name="shop")

    @agent.tool_plain
    @perdure_tool(effect="keyed")
    def issue_refund(order: str) -> str:
        return f"refunded {order}"

    durable = PerdureAgent(agent, app)
    handle = durable.start("refund order 42")
    worker.crash_after_intent(f"{NAME}.tool.issue_refund")
    with pytest.raises(SimulatedCrash):
        worker.run_until_idle()

    script.tool = "refund_order"
    agent2 = Agent(FunctionModel(script), name="shop")

    @agent2.tool_plain
    @perdure_tool(effect="keyed")
    def refund_order(order: str) -> str:
        return f"refunded {order}"

    fresh = perdure.App(app.url, clock=clock)
    try:
        PerdureAgent(agent2, fresh)
        clock.advance(worker.lease + 1)
        TestWorker(fresh).run_until_idle()
        run = fresh.get_run(handle.id)
    finally:
        fresh.close()
    assert run.status == "failed", run
    # the first recorded request offered issue_refund, which the new code lacks: replay
    # stops at that request, before the recorded response could reach a tool list without it
    error = json.loads(run.error or "{}")
    message = error.get("message", "")
    assert error.get("type") == "perdure.errors.NonDeterminismError", error
    assert "at position 0" in message and "['issue_refund']" in message, message
    assert "['refund_order']" in message and "\n" not in message, message


def test_run_inside_a_workflow_journals_into_that_run(app: perdure.App, worker: TestWorker) -> None:
    """`await durable.run(...)` inside a workflow runs the agent as part of that run: its
    model request is a step of the calling workflow, after the workflow's own step."""
    agent = Agent(TestModel(custom_output_text="42 shipped"), name="shop")
    durable = PerdureAgent(agent, app)

    @app.step(effect="read", name="ticket")
    def ticket() -> str:
        return "where is 42?"

    @app.workflow(name="support")
    async def support() -> str:
        result = await durable.run(await ticket())
        return f"{result.run_id == perdure.current_run().id}: {result.output}"

    handle = app.start(support)
    worker.run_until_idle()
    assert handle.result() == "True: 42 shipped"
    assert steps_of(app, handle.id) == [(0, "ticket"), (1, f"{NAME}.model")]


@pytest.mark.parametrize(
    ("agent", "kwargs", "needle"),
    [
        (object(), {}, "PerdureAgent wraps a pydantic_ai.Agent, not object"),
        (Agent(TestModel()), {}, "PerdureAgent needs a name"),
        (Agent(name="x"), {}, "agent 'x' has no model"),
        (Agent(TestModel(), name="x"), {"tool_effects": {"t": "twice"}}, "twice"),
    ],
)
def test_bad_input_is_one_line(
    app: perdure.App, agent: Any, kwargs: dict[str, Any], needle: str
) -> None:
    """Something that is not a usable Agent, or an unknown effect, is one clear line."""
    with pytest.raises(ConfigError) as caught:
        PerdureAgent(agent, app, **kwargs)
    assert needle in str(caught.value) and "\n" not in str(caught.value)


def test_run_and_run_sync_wait_for_a_worker_and_return_the_output(app: perdure.App) -> None:
    """`await durable.run(...)` and `durable.run_sync(...)` start the workflow and return its
    output once a worker (here one running on the app's loop) has run it."""
    agent = Agent(TestModel(custom_output_text="hello"), name="shop")
    durable = PerdureAgent(agent, app)
    w = app.worker(concurrency=2)

    async def spawn() -> asyncio.Task[None]:
        return asyncio.create_task(w.run())

    async def stop(task: asyncio.Task[None]) -> None:
        w.stop()
        await task

    task = app.runtime.sync(spawn(), "test")
    try:
        first = app.runtime.sync(durable.run("hi", timeout=30), "test")
        second = durable.run_sync("hi again", timeout=30)
    finally:
        app.runtime.sync(stop(task), "test")
    assert (first.output, second.output) == ("hello", "hello")
    assert first.run_id != second.run_id
    assert steps_of(app, second.run_id) == [(0, f"{NAME}.model")]


@pytest.mark.slow
def test_a_worker_killed_inside_a_once_tool_parks_the_run_and_no_model_call_repeats(
    tmp_path: Path, store_url: str
) -> None:
    """`kill -9` of a real `perdure worker` while the refund tool runs: a new worker finds the
    run, does not request the recorded model response again and does not re-run the refund;
    the run is in needs_attention, and resolved it finishes with one more model request."""
    pai_app = app_module("pai_app")
    url, ledger, log = store_url, tmp_path / "ledger", tmp_path / "log"
    ledger.touch()
    env = {"PAI_LEDGER": str(ledger)}
    client = perdure.App(url)
    durable = pai_app.register(client)
    lines = lambda: ledger.read_text().split()  # noqa: E731
    first = worker_process("pai_app:app", url, env, log)
    second: subprocess.Popen[bytes] | None = None
    try:
        handle = durable.start("refund order 42", run_id="refund-42")
        wait_for("the refund to start", lambda: "refund-started" in lines(), log)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        assert lines() == ["model", "refund-started"]  # killed inside the tool
        second = worker_process("pai_app:app", url, env, log)
        wait_for(
            "needs_attention", lambda: client.get_run(handle.id).status == "needs_attention", log
        )
        time.sleep(pai_app.HOLD + 0.5)  # a re-run refund would have logged by now
        assert lines() == ["model", "refund-started"]
        client.resolve(handle.id, 1, value={"value": "refunded 42 (checked by hand)"})
        result = durable.result(handle, timeout=30)
        assert result.output == "done: refunded 42 (checked by hand)"
        assert lines() == ["model", "refund-started", "model"]
    finally:
        kill_all(first, second)
        client.close()
