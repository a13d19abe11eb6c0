"""The Agents SDK made durable, continued: Runner.run_streamed through the run's durable
stream, needs_approval as perdure gates, budgets reserved before every model call."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from extras_needed import needs

pytest.importorskip("agents", reason=needs("openai-agents"))

import agents
from agents import Agent, function_tool
from agents_support import wire_servers
from gate_checks import assert_decided_once
from test_openai_agents import Payments, make_runner, script, shop_agent

import perdure
from crash_steps import crash_after, recover
from perdure.agent import budgets
from perdure.agent.budget_sql import Budget, Budgets
from perdure.integrations.openai_agents import REJECTED, Runner
from perdure.server import operations
from perdure.server.access import local_operator
from perdure.testing import TestClock, TestWorker

agents.set_tracing_disabled(True)


class HeldServer(wire_servers().OpenAIServer):  # type: ignore[misc]
    """Streams like its parent, but holds after the first text piece until `go` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()
        self.held = False

    def render_stream(self, body: dict[str, Any], turn: Any) -> Iterator[str]:
        for event in super().render_stream(body, turn):
            yield event
            if '"content": "' in event and '"content": ""' not in event and not self.held:
                self.held = True
                assert self.go.wait(20), "the reader never saw the first tokens"


def test_run_streamed_gives_tokens_while_the_model_step_runs(
    app: perdure.App, live_worker: perdure.Worker
) -> None:
    """The server holds its answer after the first piece until the caller has read it from
    the durable stream: the run finishes only because tokens flow while the step runs."""
    held = HeldServer().start()
    try:
        runner = make_runner(app)
        agent = shop_agent(held, Payments())
        runner.workflow(agent)  # registered before a worker needs it, as at import time
        held.reply("Nothing to refund today.")

        async def read() -> tuple[list[str], Any, str | None]:
            streamed = runner.run_streamed(agent, "refund o42", run_id="a-live")
            deltas: list[str] = []
            async for event in streamed.stream_events():
                if event.type != "raw_response_event":
                    continue  # the run's items, read in test_openai_agents_items.py
                if event.data.type == "response.output_text.delta":
                    deltas.append(event.data.delta)
                    held.go.set()
            assert streamed.is_complete
            return deltas, streamed.final_output, streamed.run_id

        deltas, output, run_id = app.runtime.sync(read(), "test")
    finally:
        held.go.set()
        held.stop()
    assert output == "Nothing to refund today." == "".join(deltas) and len(deltas) > 2
    assert run_id == "a-live" and held.held
    assert held.requests[0].body["stream"] is True
    names = [e.name for e in app.journal("a-live") if e.kind == "step.outcome"]
    assert names == ["agents.refunds.model"]


def test_a_recovered_run_does_not_stream_a_recorded_call_again(
    app: perdure.App, clock: TestClock, server: Any
) -> None:
    """A crash in the keyed refund after two streamed calls: recovery sends neither again
    and streams neither again (no retry marker), and a reader that reconnects at its
    offset gets exactly the rest."""
    payments = Payments()
    workflow = make_runner(app).workflow(shop_agent(server, payments))
    script(server)
    app.start(workflow, "refund o42", run_id="a-crash", stream=True)
    dead = crash_after(app, "agents.refunds.tool.issue_refund")
    assert len(server.requests) == 2
    recover(app, clock, dead)
    handle = app.handle("a-crash")
    assert handle.result() == "Order o42 was refunded." and len(server.requests) == 4

    chunks = list(handle.stream())
    markers = [(c.kind, c.data["step"]) for c in chunks if c.kind != "chunk"]
    model, tool = "agents.refunds.model", "agents.refunds.tool."
    assert markers == [  # one per step that streamed (model calls, tool outputs), none retried
        ("attempt", model), ("attempt", tool + "lookup_order"), ("attempt", model),
        ("attempt", tool + "issue_refund"), ("attempt", model),
        ("attempt", tool + "send_email"), ("attempt", model),
    ]  # fmt: skip
    runner = make_runner(app)

    async def read(offset: int, stop_after: int | None) -> tuple[list[Any], int]:
        streamed = runner.stream("a-crash", offset=offset)
        seen: list[Any] = []
        async for event in streamed.stream_events():
            if event.type == "raw_response_event":
                seen.append(event.data.model_dump(mode="json"))
            if stop_after is not None and len(seen) == stop_after:
                break
        return seen, streamed.offset

    whole, _ = app.runtime.sync(read(-1, None), "test")
    head, offset = app.runtime.sync(read(-1, 5), "test")
    rest, _ = app.runtime.sync(read(offset, None), "test")
    assert head + rest == whole and len(head) == 5 and rest
    texts = "".join(e["delta"] for e in whole if e["type"] == "response.output_text.delta")
    assert texts == "Order o42 was refunded."


def approval_agent(server: Any, payments: Payments) -> Agent[Any]:
    """The shop agent whose refund needs a person's approval."""
    agent = shop_agent(server, payments)

    @function_tool(needs_approval=True)
    def issue_refund(order: str) -> str:
        """Refund an order."""
        payments.refunds.append((order, perdure.current_step().idempotency_key))
        return f"refunded {order}"

    tools = [issue_refund if t.name == "issue_refund" else t for t in agent.tools]
    return agent.clone(tools=tools)


@pytest.mark.parametrize("approve", [True, False])
def test_needs_approval_waits_at_a_gate_answered_once_and_audited(
    app: perdure.App, worker: TestWorker, server: Any, approve: bool
) -> None:
    """A tool that needs approval parks the run at a gate that lists the call; the answer
    (audited) lets the run go on: approved, the refund runs once; denied, the model reads
    the rejection. A second answer finds no gate."""
    payments = Payments()
    workflow = Runner(app, tool_effects={"lookup_order": "read", "issue_refund": "keyed"})
    flow = workflow.workflow(approval_agent(server, payments))
    script(server)
    handle = app.start(flow, "refund o42", run_id="a-gate")
    worker.run_until_idle()
    assert handle.status() == "waiting" and payments.refunds == []
    gates = app.runtime.sync(operations.pending_gates(app), "gates")
    assert [(g.run_id, g.kind, g.call_id, g.tool, g.arguments) for g in gates] == [
        ("a-gate", "approval", "c2", "issue_refund", {"order": "o42"})
    ]
    who = local_operator()
    app.runtime.sync(operations.decide(app, who, "a-gate", "c2", approve, "checked"), "decide")
    worker.run_until_idle()
    assert handle.result() == "Order o42 was refunded."
    assert len(payments.refunds) == (1 if approve else 0)
    tool_reply = server.requests[2].body["messages"][-1]
    assert tool_reply["content"] == ("refunded o42" if approve else "checked")
    assert_decided_once(app, who, "a-gate", "c2", approve)


def test_a_steer_sent_at_a_gate_is_in_every_later_model_input_once(
    app: perdure.App, worker: TestWorker, server: Any
) -> None:
    """Steered while it waits at a gate, the agent's next model request carries the message
    as a user message, once, and so does every request after it (the SDK's input filter
    changes one call's input: it is put back each time); the journal takes it once."""
    flow = Runner(app, tool_effects={"lookup_order": "read", "issue_refund": "keyed"}).workflow(
        approval_agent(server, Payments())
    )
    script(server)
    handle = app.start(flow, "refund o42", run_id="a-steer")
    worker.run_until_idle()
    assert handle.status() == "waiting"
    app.runtime.sync(app.client.steer("a-steer", "write the e-mail in French"), "steer")
    app.send_event("a-steer", "approve:c2", {"approve": True})
    worker.run_until_idle()
    assert handle.result() == "Order o42 was refunded."
    carried = [
        [m["role"] for m in r.body["messages"] if "in French" in str(m.get("content"))]
        for r in server.requests
    ]
    assert carried == [[], [], ["user"], ["user"]]
    assert sum(e.kind == "steer.received" for e in app.journal("a-steer")) == 1


def test_a_denied_call_without_a_comment_reads_the_sdks_rejection(
    app: perdure.App, clock: TestClock, worker: TestWorker, server: Any
) -> None:
    """Denied from the CLI (`perdure send RUN approve:c2 false`) days later, the model
    reads the SDK's own rejection message."""
    payments = Payments()
    flow = Runner(app, tool_effects={"lookup_order": "read"}).workflow(
        approval_agent(server, payments)
    )
    script(server)
    handle = app.start(flow, "refund o42", run_id="a-deny")
    worker.run_until_idle()
    clock.advance(3 * 86400)
    cli = [sys.executable, "-m", "perdure", "--db", app.url, "send", "a-deny", "approve:c2",
           "false"]  # fmt: skip
    done = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    worker.run_until_idle()
    assert handle.status() == "completed" and payments.refunds == []
    assert server.requests[2].body["messages"][-1]["content"] == REJECTED


def test_a_spent_budget_parks_the_run_before_the_call_and_a_raise_wakes_it(
    app: perdure.App, worker: TestWorker, server: Any
) -> None:
    """The second call's worst case does not fit the hourly budget: it is never sent, the
    run waits holding no slot; raising the budget wakes it and it finishes."""
    runner = Runner(app, tool_effects={"lookup_order": "read"}, budget={"tokens_per_hour": 1100})
    flow = runner.workflow(shop_agent(server, Payments()))
    script(server)
    handle = app.start(flow, "refund o42", run_id="a-budget")
    worker.run_until_idle()
    assert handle.status() == "waiting" and len(server.requests) == 1
    assert app.get_run("a-budget").waiting_for == f"event:{budgets.BUDGET_EVENT}"
    woken = app.runtime.sync(
        budgets.set_budget(app.runtime, "refunds", Budget("refunds", tokens_per_hour=10**6)),
        "budget",
    )
    assert woken == 1
    worker.run_until_idle()
    assert handle.result() == "Order o42 was refunded." and len(server.requests) == 4
    rows = app.runtime.sync(Budgets(app.runtime.store).usage("refunds", 0.0), "usage")
    assert len(rows) == 4  # the refused call cost nothing and was never recorded as used


def test_a_run_over_its_own_token_limit_fails_in_one_line(
    app: perdure.App, worker: TestWorker, server: Any
) -> None:
    """A call whose worst case is over the run's max_tokens fails the run, unsent."""
    flow = Runner(app, max_tokens=200).workflow(shop_agent(server, Payments()))
    handle = app.start(flow, "refund o42", run_id="a-limit")
    worker.run_until_idle()
    assert handle.status() == "failed" and server.requests == []
    message = json.loads(app.get_run("a-limit").error or "{}")["message"]
    assert "run limit" in message and "200" in message and "\n" not in message, message


def test_a_wrong_budget_is_one_line(app: perdure.App) -> None:
    """An unknown limit or a negative one is refused when the Runner is made."""
    with pytest.raises(perdure.ConfigError, match="tokens_per_week") as bad:
        Runner(app, budget={"tokens_per_week": 5})
    assert "\n" not in str(bad.value)
    with pytest.raises(perdure.ConfigError, match="Runner: limits max_tokens: Input should be"):
        Runner(app, max_tokens=-1)
    with pytest.raises(perdure.ConfigError, match="Runner: price input: Extra inputs"):
        Runner(app, price={"input": 1.0})
