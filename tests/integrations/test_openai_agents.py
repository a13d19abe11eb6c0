"""perdure.integrations.openai_agents: the OpenAI Agents SDK's real loop, talking to a real
OpenAI-compatible HTTP server on 127.0.0.1, with its model and tool calls journaled as steps."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from crash_steps import crash_after, crash_and_recover, recover
from extras_needed import needs
from live_workers import worker_thread

pytest.importorskip("agents", reason=needs("openai-agents"))

import agents
from agents import Agent, ModelResponse, OpenAIChatCompletionsModel, function_tool
from openai import AsyncOpenAI
from pydantic import TypeAdapter

import perdure
from perdure.agent.budget_sql import Budgets
from perdure.integrations.openai_agents import Runner, tool_effect
from perdure.testing import SimulatedCrash, TestClock, TestWorker

NO_EXTRAS = Path(__file__).parent.parent / "packaging"

agents.set_tracing_disabled(True)  # no trace export: no network but the local server


class Receipt:
    """Not JSON: no journal can hold it."""


class Payments:
    """The outside world the tools act on: what each tool did, and with which key."""

    def __init__(self) -> None:
        self.lookups: list[str] = []
        self.refunds: list[tuple[str, str]] = []  # (order, idempotency key)
        self.emails: list[str] = []
        self.die_after_refund = False  # the first refund dies after paying, as a kill -9 would


def shop_agent(server: Any, payments: Payments) -> Agent[Any]:
    """A refund agent with a read, a keyed and a once tool, on the scripted server."""

    @function_tool
    def lookup_order(order: str) -> str:
        """Look an order up."""
        payments.lookups.append(order)
        return f"{order}: paid 30 EUR"

    @tool_effect("keyed")
    @function_tool
    def issue_refund(order: str) -> str:
        """Refund an order."""
        try:
            key = perdure.current_step().idempotency_key
        except perdure.PerdureError:  # the plain SDK Runner: no step, no key
            key = ""
        payments.refunds.append((order, key))
        if payments.die_after_refund:
            payments.die_after_refund = False
            raise SimulatedCrash("killed after the payment, before its outcome was journaled")
        return f"refunded {order}"

    @function_tool
    def send_email(order: str) -> str:
        """Tell the customer."""
        payments.emails.append(order)
        return "sent"

    client = AsyncOpenAI(base_url=server.origin + "/v1", api_key="dummy", max_retries=0)
    model = OpenAIChatCompletionsModel(model="scripted", openai_client=client)
    return Agent(
        name="refunds",
        instructions="Refund orders.",
        tools=[lookup_order, issue_refund, send_email],
        model=model,
    )


def script(server: Any) -> None:
    """Four model turns: look up, refund, e-mail, answer."""
    server.reply(tool_calls=[("c1", "lookup_order", {"order": "o42"})])
    server.reply(tool_calls=[("c2", "issue_refund", {"order": "o42"})])
    server.reply(tool_calls=[("c3", "send_email", {"order": "o42"})])
    server.reply("Order o42 was refunded.")


def script_parallel(server: Any) -> None:
    """Two model turns: a lookup and a refund called at once, then the answer."""
    server.reply(
        tool_calls=[
            ("c1", "lookup_order", {"order": "o42"}),
            ("c2", "issue_refund", {"order": "o42"}),
        ]
    )
    server.reply("Done.")


def steps(app: perdure.App, run_id: str) -> list[tuple[str, str]]:
    """(step name, effect) of each journaled step intent or read outcome, in order."""
    found: dict[int, tuple[str, str]] = {}
    for entry in app.journal(run_id):
        if entry.kind == "step.intent" and entry.position is not None:
            found[entry.position] = (entry.name, json.loads(entry.data or "{}")["effect"])
        elif entry.kind == "step.outcome" and entry.position not in found:
            assert entry.position is not None
            found[entry.position] = (entry.name, "read")
    return [found[p] for p in sorted(found)]


def make_runner(app: perdure.App) -> Runner:
    return Runner(app, tool_effects={"lookup_order": "read"})


def test_result_equals_the_plain_runner_and_each_call_is_a_step(
    app: perdure.App, worker: TestWorker, server: Any
) -> None:
    """The durable run answers what the SDK's own Runner answers, with the same requests,
    and journals one step per model call and per tool call, each with its effect."""
    plain_payments = Payments()
    script(server)
    plain = agents.Runner.run_sync(shop_agent(server, plain_payments), "refund o42")
    plain_requests = len(server.requests)
    assert plain_requests == 4

    payments = Payments()
    runner = make_runner(app)
    workflow = runner.workflow(shop_agent(server, payments))
    script(server)
    handle = app.start(workflow, "refund o42", run_id="r1")
    worker.run_until_idle()

    assert handle.status() == "completed"
    assert handle.result() == plain.final_output == "Order o42 was refunded."
    assert len(server.requests) - plain_requests == 4
    assert [r.body["messages"] for r in server.requests[plain_requests:]] == [
        r.body["messages"] for r in server.requests[:plain_requests]
    ]
    assert payments.refunds[0][0] == "o42" and payments.emails == ["o42"]
    model = ("agents.refunds.model", "keyed")
    assert steps(app, "r1") == [
        model,
        ("agents.refunds.tool.lookup_order", "read"),
        model,
        ("agents.refunds.tool.issue_refund", "keyed"),
        model,
        ("agents.refunds.tool.send_email", "once"),
        model,
    ]


def test_recovery_never_requests_a_recorded_response_again(
    app: perdure.App, clock: TestClock, server: Any
) -> None:
    """A crash inside the keyed refund: recovery replays the two recorded responses (the
    server sees no request for them), re-runs the refund with the same key, finishes."""
    payments = Payments()
    workflow = make_runner(app).workflow(shop_agent(server, payments))
    script(server)
    handle = app.start(workflow, "refund o42", run_id="r2")
    dead = crash_after(app, "agents.refunds.tool.issue_refund")
    assert len(server.requests) == 2 and payments.refunds == []

    recover(app, clock, dead)

    assert handle.result() == "Order o42 was refunded."
    assert len(server.requests) == 4  # only the two calls that had not been made
    assert payments.lookups == ["o42"]  # the read tool's recorded outcome was replayed
    assert len(payments.refunds) == 1
    assert payments.refunds[0][1]  # the keyed tool saw its idempotency key


def test_a_refund_killed_after_paying_is_retried_with_the_same_key(
    app: perdure.App, clock: TestClock, server: Any
) -> None:
    """The refund pays, then the worker dies before the outcome is journaled: recovery
    runs the keyed tool again with the same idempotency key (so the payments side can
    deduplicate) and asks the model only for the turns it had not answered."""
    payments = Payments()
    payments.die_after_refund = True
    workflow = make_runner(app).workflow(shop_agent(server, payments))
    script(server)
    handle = app.start(workflow, "refund o42", run_id="r-kill")
    dead = TestWorker(app)
    with pytest.raises(SimulatedCrash):
        dead.run_until_idle()
    assert len(server.requests) == 2 and len(payments.refunds) == 1

    recover(app, clock, dead)

    assert handle.result() == "Order o42 was refunded."
    assert len(server.requests) == 4
    (order, key), (again, same) = payments.refunds
    assert order == again == "o42" and key == same != ""


def test_an_interrupted_once_tool_parks_the_run(
    app: perdure.App, clock: TestClock, server: Any
) -> None:
    """A crash between the e-mail's intent and its outcome: recovery does not send it again
    (nor ask the model again); the run waits in needs_attention until an operator resolves
    the step by value, which the SDK then reads as the tool's output."""
    payments = Payments()
    workflow = make_runner(app).workflow(shop_agent(server, payments))
    script(server)
    handle = app.start(workflow, "refund o42", run_id="r3")
    dead = crash_after(app, "agents.refunds.tool.send_email")
    assert len(server.requests) == 3

    recover(app, clock, dead)

    assert handle.status() == "needs_attention"
    assert len(server.requests) == 3
    assert payments.emails == [] and len(payments.refunds) == 1

    # the operator checked the mailbox: it was sent; the value becomes the tool's output
    app.resolve("r3", "agents.refunds.tool.send_email", value="sent")
    TestWorker(app).run_until_idle()
    assert handle.result() == "Order o42 was refunded."
    assert payments.emails == [] and len(server.requests) == 4
    last = server.requests[-1].body["messages"][-1]
    assert last == {"role": "tool", "tool_call_id": "c3", "content": "sent"}


def test_run_inside_a_workflow_returns_the_sdk_result(
    app: perdure.App, worker: TestWorker, server: Any
) -> None:
    """`await runner.run(agent, input)` inside one's own workflow gives the SDK's RunResult."""
    payments = Payments()
    runner = make_runner(app)
    agent = shop_agent(server, payments)

    @app.workflow()
    async def support(text: str) -> list[str]:
        result = await runner.run(agent, text)
        return [str(result.final_output), type(result).__name__, result.last_agent.name]

    script(server)
    handle = app.start(support, "refund o42")
    worker.run_until_idle()
    assert handle.result() == ["Order o42 was refunded.", "RunResult", "refunds"]


def test_bad_input_is_one_line(app: perdure.App, server: Any) -> None:
    """Not an Agent, a bad effect, a misplaced mark, a tool without an effect under
    require_effects, run() outside a workflow: one clear line each."""
    runner = make_runner(app)
    with pytest.raises(perdure.ConfigError, match=r"needs an agents\.Agent, not str") as bad:
        runner.workflow("refunds")  # type: ignore[arg-type]
    assert "\n" not in str(bad.value)
    with pytest.raises(perdure.ConfigError, match="tool_effects\\['x'\\]"):
        Runner(app, tool_effects={"x": "twice"})  # type: ignore[dict-item]
    with pytest.raises(perdure.ConfigError, match="above @function_tool, not on builtin_function"):
        tool_effect("read")(print)  # type: ignore[type-var]
    strict = Runner(app, tool_effects={"lookup_order": "read"}, require_effects=True)
    with pytest.raises(perdure.ConfigError, match="tool 'send_email' declares no effect"):
        strict.workflow(shop_agent(server, Payments()))
    with pytest.raises(perdure.ConfigError, match=r"needs a PerdureSession, not SQLiteSession"):
        asyncio.run(runner.run(Agent(name="a"), "hi", session=agents.SQLiteSession("s")))
    with pytest.raises(perdure.ConfigError, match="inside a perdure workflow"):
        asyncio.run(runner.run(Agent(name="a"), "hi"))


def test_without_the_extra_the_import_is_one_line(tmp_path: Path) -> None:
    """With the SDK not installed (blocked as a bare install would lack it), `import perdure`
    works and importing the integration raises MissingExtra naming the extra."""
    code = (
        "import no_extras; no_extras.install()\n"
        "import perdure\n"
        "try:\n"
        "    import perdure.integrations.openai_agents\n"
        "except perdure.errors.MissingExtra as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(NO_EXTRAS)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        "perdure.integrations.openai_agents needs the openai-agents extra (agents is missing):"
        " pip install 'perdure[openai-agents]'\n"
    )


def test_a_replayed_response_is_the_recorded_one(
    app: perdure.App, clock: TestClock, worker: TestWorker, server: Any
) -> None:
    """After a durable sleep the whole workflow replays: the SDK rebuilds its result from
    the journal (no request), item for item and token for token what the live run got."""
    payments = Payments()
    runner = make_runner(app)
    agent = shop_agent(server, payments)
    dump = TypeAdapter(list[ModelResponse]).dump_python

    @app.step(effect="idempotent")
    def first_pass(responses: list[Any]) -> list[Any]:
        return responses

    @app.workflow()
    async def twice(text: str) -> list[Any]:
        result = await runner.run(agent, text)
        live = await first_pass(dump(result.raw_responses, mode="json"))
        await perdure.sleep(60)
        return [live, dump(result.raw_responses, mode="json"), result.final_output]

    script(server)
    handle = app.start(twice, "refund o42")
    worker.run_until_idle()
    assert len(server.requests) == 4
    clock.advance(61)
    worker.run_until_idle()

    live, replayed, answer = handle.result()
    assert len(server.requests) == 4
    assert replayed == live and len(live) == 4 and answer == "Order o42 was refunded."
    assert live[0]["output"][0]["type"] == "function_call"
    assert sum(r["usage"]["input_tokens"] for r in replayed) == 4 * 21


def test_the_sdks_own_streamed_loop_is_refused(app: perdure.App, server: Any) -> None:
    """The SDK's run_streamed on a durable agent is one clear error naming perdure's
    run_streamed, not an unjournaled run."""
    durable = make_runner(app).durable(shop_agent(server, Payments()))

    async def drain() -> None:
        streamed = agents.Runner.run_streamed(durable, "hi")
        async for _ in streamed.stream_events():
            pass

    with pytest.raises(perdure.ConfigError, match=r"use perdure's Runner\(app\)\.run_streamed"):
        asyncio.run(drain())
    assert server.requests == []


def test_usage_shows_per_model_call(app: perdure.App, worker: TestWorker, server: Any) -> None:
    """Each model call's tokens are recorded for `perdure usage`, under the agent's name."""
    workflow = make_runner(app).workflow(shop_agent(server, Payments()))
    script(server)
    handle = app.start(workflow, "refund o42", run_id="r-usage")
    worker.run_until_idle()
    assert handle.status() == "completed"
    rows = app.runtime.sync(Budgets(app.runtime.store).usage("refunds", 0.0), "usage")
    assert [(r.run_id, r.model, r.input_tokens, r.output_tokens) for r in rows] == [
        ("r-usage", "scripted", 21, 7)
    ] * 4
    assert sorted(r.position for r in rows) == [0, 2, 4, 6]


def test_a_refused_key_parks_and_a_bad_request_fails_in_one_line(
    app: perdure.App, worker: TestWorker, server: Any
) -> None:
    """A 401 pauses the run with a reason naming the agent and `perdure resume`; a 400
    fails it at once with one line naming the step; neither records a response."""
    workflow = make_runner(app).workflow(shop_agent(server, Payments()))
    server.fail_next(401)
    parked = app.start(workflow, "refund o42", run_id="r-401")
    worker.run_until_idle()
    assert parked.status() == "paused"
    reason = json.loads(app.get_run("r-401").error or "{}")["message"]
    assert reason.startswith("agent 'refunds', model 'scripted': the provider refused the key")
    assert "\n" not in reason and reason.endswith("then `perdure resume r-401`")
    assert len(server.requests) == 1
    server.reply("Nothing to refund.")  # the key was fixed: resume asks the model again
    app.resume("r-401")
    worker.run_until_idle()
    assert parked.result() == "Nothing to refund." and len(server.requests) == 2
    server.fail_next(400)
    failed = app.start(workflow, "refund o42", run_id="r-400")
    worker.run_until_idle()
    assert failed.status() == "failed"
    error = json.loads(app.get_run("r-400").error or "{}")["message"]
    assert "agents.refunds.model" in error and "Unknown parameter" in error, error
    assert "\n" not in error and len(server.requests) == 3


def test_handoffs_are_durable_too(app: perdure.App, worker: TestWorker, server: Any) -> None:
    """The agent a triage agent hands off to gets its own durable model and tools: every
    model call of both agents is a step, under each agent's name."""
    refunds = shop_agent(server, Payments())
    triage = Agent(name="triage", instructions="Route.", handoffs=[refunds], model=refunds.model)
    workflow = make_runner(app).workflow(triage)
    server.reply(tool_calls=[("h1", "transfer_to_refunds", {})])
    server.reply(tool_calls=[("c1", "lookup_order", {"order": "o42"})])
    server.reply("Order o42 is paid.")
    handle = app.start(workflow, "refund o42", run_id="r-handoff")
    worker.run_until_idle()
    assert handle.result() == "Order o42 is paid."
    assert steps(app, "r-handoff") == [
        ("agents.triage.model", "keyed"),
        ("agents.refunds.model", "keyed"),
        ("agents.refunds.tool.lookup_order", "read"),
        ("agents.refunds.model", "keyed"),
    ]


def test_run_sync_waits_for_a_real_worker(app: perdure.App, server: Any) -> None:
    """`runner.run_sync(agent, input)` starts the durable run and returns its final output
    once a worker (here a real one, on its own thread) has run it."""
    runner = make_runner(app)
    agent = shop_agent(server, Payments())
    runner.workflow(agent)  # registered before the worker starts, as at import time
    script(server)
    with worker_thread(app, poll=0.05, gc_every=None):
        answer = runner.run_sync(agent, "refund o42", run_id="r-sync", timeout=60)
    assert answer == "Order o42 was refunded."
    assert app.get_run("r-sync").status == "completed" and len(server.requests) == 4


@pytest.mark.postgres
def test_recovery_on_postgres(pg_url: str, server: Any) -> None:
    """On PostgreSQL too: recovery after a crash in the e-mail tool asks the model for
    nothing it had answered and parks the interrupted once tool."""
    clock = TestClock()
    app = perdure.App(pg_url, clock=clock)
    try:
        payments = Payments()
        workflow = make_runner(app).workflow(shop_agent(server, payments))
        script(server)
        handle = app.start(workflow, "refund o42", run_id="r-pg")
        crash_and_recover(app, clock, "agents.refunds.tool.send_email")
        assert handle.status() == "needs_attention"
        assert len(server.requests) == 3 and payments.emails == []
        assert len(payments.refunds) == 1
    finally:
        app.close()


def test_a_non_json_tool_result_fails_the_run_in_one_line(
    app: perdure.App, worker: TestWorker, server: Any
) -> None:
    """A tool whose result cannot be journaled fails the run with one line naming the tool
    and the value, instead of a response the journal could not replay."""

    @function_tool
    def lookup_order(order: str) -> Receipt:
        """Look an order up."""
        return Receipt()

    agent = shop_agent(server, Payments()).clone(tools=[lookup_order])
    workflow = make_runner(app).workflow(agent)
    server.reply(tool_calls=[("c1", "lookup_order", {"order": "o42"})])
    handle = app.start(workflow, "refund o42", run_id="r-json")
    worker.run_until_idle()
    assert handle.status() == "failed"
    message = json.loads(app.get_run("r-json").error or "{}")["message"]
    assert "\n" not in message
    assert "agents.refunds.tool.lookup_order" in message and "not JSON" in message, message
    assert len(server.requests) == 1


def test_the_side_effect_inventory_lists_every_step_before_any_run(
    app: perdure.App, server: Any
) -> None:
    """`runner.workflow(agent)` registers its model and tool steps at once, with their
    effects, so `perdure effects` shows them before the first run."""
    make_runner(app).workflow(shop_agent(server, Payments()))
    assert {n: d.effect for n, d in app.runtime.steps.items() if n.startswith("agents.")} == {
        "agents.refunds.model": "keyed",
        "agents.refunds.tool.lookup_order": "read",
        "agents.refunds.tool.issue_refund": "keyed",
        "agents.refunds.tool.send_email": "once",
    }


def test_two_runners_share_steps_but_not_effects(app: perdure.App, server: Any) -> None:
    """A second Runner on the same app reuses the agent's steps; one that declares another
    effect for the same tool is one clear line."""
    agent = shop_agent(server, Payments())
    make_runner(app).workflow(agent)
    make_runner(app).durable(agent)  # same effects: fine
    with pytest.raises(perdure.ConfigError, match="already registered as read, not once"):
        Runner(app).durable(agent)


def test_parallel_tool_calls_keep_their_positions_across_recovery(
    app: perdure.App, clock: TestClock, server: Any
) -> None:
    """Two tool calls in one turn run concurrently in the SDK; their steps take positions
    in call order, so the replay after a crash in the second finds the first recorded."""
    payments = Payments()
    workflow = make_runner(app).workflow(shop_agent(server, payments))
    script_parallel(server)
    handle = app.start(workflow, "refund o42", run_id="r-par")
    crash_and_recover(app, clock, "agents.refunds.tool.issue_refund")
    assert handle.result() == "Done."
    assert len(server.requests) == 2 and len(payments.refunds) == 1
    assert steps(app, "r-par") == [
        ("agents.refunds.model", "keyed"),
        ("agents.refunds.tool.lookup_order", "read"),
        ("agents.refunds.tool.issue_refund", "keyed"),
        ("agents.refunds.model", "keyed"),
    ]
