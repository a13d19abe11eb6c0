"""The OpenAI Agents SDK's own loop, made durable by perdure.

Every model call of the SDK goes through a `Model` wrapper whose `get_response` is a
`keyed` step (the `ModelResponse` is journaled once, never requested again on replay or
recovery), and every function tool's `on_invoke_tool` is a step with the tool's effect
(default `once`: an interrupted call parks the run in `needs_attention`, never re-runs).
Each model call reserves its worst case against the agent's budgets first (a spent budget
parks the run, integrations/budget.py); `Runner.run_streamed` reads the SDK's raw response
events and run items (tool called, tool output, message) through the run's durable stream,
written by the steps that made them; a tool's `needs_approval` waits at a perdure gate
(integrations/gates.py) instead of interrupting the run; steering messages (`perdure
steer`) join the model's input from the next call on (`Steered`); `PerdureSession` keeps
an SDK session's items in the store, each call a transactional step
(integrations/agents_session.py).

    runner = Runner(app, tool_effects={"lookup_order": "read"})
    refunds = runner.workflow(agent)        # a perdure workflow running `agent` on its input
    app.start(refunds, "refund order 42")   # or, inside any workflow: await runner.run(agent, x)
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from ..agent.spec import BudgetSpec, Price
from ..engine import durable as durable_calls
from ..engine.context import current
from ..engine.effects import Effect, check_effect
from ..engine.retry import Retry
from ..engine.steps import Step, current_step
from ..errors import ConfigError, ParkRun
from ..extras import require_extra
from .budget import ModelBudget, call_within_budget, reserved
from .gates import Gates
from .replay import check_tools
from .streaming import ModelEvents, streaming, write_event, write_item
from .tool_probes import step_probe

require_extra("openai-agents", "perdure.integrations.openai_agents")

import agents  # noqa: E402  # only once the extra is known to be there
import openai  # noqa: E402  # the SDK's own dependency
from agents import Agent, FunctionTool, Model, ModelResponse, RunConfig, RunResult  # noqa: E402
from agents.exceptions import ModelBehaviorError  # noqa: E402
from agents.items import (  # noqa: E402
    HandoffCallItem,
    MessageOutputItem,
    ReasoningItem,
    RunItem,
    ToolCallItem,
    ToolCallOutputItem,
)
from agents.mcp import MCPServer  # noqa: E402
from agents.run_config import CallModelData, CallModelInputFilter, ModelInputData  # noqa: E402
from agents.stream_events import RawResponsesStreamEvent, RunItemStreamEvent  # noqa: E402
from agents.usage import Usage  # noqa: E402
from openai.types.responses import (  # noqa: E402
    ResponseCompletedEvent,
    ResponseOutputItem,
    ResponseOutputItemDoneEvent,
    ResponseStreamEvent,
)
from pydantic import TypeAdapter  # noqa: E402

from .agents_mcp import DurableMCPServer, mcp_call  # noqa: E402  # imports the SDK
from .agents_session import PerdureSession  # noqa: E402  # imports the SDK

if TYPE_CHECKING:
    from ..app import App
    from ..engine.handles import Workflow
    from ..engine.runtime import Runtime

__all__ = ["DurableStreamedRun", "PerdureSession", "Runner", "tool_effect"]

T = TypeVar("T", bound=FunctionTool)

# A ModelResponse is a dataclass of pydantic items (a discriminated union) and a Usage
# dataclass: one adapter dumps it to JSON and validates it back to the same objects.
_RESPONSE: TypeAdapter[ModelResponse] = TypeAdapter(ModelResponse)
_EVENT: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
_OUTPUT: TypeAdapter[Any] = TypeAdapter(ResponseOutputItem)
REJECTED = "Tool execution was not approved."  # what the model reads for a denied call
_EFFECT_ATTR = "__perdure_effect__"
_PROBE_ATTR = "__perdure_probe__"


def tool_effect(
    effect: Effect, *, probe: Callable[..., Any] | Literal["tell_model"] | None = None
) -> Callable[[T], T]:
    """Declare a function tool's effect: `@tool_effect("read")` above `@function_tool`.

    `probe` (a `once` tool's): a read-only function recovery calls with an interrupted
    call's arguments, answering a `perdure.ProbeAnswer` (done with what the tool would have
    returned, not done: call again, cannot tell: park), or `"tell_model"`: the model is
    told the call was cut off, outcome unknown (opt-in; it may call again); see
    integrations/tool_probes.py."""
    kind = check_effect(effect, "tool_effect()")
    if probe is not None and kind != "once":
        raise ConfigError(f"tool_effect({kind!r}, probe=...): a probe is for once tools")

    def mark(tool: T) -> T:
        if not isinstance(tool, FunctionTool):
            raise ConfigError(
                f"@tool_effect({kind!r}) goes above @function_tool, not on {type(tool).__name__}"
            )
        setattr(tool, _EFFECT_ATTR, kind)
        if probe is not None:
            setattr(tool, _PROBE_ATTR, probe)
        return tool

    return mark


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _model_body(runtime: Runtime, agent: str, budget: ModelBudget) -> Callable[..., Any]:
    """The body of `agent`'s model step: its worst case reserved, the SDK's request
    (streamed to the run's stream if asked), its usage settled for `perdure usage` (once
    per position), its response as JSON. A refused key parks the run."""

    async def model_call(
        call: Callable[[], Awaitable[ModelResponse]],
        stream_call: Callable[[], AsyncIterator[Any]],
        model: str,
        stream: bool,
        prompt: Any,
        max_output: int | None,
        offered: list[str],
        handoffs: list[str],
    ) -> dict[str, Any]:
        info = current_step()
        held = await reserved(budget, runtime, prompt, max_output, model)
        if isinstance(held, dict):  # refused: journaled as the outcome, the run parks
            return held
        try:
            response = await (_streamed(stream_call(), info.position) if stream else call())
        except (openai.AuthenticationError, openai.PermissionDeniedError) as exc:
            await budget.release(runtime, held)
            raise ParkRun(
                f"agent {agent!r}, model {model!r}: the provider refused the key "
                f"({_one_line(exc)}); fix it where the workers run, then "
                f"`perdure resume {info.run_id}`"
            ) from exc
        except Exception:  # an error answer was not paid; a kill leaves it held
            await budget.release(runtime, held)
            raise
        if stream:  # the run items the SDK makes of it, as its own streamed run shows them
            _write_items(info.position, agent, response, handoffs)
        usage = response.usage
        tokens = (usage.input_tokens, usage.output_tokens)
        await budget.settle(runtime, held, model, tokens, budget.cost(*tokens))
        dump = _RESPONSE.dump_python(response, mode="json")
        return {"response": dump, "tools": offered, "position": info.position}

    return model_call


def _write_items(position: int, agent: str, response: ModelResponse, handoffs: list[str]) -> None:
    """The run items of a model response (tools called, handoffs asked for, messages,
    reasoning) to the run's stream, named as the SDK's RunItemStreamEvents are."""
    for out in response.output:
        kind = str(getattr(out, "type", ""))
        if kind == "function_call" and getattr(out, "name", None) in handoffs:
            item_type, name = "handoff_call_item", "handoff_requested"
        elif kind.endswith("_call"):
            item_type, name = "tool_call_item", "tool_called"
        elif kind == "message":
            item_type, name = "message_output_item", "message_output_created"
        elif kind == "reasoning":
            item_type, name = "reasoning_item", "reasoning_item_created"
        else:
            continue
        raw = out.model_dump(mode="json")
        write_item(position, {"name": name, "type": item_type, "agent": agent, "raw": raw})


async def _streamed(events: AsyncIterator[Any], position: int) -> ModelResponse:
    """The SDK's stream of response events, each written to the run's stream as it comes;
    the ModelResponse (what the step journals) built from its completed response, as the
    SDK's own streamed runs build it."""
    final = None
    done: list[Any] = []
    async for event in events:
        write_event(position, event.model_dump(mode="json"))
        kind = getattr(event, "type", "")
        if isinstance(event, ResponseCompletedEvent):
            final = event.response
        elif kind in ("response.incomplete", "response.failed", "error", "response.error"):
            raise ModelBehaviorError(f"the model's stream ended with {kind}")
        if isinstance(event, ResponseOutputItemDoneEvent):
            done.append(event.item)
    if final is None:
        raise ModelBehaviorError("the model's stream ended without a completed response")
    used = final.usage
    usage = Usage(requests=1)
    if used is not None:
        usage = Usage(requests=1, input_tokens=used.input_tokens,
                      output_tokens=used.output_tokens, total_tokens=used.total_tokens)  # fmt: skip
    return ModelResponse(output=list(final.output or done), usage=usage, response_id=final.id)


# A model call is retried when the provider may answer later; a refused key parks the run
# (ParkRun) and any other error (a bad request) fails it at once, in one line.
MODEL_RETRY = Retry(
    max_attempts=6,
    initial=1.0,
    max_delay=60.0,
    retry_on=(openai.APIConnectionError, openai.RateLimitError, openai.InternalServerError),
    no_retry_on=(ParkRun,),
)


async def _tool_call(
    call: Callable[[], Awaitable[Any]],
    streamed: tuple[str, str] | None = None,
    arguments: str = "",  # the model's, as JSON: what the tool's probe is asked with
) -> Any:
    """The body of a tool step: the SDK's own invoker (schema check, failure handler); in a
    streamed run its output goes to the run's stream as the SDK's `tool_output` item, from
    the step, so a replay (which returns the journaled output) does not stream it again."""
    value = await call()
    if streamed is not None:
        agent, call_id = streamed
        raw = {"call_id": call_id, "output": str(value), "type": "function_call_output"}
        item = {"name": "tool_output", "type": "tool_call_output_item", "agent": agent,
                "raw": raw, "output": value}  # fmt: skip
        write_item(current_step().position, item)
    return value


def _tool_arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """A function tool call's arguments, from its step's (`_tool_call`'s) own."""
    text = kwargs.get("arguments", args[2] if len(args) > 2 else "")
    found = json.loads(text or "{}")
    if not isinstance(found, dict):
        raise ValueError(f"the call's arguments are not a JSON object: {text[:80]}")
    return found


def _mcp_arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """An MCP tool call's arguments, from its step's (`mcp_call`'s) own."""
    found = kwargs.get("arguments", args[1] if len(args) > 1 else None)
    return dict(found or {})


def _mcp_result(value: Any) -> dict[str, Any]:
    """A probe's `done` value as the MCP result the step journals: a CallToolResult as JSON
    as it is, anything else as its one text content."""
    if isinstance(value, dict) and "content" in value:
        return value
    text = value if isinstance(value, str) else json.dumps(value)
    return {"content": [{"type": "text", "text": text}], "isError": False}


_GET = inspect.signature(Model.get_response)


class _DurableModel(Model):
    """A Model whose responses come from the journal when they are there."""

    def __init__(self, inner: Model, step: Step[..., Any], agent: str) -> None:
        self.inner = inner
        self.step = step
        self.agent = agent

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        async def call() -> ModelResponse:
            return await self.inner.get_response(*args, **kwargs)

        def stream_call() -> AsyncIterator[Any]:
            return self.inner.stream_response(*args, **kwargs)

        bound = _GET.bind(self, *args, **kwargs).arguments
        prompt = [bound.get("system_instructions"), bound.get("input")]
        settings = bound.get("model_settings")
        max_output = getattr(settings, "max_tokens", None)
        model = str(getattr(self.inner, "model", type(self.inner).__name__))
        stream = streaming.get()

        tools = [str(getattr(t, "name", t)) for t in bound.get("tools") or []]
        handoffs = [h.tool_name for h in bound.get("handoffs") or []]
        offered = tools + handoffs

        async def step() -> Any:
            return await self.step(
                call, stream_call, model, stream, prompt, max_output, offered, handoffs
            )

        data = await call_within_budget(self.agent, step)
        if "response" in data:  # the response, with the tools it was offered
            check_tools(data, offered, f"agents.{self.agent}.model")
            data = data["response"]
        return _RESPONSE.validate_python(data)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        # the SDK's own streamed loop would bypass the journal: refused, not silently undurable
        raise ConfigError(
            "a durable agent streams through perdure: use perdure's "
            "Runner(app).run_streamed(agent, input), not agents.Runner.run_streamed"
        )


class Steered:
    """The SDK's `call_model_input_filter` of a durable run: before each model call it takes
    the steering messages sent to the run (`perdure steer`, journaled in workflow code) and
    puts each, as a user message, where it was taken in this call's input and every later
    call's (the filter changes one call's input, not the run's items); then the caller's
    own filter, if any. A replay takes the same messages at the same calls."""

    def __init__(self, then: CallModelInputFilter | None) -> None:
        self.then = then
        self.taken: list[tuple[int, str]] = []  # (input index when taken, the message)

    async def __call__(self, data: CallModelData[Any]) -> ModelInputData:
        items = list(data.model_data.input)
        self.taken += [(len(items), s.prompt()) for s in await durable_calls.steering()]
        for index, text in reversed(self.taken):
            items.insert(index, {"role": "user", "content": text})
        data.model_data = ModelInputData(input=items, instructions=data.model_data.instructions)
        if self.then is None:
            return data.model_data
        updated = self.then(data)
        return await updated if inspect.isawaitable(updated) else updated


async def _needs_approval(tool: FunctionTool, context: Any, arguments: str) -> bool:
    """The tool's `needs_approval` for this call (a bool, or the SDK's policy callable)."""
    setting = tool.needs_approval
    if isinstance(setting, bool):
        return setting
    try:
        params = json.loads(arguments or "{}")
    except ValueError:
        return True  # arguments that cannot be read need a person, as in the SDK
    verdict = setting(context, params, context.tool_call_id)
    return bool(await verdict if inspect.isawaitable(verdict) else verdict)


class Runner:
    """The SDK's `Runner`, with model and function-tool calls as journaled perdure steps.

    Args:
        app: the perdure app whose store journals the runs.
        tool_effects: effect per tool name (`{"lookup_order": "read"}`); it wins over a
            tool's `@tool_effect` mark; a tool with neither is `once`.
        mcp_effects: effect of the tools of an agent's MCP server, by the server's name,
            where `tool_effects` names none.
        require_effects: refuse (one line, when the agent is registered or run) a tool
            with neither, instead of defaulting it to `once`.
        tool_probes: probe per `once` tool name, function or MCP (`{"issue_refund":
            find_refund}`): asked with an interrupted call's arguments (a ProbeAnswer) before
            the run would park; it wins over a `@tool_effect(..., probe=)` mark.
        budget: limits per rolling hour/day for all runs of each agent
            (`{"tokens_per_hour": 50_000}`); one stored with `perdure budget AGENT` wins
            limit by limit. Every model call reserves its worst case first.
        max_tokens: tokens one run may use (over it, the run fails in one line).
        max_cost: cost one run may use, at `price`.
        price: `{"input_per_mtok": ..., "output_per_mtok": ...}`, what calls cost.
    """

    def __init__(
        self,
        app: App,
        *,
        tool_effects: Mapping[str, Effect] | None = None,
        mcp_effects: Mapping[str, Effect] | None = None,
        require_effects: bool = False,
        tool_probes: Mapping[str, Callable[..., Any] | Literal["tell_model"]] | None = None,
        budget: BudgetSpec | Mapping[str, Any] | None = None,
        max_tokens: int | None = None,
        max_cost: float | None = None,
        price: Price | Mapping[str, float] | None = None,
    ) -> None:
        self.app = app
        self.tool_probes = dict(tool_probes or {})
        self.tool_effects = {
            name: check_effect(kind, f"tool_effects[{name!r}]")
            for name, kind in (tool_effects or {}).items()
        }
        self.mcp_effects = {
            name: check_effect(kind, f"mcp_effects[{name!r}]")
            for name, kind in (mcp_effects or {}).items()
        }
        self.require_effects = require_effects
        self._connected: dict[int, int] = {}  # MCP servers this runner connected: runs using them
        self._budget_args: dict[str, Any] = {"max_tokens": max_tokens, "max_cost": max_cost,
                                             "price": price}  # fmt: skip
        self._budget_spec = budget
        ModelBudget.of("", budget, where="Runner", **self._budget_args)  # wrong: one line now
        self._steps: dict[str, Step[..., Any]] = {}
        self._gates: dict[str, Gates] = {}
        self._workflows: dict[str, Workflow[..., Any]] = {}
        self._agents: dict[str, Agent[Any]] = {}  # by name: what streamed run items name

    # -- the durable agent ------------------------------------------------------------

    def _step(
        self,
        name: str,
        fn: Callable[..., Any],
        effect: Effect,
        *,
        model: bool = False,
        probe: Callable[..., Any] | None = None,
    ) -> Step[..., Any]:
        """Register (once) a step; a model step retries per MODEL_RETRY and commits its
        outcome before the loop goes on, so a billed response is never bought twice."""
        step = self._steps.get(name)
        if step is None:
            known = self.app.runtime.steps.get(name)  # another Runner on this app registered it
            if known is not None:
                step = Step(known)
            else:
                retry = MODEL_RETRY if model else None
                step = self.app.step(
                    name=name, effect=effect, retry=retry, commit=model, probe=probe
                )(fn)
            self._steps[name] = step
        if step.definition.effect != effect:
            raise ConfigError(
                f"step {name!r} is already registered as {step.definition.effect}, not {effect}"
                " (one effect per agent and tool name)"
            )
        return step

    def effect_of(self, tool: FunctionTool) -> Effect:
        """The effect a tool's calls are journaled with."""
        effect: Effect | None = self.tool_effects.get(tool.name, getattr(tool, _EFFECT_ATTR, None))
        if effect is None and self.require_effects:
            raise ConfigError(
                f"tool {tool.name!r} declares no effect (require_effects=True): add it to "
                f"tool_effects or mark it @tool_effect(...)"
            )
        return effect or "once"

    def _model_step(self, agent: str) -> Step[..., Any]:
        budget = ModelBudget.of(agent, self._budget_spec, **self._budget_args)
        return self._step(
            f"agents.{agent}.model",
            _model_body(self.app.runtime, agent, budget),
            "keyed",
            model=True,
        )

    def gates(self, agent: str) -> Gates:
        """The approval gates of `agent` (journaled as `agents.{agent}.gate`)."""
        found = self._gates.get(agent)
        if found is None:
            found = self._gates[agent] = Gates(self.app, f"agents.{agent}")
        return found

    def _mcp_effect(self, server: str) -> Effect:
        effect = self.mcp_effects.get(server)
        if effect is None and self.require_effects:
            raise ConfigError(
                f"MCP server {server!r} declares no effect (require_effects=True): add it to "
                "mcp_effects, or name its tools in tool_effects"
            )
        return effect or "once"

    def probe_of(self, tool: FunctionTool) -> Callable[..., Any] | str | None:
        """The probe a tool's interrupted `once` calls are asked about: `tool_probes`'s,
        else its `@tool_effect(..., probe=)`."""
        found: Callable[..., Any] | str | None = self.tool_probes.get(
            tool.name, getattr(tool, _PROBE_ATTR, None)
        )
        return found

    def _mcp_step(self, agent: str, server: str, tool: str) -> Step[..., Any]:
        effect = self.tool_effects.get(tool) or self._mcp_effect(server)
        name = f"agents.{agent}.tool.{tool}"
        found = self.tool_probes.get(tool)
        probe = None if found is None else step_probe(name, found, _mcp_arguments, _mcp_result)
        return self._step(name, mcp_call, effect, probe=probe)

    def _tool_step(self, agent: str, tool: FunctionTool) -> Step[..., Any]:
        name = f"agents.{agent}.tool.{tool.name}"
        found = self.probe_of(tool)
        probe = None if found is None else step_probe(name, found, _tool_arguments)
        return self._step(name, _tool_call, self.effect_of(tool), probe=probe)

    def _tool(self, agent: str, tool: FunctionTool) -> FunctionTool:
        """A copy of `tool` whose calls are steps; one that `needs_approval` waits at a
        perdure gate first (a denied call's output is the SDK's rejection message)."""
        step = self._tool_step(agent, tool)
        invoke = tool.on_invoke_tool
        gates = self.gates(agent) if tool.needs_approval is not False else None

        async def durable(context: Any, arguments: str) -> Any:
            if gates is not None and await _needs_approval(tool, context, arguments):
                decision = await gates.approve(context.tool_call_id, tool.name, arguments)
                if not decision.approved:
                    return decision.comment or REJECTED
            streamed = (agent, context.tool_call_id) if streaming.get() else None
            return await step(lambda: invoke(context, arguments), streamed, arguments)

        return dataclasses.replace(tool, on_invoke_tool=durable, needs_approval=False)

    def durable(self, agent: Agent[Any], run_config: RunConfig | None = None) -> Agent[Any]:
        """A copy of `agent` (and of the agents it hands off to) whose model and function
        tools run as steps; `run_config.model` / `model_provider` pick the inner model as
        the SDK would."""
        config = run_config or RunConfig()
        done: dict[int, Agent[Any]] = {}

        def wrap(one: Agent[Any]) -> Agent[Any]:
            if id(one) in done:
                return done[id(one)]
            if isinstance(config.model, Model):
                inner = config.model
            elif isinstance(config.model, str):
                inner = config.model_provider.get_model(config.model)
            elif isinstance(one.model, Model):
                inner = one.model
            else:
                inner = config.model_provider.get_model(one.model)
            copy = one.clone(model=_DurableModel(inner, self._model_step(one.name), one.name))
            self._agents.setdefault(one.name, one)
            done[id(one)] = copy
            copy.tools = [
                self._tool(one.name, t) if isinstance(t, FunctionTool) else t for t in one.tools
            ]
            copy.handoffs = [wrap(h) if isinstance(h, Agent) else h for h in one.handoffs]
            copy.mcp_servers = [
                DurableMCPServer(m, functools.partial(self._mcp_step, one.name))
                for m in one.mcp_servers
            ]
            return copy

        return wrap(_agent(agent))

    # -- running ----------------------------------------------------------------------

    async def run(
        self,
        starting_agent: Agent[Any],
        input: Any,
        *,
        run_config: RunConfig | None = None,
        **kwargs: Any,
    ) -> RunResult:
        """`agents.Runner.run`, inside a perdure workflow: same arguments, same result."""
        agent = _agent(starting_agent)
        session = kwargs.get("session")
        if session is not None and not isinstance(session, PerdureSession):
            # another session keeps history outside the journal: a replay would add it twice
            raise ConfigError(
                f"openai_agents.Runner.run(session=...) needs a PerdureSession, not "
                f"{type(session).__name__}: PerdureSession(session_id, app) keeps the "
                "conversation in perdure's store, written once per durable step"
            )
        if current() is None:
            raise ConfigError(
                "openai_agents.Runner.run() runs inside a perdure workflow; outside one, "
                "start runner.workflow(agent) or call runner.run_sync(agent, input)"
            )
        config = run_config or RunConfig()
        config = dataclasses.replace(
            config, model=None, call_model_input_filter=Steered(config.call_model_input_filter)
        )
        durable = self.durable(agent, run_config)
        async with self._mcp_sessions(durable):
            result = await agents.Runner.run(durable, input, run_config=config, **kwargs)
            # what still interrupts the SDK's loop (an MCP server's require_approval, a
            # hosted tool's approval) waits at a gate too, then the run goes on from its state
            while result.interruptions:
                state = result.to_state()
                for item in result.interruptions:
                    gates = self.gates(item.agent.name)
                    call_id = item.call_id or f"{item.agent.name}:{item.name}"
                    decision = await gates.approve(call_id, item.name or "", item.arguments)
                    if decision.approved:
                        state.approve(item)
                    else:
                        state.reject(item, rejection_message=decision.comment or REJECTED)
                result = await agents.Runner.run(durable, state, run_config=config, **kwargs)
            return result

    @contextlib.asynccontextmanager
    async def _mcp_sessions(self, agent: Agent[Any]) -> AsyncIterator[None]:
        """Connect, for the run, the agents' MCP servers not connected yet (a worker runs
        the agent without the caller's `async with server:`), shared by concurrent runs."""
        servers: dict[int, MCPServer] = {}
        todo, seen = [agent], set()
        while todo:
            one = todo.pop()
            if id(one) in seen:
                continue
            seen.add(id(one))
            for server in one.mcp_servers:
                inner = server.inner if isinstance(server, DurableMCPServer) else server
                if id(inner) in self._connected or getattr(inner, "session", "") is None:
                    servers[id(inner)] = inner
            todo.extend(h for h in one.handoffs if isinstance(h, Agent))
        for key, inner in servers.items():
            if key not in self._connected:
                self._connected[key] = 0
                await inner.connect()  # type: ignore[no-untyped-call]
            self._connected[key] += 1
        try:
            yield
        finally:
            for key, inner in servers.items():
                self._connected[key] -= 1
                if self._connected[key] == 0:
                    del self._connected[key]
                    await inner.cleanup()  # type: ignore[no-untyped-call]

    def workflow(self, agent: Agent[Any], *, name: str | None = None) -> Workflow[..., Any]:
        """Register (once) the perdure workflow `agents.{agent.name}` that runs `agent` on its
        input and returns the final output. Register it at import time, so that every worker
        knows the agent by its name."""
        agent = _agent(agent)
        wf_name = name or f"agents.{agent.name}"
        found = self._workflows.get(wf_name)
        if found is not None:
            return found

        async def run_agent(input: Any, stream: bool = False, session: str | None = None) -> Any:
            token = streaming.set(stream)
            try:
                talk = None if session is None else PerdureSession(session, self.app.runtime)
                return (await self.run(agent, input, session=talk)).final_output
            finally:
                streaming.reset(token)

        self._register(agent)  # first: an agent refused here leaves no workflow behind
        workflow = self.app.workflow(name=wf_name)(run_agent)
        self._workflows[wf_name] = workflow
        return workflow

    def _register(self, agent: Agent[Any]) -> None:
        """Register the steps of `agent` and of the agents it hands off to now, so that
        `perdure effects` lists every model and tool step before any run."""
        seen: set[int] = set()
        todo = [agent]
        while todo:
            one = todo.pop()
            if id(one) in seen:
                continue
            seen.add(id(one))
            self._agents.setdefault(one.name, one)
            self._model_step(one.name)
            for tool in one.tools:
                if isinstance(tool, FunctionTool):
                    self._tool_step(one.name, tool)
            for server in one.mcp_servers:  # its tools are listed at run time; its effect now
                self._mcp_effect(server.name)
            todo.extend(h for h in one.handoffs if isinstance(h, Agent))

    def run_sync(
        self,
        starting_agent: Agent[Any],
        input: Any,
        *,
        run_id: str | None = None,
        timeout: float | None = None,
        session: PerdureSession | str | None = None,
    ) -> Any:
        """Start `starting_agent`'s durable run (idempotent by `run_id`) and wait for its
        final output; a worker (`perdure worker`, `app.run_worker()`) runs it. `session`
        (a PerdureSession or its id) keeps the conversation across runs."""
        workflow = self.workflow(starting_agent)
        extra = _session_arg(session)
        return self.app.start(workflow, input, run_id=run_id, **extra).result(timeout=timeout)

    def run_streamed(
        self,
        starting_agent: Agent[Any],
        input: Any,
        *,
        run_id: str | None = None,
        session: PerdureSession | str | None = None,
    ) -> DurableStreamedRun:
        """`agents.Runner.run_streamed`, durable: the run starts (idempotent by `run_id`)
        when its events are first read, a worker runs it, and `stream_events()` gives the
        model's raw response events and the run's items (tool called, tool output, message
        output) through the run's durable stream as they come; then `final_output` holds
        the output."""
        workflow = self.workflow(starting_agent)
        start = (workflow, input, _session_arg(session))
        return DurableStreamedRun(self.app, run_id, start=start, agents=self._agents)

    def stream(self, run_id: str, *, offset: int = -1) -> DurableStreamedRun:
        """Read run `run_id`'s events after stream `offset` (where a reader had got to:
        it goes on from there after a disconnect or a crash of either side)."""
        return DurableStreamedRun(self.app, run_id, offset=offset, agents=self._agents)


class DurableStreamedRun:
    """A durable run read while it runs, as the SDK's streamed run is: the
    `RawResponsesStreamEvent`s of its model calls and the `RunItemStreamEvent`s of its
    items (tool called, tool output, message output), from stream offset `offset` on,
    then its `final_output`."""

    def __init__(
        self,
        app: App,
        run_id: str | None,
        *,
        start: tuple[Workflow[..., Any], Any, dict[str, Any]] | None = None,
        offset: int = -1,
        agents: Mapping[str, Agent[Any]] | None = None,
    ) -> None:
        self.app = app
        self.run_id = run_id
        self.final_output: Any = None
        self.is_complete = False
        self._start = start
        self._offset = offset
        self._agents = agents if agents is not None else {}
        self._events: ModelEvents | None = None

    @property
    def offset(self) -> int:
        """The stream offset read so far."""
        return self._events.offset if self._events is not None else self._offset

    async def stream_events(self) -> AsyncIterator[RawResponsesStreamEvent | RunItemStreamEvent]:
        """The model's response events and the run's items as they come (a call retried
        after a crash streams again from its start), until the run is done; then
        `final_output` is set."""
        if self._start is not None:
            workflow, given, extra = self._start
            handle = await self.app.start_async(
                workflow, given, stream=True, run_id=self.run_id, **extra
            )
            self.run_id, self._start = handle.id, None
        assert self.run_id is not None
        self._events = ModelEvents(self.app.client, self.run_id, self.offset, items=True)
        async for one in self._events:
            if one.item is not None:
                yield RunItemStreamEvent(name=one.item["name"], item=self._run_item(one.item))
            elif not one.retry:
                yield RawResponsesStreamEvent(data=_EVENT.validate_python(one.event))
        self.final_output = await self.app.handle(self.run_id).result_async()
        self.is_complete = True

    def _run_item(self, data: dict[str, Any]) -> RunItem:
        """The SDK's RunItem a step wrote, with the agent it names (this runner's, by name)."""
        name = str(data.get("agent"))
        agent = self._agents.get(name) or Agent(name=name)
        kind, raw = data.get("type"), data.get("raw")
        if kind == "tool_call_output_item":
            return ToolCallOutputItem(agent=agent, raw_item=raw, output=data.get("output"))  # type: ignore[arg-type]
        made: dict[str, Any] = {"tool_call_item": ToolCallItem, "reasoning_item": ReasoningItem,
                                "handoff_call_item": HandoffCallItem,
                                "message_output_item": MessageOutputItem}  # fmt: skip
        return made[str(kind)](agent=agent, raw_item=_OUTPUT.validate_python(raw))  # type: ignore[no-any-return]


def _session_arg(session: PerdureSession | str | None) -> dict[str, Any]:
    """The workflow's `session` argument: the conversation's id (the run rebuilds it)."""
    if session is None:
        return {}
    if isinstance(session, PerdureSession):
        return {"session": session.session_id}
    if isinstance(session, str) and session.strip():
        return {"session": session}
    raise ConfigError(
        f"session= takes a PerdureSession or a session id (a non-empty string), not {session!r}"
    )


def _agent(agent: object) -> Agent[Any]:
    if not isinstance(agent, Agent):
        raise ConfigError(
            f"openai_agents.Runner needs an agents.Agent, not {type(agent).__name__}: "
            "build it with agents.Agent(name=..., instructions=..., tools=[...])"
        )
    return agent
