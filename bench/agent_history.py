"""Figure A1: an agent run's journal as its conversation grows (issue 37 item 3).

One agent run of N tool-calling model calls (10 / 100 / 1,000) whose context grows to
~200k tokens (`--tokens`): each tool call returns TOKENS*4/N characters of text, so the
last request carries ~TOKENS tokens (4 characters a token). The model is scripted: call
`fetch` N-1 times, then a tool that needs approval, so the run waits at a perdure gate with
its whole conversation journaled; then answer. Measured, per integration (`spec`: perdure's
own agent loop, a spec agent on the scripted provider; `capability`: `PerdureDurability`
on pydantic-ai's durable_exec surface, pydantic-ai's FunctionModel; `wrapper`:
`PerdureAgent`; `agents-sdk`: perdure's `Runner` over the OpenAI Agents SDK, its model an
in-process SDK `Model` with the same script):

- journal MB: the run's journal rows plus the blobs they name (SQLite, the bytes of JSON
  text stored), at the gate;
- B/call: the journal bytes of one tool-calling model call beyond its tool result's own
  text, over calls 1-10 and over the last 10 (flat: no call journals the history before it);
- whole-history MB: what an engine that journals each call's full input would have
  stored (the sum of every request's messages as JSON: temporalio/sdk-python #1890), and
  the call at which that passed Temporal's 50 MB;
- CPU ms/call: the first run's CPU time to the gate, per model call (the framework's own
  work on a growing context included); plain: the same conversation by pydantic-ai alone
  (`--plain-up-to`: only up to that many calls);
- resume ms: from the gate's answer to the run's end, by a fresh App and worker (no
  run kept in memory): the whole conversation is replayed from the journal, no model
  called again.

Temporal's limits for one workflow history: 50 MB and 51,200 events.

    python -m bench.agent_history [--calls 10,100,1000] [--tokens 200000]
        [--integrations spec,capability,wrapper,agents-sdk] [--plain-up-to 100]
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import time
from typing import Any

from .common import Config, Table, child_main, fmt, run_child, scratch

MODULE = "bench.agent_history"
CALLS = (10, 100, 1_000)
TOKENS = 200_000
TEMPORAL_BYTES = 50 * 2**20  # Temporal's limits on one workflow's history: 50 MB (MiB)
TEMPORAL_EVENTS = 51_200
CHARS_PER_TOKEN = 4
HEADERS = ["integration", "model calls", "journal MB", "entries", "of Temporal's 50 MB / 51,200",
           "B/call, calls 1-10", "B/call, last 10", "whole-history MB", "whole over 50 MB at",
           "CPU ms/call", "plain CPU ms/call", "resume CPU ms", "resume ms"]  # fmt: skip
INTEGRATIONS = ("spec", "capability", "wrapper", "agents-sdk")
WORDS = [
    "".join(random.Random(i).choices("abcdefghijklmnopqrstuvwxyz", k=1 + i % 9)) for i in range(997)
]


def text(i: int, size: int) -> str:
    """`size` characters of word-like text, different for each `i` (a tool result)."""
    rng, out, length = random.Random(i), [], 0
    while length < size:
        word = WORDS[rng.randrange(len(WORDS))]
        out.append(word)
        length += len(word) + 1
    return " ".join(out)[:size]


class Weighed:
    """A scripted model's tally: its calls, the bytes of every request's input as JSON, the
    call at which their sum passed Temporal's 50 MB, and the CPU time weighing took."""

    def __init__(self, calls: int) -> None:
        self.calls = calls
        self.requests = 0
        self.input_bytes = 0
        self.over_at: int | None = None  # the call whose input took the sum past 50 MB
        self.weighing = 0.0  # CPU seconds spent weighing requests (taken off the run's)

    def weigh(self, dump: Any) -> None:
        """Count one request (already counted in `requests`): `dump()` is its input as JSON."""
        began = time.process_time()
        self.input_bytes += len(dump())
        if self.over_at is None and self.input_bytes > TEMPORAL_BYTES:
            self.over_at = self.requests
        self.weighing += time.process_time() - began


class Script(Weighed):
    """The scripted model: `fetch` N-1 times, then `finish` (approval), then the answer."""

    def __init__(self, calls: int, *, weigh: bool = True) -> None:
        super().__init__(calls)
        self.weigh_requests = weigh

    def __call__(self, messages: list[Any], info: Any) -> Any:
        from pydantic_ai.messages import (
            ModelMessagesTypeAdapter,
            ModelResponse,
            TextPart,
            ToolCallPart,
        )
        from pydantic_ai.usage import RequestUsage

        self.requests += 1
        if self.weigh_requests:  # the first run only (a replay sends nothing)
            self.weigh(lambda: ModelMessagesTypeAdapter.dump_json(messages))
        usage = RequestUsage(input_tokens=100, output_tokens=10)  # no estimate by pydantic-ai
        done = sum(1 for m in messages for p in getattr(m, "parts", ())
                   if p.part_kind == "tool-return")  # fmt: skip
        if done < self.calls - 1:
            return ModelResponse(parts=[ToolCallPart("fetch", {"i": done}, f"c{done}")],
                                 usage=usage)  # fmt: skip
        if done == self.calls - 1:
            return ModelResponse(parts=[ToolCallPart("finish", {}, "last")], usage=usage)
        return ModelResponse(parts=[TextPart(f"read {done} results")], usage=usage)


def plain(calls: int, chunk: int) -> tuple[float, Script]:
    """The same conversation by pydantic-ai alone (no perdure, `finish` needs no approval):
    its wall time and script (which weighed every request)."""
    import asyncio

    from pydantic_ai import Agent
    from pydantic_ai.models.function import FunctionModel
    from pydantic_ai.usage import UsageLimits

    script = Script(calls, weigh=False)
    agent = Agent(FunctionModel(script), name="reader")

    @agent.tool_plain
    def fetch(i: int) -> str:
        return text(i, chunk)

    @agent.tool_plain
    def finish() -> str:
        return "finished"

    began = time.process_time()
    limits = UsageLimits(request_limit=None)
    asyncio.run(agent.run("read everything", usage_limits=limits))
    return time.process_time() - began, script


def build(url: str, integration: str, calls: int, chunk: int) -> tuple[Any, Script, Any]:
    """The app, the script and a function starting the run (returning its handle)."""
    from pydantic_ai import Agent
    from pydantic_ai.models.function import FunctionModel
    from pydantic_ai.usage import UsageLimits

    import perdure

    app = perdure.App(url)
    unlimited = UsageLimits(request_limit=None)  # pydantic-ai's default stops at 50 requests
    script = Script(calls)
    effects = {"fetch": "read", "finish": "keyed"}
    if integration == "capability":
        from perdure.integrations.pydantic_durability import PerdureDurability

        capability = PerdureDurability(app, tool_effects=effects)
        agent = Agent(FunctionModel(script), name="reader", capabilities=[capability])
    else:
        agent = Agent(FunctionModel(script), name="reader")

    @agent.tool_plain
    def fetch(i: int) -> str:
        return text(i, chunk)

    @agent.tool_plain(requires_approval=True)
    def finish() -> str:
        return "finished"

    if integration == "capability":

        @app.workflow(name="reader")
        async def reader(prompt: str) -> str:
            return str((await agent.run(prompt, usage_limits=unlimited)).output)

        return app, script, lambda: app.start(reader, "read everything", run_id="r")

    from perdure.integrations.pydantic_ai import PerdureAgent

    durable = PerdureAgent(agent, app, tool_effects=effects, usage_limits=unlimited)
    return app, script, lambda: durable.start("read everything", run_id="r")


class SdkScript(Weighed):
    """The same script as an OpenAI Agents SDK `Model` (in process, no server)."""

    def model(self) -> Any:
        import json

        from agents import Model, ModelResponse
        from agents.usage import Usage
        from openai.types.responses import (
            ResponseFunctionToolCall,
            ResponseOutputMessage,
            ResponseOutputText,
        )

        script = self

        class Scripted(Model):
            async def get_response(self, system_instructions: Any, input: Any, *args: Any,
                                   **kwargs: Any) -> Any:  # fmt: skip
                script.requests += 1
                script.weigh(lambda: json.dumps(input, default=str))
                items = input if isinstance(input, list) else []
                done = sum(1 for i in items if isinstance(i, dict)
                           and i.get("type") == "function_call_output")  # fmt: skip
                usage = Usage(requests=1, input_tokens=100, output_tokens=10, total_tokens=110)
                if done < script.calls:
                    name, args = ("fetch", {"i": done}) if done < script.calls - 1 else (
                        "finish", {})  # fmt: skip
                    call = ResponseFunctionToolCall(
                        arguments=json.dumps(args), call_id=f"c{done}", name=name,
                        type="function_call", id=f"fc{done}", status="completed",
                    )  # fmt: skip
                    return ModelResponse(output=[call], usage=usage, response_id=None)
                text = ResponseOutputText(text=f"read {done} results", type="output_text",
                                          annotations=[])  # fmt: skip
                message = ResponseOutputMessage(id="m", content=[text], role="assistant",
                                                status="completed", type="message")  # fmt: skip
                return ModelResponse(output=[message], usage=usage, response_id=None)

            def stream_response(self, *args: Any, **kwargs: Any) -> Any:
                raise NotImplementedError("the bench does not stream")

        return Scripted()


def build_sdk(url: str, calls: int, chunk: int) -> tuple[Any, SdkScript, Any]:
    """The Agents SDK variant: perdure's `Runner`, `finish` needing approval (a gate)."""
    import agents
    from agents import Agent, function_tool

    import perdure
    from perdure.integrations.openai_agents import Runner

    agents.set_tracing_disabled(True)
    app = perdure.App(url)
    script = SdkScript(calls)

    @function_tool
    def fetch(i: int) -> str:
        """Fetch part i."""
        return text(i, chunk)

    @function_tool(needs_approval=True)
    def finish() -> str:
        """Finish."""
        return "finished"

    agent = Agent(name="reader", tools=[fetch, finish], model=script.model())
    runner = Runner(app, tool_effects={"fetch": "read", "finish": "keyed"})

    @app.workflow(name="reader")  # Runner.workflow's runs stop at the SDK's 10 turns
    async def reader(prompt: str) -> str:
        return str((await runner.run(agent, prompt, max_turns=calls + 5)).final_output)

    return app, script, lambda: app.start(reader, "read everything", run_id="r")


SPEC = """
name = "reader"
goal = "Read every part"
instructions = "Fetch each part, then finish reading."

[models.fast]
provider = "scripted"
context_tokens = {context}

[tools]
grant = ["fetch", "finish_reading", "finish"]
approval = ["finish_reading"]

[limits]
max_iterations = {iterations}
"""


class SpecScript(Weighed):
    """The same script for perdure's own agent loop (a spec agent on the scripted model)."""

    def __call__(self, request: Any) -> dict[str, Any]:
        import json

        self.requests += 1
        self.weigh(lambda: json.dumps(request.to_dict()))
        done = sum(1 for m in request.messages if m.role == "tool")
        usage = {"input_tokens": 100, "output_tokens": 10}
        if done < self.calls - 1:
            tool = {"id": f"c{done}", "name": "fetch", "arguments": {"i": done}}
        elif done == self.calls - 1:
            tool = {"id": "last", "name": "finish_reading", "arguments": {}}
        else:
            tool = {"id": "end", "name": "finish", "arguments": {"summary": f"read {done} results"}}
        return {"content": "", "tool_calls": [tool], "usage": usage}


def build_spec(url: str, folder: str, calls: int, chunk: int, tokens: int
               ) -> tuple[Any, SpecScript, Any]:  # fmt: skip
    """The spec variant: perdure's agent loop, `finish_reading` needing approval (a gate)."""
    from pathlib import Path

    import perdure
    from perdure.agent.loop import Agent
    from perdure.agent.providers.scripted import ScriptedModel
    from perdure.agent.spec import load_spec
    from perdure.agent.tools import tool

    app = perdure.App(url)
    script = SpecScript(calls)
    path = Path(folder) / "reader.toml"
    context = 4 * tokens + 100_000  # never compacted: the whole conversation stays in it
    path.write_text(SPEC.format(context=context, iterations=calls + 5))

    @tool(effect="read")
    def fetch(ctx: Any, i: int) -> str:
        """Fetch part i.

        Args:
            i: The part.
        """
        return text(i, chunk)

    @tool(effect="keyed", destructive=True)
    def finish_reading(ctx: Any) -> str:
        """Finish reading."""
        return "finished"

    model = ScriptedModel(responder=script)
    agent = Agent(app, load_spec(path), providers={"fast": model}, tools=[fetch, finish_reading])
    return app, script, lambda: app.start(agent.workflow, {"prompt": "read everything"}, run_id="r")


def journal_rows(path: str, run_id: str) -> list[tuple[str, str, int]]:
    """The run's journal in order: (kind, name, bytes of its data plus the blob it names)."""
    from perdure.store.blobs import blob_ref

    db = sqlite3.connect(path)
    try:
        rows = db.execute("SELECT kind, name, data FROM journal WHERE run_id = ? ORDER BY seq",
                          (run_id,)).fetchall()  # fmt: skip
        out = []
        for kind, name, data in rows:
            key = blob_ref(data)
            if key is not None:
                (data,) = db.execute("SELECT data FROM blobs WHERE key = ?", (key,)).fetchone()
            out.append((kind, name, len(data or "")))
        return out
    finally:
        db.close()


def is_model_call(kind: str, name: str) -> bool:
    """A model call's first journal entry, in any of the integrations."""
    return kind in ("step.intent", "step.outcome") and (
        name.endswith((".model", "model.request", ".model_call"))
    )


def per_call(rows: list[tuple[str, str, int]], chunk: int) -> list[int]:
    """Journal bytes of each tool-calling model call beyond its tool result's own text:
    the entries from one model call's first to the next one's, less `chunk`; the calls that
    fetched only (not the last, whose tool waits at the gate)."""
    segments: list[int] = []
    previous = ""
    for kind, name, size in rows:
        starts = is_model_call(kind, name) and not (kind == "step.outcome" and previous == name)
        if starts:
            segments.append(0)
        if segments:
            segments[-1] += size
        previous = name if kind == "step.intent" else ""
    return [size - chunk for size in segments[:-1]]


def child(cfg: Config) -> Config:
    from perdure.testing import TestWorker

    folder, calls, tokens = cfg["folder"], int(cfg["calls"]), int(cfg["tokens"])
    chunk = tokens * CHARS_PER_TOKEN // calls
    url = f"sqlite:///{folder}/perdure.db"
    alone = plain(calls, chunk)[0] if cfg.get("plain", True) else None
    integration = cfg["integration"]

    def built() -> tuple[Any, Any, Any]:
        if integration == "agents-sdk":
            return build_sdk(url, calls, chunk)
        if integration == "spec":
            return build_spec(url, folder, calls, chunk, tokens)
        return build(url, integration, calls, chunk)

    app, script, start = built()
    began = time.process_time()
    handle = start()
    TestWorker(app).run_until_idle()
    first = time.process_time() - began - script.weighing
    if handle.status() != "waiting":
        raise RuntimeError(
            f"run r: {handle.status()} at the gate ({app.get_run('r').error}), expected waiting"
        )
    rows = journal_rows(f"{folder}/perdure.db", "r")
    requests, whole, over_at = script.requests, script.input_bytes, script.over_at
    app.close()

    app, script, _ = built()  # a fresh process's view
    began, wall = time.process_time(), time.perf_counter()
    last = f"c{calls - 1}" if integration == "agents-sdk" else "last"
    app.send_event("r", f"approve:{last}", {"approve": True})
    TestWorker(app).run_until_idle()
    output = app.handle("r").result(60)
    resume, resume_wall = time.process_time() - began, time.perf_counter() - wall
    answer = (output.get("summary") or output.get("output") or output  # spec / wrapper
              if isinstance(output, dict) else output)  # fmt: skip
    if script.requests != 1:  # only the answer after the gate: nothing recorded asked again
        raise RuntimeError(f"resume asked the model {script.requests} times, expected 1")
    app.close()
    return {
        "output": str(answer)[:80],
        "requests": requests,
        "journal": sum(size for _, _, size in rows),
        "entries": len(rows),
        "per_call": per_call(rows, chunk),
        "payload": (calls - 1) * chunk,
        "whole": whole,
        "over_at": over_at,
        "first_s": first,
        "plain_s": alone,
        "resume_s": resume,
        "resume_wall_s": resume_wall,
    }


def figure(
    calls: tuple[int, ...], tokens: int, integrations: tuple[str, ...], plain_up_to: int
) -> Table:
    table = Table(
        title=f"Figure A1. One agent run's journal as its context grows to ~{tokens:,} tokens "
        "(scripted models, SQLite; Temporal's limit: 50 MB / 51,200 events)",
        headers=HEADERS,
    )
    for integration in integrations:
        pydantic = integration in ("capability", "wrapper")
        for n in calls:
            cfg = {"folder": scratch("agent-history"), "calls": n, "tokens": tokens,
                   "integration": integration, "plain": pydantic and n <= plain_up_to}  # fmt: skip
            got = run_child(MODULE, cfg, timeout=3600)
            model_calls, calls_bytes = int(got["requests"]), got["per_call"]
            over = got["over_at"]
            table.rows.append([
                integration, f"{n:,}", fmt(got["journal"] / 1e6, 2), f"{got['entries']:,}",
                f"{100 * got['journal'] / TEMPORAL_BYTES:.1f}% / "
                f"{100 * got['entries'] / TEMPORAL_EVENTS:.1f}%",
                fmt(sum(calls_bytes[:10]) / len(calls_bytes[:10]), 0),
                fmt(sum(calls_bytes[-10:]) / len(calls_bytes[-10:]), 0),
                fmt(got["whole"] / 1e6, 1), "-" if over is None else f"call {over}",
                fmt(got["first_s"] * 1000 / model_calls, 1),
                fmt(None if got["plain_s"] is None else got["plain_s"] * 1000 / model_calls, 1),
                fmt(got["resume_s"] * 1000, 0),
                fmt(got["resume_wall_s"] * 1000, 0),
            ])  # fmt: skip
    table.notes.append(
        "journal MB: the run's journal rows and the blobs they name, at the gate before the "
        "answer (MB = 10^6 bytes of JSON text); entries: its journal rows"
    )
    table.notes.append(
        "whole-history MB: the sum of every request's input as JSON, what journaling "
        "each call's full input stores (temporalio/sdk-python #1890)"
    )
    table.notes.append(
        "B/call: the journal bytes of one tool-calling model call (its model step and its "
        "tool's) beyond the tool result's own text, averaged over calls 1-10 and over the last "
        "10 calls before the gate; equal: the journal grows with the conversation, not its "
        "square"
    )
    table.notes.append(
        "Temporal's limits on one workflow history: 50 MB (52,428,800 bytes) and 51,200 "
        "events; whole over 50 MB at: the call whose input took the sum of inputs past 50 MB "
        "(temporalio/sdk-python #1890: terminated at call 53 of 100)"
    )
    table.notes.append(
        "CPU ms/call: the process's CPU time (all threads) from start to the gate, per model "
        "call, pydantic-ai's own work included; plain: the same conversation by pydantic-ai "
        "alone, without perdure (CPU, not wall time: the machine is shared; pydantic-ai rows "
        "only)"
    )
    table.notes.append(
        "resume: gate answered to run end by a fresh App and worker, replaying the whole "
        "conversation from the journal (the model is asked once, for the answer); CPU and wall"
    )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.agent_history")
    parser.add_argument("--calls", default=",".join(map(str, CALLS)))
    parser.add_argument("--tokens", type=int, default=TOKENS)
    parser.add_argument("--integrations", default=",".join(INTEGRATIONS))
    parser.add_argument("--plain-up-to", type=int, default=100,
                        help="pydantic-ai alone (plain) up to this many calls")  # fmt: skip
    args = parser.parse_args()
    calls = tuple(int(c) for c in args.calls.split(","))
    integrations = tuple(args.integrations.split(","))
    print(figure(calls, args.tokens, integrations, args.plain_up_to).render())


if __name__ == "__main__":
    child_main(main, child)
