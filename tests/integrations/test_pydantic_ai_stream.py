"""PerdureAgent.run_stream: a model step's tokens reach the caller through the run's durable
stream while the step runs; the response is journaled once and never streamed again."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest

from extras_needed import needs

pytest.importorskip("pydantic_ai", reason=needs("pydantic-ai"))

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, PartDeltaEvent, PartStartEvent
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel

import perdure
from crash_steps import crash_after, recover
from perdure.agent.budget_sql import Budgets
from perdure.integrations.pydantic_ai import PerdureAgent, perdure_tool
from perdure.testing import SimulatedCrash, TestClock, TestWorker

NAME = "pydantic_ai:writer"


def no_request(messages: list[ModelMessage], info: AgentInfo) -> Any:
    raise AssertionError("a streaming run asks the model through request_stream only")


def test_tokens_reach_the_caller_while_the_model_step_runs(
    app: perdure.App, live_worker: perdure.Worker
) -> None:
    """The model holds its last token until the caller has read the first ones from the
    durable stream: the run can only finish if tokens flow while the step runs."""
    seen = threading.Event()
    calls: list[int] = []

    async def tokens(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
        calls.append(1)
        yield "Hel"
        yield "lo "
        assert await asyncio.to_thread(seen.wait, 20), "the caller never saw the first tokens"
        yield "world"

    durable = PerdureAgent(
        Agent(FunctionModel(no_request, stream_function=tokens), name="writer"), app
    )

    async def read() -> tuple[list[str], Any, str]:
        texts: list[str] = []
        async with durable.run_stream("greet", run_id="s-live") as run:
            async for text in run.stream_text():
                texts.append(text)
                if text.startswith("Hello"):
                    seen.set()
            return texts, await run.get_output(timeout=30), run.run_id

    texts, output, run_id = app.runtime.sync(read(), "test")
    assert output == "Hello world" and run_id == "s-live"
    assert texts[-1] == "Hello world" and "Hel" in texts
    assert calls == [1]
    journal = app.journal("s-live")
    outcomes = [e for e in journal if e.kind == "step.outcome"]
    assert [e.name for e in outcomes] == [f"{NAME}.model"]  # the response journaled once


class ToolThenText:
    """Stream a tool call (with some text first), then the answer; counts model calls."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(
        self, messages: list[ModelMessage], info: AgentInfo
    ) -> AsyncIterator[str | DeltaToolCalls]:
        self.calls += 1
        returns = [p for m in messages for p in getattr(m, "parts", [])
                   if p.part_kind == "tool-return"]  # fmt: skip
        if not returns:
            yield {0: DeltaToolCall("issue_refund", '{"order": ', tool_call_id="c1")}
            yield {0: DeltaToolCall(json_args='"42"}')}
            return
        for piece in ("refunded ", "order ", "42"):
            yield piece


def test_a_replayed_step_is_not_streamed_again_and_a_reader_resumes_at_its_offset(
    app: perdure.App, clock: TestClock
) -> None:
    """A crash in the keyed tool after a streamed model step: recovery replays the recorded
    response without calling the model or streaming it again; a reader that stopped half
    way and reconnects at its offset gets exactly the rest."""
    script = ToolThenText()
    agent = Agent(FunctionModel(no_request, stream_function=script), name="writer")
    refunds: list[str] = []

    @agent.tool_plain
    @perdure_tool(effect="keyed")
    def issue_refund(order: str) -> str:
        refunds.append(order)
        return f"ok {order}"

    durable = PerdureAgent(agent, app)
    handle = durable.start("refund 42", run_id="s-crash", stream=True)
    dead = crash_after(app, f"{NAME}.tool.issue_refund")
    assert script.calls == 1
    recover(app, clock, dead)
    assert durable.result(handle).output == "refunded order 42"
    assert script.calls == 2 and refunds == ["42"]

    chunks = list(handle.stream())
    markers = [(c.kind, c.data["position"]) for c in chunks if c.kind != "chunk"]
    assert markers == [("attempt", 0), ("attempt", 2)]  # no retry: position 0 streamed once
    positions = [c.data["position"] for c in chunks if c.kind == "chunk"]
    assert positions == sorted(positions) and set(positions) == {0, 2}

    async def read(offset: int, stop_after: int | None) -> tuple[list[Any], int]:
        run = durable.stream("s-crash", offset=offset)
        events: list[Any] = []
        async for event in run.stream_events():
            events.append(event)
            if stop_after is not None and len(events) == stop_after:
                break
        return events, run.offset

    whole, _ = app.runtime.sync(read(-1, None), "test")
    head, offset = app.runtime.sync(read(-1, 2), "test")
    rest, _ = app.runtime.sync(read(offset, None), "test")
    assert head + rest == whole and len(head) == 2 and rest
    assert isinstance(whole[0], PartStartEvent) and any(
        isinstance(e, PartDeltaEvent) for e in whole
    )

    async def text() -> list[str]:
        return [t async for t in durable.stream("s-crash").stream_text(delta=True)]

    assert "".join(app.runtime.sync(text(), "test")) == "refunded order 42"


def test_run_stream_inside_a_workflow_is_one_line(app: perdure.App, worker: TestWorker) -> None:
    """run_stream starts a run of its own: called inside a workflow it says to use run()."""
    durable = PerdureAgent(Agent(FunctionModel(no_request), name="writer"), app)

    @app.workflow(name="outer")
    async def outer() -> str:
        async with durable.run_stream("x"):
            return "unreachable"

    handle = app.start(outer)
    worker.run_until_idle()
    run = app.get_run(handle.id)
    assert run.status == "failed" and "inside a workflow use run()" in (run.error or "")


def test_a_stream_cut_off_by_a_crash_is_dropped_and_streamed_again(
    app: perdure.App, clock: TestClock
) -> None:
    """A crash while the model streams: the keyed request runs again on recovery behind a
    `retry` marker, and stream_text drops the partial text it had shown."""
    calls: list[int] = []

    async def tokens(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
        calls.append(1)
        yield "Hel"
        yield "lo"
        if len(calls) == 1:  # wait until the partial text is in the store, then die
            for _ in range(2000):
                if (
                    len(await app.runtime.store.read_stream("s-cut", -1, 10)) >= 3
                ):  # marker, 2 pieces
                    break
                await asyncio.sleep(0.005)
            raise SimulatedCrash("killed while the model streamed")
        yield " world"

    durable = PerdureAgent(
        Agent(FunctionModel(no_request, stream_function=tokens), name="writer"), app
    )
    handle = durable.start("greet", run_id="s-cut", stream=True)
    dead = TestWorker(app)
    with pytest.raises(SimulatedCrash):
        dead.run_until_idle()
    recover(app, clock, dead)
    assert durable.result(handle).output == "Hello world" and len(calls) == 2

    markers = [c.kind for c in handle.stream() if c.kind != "chunk"]
    assert markers == ["attempt", "retry"]

    async def texts() -> list[str]:
        return [t async for t in durable.stream("s-cut").stream_text()]

    assert app.runtime.sync(texts(), "test") == ["Hel", "Hello", "Hel", "Hello", "Hello world"]


def test_an_openai_compatible_sse_stream_is_read_back_and_its_usage_recorded(
    app: perdure.App, worker: TestWorker
) -> None:
    """pydantic-ai's OpenAI model on a scripted server that answers in server-sent events:
    the run's stream holds the text the server sent in pieces, the journal the response
    once, and `perdure usage` the tokens the stream reported."""
    from agents_support import wire_servers
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    server = wire_servers().OpenAIServer().start()
    try:
        server.reply("Order 42 is on its way.")
        provider = OpenAIProvider(base_url=server.origin + "/v1", api_key="dummy")
        agent = Agent(OpenAIChatModel("scripted", provider=provider), name="writer")
        durable = PerdureAgent(agent, app)
        handle = durable.start("where is 42?", run_id="s-sse", stream=True)
        worker.run_until_idle()
    finally:
        server.stop()
    assert durable.result(handle).output == "Order 42 is on its way."
    assert len(server.requests) == 1 and server.requests[0].body["stream"] is True

    async def texts() -> list[str]:
        return [t async for t in durable.stream("s-sse").stream_text(delta=True)]

    pieces = app.runtime.sync(texts(), "test")
    assert "".join(pieces) == "Order 42 is on its way." and len(pieces) > 3
    rows = app.runtime.sync(Budgets(app.runtime.store).usage(NAME, 0.0), "usage")
    assert [(r.run_id, r.input_tokens, r.output_tokens) for r in rows] == [("s-sse", 21, 7)]
