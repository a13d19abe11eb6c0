"""Spec agents' `[tools.effects]`: a `once` tool's probe (a granted read tool, or a Python
`module:function`), asked by recovery with the interrupted call's arguments, and the opt-in
`on_interrupt = "tell_model"`; each checked when the spec is loaded, in one line. The model
is the deterministic scripted one; crashes are staged in-process (SimulatedCrash)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import perdure
from perdure.agent.loop import Agent
from perdure.agent.providers.scripted import ScriptedModel
from perdure.agent.spec import load_spec
from perdure.agent.tool_probes import INTERRUPTED
from perdure.agent.tools import tool
from perdure.cli.main import cli
from perdure.testing import SimulatedCrash, TestWorker

SPEC = """
name = "refunder"
goal = "Refund"

[models.fast]
provider = "scripted"
context_tokens = 100000

[tools]
grant = {grant}

[tools.effects]
{effects}
"""
GRANT = ["issue_refund", "find_refund", "send_email", "finish"]
STEP = "agent:refunder.tool.issue_refund"  # each tool is a step of its own
EMAIL = "agent:refunder.tool.send_email"


class Ledger:
    """The payment system: refunds by order, written by the refund tool, read by the probe."""

    def __init__(self, folder: Path) -> None:
        self.file = folder / "ledger.json"
        self.file.write_text("{}")
        self.calls = 0
        self.die_after_paying = False
        self.find_says: str | None = None  # what find_refund answers instead of looking

    def refunds(self) -> dict[str, list[str]]:
        found: dict[str, list[str]] = json.loads(self.file.read_text())
        return found

    def tools(self) -> list[Any]:
        ledger = self

        @tool(effect="once")
        def issue_refund(order: str, amount: float) -> str:
            """Refund an order.

            Args:
                order: The order.
                amount: EUR.
            """
            ledger.calls += 1
            refunds = ledger.refunds()
            refunds.setdefault(order, []).append(f"rf-{order}-{ledger.calls}")
            ledger.file.write_text(json.dumps(refunds))
            if ledger.die_after_paying:
                ledger.die_after_paying = False
                raise SimulatedCrash("killed after paying, before the outcome was journaled")
            return f"refunded {amount:g} EUR as rf-{order}-{ledger.calls}"

        @tool(effect="read")
        def find_refund(order: str) -> str:
            """Look a refund up by its order.

            Args:
                order: The order.
            """
            if ledger.find_says is not None:
                return ledger.find_says
            found = ledger.refunds().get(order)
            if found:
                return json.dumps({"done": True, "value": f"refunded as {found[0]}"})
            return json.dumps({"done": False})

        @tool(effect="once")
        def send_email(order: str) -> str:
            """E-mail the customer.

            Args:
                order: The order.
            """
            return f"sent about {order}"

        return [issue_refund, find_refund, send_email]


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"content": "", "tool_calls": [{"name": name, "arguments": arguments}]}


REFUND = [call("issue_refund", order="o1", amount=30), call("finish", summary="refunded")]


def spec_file(folder: Path, effects: str, grant: list[str] = GRANT) -> Path:
    path = folder / "agent.toml"
    path.write_text(SPEC.format(grant=json.dumps(grant), effects=effects))
    return path


def make(
    app: perdure.App, folder: Path, ledger: Ledger, effects: str, replies: list[Any] = REFUND
) -> tuple[Agent, ScriptedModel]:
    model = ScriptedModel(replies)
    spec = load_spec(spec_file(folder, effects))
    return Agent(app.runtime, spec, providers={"fast": model}, tools=ledger.tools()), model


def recover(app: perdure.App, dead: TestWorker) -> None:
    app.clock.advance(dead.lease + 1)  # type: ignore[attr-defined]
    TestWorker(app).run_until_idle()


def probed(app: perdure.App, run_id: str) -> list[dict[str, Any]]:
    return [json.loads(e.data or "{}") for e in app.journal(run_id) if e.kind == "step.probed"]


def tool_results(model: ScriptedModel) -> list[str]:
    """The tool results the model was shown in its last request."""
    return [m.content for m in model.requests[-1].messages if m.role == "tool"]


def test_a_refund_paid_before_the_kill_is_settled_by_the_read_tool_probe(
    app: perdure.App, tmp_path: Path
) -> None:
    """The refund pays, the worker dies before its outcome: recovery calls the probe tool
    find_refund with the call's arguments it declares (the order), which finds the refund;
    the refund is not run again, the model reads the probe's value as the tool's result and
    the run completes. The answer is journaled."""
    ledger = Ledger(tmp_path)
    ledger.die_after_paying = True
    agent, model = make(app, tmp_path, ledger,
                        'issue_refund = { effect = "once", probe = "find_refund" }')  # fmt: skip
    handle = app.start(agent.workflow, {"prompt": "refund o1"})
    dead = TestWorker(app)
    with pytest.raises(SimulatedCrash):
        dead.run_until_idle()

    recover(app, dead)

    assert handle.result(timeout=5)["status"] == "done"
    assert ledger.calls == 1 and ledger.refunds() == {"o1": ["rf-o1-1"]}
    assert tool_results(model) == ["refunded as rf-o1-1"]
    [answer] = probed(app, handle.id)
    assert answer["answer"] == "done" and answer["reason"] == "find_refund found it"


def test_a_refund_cut_before_paying_runs_again(app: perdure.App, tmp_path: Path) -> None:
    """Cut off after its intent, before paying: the probe says not done, the refund runs
    again and the run completes with one refund."""
    ledger = Ledger(tmp_path)
    agent, model = make(app, tmp_path, ledger, 'issue_refund = { probe = "find_refund" }')
    handle = app.start(agent.workflow, {"prompt": "refund o1"})
    dead = TestWorker(app)
    dead.crash_after_intent(STEP)
    with pytest.raises(SimulatedCrash):
        dead.run_until_idle()

    recover(app, dead)

    assert handle.result(timeout=5)["status"] == "done"
    assert ledger.calls == 1 and len(ledger.refunds()["o1"]) == 1
    assert [a["answer"] for a in probed(app, handle.id)] == ["not_done"]
    assert tool_results(model) == ["refunded 30 EUR as rf-o1-1"]


def test_a_probe_tool_answering_anything_else_parks_with_its_answer(
    app: perdure.App, tmp_path: Path
) -> None:
    """A probe result that is not `{"done": true/false}` is "cannot tell": the run parks,
    the reason quoting what the probe answered, and the refund is not run again."""
    ledger = Ledger(tmp_path)
    ledger.find_says = "payment API down (503)"
    agent, _ = make(app, tmp_path, ledger, 'issue_refund = { probe = "find_refund" }')
    handle = app.start(agent.workflow, {"prompt": "refund o1"})
    dead = TestWorker(app)
    dead.crash_after_intent(STEP)
    with pytest.raises(SimulatedCrash):
        dead.run_until_idle()

    recover(app, dead)

    assert handle.status() == "needs_attention"
    assert ledger.calls == 0
    [parked] = [e for e in app.journal(handle.id) if e.kind == "step.needs_attention"]
    reason = json.loads(parked.data or "{}")["reason"]
    assert "find_refund answered 'payment API down (503)'" in reason and "\n" not in reason


def test_a_python_probe_function_is_imported_from_the_spec_folder(
    app: perdure.App, tmp_path: Path
) -> None:
    """`probe = "module:function"`: imported from the spec's folder, called with the call's
    arguments, its ProbeAnswer acted on (done: the value becomes the tool's result)."""
    ledger = Ledger(tmp_path)
    ledger.die_after_paying = True
    (tmp_path / "ledger_probe_mod.py").write_text(
        "import json, pathlib\n"
        "from perdure import ProbeAnswer\n"
        "def find(order, amount):\n"
        f"    found = json.loads(pathlib.Path({str(ledger.file)!r}).read_text()).get(order)\n"
        "    return ProbeAnswer.done({'refund': found[0], 'amount': amount}) if found "
        "else ProbeAnswer.not_done()\n"
    )
    agent, model = make(app, tmp_path, ledger,
                        'issue_refund = { probe = "ledger_probe_mod:find" }')  # fmt: skip
    handle = app.start(agent.workflow, {"prompt": "refund o1"})
    dead = TestWorker(app)
    with pytest.raises(SimulatedCrash):
        dead.run_until_idle()

    recover(app, dead)

    assert handle.result(timeout=5)["status"] == "done"
    assert ledger.calls == 1
    assert [json.loads(t) for t in tool_results(model)] == [{"refund": "rf-o1-1", "amount": 30}]
    [answer] = probed(app, handle.id)
    assert answer["reason"] == "ledger_probe_mod:find"


def test_tell_model_settles_the_cut_call_with_an_interrupted_result(
    app: perdure.App, tmp_path: Path
) -> None:
    """`on_interrupt = "tell_model"`: the e-mail cut off after its intent is not sent again
    and the run does not park: the model is shown a journaled tool result saying the call
    was cut off and its outcome is unknown, and goes on (here: checks, then finishes)."""
    ledger = Ledger(tmp_path)
    replies = [call("send_email", order="o1"), call("find_refund", order="o1"),
               call("finish", summary="checked")]  # fmt: skip
    agent, model = make(app, tmp_path, ledger,
                        'send_email = { on_interrupt = "tell_model" }', replies)  # fmt: skip
    handle = app.start(agent.workflow, {"prompt": "mail o1"})
    dead = TestWorker(app)
    dead.crash_after_intent(EMAIL)
    with pytest.raises(SimulatedCrash):
        dead.run_until_idle()

    recover(app, dead)

    assert handle.result(timeout=5)["status"] == "done"
    told = INTERRUPTED.format(tool="send_email")
    assert [m.content for m in model.requests[1].messages if m.role == "tool"] == [told]
    [answer] = probed(app, handle.id)
    assert answer["probe"] == "tell_model" and "outcome unknown" in answer["reason"]
    outcomes = [json.loads(e.data or "{}") for e in app.journal(handle.id)
                if e.kind == "step.outcome" and e.name == EMAIL]  # fmt: skip
    assert outcomes[0]["probe"] == "tell_model" and told in json.dumps(outcomes[0])


def test_a_once_tool_without_an_entry_still_parks(app: perdure.App, tmp_path: Path) -> None:
    """Only the tools its table names have a probe: another once tool's cut call parks as
    before, and nothing of a probe is journaled."""
    ledger = Ledger(tmp_path)
    agent, _ = make(app, tmp_path, ledger, 'issue_refund = { probe = "find_refund" }',
                    [call("send_email", order="o1"), call("finish", summary="x")])  # fmt: skip
    handle = app.start(agent.workflow, {"prompt": "mail o1"})
    dead = TestWorker(app)
    dead.crash_after_intent(EMAIL)
    with pytest.raises(SimulatedCrash):
        dead.run_until_idle()

    recover(app, dead)

    assert handle.status() == "needs_attention"
    assert probed(app, handle.id) == []


@pytest.mark.parametrize("tool", ["issue_refund", "send_email"])
def test_every_view_names_the_tool_that_was_cut_off(
    app: perdure.App, tmp_path: Path, db_url: str, tool: str
) -> None:
    """A parked call is its tool's step in `stuck`, `explain`, `show` and the dashboard's
    timeline; `--probe` is offered only for the tool that has a probe (issue_refund, whose
    probe could not tell), not for send_email beside it."""
    from perdure.observe.redact import Redactor
    from perdure.server.dashboard import timeline

    ledger = Ledger(tmp_path)
    ledger.find_says = "payment API down (503)"
    agent, _ = make(app, tmp_path, ledger, 'issue_refund = { probe = "find_refund" }',
                    [call(tool, order="o1", amount=30) if tool == "issue_refund"
                     else call(tool, order="o1"), call("finish", summary="x")])  # fmt: skip
    handle = app.start(agent.workflow, {"prompt": "o1"})
    dead = TestWorker(app)
    step = f"agent:refunder.tool.{tool}"
    dead.crash_after_intent(step)
    with pytest.raises(SimulatedCrash):
        dead.run_until_idle()

    recover(app, dead)

    assert handle.status() == "needs_attention"
    stuck = CliRunner().invoke(cli, ["--db", db_url, "stuck"]).output
    assert f"({step})" in stuck and ("--probe" in stuck) == (tool == "issue_refund")
    for command in ("explain", "show"):
        shown = CliRunner().invoke(cli, ["--db", db_url, command, handle.id]).output
        assert step in shown, shown
    run, entries = app.get_run(handle.id), app.journal(handle.id)
    rows = timeline(app, run, entries, Redactor())
    [parked] = [r for r in rows if r.name == step and r.state == "needs_attention"]
    assert parked.effect == "once" and parked.probe == (tool == "issue_refund")


@pytest.mark.parametrize(
    ("effects", "grant", "said"),
    [
        ('issue_refund = { probe = "lookup" }', GRANT, "probe 'lookup' is no tool of the agent"),
        (
            'issue_refund = { probe = "find_refund" }',
            ["issue_refund", "finish"],
            "probe 'find_refund' is not granted",
        ),
        (
            'issue_refund = { probe = "send_email" }',
            GRANT,
            "probe 'send_email' is once; a probe only reads",
        ),
        ('find_refund = { probe = "find_refund2" }', GRANT, "a probe is for once tools"),
        (
            'issue_refund = { effect = "keyed", probe = "find_refund" }',
            GRANT,
            "a probe is for once tools",
        ),
        (
            'issue_refund = { probe = "find_refund", on_interrupt = "tell_model" }',
            GRANT,
            "not both",
        ),
        (
            'send_email = { on_interrupt = "tell_model" }',
            ["send_email", "finish"],
            "needs a granted read tool",
        ),
        ('issue_refund = { probe = "nosuchmodule_xyz:find" }', GRANT, "cannot import"),
        ('shred = "once"', GRANT, "no tool 'shred'"),
        (
            'issue_refund = { probe = "find_refund", on_interupt = "park" }',
            GRANT,
            "Extra inputs are not permitted",
        ),
    ],
)
def test_bad_entries_are_refused_in_one_line(
    app: perdure.App, tmp_path: Path, effects: str, grant: list[str], said: str
) -> None:
    """Each wrong `[tools.effects]` entry is one ConfigError naming the file, line and
    entry, before anything is registered."""
    ledger = Ledger(tmp_path)
    with pytest.raises(perdure.ConfigError) as raised:
        spec = load_spec(spec_file(tmp_path, effects, grant))
        Agent(app.runtime, spec, providers={"fast": ScriptedModel([])}, tools=ledger.tools())
    text = str(raised.value)
    assert said in text and "tools.effects." in text and "\n" not in text
    assert "agent:refunder" not in app.runtime.workflows


def test_validate_checks_the_table_against_the_builtin_tools(tmp_path: Path) -> None:
    """`perdure validate` refuses a probe that is not read-only (a built-in `once` tool) in
    one line, and accepts a built-in read tool as the probe of an MCP server's once tool."""
    bad = spec_file(tmp_path, 'finish = { effect = "once", probe = "run_command" }',
                    ["finish", "run_command"])  # fmt: skip
    out = CliRunner().invoke(cli, ["validate", str(bad)])
    assert out.exit_code != 0 and len(out.output.strip().splitlines()) == 1
    assert "run_command" in out.output and "a probe only reads" in out.output

    text = SPEC.format(grant=json.dumps(["read_file", "finish"]),
                       effects='pay__refund = { probe = "read_file" }')  # fmt: skip
    server = tmp_path / "pay-server"  # validate checks the server's command exists
    server.write_text("#!/bin/sh\n")
    server.chmod(0o755)
    mcp = '[[tools.mcp]]\nname = "pay"\ncommand = "./pay-server"\n\n[tools.effects]'
    good = tmp_path / "good.toml"
    good.write_text(text.replace("[tools.effects]", mcp))
    out = CliRunner().invoke(cli, ["validate", str(good)])
    assert out.exit_code == 0, out.output


MCP_SPEC = """
name = "toucher"
goal = "Touch"

[models.fast]
provider = "scripted"
context_tokens = 100000

[tools]
grant = ["finish"]

[[tools.mcp]]
name = "fx"
command = {python}
args = [{fixture}]
grant = ["touch", "find_touched"]

[tools.effects]
fx__touch = {{ probe = "fx__find_touched" }}
fx__find_touched = "read"
"""


@pytest.mark.parametrize("happened", [True, False], ids=["done", "not_done"])
def test_an_mcp_tool_is_probed_by_another_mcp_tool(
    app: perdure.App, tmp_path: Path, happened: bool
) -> None:
    """An MCP server's once tool names a read tool of the same server as its probe in
    `[tools.effects]`: cut off after its intent, the call is settled by the probe (done: the
    file is there, `touch` is not called again) or called again (not done)."""
    pytest.importorskip("mcp", reason="the mcp extra")
    fixture = Path(__file__).with_name("mcp_server_fixture.py")
    path = tmp_path / "agent.toml"
    path.write_text(MCP_SPEC.format(python=json.dumps(sys.executable),
                                    fixture=json.dumps(str(fixture))))  # fmt: skip
    target = tmp_path / "t.txt"
    model = ScriptedModel([call("fx__touch", path=str(target)), call("finish", summary="ok")])
    agent = Agent(app.runtime, load_spec(path), providers={"fast": model})
    handle = app.start(agent.workflow, {"prompt": "touch"})
    dead = TestWorker(app)
    dead.crash_after_intent("agent:toucher.tool.fx__touch")
    with pytest.raises(SimulatedCrash):
        dead.run_until_idle()
    if happened:  # the call had reached the server before the worker died
        target.write_text("before the crash")

    recover(app, dead)

    assert handle.result(timeout=10)["status"] == "done"
    assert target.read_text() == ("before the crash" if happened else "touched")
    [answer] = probed(app, handle.id)
    assert answer["answer"] == ("done" if happened else "not_done")
    assert [m.content for m in model.requests[-1].messages if m.role == "tool"] == [
        f"touched {target}"
    ]


@pytest.mark.parametrize(
    ("body", "timeout", "said"),
    [
        (
            "    time.sleep(3)\n    return ProbeAnswer.not_done()\n",
            0.3,
            "bad_probe_mod_0:ask: no answer within 0.3s",
        ),
        ("    raise RuntimeError('ledger offline')\n", None, "raised RuntimeError: ledger offline"),
        ("    return {'done': True}\n", None, "not a ProbeAnswer"),
    ],
    ids=["hangs", "raises", "wrong-answer"],
)
def test_a_python_probe_that_hangs_raises_or_answers_wrong_parks_in_one_line(
    app: perdure.App, tmp_path: Path, body: str, timeout: float | None, said: str,
    request: pytest.FixtureRequest,
) -> None:  # fmt: skip
    """A `module:function` probe that outlasts its `probe_timeout`, raises, or returns what
    is not a ProbeAnswer is "cannot tell": the run parks, the reason saying so in one line,
    and the refund is not run again."""
    ledger = Ledger(tmp_path)
    index = request.node.callspec.indices["body"]
    module = f"bad_probe_mod_{index}"
    (tmp_path / f"{module}.py").write_text(
        f"import time\nfrom perdure import ProbeAnswer\ndef ask(order, amount):\n{body}"
    )
    extra = f", probe_timeout = {timeout}" if timeout else ""
    agent, _ = make(app, tmp_path, ledger,
                    f'issue_refund = {{ probe = "{module}:ask"{extra} }}')  # fmt: skip
    handle = app.start(agent.workflow, {"prompt": "refund o1"})
    dead = TestWorker(app)
    dead.crash_after_intent(STEP)
    with pytest.raises(SimulatedCrash):
        dead.run_until_idle()

    recover(app, dead)

    assert handle.status() == "needs_attention"
    assert ledger.calls == 0
    [parked] = [e for e in app.journal(handle.id) if e.kind == "step.needs_attention"]
    reason = json.loads(parked.data or "{}")["reason"]
    assert said in reason and "\n" not in reason
