"""PerdureSession: the Agents SDK's Session protocol over perdure's store, each call inside a
durable run a transactional step, so a replay or a recovery never adds an item twice."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from extras_needed import needs

pytest.importorskip("agents", reason=needs("openai-agents"))

import agents
from agents.memory import SessionSettings
from crashes import app_module, kill_all, worker_process
from test_openai_agents import Payments, make_runner, script_parallel, shop_agent

import perdure
from crash_steps import crash_after, crash_and_recover, recover
from perdure.integrations.openai_agents import PerdureSession
from perdure.testing import TestClock, TestWorker
from waits import wait_for

agents.set_tracing_disabled(True)


@pytest.fixture
def store_app(store_url: str) -> Iterator[tuple[perdure.App, TestClock]]:
    """An app on a fresh store of each kind, with a driven clock."""
    clock = TestClock()
    app = perdure.App(store_url, clock=clock)
    yield app, clock
    app.close()


def items(app: perdure.App, session_id: str) -> list[Any]:
    """The session's items, read outside any run."""
    return app.runtime.sync(PerdureSession(session_id, app.runtime).get_items(), "test")  # type: ignore[no-any-return]


def kinds(found: list[Any]) -> list[str]:
    """Each item as its role or type: user, function_call, function_call_output, assistant."""
    return [str(i.get("role") or i.get("type")) for i in found]


TURN_1 = ["user", "function_call", "function_call_output", "assistant"]


def lookup_turn(server: Any) -> None:
    server.reply(tool_calls=[("c1", "lookup_order", {"order": "o42"})])
    server.reply("Order o42 is paid.")


def test_a_session_keeps_the_conversation_across_runs_on_both_stores(
    store_app: tuple[perdure.App, TestClock], server: Any
) -> None:
    """Turn 1 stores its items once; turn 2 (another run, same session id) sends the model
    turn 1's messages exactly once before its own; every session call is a journaled step."""
    app, _ = store_app
    workflow = make_runner(app).workflow(shop_agent(server, Payments()))
    lookup_turn(server)
    first = app.start(workflow, "is o42 paid?", run_id="t1", session="conv-1")
    TestWorker(app).run_until_idle()
    assert first.result() == "Order o42 is paid."
    assert kinds(items(app, "conv-1")) == TURN_1
    assert items(app, "conv-1")[0]["content"] == "is o42 paid?"

    server.reply("You asked about o42.")
    second = app.start(workflow, "what did I ask?", run_id="t2", session="conv-1")
    TestWorker(app).run_until_idle()
    assert second.result() == "You asked about o42."
    sent = server.requests[-1].body["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert [m.get("content") for m in sent if m["role"] == "user"] == [
        "is o42 paid?", "what did I ask?"
    ]  # fmt: skip
    assert kinds(items(app, "conv-1")) == [*TURN_1, "user", "assistant"]
    names = {e.name for e in app.journal("t2") if e.kind == "step.outcome"}
    assert {"agents.session.get_items", "agents.session.add_items"} <= names
    assert items(app, "conv-2") == []  # another conversation is its own


def test_a_replayed_run_adds_nothing_twice_and_reads_what_it_read(
    app: perdure.App, clock: TestClock, worker: TestWorker, server: Any
) -> None:
    """After a durable sleep the whole workflow replays: the SDK's session calls return
    their journaled answers (the history as it was then, though the session has moved
    on) and add nothing again."""
    runner = make_runner(app)
    agent = shop_agent(server, Payments())

    @app.workflow()
    async def chat(text: str) -> list[Any]:
        result = await runner.run(agent, text, session=PerdureSession("conv-r", app.runtime))
        await perdure.sleep(60)
        return [result.final_output, len(result.to_input_list())]

    lookup_turn(server)
    handle = app.start(chat, "is o42 paid?")
    worker.run_until_idle()
    assert kinds(items(app, "conv-r")) == TURN_1
    # someone else talks in the same conversation while the run sleeps
    app.runtime.sync(
        PerdureSession("conv-r", app.runtime).add_items([{"role": "user", "content": "hi"}]), "t"
    )
    clock.advance(61)
    worker.run_until_idle()
    assert handle.result() == ["Order o42 is paid.", 4]
    assert kinds(items(app, "conv-r")) == [*TURN_1, "user"]
    assert len(server.requests) == 2


def test_a_crash_after_the_items_were_written_adds_them_once(
    store_app: tuple[perdure.App, TestClock], server: Any
) -> None:
    """The worker dies after the agent's run wrote its items, before the workflow's outcome:
    recovery replays the session calls from the journal, asks the model nothing again,
    and the next turn sees turn 1 once."""
    app, clock = store_app
    runner = make_runner(app)
    agent = shop_agent(server, Payments())

    @app.step(effect="once", name="notify")
    async def notify(answer: str) -> str:
        return answer

    @app.workflow()
    async def chat(text: str) -> str:
        result = await runner.run(agent, text, session=PerdureSession("conv-c", app.runtime))
        return await notify(str(result.final_output))

    lookup_turn(server)
    handle = app.start(chat, "is o42 paid?", run_id="c1")
    dead = crash_after(app, "notify")
    assert kinds(items(app, "conv-c")) == TURN_1  # written, committed with their steps
    recover(app, clock, dead)
    assert handle.status() == "needs_attention"  # the once step, not the session
    app.resolve("c1", "notify", value="told")
    TestWorker(app).run_until_idle()
    assert handle.result() == "told"
    assert kinds(items(app, "conv-c")) == TURN_1 and len(server.requests) == 2


def test_a_crash_mid_conversation_resumes_with_the_items_once(
    app: perdure.App, clock: TestClock, server: Any
) -> None:
    """A crash inside the keyed refund, after the turn's input was stored: recovery does
    not store it again, and the run's items end up in the session once each."""
    payments = Payments()
    workflow = make_runner(app).workflow(shop_agent(server, payments))
    server.reply(tool_calls=[("c2", "issue_refund", {"order": "o42"})])
    server.reply("Refunded.")
    handle = app.start(workflow, "refund o42", run_id="m1", session="conv-m")
    dead = crash_after(app, "agents.refunds.tool.issue_refund")
    before = items(app, "conv-m")
    assert kinds(before)[:1] == ["user"]
    recover(app, clock, dead)
    assert handle.result() == "Refunded." and len(payments.refunds) == 1
    assert kinds(items(app, "conv-m")) == TURN_1


def test_pop_and_clear_are_steps_too(store_app: tuple[perdure.App, TestClock]) -> None:
    """pop_item and clear_session inside a run happen once: the replay after a sleep gets
    the popped item from the journal and removes nothing more (both stores)."""
    app, clock = store_app
    worker = TestWorker(app)

    @app.workflow()
    async def tidy() -> list[Any]:
        talk = PerdureSession("conv-p", app.runtime)
        await talk.add_items([{"role": "user", "content": c} for c in ("a", "b", "c")])
        popped = await talk.pop_item()
        await perdure.sleep(60)
        latest = await talk.get_items(limit=1)
        return [popped, latest]

    handle = app.start(tidy)
    worker.run_until_idle()
    clock.advance(61)
    worker.run_until_idle()
    assert handle.result() == [{"role": "user", "content": "c"}, [{"role": "user", "content": "b"}]]
    assert [i["content"] for i in items(app, "conv-p")] == ["a", "b"]

    limited = PerdureSession("conv-p", app.runtime, session_settings=SessionSettings(limit=1))
    assert app.runtime.sync(limited.get_items(), "t") == [{"role": "user", "content": "b"}]
    outside = PerdureSession("conv-p", app.runtime)
    assert app.runtime.sync(outside.pop_item(), "t") == {"role": "user", "content": "b"}
    app.runtime.sync(outside.clear_session(), "t")
    assert items(app, "conv-p") == [] and app.runtime.sync(outside.pop_item(), "t") is None

    @app.workflow()
    async def reset() -> int:
        talk = PerdureSession("conv-p", app.runtime)
        await talk.clear_session()
        await talk.add_items([{"role": "user", "content": "fresh"}])
        await perdure.sleep(60)
        return len(await talk.get_items())

    app.runtime.sync(outside.add_items([{"role": "user", "content": "old"}]), "t")
    again = app.start(reset)
    worker.run_until_idle()
    app.runtime.sync(outside.add_items([{"role": "user", "content": "later"}]), "t")
    clock.advance(61)
    worker.run_until_idle()
    assert again.result() == 2  # the replay cleared nothing again
    assert [i["content"] for i in items(app, "conv-p")] == ["fresh", "later"]


def test_bad_session_input_is_one_line(app: perdure.App, server: Any) -> None:
    """An empty id, a session= that is neither, an item JSON cannot hold: one line each,
    nothing stored."""
    with pytest.raises(perdure.ConfigError, match="needs a session id") as bad:
        PerdureSession("", app.runtime)
    assert "\n" not in str(bad.value)
    runner = make_runner(app)
    with pytest.raises(perdure.ConfigError, match="session= takes a PerdureSession"):
        runner.run_sync(shop_agent(server, Payments()), "hi", session=5)  # type: ignore[arg-type]
    talk = PerdureSession("conv-b", app.runtime)
    with pytest.raises(perdure.PayloadError, match="cannot be stored") as payload:
        app.runtime.sync(talk.add_items([{"role": "user", "content": object()}]), "t")  # type: ignore[list-item]
    assert "\n" not in str(payload.value)
    assert items(app, "conv-b") == []


@pytest.mark.slow
def test_a_worker_killed_mid_conversation_leaves_each_item_once(
    tmp_path: Path, store_url: str, server: Any
) -> None:
    """`kill -9` of a real `perdure worker` inside turn 1's stock check, after the turn's
    input was stored: a restarted worker finishes the turn (the read tool runs again, no
    recorded model call is sent again), the session holds turn 1 once, and turn 2, another
    run, sends the model turn 1's messages exactly once before its own."""
    ledger, log = tmp_path / "ledger", tmp_path / "log"
    ledger.touch()
    env = {"AGENTS_LEDGER": str(ledger), "AGENTS_BASE_URL": server.origin + "/v1"}
    os.environ.update(env)  # the client's copy of the app builds the same agent
    agents_app = app_module("agents_app")
    client = perdure.App(store_url)
    workflow = agents_app.register_helpdesk(client)
    lines = lambda: ledger.read_text().split()  # noqa: E731
    server.reply(tool_calls=[("s1", "check_stock", {"item": "lamp"})])
    server.reply("3 lamps left.")
    first = worker_process("agents_app:app", store_url, env, log)
    second: subprocess.Popen[bytes] | None = None
    try:
        turn1 = client.start(workflow, "any lamps?", run_id="k-t1", session="conv-k")
        wait_for("the stock check to start", lambda: "stock-started" in lines(), log)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        assert kinds(items(client, "conv-k")) == ["user"]  # stored before the kill
        assert len(server.requests) == 1
        second = worker_process("agents_app:app", store_url, env, log)
        assert turn1.result(timeout=60) == "3 lamps left."
        assert lines() == ["stock-started", "stock-started", "stock-done"]
        assert len(server.requests) == 2  # the first call's recorded response was replayed
        assert kinds(items(client, "conv-k")) == TURN_1

        server.reply("You asked about lamps.")
        turn2 = client.start(workflow, "what did I ask?", run_id="k-t2", session="conv-k")
        assert turn2.result(timeout=60) == "You asked about lamps."
        sent = server.requests[-1].body["messages"]
        assert [m["role"] for m in sent] == [
            "system", "user", "assistant", "tool", "assistant", "user"
        ]  # fmt: skip
        assert [m["content"] for m in sent if m["role"] == "tool"] == ["lamp: 3 left"]
        assert kinds(items(client, "conv-k")) == [*TURN_1, "user", "assistant"]
    finally:
        kill_all(first, second)
        client.close()
        for key in env:
            os.environ.pop(key, None)


def test_parallel_tool_calls_with_a_session_recover_in_order(
    app: perdure.App, clock: TestClock, server: Any
) -> None:
    """Two tool calls in one turn run concurrently; the session calls around them keep
    their positions, so the replay after a crash in the second finds each recorded, and
    the session holds the turn once, in the SDK's order."""
    payments = Payments()
    workflow = make_runner(app).workflow(shop_agent(server, payments))
    script_parallel(server)
    handle = app.start(workflow, "refund o42", run_id="p1", session="conv-par")
    crash_and_recover(app, clock, "agents.refunds.tool.issue_refund")
    assert handle.result() == "Done." and len(payments.refunds) == 1
    found = items(app, "conv-par")
    assert kinds(found) == [
        "user", "function_call", "function_call", "function_call_output",
        "function_call_output", "assistant",
    ]  # fmt: skip
    assert [i["call_id"] for i in found if i.get("type") == "function_call_output"] == [
        "c1", "c2"
    ]  # fmt: skip
