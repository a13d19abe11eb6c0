"""The agent loop on a driven clock with the scripted model: tools, boundaries, completion,
limits, budgets, usage, memory and crash recovery that never re-bills a model call."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import perdure
from perdure.agent.budget_sql import Budget, Budgets
from perdure.agent.loop import Agent, raise_budget
from perdure.agent.memory_sql import AgentMemory
from perdure.agent.providers.scripted import ScriptedModel
from perdure.agent.spec import load_spec
from perdure.agent.tools import ToolContext, tool
from perdure.testing import SimulatedCrash, TestClock, TestWorker

SPEC = """
name = "helper"
goal = "Do the task"
instructions = "Use tools."

[models.fast]
provider = "scripted"
context_tokens = 100000
price = {{ input_per_mtok = 1000, output_per_mtok = 2000 }}

[tools]
grant = ["read_file", "write_file", "finish", "remember", "recall"{grant}]
approval = {approval}
read_paths = ["data"]
write_paths = ["out"]

[limits]
max_iterations = {iterations}
repeat_failures = 2
{extra}
"""


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"content": "", "tool_calls": [{"name": name, "arguments": arguments}]}


def make(
    app: perdure.App,
    tmp_path: Path,
    replies: list[Any],
    *,
    iterations: int = 6,
    extra: str = "",
    grant: tuple[str, ...] = (),
    approval: tuple[str, ...] = (),
    tools: tuple[Any, ...] = (),
) -> tuple[Agent, ScriptedModel]:
    (tmp_path / "data").mkdir(exist_ok=True)
    (tmp_path / "out").mkdir(exist_ok=True)
    (tmp_path / "data" / "in.txt").write_text("alpha beta")
    path = tmp_path / "agent.toml"
    more = "".join(f', "{g}"' for g in grant)
    path.write_text(
        SPEC.format(iterations=iterations, extra=extra, grant=more, approval=json.dumps(approval))
    )
    model = ScriptedModel(replies)
    return Agent(app.runtime, load_spec(path), providers={"fast": model}, tools=list(tools)), model


def test_tools_run_and_finish_needs_the_acceptance(
    app: perdure.App, worker: TestWorker, tmp_path: Path
) -> None:
    agent, model = make(
        app, tmp_path,
        [
            call("read_file", path="data/in.txt"),  # from the spec's folder, like read_paths
            call("write_file", path=str(tmp_path / "out" / "res.txt"), content="ALPHA BETA"),
            call("finish", summary="copied in upper case"),
        ],
        extra=f'[acceptance]\ncommand = "test -s {tmp_path}/out/res.txt"',
    )  # fmt: skip
    handle = app.start(agent.workflow, {"prompt": "copy in.txt in upper case"})
    worker.run_until_idle()
    result = handle.result(timeout=5)
    assert result["status"] == "done" and "exited 0" in result["evidence"]
    assert (tmp_path / "out" / "res.txt").read_text() == "ALPHA BETA"
    assert model.calls == 3 and result["tokens"] == model.tokens
    tool_turns = [m for m in model.requests[1].messages if m.role == "tool"]
    assert tool_turns[0].content == "alpha beta"  # the tool's result went back, paired by id
    [asked] = [m for m in model.requests[1].messages if m.role == "assistant"]
    assert tool_turns[0].tool_call_id == asked.tool_calls[0].id
    usage = app.runtime.sync(Budgets(app.runtime.store).usage("helper", 0.0), "usage")
    assert len(usage) == 3 and sum(u.input_tokens + u.output_tokens for u in usage) == model.tokens
    assert result["cost"] == pytest.approx(sum(u.cost for u in usage)) and result["cost"] > 0


def test_a_call_outside_the_boundary_is_refused_journaled_and_shown_to_the_model(
    app: perdure.App, worker: TestWorker, tmp_path: Path
) -> None:
    outside = tmp_path / "secret.txt"
    outside.write_text("do not read")
    agent, model = make(
        app, tmp_path,
        [call("read_file", path="../secret.txt"), call("run_command", argv=["touch", "x"]),
         call("finish", summary="gave up")],
    )  # fmt: skip
    handle = app.start(agent.workflow, {"prompt": "read the secret"})
    worker.run_until_idle()
    assert handle.result(timeout=5)["status"] == "done"
    answers = [m.content for m in model.requests[2].messages if m.role == "tool"]
    assert answers[0].startswith("refused: ") and "do not read" not in answers[0]
    assert answers[1] == "refused: tool 'run_command' is not granted"
    offered = {t.name for t in model.requests[0].tools}
    assert offered == {"read_file", "write_file", "finish", "remember", "recall"}
    refusals = [e for e in app.journal(handle.id) if e.name == "agent:helper.refuse" and e.final]
    assert len(refusals) == 2 and not (tmp_path / "x").exists()


def test_the_same_failing_call_stops_the_loop(
    app: perdure.App, worker: TestWorker, tmp_path: Path
) -> None:
    agent, _ = make(app, tmp_path, [call("read_file", path="../etc/passwd")] * 3)
    handle = app.start(agent.workflow, {"prompt": "x"})
    worker.run_until_idle()
    with pytest.raises(perdure.RunFailed, match="repeated 2 times"):
        handle.result(timeout=5)
    notes = app.runtime.sync(AgentMemory(app.runtime.store).get_notes("helper"), "notes")
    assert " failed: x: the same failing call read_file" in notes  # a failed run leaves notes


def test_iterations_are_limited_and_the_last_evidence_is_given(
    app: perdure.App, worker: TestWorker, tmp_path: Path
) -> None:
    agent, _ = make(
        app, tmp_path, ["not yet", "still not"], iterations=2,
        extra='[acceptance]\ncommand = "false"',
    )  # fmt: skip
    handle = app.start(agent.workflow, {"prompt": "x"})
    worker.run_until_idle()
    with pytest.raises(perdure.RunFailed, match=r"2 iterations .*`false` exited 1"):
        handle.result(timeout=5)


def test_a_spent_budget_parks_the_run_until_it_is_raised(
    app: perdure.App, worker: TestWorker, tmp_path: Path
) -> None:
    """The second run's worst case does not fit what the first spent: it parks (the refusal
    journaled with its reason) and runs when the budget is raised."""
    first_reply = {"content": "first", "usage": {"input_tokens": 850, "output_tokens": 50}}
    agent, model = make(
        app, tmp_path, [first_reply, "second"],
        extra="max_tokens_per_call = 50\n[budget]\ntokens_per_day = 1000",
    )  # fmt: skip
    first = app.start(agent.workflow, {"prompt": "one"}, run_id="one")
    worker.run_until_idle()
    assert first.result(timeout=5)["status"] == "done"  # its worst case fitted
    second = app.start(agent.workflow, {"prompt": "two"}, run_id="two")
    worker.run_until_idle()
    assert second.status() == "waiting" and model.calls == 1
    refused = [e for e in app.journal("two") if e.name == "agent:helper.model" and e.final]
    assert "900 of 1000 tokens used or reserved" in (refused[-1].data or "")
    woken = app.runtime.sync(
        raise_budget(app.runtime, "helper", Budget("helper", tokens_per_day=10**6)), "raise"
    )
    assert woken == 1
    worker.run_until_idle()
    assert second.result(timeout=5)["answer"] == "second" and model.calls == 2


def test_a_crash_after_a_tool_resumes_without_calling_the_model_again(
    app: perdure.App, worker: TestWorker, tmp_path: Path
) -> None:
    """The worker dies right after a `once` tool's intent: recovery parks that call (never
    repeated), the operator resolves it, and the model is not called again for turns
    already journaled: replay spends zero tokens."""
    agent, model = make(
        app, tmp_path,
        [call("write_file", path=str(tmp_path / "out" / "a.txt"), content="A"),
         call("finish", summary="ok")],
    )  # fmt: skip
    handle = app.start(agent.workflow, {"prompt": "write a"})
    worker.crash_after_intent("agent:helper.tool.write_file")
    with pytest.raises(SimulatedCrash):
        worker.run_until_idle()
    calls, tokens = model.calls, model.tokens
    assert calls == 1
    app.clock.advance(worker.lease + 1)  # type: ignore[attr-defined]
    worker.run_until_idle()
    assert handle.result(timeout=5)["status"] == "done"
    assert model.calls == calls + 1  # only the turn after the tool; the first was replayed
    assert (tmp_path / "out" / "a.txt").read_text() == "A"
    assert model.tokens > tokens


@tool(effect=lambda args: "read" if args.get("method") == "GET" else "once")
def hook(url: str, method: str = "GET") -> str:
    """Call a web hook.

    Args:
        url: The hook.
        method: GET reads, anything else changes something.
    """
    return f"{method} {url}"


def test_each_tool_call_is_a_step_named_after_its_tool(
    app: perdure.App, worker: TestWorker, tmp_path: Path
) -> None:
    """Each tool's calls are the step `agent:NAME.tool.TOOL` with the tool's effect; a call
    whose effect depends on its arguments (a GET) is `agent:NAME.tool.TOOL.EFFECT`; the run
    records one marker saying so (not the budget one, which it implies)."""
    agent, _ = make(
        app, tmp_path,
        [call("write_file", path=str(tmp_path / "out" / "a.txt"), content="A"),
         call("hook", url="http://h/x", method="GET"), call("hook", url="http://h/x",
         method="POST"), call("finish", summary="ok")],
        grant=("hook",), tools=(hook,),
    )  # fmt: skip
    handle = app.start(agent.workflow, {"prompt": "write a"})
    worker.run_until_idle()
    assert handle.result(timeout=5)["status"] == "done"
    journal = app.journal(handle.id)
    assert [(e.kind, e.name) for e in journal if e.position == 0] == [
        ("patch.marker", "perdure.agent.tool_names")
    ]
    outcomes = [e.name for e in journal if e.kind == "step.outcome" and ".tool." in e.name]
    assert outcomes == ["agent:helper.tool.write_file", "agent:helper.tool.hook.read",
                        "agent:helper.tool.hook", "agent:helper.tool.finish"]  # fmt: skip
    steps = app.runtime.steps
    assert steps["agent:helper.tool.write_file"].effect == "idempotent"
    assert steps["agent:helper.tool.hook"].effect == "once"
    assert steps["agent:helper.tool.hook.read"].effect == "read"


@pytest.mark.parametrize("effect", ["read", "once"])
def test_a_tool_named_like_an_effect_shares_the_older_step_or_is_refused(
    app: perdure.App, tmp_path: Path, effect: str
) -> None:
    """A tool named `read` takes the step older runs' read calls ran as (the same name,
    the same effect); declared `once`, it could not, and the agent says so in one line."""

    @tool(name="read", effect=effect)
    def read_it(what: str) -> str:
        """Read it.

        Args:
            what: What.
        """
        return what

    if effect == "once":
        with pytest.raises(perdure.ConfigError, match=r"tool 'read' is once.*rename the tool"):
            make(app, tmp_path, [], grant=("read",), tools=(read_it,))
        return
    agent, _ = make(app, tmp_path, [], grant=("read",), tools=(read_it,))
    assert agent.steps.tools["read"] is agent.steps.by_effect["read"]


def test_memory_is_kept_across_runs_of_the_agent(
    app: perdure.App, worker: TestWorker, tmp_path: Path
) -> None:
    agent, model = make(
        app, tmp_path,
        [call("remember", text="the client is ACME", tags=["client"]), "noted",
         "I recall ACME"],
        extra='[memory]\nnotes = "agent"',
    )  # fmt: skip
    app.start(agent.workflow, {"prompt": "note the client"}, run_id="m1")
    worker.run_until_idle()
    app.start(agent.workflow, {"prompt": "who is the client"}, run_id="m2")
    worker.run_until_idle()
    system = model.requests[-1].messages[0].content
    assert "the client is ACME" in system and "done" in system  # memory and progress notes


def test_a_destructive_call_waits_for_approval_and_a_denial_is_shown(
    app: perdure.App, worker: TestWorker, tmp_path: Path
) -> None:
    target = tmp_path / "out" / "w.txt"
    agent, model = make(
        app, tmp_path,
        [call("write_file", path=str(target), content="1"),
         call("write_file", path=str(target), content="2"), call("finish", summary="ok")],
        approval=("write_file",),
    )  # fmt: skip
    handle = app.start(agent.workflow, {"prompt": "write"}, run_id="ap")
    worker.run_until_idle()
    assert handle.status() == "waiting" and not target.exists()  # nothing runs before a yes
    first = model.script[0].message.tool_calls[0].id
    app.send_event("ap", f"approve:{first}", {"approve": True})
    worker.run_until_idle()
    assert target.read_text() == "1" and handle.status() == "waiting"
    second = model.script[1].message.tool_calls[0].id
    app.send_event("ap", f"approve:{second}", {"approve": False, "comment": "not now"})
    worker.run_until_idle()
    assert handle.result(timeout=5)["status"] == "done" and target.read_text() == "1"
    denied = [m.content for m in model.requests[-1].messages if m.role == "tool"][-1]
    assert denied == "refused: a human denied this call not now"


def test_ask_human_is_a_durable_wait_for_the_answer(
    app: perdure.App, worker: TestWorker, tmp_path: Path
) -> None:
    agent, model = make(
        app, tmp_path, [call("ask_human", question="Which colour?"), "blue it is"],
        grant=("ask_human",),
    )  # fmt: skip
    assert "ask_human" in {t.name for t in agent.toolbox.offered()}
    handle = app.start(agent.workflow, {"prompt": "pick"}, run_id="ask")
    worker.run_until_idle()
    assert handle.status() == "waiting"
    call_id = model.script[0].message.tool_calls[0].id
    app.send_event("ask", f"human:{call_id}", "blue")
    worker.run_until_idle()
    assert handle.result(timeout=5)["answer"] == "blue it is"
    assert [m.content for m in model.requests[1].messages if m.role == "tool"] == ["blue"]


def test_a_long_transcript_is_compacted_without_splitting_a_call_from_its_result(
    app: perdure.App, worker: TestWorker, tmp_path: Path
) -> None:
    (tmp_path / "data").mkdir(exist_ok=True)
    (tmp_path / "data" / "big.txt").write_text("x" * 3000)
    replies: list[Any] = [call("read_file", path="data/big.txt") for _ in range(4)]
    replies += ["the notes", call("finish", summary="done")]
    agent, model = make(app, tmp_path, replies, iterations=8)
    agent.spec.models["fast"].context_tokens = 2000
    agent.spec.limits.repeat_failures = 99
    handle = app.start(agent.workflow, {"prompt": "read a lot"})
    worker.run_until_idle()
    assert handle.result(timeout=5)["status"] == "done"
    summary_requests = [r for r in model.requests if r.messages[0].content.startswith("Summarise")]
    assert summary_requests, "the transcript was never compacted"
    after = model.requests[model.requests.index(summary_requests[0]) + 1]
    assert any(m.content.startswith("Notes on the work so far: ") for m in after.messages)
    for i, m in enumerate(after.messages):  # every tool result follows its call
        if m.role == "tool":
            calls = [c.id for prev in after.messages[:i] for c in prev.tool_calls]
            assert m.tool_call_id in calls


def test_a_workspace_gets_progress_notes_committed_once_per_change(
    app: perdure.App, worker: TestWorker, tmp_path: Path
) -> None:
    agent, _ = make(app, tmp_path, ["one", "two"], extra='[workspace]\npath = "ws"')
    for run_id in ("w1", "w2"):
        app.start(agent.workflow, {"prompt": run_id}, run_id=run_id)
        worker.run_until_idle()
    import subprocess

    log = subprocess.run(["git", "log", "--format=%s"], cwd=tmp_path / "ws", capture_output=True,
                         text=True, check=True).stdout.split("\n")  # fmt: skip
    assert [line for line in log if line] == ["helper: run w2", "helper: run w1"]
    progress = (tmp_path / "ws" / "PROGRESS.md").read_text()
    assert "done: w1" in progress and "done: w2" in progress


def test_an_agent_refuses_a_grant_of_no_tool_unless_it_is_given_that_tool(
    app: perdure.App, tmp_path: Path
) -> None:
    """A run from the spec checks grants as validate does; a tool given in Python counts."""
    with pytest.raises(perdure.ConfigError, match=r"tools.grant: no tool 'shred'"):
        make(app, tmp_path, [], grant=("shred",))
    assert "agent:helper" not in app.runtime.workflows  # nothing registered

    @tool(effect="once")
    def shred(ctx: ToolContext, name: str) -> str:
        """Shred a document.

        Args:
            name: Which one.
        """
        return name

    spec = load_spec(tmp_path / "agent.toml")
    agent = Agent(app.runtime, spec, providers={"fast": ScriptedModel([])}, tools=[shred])
    assert "shred" in {t.name for t in agent.toolbox.offered()}


def test_compaction_summaries_count_toward_the_runs_tokens_and_its_limit(
    app: perdure.App, worker: TestWorker, tmp_path: Path
) -> None:
    """The summary call's tokens are in the run's total (== recorded usage), and the run's
    max_tokens holds with them counted: the run stops before passing it."""
    (tmp_path / "data").mkdir(exist_ok=True)
    (tmp_path / "data" / "big.txt").write_text("x" * 3000)
    replies: list[Any] = [call("read_file", path="data/big.txt") for _ in range(4)]
    replies += ["the notes", call("finish", summary="done")]
    agent, _ = make(app, tmp_path, replies, iterations=8)
    agent.spec.models["fast"].context_tokens = 2000
    agent.spec.limits.repeat_failures = 99
    handle = app.start(agent.workflow, {"prompt": "read a lot"}, run_id="c1")
    worker.run_until_idle()
    result = handle.result(timeout=5)
    used, _ = app.runtime.sync(Budgets(app.runtime.store).run_spent("c1"), "spent")
    assert result["tokens"] == used  # the summary's tokens included
    other = perdure.App(f"sqlite:///{tmp_path}/c2.db", clock=TestClock())
    try:
        limited, _ = make(other, tmp_path, replies, iterations=8)
        limited.spec.models["fast"].context_tokens = 2000
        limited.spec.limits.repeat_failures = 99
        limited.spec.limits.max_tokens = used - 1
        capped = other.start(limited.workflow, {"prompt": "read a lot"}, run_id="c2")
        TestWorker(other).run_until_idle()
        with pytest.raises(perdure.RunFailed, match="token limit"):
            capped.result(timeout=5)
        spent, _ = other.runtime.sync(Budgets(other.runtime.store).run_spent("c2"), "spent")
        assert spent <= used - 1
    finally:
        other.close()


def test_an_escalation_is_journaled_with_its_reason(
    app: perdure.App, worker: TestWorker, tmp_path: Path
) -> None:
    """After a failed iteration the strong tier answers; the journal says so, and why."""
    agent, _ = make(
        app, tmp_path, ["not yet"], iterations=2,
        extra='[models.strong]\nprovider = "scripted"\n[routing]\nescalate_after_failures = 1\n'
              'escalate = ["strong"]\n[acceptance]\ncommand = "false"',
    )  # fmt: skip
    agent.providers["strong"] = ScriptedModel(["strong answer"])
    handle = app.start(agent.workflow, {"prompt": "x"}, run_id="e1")
    worker.run_until_idle()
    with pytest.raises(perdure.RunFailed):
        handle.result(timeout=5)
    [entry] = [e for e in app.journal("e1") if e.name == "agent:helper.escalate" and e.final]
    value = json.loads(entry.data or "{}")["value"]
    assert value["from"] == "fast" and value["to"] == "strong"
    assert "`false` exited 1" in value["reason"]


def test_a_parked_run_goes_on_when_the_window_rolls_past_what_filled_it(
    app: perdure.App, worker: TestWorker, tmp_path: Path, clock: TestClock
) -> None:
    """No raise: the parked run's timer is when the first run's usage leaves the hour, and
    then its call fits."""
    first_reply = {"content": "first", "usage": {"input_tokens": 850, "output_tokens": 50}}
    agent, model = make(
        app, tmp_path, [first_reply, "second"],
        extra="max_tokens_per_call = 50\n[budget]\ntokens_per_hour = 1000",
    )  # fmt: skip
    app.start(agent.workflow, {"prompt": "one"}, run_id="one")
    worker.run_until_idle()
    clock.advance(600)
    second = app.start(agent.workflow, {"prompt": "two"}, run_id="two")
    worker.run_until_idle()
    assert second.status() == "waiting" and model.calls == 1
    wake_at = app.get_run("two").wake_at
    assert wake_at is not None and 2990 <= wake_at - clock.now() <= 3001  # 3000 s to go
    clock.advance(3001)
    worker.run_until_idle()
    assert second.result(timeout=5)["answer"] == "second" and model.calls == 2
