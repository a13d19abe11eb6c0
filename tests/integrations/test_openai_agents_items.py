"""Runner.run_streamed gives the SDK's run-item events too (tool called, tool output, message
output), as the plain SDK's streamed run does, written by the steps that made them: a
replayed or recovered run does not stream a recorded item again."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from extras_needed import needs

pytest.importorskip("agents", reason=needs("openai-agents"))

import agents
from agents import ItemHelpers
from test_openai_agents import Payments, make_runner, script, shop_agent

import perdure
from crash_steps import crash_and_recover
from perdure.integrations.openai_agents import PerdureSession
from perdure.testing import TestClock, TestWorker

agents.set_tracing_disabled(True)


def seen(event: Any) -> tuple[Any, ...]:
    """What a run-item event says: its name, the item's type and agent, and its payload
    (the tool's name, the tool's output, the message's text)."""
    item = event.item
    if item.type == "tool_call_item":
        detail: Any = (item.raw_item.name, item.raw_item.call_id)
    elif item.type == "tool_call_output_item":
        detail = (item.output, item.raw_item["call_id"])
    elif item.type == "message_output_item":
        detail = ItemHelpers.text_message_output(item)
    else:
        detail = None
    return (event.name, item.type, item.agent.name, detail)


async def drain(streamed: Any) -> tuple[list[tuple[Any, ...]], int]:
    """The run-item events of a streamed run and how many raw response events came."""
    items: list[tuple[Any, ...]] = []
    raw = 0
    async for event in streamed.stream_events():
        if event.type == "run_item_stream_event":
            items.append(seen(event))
        elif event.type == "raw_response_event":
            raw += 1
    return items, raw


def test_run_item_events_are_the_plain_sdks(
    app: perdure.App, live_worker: perdure.Worker, server: Any
) -> None:
    """The durable stream's run items equal, one for one and in order, those the SDK's own
    run_streamed gives for the same conversation, between the raw response events."""
    script(server)

    async def plain() -> tuple[list[tuple[Any, ...]], int]:
        return await drain(agents.Runner.run_streamed(shop_agent(server, Payments()), "refund o42"))

    plain_items, plain_raw = asyncio.run(plain())
    runner = make_runner(app)
    agent = shop_agent(server, Payments())
    runner.workflow(agent)  # registered before a worker needs it, as at import time
    script(server)
    streamed = runner.run_streamed(agent, "refund o42", run_id="i-live")
    items, raw = app.runtime.sync(drain(streamed), "test")
    assert streamed.final_output == "Order o42 was refunded."
    assert items == plain_items and raw > 0 and plain_raw > 0
    assert [i[0] for i in items] == [
        "tool_called", "tool_output", "tool_called", "tool_output",
        "tool_called", "tool_output", "message_output_created",
    ]  # fmt: skip
    assert items[1][3] == ("o42: paid 30 EUR", "c1")
    assert items[-1][3] == "Order o42 was refunded."


def test_a_recovered_run_streams_each_item_once(
    app: perdure.App, clock: TestClock, server: Any
) -> None:
    """A crash inside the keyed refund after two turns: recovery replays the recorded model
    calls and the lookup from the journal and streams none of their items again; a reader
    from the start gets each item exactly once, and one reconnecting at its offset the rest."""
    payments = Payments()
    runner = make_runner(app)
    workflow = runner.workflow(shop_agent(server, payments))
    script(server)
    app.start(workflow, "refund o42", run_id="i-crash", stream=True)
    crash_and_recover(app, clock, "agents.refunds.tool.issue_refund")
    assert app.handle("i-crash").result() == "Order o42 was refunded."

    whole, _ = app.runtime.sync(drain(runner.stream("i-crash")), "test")
    assert Counter(i[0] for i in whole) == {
        "tool_called": 3, "tool_output": 3, "message_output_created": 1
    }  # fmt: skip
    assert len(set(whole)) == len(whole)  # nothing twice
    assert [i[3] for i in whole if i[0] == "tool_output"] == [
        ("o42: paid 30 EUR", "c1"), ("refunded o42", "c2"), ("sent", "c3")
    ]  # fmt: skip
    assert {i[2] for i in whole} == {"refunds"}


def test_a_replay_streams_nothing_again(
    app: perdure.App, clock: TestClock, worker: TestWorker, server: Any
) -> None:
    """A streamed run that sleeps after the agent replays the whole SDK loop when it wakes:
    the stream holds the items of the live run only."""
    runner = make_runner(app)
    agent = shop_agent(server, Payments())

    @app.workflow()
    async def twice(text: str, stream: bool = False) -> str:
        from perdure.integrations.streaming import streaming

        token = streaming.set(stream)
        try:
            result = await runner.run(agent, text)
        finally:
            streaming.reset(token)
        await perdure.sleep(60)
        return str(result.final_output)

    script(server)
    handle = app.start(twice, "refund o42", stream=True)
    worker.run_until_idle()
    before = app.runtime.sync(
        app.runtime.store.read_stream(handle.id), "test"
    )  # the run sleeps: read, not follow
    assert sum(1 for c in before if c.topic == "items") == 7
    clock.advance(61)
    worker.run_until_idle()
    assert handle.result() == "Order o42 was refunded."
    after = list(handle.stream())
    assert [c.seq for c in after] == [c.seq for c in before]  # nothing more was written


def test_a_streamed_run_with_a_session(
    app: perdure.App, live_worker: perdure.Worker, server: Any
) -> None:
    """run_streamed(session=...) streams the turn and stores it in the conversation once."""
    runner = make_runner(app)
    agent = shop_agent(server, Payments())
    runner.workflow(agent)
    server.reply(tool_calls=[("c1", "lookup_order", {"order": "o42"})])
    server.reply("Order o42 is paid.")
    talk = PerdureSession("conv-s", app.runtime)
    streamed = runner.run_streamed(agent, "is o42 paid?", run_id="i-talk", session=talk)
    found, _ = app.runtime.sync(drain(streamed), "test")
    assert [i[0] for i in found] == ["tool_called", "tool_output", "message_output_created"]
    stored = app.runtime.sync(talk.get_items(), "test")
    assert [i.get("role") or i.get("type") for i in stored] == [
        "user", "function_call", "function_call_output", "assistant"
    ]  # fmt: skip
