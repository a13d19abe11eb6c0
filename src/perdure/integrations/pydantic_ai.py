"""pydantic-ai agents made durable: `PerdureAgent` runs an existing `pydantic_ai.Agent` as a
perdure workflow whose model requests and tool calls are journaled steps.

The framework's loop stays pydantic-ai's. The agent's model is wrapped so that each
`request()` is a `keyed` step committed before the loop goes on (a recorded response is
never requested, nor billed, again); each toolset is wrapped so that each `call_tool()`
is a step with the tool's declared effect (`tool_effects=`, `@perdure_tool`, else
`once`: an interrupted call parks the run in `needs_attention`, never runs twice).
Responses go through pydantic-ai's own `ModelMessagesTypeAdapter`, so the journal is JSON.
Before each request its worst case is reserved against the agent's budgets (a spent budget
parks the run, integrations/budget.py); `run_stream` reads the tokens through the run's
durable stream while the step runs; deferred tools (`requires_approval=True`,
`ApprovalRequired`, `CallDeferred`) wait at perdure gates (integrations/gates.py).

    agent = Agent("openai:gpt-5", name="support")
    durable = PerdureAgent(agent, app, tool_effects={"lookup_order": "read"})
    result = await durable.run("Where is order 42?", deps=Deps(shop="eu"))
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from ..agent.spec import BudgetSpec, Price
from ..engine import durable
from ..engine.context import current
from ..engine.effects import Effect, check_effect
from ..engine.handles import RunHandle
from ..engine.retry import NO_RETRY
from ..engine.steps import Step, _step_info, current_step
from ..errors import ConfigError, PayloadError
from ..extras import require_extra
from .budget import ModelBudget, call_within_budget, reserved
from .gates import Gates
from .replay import check_tools
from .streaming import ModelEvents, streaming, write_event
from .tool_probes import step_probe

require_extra("pydantic-ai", "perdure.integrations.pydantic_ai")

from pydantic import TypeAdapter  # noqa: E402
from pydantic_ai import Agent, ModelRetry  # noqa: E402
from pydantic_ai.capabilities import AbstractCapability, HandleDeferredToolCalls  # noqa: E402
from pydantic_ai.exceptions import ApprovalRequired, CallDeferred  # noqa: E402
from pydantic_ai.messages import (  # noqa: E402
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelResponse,
    ModelResponseStreamEvent,
)
from pydantic_ai.models import (  # noqa: E402
    Model,
    ModelRequestContext,
    ModelRequestParameters,
    infer_model,
)
from pydantic_ai.models.wrapper import WrapperModel  # noqa: E402
from pydantic_ai.settings import ModelSettings  # noqa: E402
from pydantic_ai.tools import (  # noqa: E402
    DeferredToolRequests,
    DeferredToolResults,
    RunContext,
    ToolApproved,
    ToolDenied,
)
from pydantic_ai.toolsets import AbstractToolset, FunctionToolset, WrapperToolset  # noqa: E402
from pydantic_ai.toolsets.abstract import ToolsetTool  # noqa: E402
from pydantic_ai.usage import UsageLimits  # noqa: E402
from pydantic_core import PydanticSerializationError, to_jsonable_python  # noqa: E402

if TYPE_CHECKING:
    from ..app import App

__all__ = ["PerdureAgent", "PerdureRunResult", "PerdureStreamedRun", "perdure_tool"]
_EVENT: TypeAdapter[Any] = TypeAdapter(ModelResponseStreamEvent)

F = TypeVar("F", bound=Callable[..., Any])
EFFECT_ATTR = "__perdure_effect__"
PROBE_ATTR = "__perdure_probe__"


class Steering(AbstractCapability[Any]):
    """Steering messages sent to the run (`perdure steer`) since the last model request join
    this one as user content (pydantic-ai's `enqueue`, asap), and so the history after it:
    taken and journaled in workflow code, so a replay puts the same ones in the same
    request. Outside a workflow it does nothing."""

    async def before_model_request(
        self, ctx: RunContext[Any], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        if current() is not None and _step_info.get() is None:
            taken = await durable.steering()
            if taken:
                ctx.enqueue(*(s.prompt() for s in taken))
        return request_context


def perdure_tool(
    *, effect: Effect, probe: Callable[..., Any] | Literal["tell_model"] | None = None
) -> Callable[[F], F]:
    """Declare a tool function's effect (above or below `@agent.tool`): what recovery may do
    with a call cut off between intent and outcome (see `perdure.Effect`).

    `probe` (a `once` tool's): a read-only function recovery calls with an interrupted
    call's arguments, answering a `perdure.ProbeAnswer` (done with what the tool would have
    returned, not done: call again, cannot tell: park), or `"tell_model"`: the model is
    told the call was cut off, outcome unknown (opt-in; it may call again); see
    integrations/tool_probes.py."""
    kind = check_effect(effect, "perdure_tool")
    if probe is not None and kind != "once":
        raise ConfigError(f"perdure_tool(effect={kind!r}, probe=...): a probe is for once tools")

    def mark(fn: F) -> F:
        setattr(fn, EFFECT_ATTR, kind)
        if probe is not None:
            setattr(fn, PROBE_ATTR, probe)
        return fn

    return mark


@dataclass(frozen=True, slots=True)
class PerdureRunResult:
    """What a durable agent run returned: the agent's output, the run id and its messages."""

    output: Any
    run_id: str
    messages_json: list[Any]

    def all_messages(self) -> list[ModelMessage]:
        """The run's whole conversation, as pydantic-ai messages."""
        return ModelMessagesTypeAdapter.validate_python(self.messages_json)


class PerdureAgent:
    """An existing `pydantic_ai.Agent` run as the perdure workflow `pydantic_ai:{name}`.

    Args:
        agent: the pydantic-ai agent; its model and toolsets are wrapped, never changed.
        app: the perdure App the workflow and its steps are registered on.
        name: the durable identity (default: the agent's name); its steps are named after it.
        tool_effects: effect per tool name (`{"lookup_order": "read"}`); wins over
            `@perdure_tool`.
        toolset_effects: effect of the tools of a toolset (an MCP server) by its `id`,
            where neither `tool_effects` nor `@perdure_tool` names one.
        default_effect: the effect of a tool declared nowhere (default `once`).
        require_effects: refuse, when wrapping, a tool (or toolset) declared nowhere.
        tool_probes: probe per `once` tool name (`{"issue_refund": find_refund}`): asked
            with an interrupted call's arguments (a ProbeAnswer) before the run would park;
            wins over `@perdure_tool(..., probe=)`.
        budget: limits per rolling hour/day for all runs (`{"tokens_per_hour": 50_000}`);
            one stored with `perdure budget pydantic_ai:NAME` wins limit by limit.
        max_tokens: tokens one run may use (reserved before each call; over it, it fails).
        max_cost: cost one run may use, at `price`.
        price: `{"input_per_mtok": ..., "output_per_mtok": ...}`, what calls are reserved
            and counted at (default: pydantic-ai's own prices, known after the call).
        usage_limits: pydantic-ai's `UsageLimits` for each run (default: pydantic-ai's,
            at most 50 requests a run).

    Raises:
        ConfigError: `agent` is not a pydantic-ai Agent, it has no name or no model, an
            effect is unknown or missing (require_effects), or a budget is wrong.
    """

    def __init__(
        self,
        agent: Any,
        app: App,
        *,
        name: str | None = None,
        tool_effects: Mapping[str, Effect] | None = None,
        toolset_effects: Mapping[str, Effect] | None = None,
        default_effect: Effect = "once",
        require_effects: bool = False,
        tool_probes: Mapping[str, Callable[..., Any] | Literal["tell_model"]] | None = None,
        budget: BudgetSpec | Mapping[str, Any] | None = None,
        max_tokens: int | None = None,
        max_cost: float | None = None,
        price: Price | Mapping[str, float] | None = None,
        usage_limits: UsageLimits | None = None,
    ) -> None:
        if not isinstance(agent, Agent):
            raise ConfigError(
                f"PerdureAgent wraps a pydantic_ai.Agent, not {type(agent).__name__}: "
                "pass the Agent(...) you built"
            )
        label = name or agent.name
        if not label:
            raise ConfigError(
                "PerdureAgent needs a name, the run's durable identity: "
                "Agent(..., name='support') or PerdureAgent(agent, app, name='support')"
            )
        if agent.model is None:
            raise ConfigError(f"agent {label!r} has no model: build it with Agent(model, ...)")
        self.agent: Agent[Any, Any] = agent
        self.app = app
        self.name = f"pydantic_ai:{label}"
        self.default_effect = check_effect(default_effect, f"agent {label!r} default_effect")
        self.tool_effects = {
            tool: check_effect(effect, f"agent {label!r} tool {tool!r}")
            for tool, effect in (tool_effects or {}).items()
        }
        self.toolset_effects = {
            ts: check_effect(effect, f"agent {label!r} toolset {ts!r}")
            for ts, effect in (toolset_effects or {}).items()
        }
        self.require_effects = require_effects
        self.tool_probes = dict(tool_probes or {})
        if require_effects:  # first: an agent refused here leaves no step behind
            for toolset in agent.toolsets:
                toolset.apply(self._check_declared)
        self.budget = ModelBudget.of(
            self.name, budget, max_tokens=max_tokens, max_cost=max_cost, price=price
        )
        self.gates = Gates(app, self.name)
        self.usage_limits = usage_limits
        self._tool_steps: dict[str, Step[..., Any]] = {}
        self._model = _PerdureModel(infer_model(agent.model), self._model_step(), self.name)
        self._toolsets = [ts.visit_and_replace(self._wrap_toolset) for ts in agent.toolsets]
        self.workflow = app.workflow(name=self.name)(self._workflow())

    # -- running ----------------------------------------------------------------------

    async def start_async(
        self, prompt: str, *, deps: Any = None, run_id: str | None = None, stream: bool = False
    ) -> RunHandle:
        """Start a run of the agent on `prompt` (an existing `run_id` returns that run);
        `deps` must be JSON (a dataclass or pydantic model): a worker rebuilds it from it.
        `stream=True`: its model steps stream their tokens to the run's stream."""
        extra: dict[str, Any] = {"stream": True} if stream else {}
        return await self.app.start_async(self.workflow, prompt, deps=deps, run_id=run_id, **extra)

    def start(
        self, prompt: str, *, deps: Any = None, run_id: str | None = None, stream: bool = False
    ) -> RunHandle:
        """`start_async` for sync code."""
        extra: dict[str, Any] = {"stream": True} if stream else {}
        return self.app.start(self.workflow, prompt, deps=deps, run_id=run_id, **extra)

    async def run(
        self,
        prompt: str,
        *,
        deps: Any = None,
        run_id: str | None = None,
        timeout: float | timedelta | None = None,
    ) -> PerdureRunResult:
        """Start a run and wait for its result (a worker of `app` must be running).

        Inside a workflow, the agent runs as part of that run instead: its model requests
        and tool calls are steps of the calling workflow, and `deps` may be any object."""
        ctx = current()
        if ctx is not None:
            return self._result(ctx.run_id, await self._run_here(prompt, deps))
        handle = await self.start_async(prompt, deps=deps, run_id=run_id)
        return self._result(handle.id, await handle.result_async(timeout))

    def run_sync(
        self,
        prompt: str,
        *,
        deps: Any = None,
        run_id: str | None = None,
        timeout: float | timedelta | None = None,
    ) -> PerdureRunResult:
        """`run` for sync code."""
        handle = self.start(prompt, deps=deps, run_id=run_id)
        return self._result(handle.id, handle.result(timeout))

    @asynccontextmanager
    async def run_stream(
        self, prompt: str, *, deps: Any = None, run_id: str | None = None
    ) -> AsyncIterator[PerdureStreamedRun]:
        """Start a streaming run and read it while a worker runs it: `stream_text()` gives
        the model's tokens as they come (through the run's durable stream), `get_output()`
        the output once the run is done. Outside a workflow only."""
        if current() is not None:
            raise ConfigError(
                "PerdureAgent.run_stream() starts a run of its own: inside a workflow use "
                "run(), whose steps are the calling run's"
            )
        handle = await self.start_async(prompt, deps=deps, run_id=run_id, stream=True)
        yield self.stream(handle.id)

    def stream(self, run_id: str, *, offset: int = -1) -> PerdureStreamedRun:
        """Read run `run_id`'s model tokens after stream `offset` (the `offset` a reader had
        reached: it goes on from there, after a disconnect or a crash of either side)."""
        return PerdureStreamedRun(self, run_id, offset)

    def result(
        self, run: RunHandle | str, timeout: float | timedelta | None = None
    ) -> PerdureRunResult:
        """Wait for a started run and give its `PerdureRunResult` (RunFailed if it failed)."""
        handle = run if isinstance(run, RunHandle) else self.app.handle(run)
        return self._result(handle.id, handle.result(timeout))

    def _result(self, run_id: str, raw: dict[str, Any]) -> PerdureRunResult:
        output_type = self.agent.output_type
        output = raw["output"]
        if isinstance(output_type, type) and output_type is not str:
            output = TypeAdapter(output_type).validate_python(output)
        return PerdureRunResult(output, run_id, raw["messages"])

    # -- the workflow and its steps ----------------------------------------------------

    def _workflow(self) -> Callable[..., Any]:
        async def run_agent(prompt: str, deps: Any = None, stream: bool = False) -> dict[str, Any]:
            token = streaming.set(stream)
            try:
                return await self._run_here(prompt, self._deps(deps))
            finally:
                streaming.reset(token)

        return run_agent

    async def _run_here(self, prompt: str, deps: Any) -> dict[str, Any]:
        """The agent's own loop, with the durable model and toolsets, in the current run;
        deferred tool calls are answered at perdure gates."""
        agent = self.agent
        gates = HandleDeferredToolCalls[Any](handler=self._deferred)
        with agent.override(model=self._model, toolsets=self._toolsets, tools=[]):
            result = await agent.run(
                prompt, deps=deps, capabilities=[gates, Steering()],
                usage_limits=self.usage_limits,
            )  # fmt: skip
        return {
            "output": to_jsonable_python(result.output),
            "messages": ModelMessagesTypeAdapter.dump_python(result.all_messages(), mode="json"),
        }

    async def _deferred(
        self, ctx: RunContext[Any], requests: DeferredToolRequests
    ) -> DeferredToolResults:
        """Each call waiting for approval, or for an answer, waits at a perdure gate."""
        results = DeferredToolResults()
        for call in requests.approvals:
            decision = await self.gates.approve(call.tool_call_id, call.tool_name, call.args)
            results.approvals[call.tool_call_id] = (
                ToolApproved()
                if decision.approved
                else ToolDenied(decision.comment or "A person denied this tool call.")
            )
        for call in requests.calls:
            results.calls[call.tool_call_id] = await self.gates.ask(
                call.tool_call_id, call.tool_name, call.args
            )
        return results

    def _deps(self, data: Any) -> Any:
        deps_type = getattr(self.agent, "deps_type", object)
        if data is None or deps_type in (object, type(None), Any):
            return data
        return TypeAdapter(deps_type).validate_python(data)

    def _model_step(self) -> Step[..., Any]:
        app, budget = self.app, self.budget

        # keyed and committed: a response that arrived is journaled before any tool runs,
        # so neither replay nor recovery requests (and pays for) it again
        @app.step(name=f"{self.name}.model", effect="keyed", retry=NO_RETRY, commit=True)
        async def model_request(
            model: Model,
            messages: list[ModelMessage],
            settings: ModelSettings | None,
            params: ModelRequestParameters,
            stream: bool = False,
        ) -> Any:
            prompt = ModelMessagesTypeAdapter.dump_python(messages, mode="json")
            limit = (settings or {}).get("max_tokens")
            held = await reserved(budget, app.runtime, prompt, limit, model.model_name)
            if isinstance(held, dict):  # refused: journaled as the outcome, the run parks
                return held
            try:
                if stream:
                    response = await _streamed(model, messages, settings, params)
                else:
                    response = await model.request(messages, settings, params)
            except Exception:  # an error answer was not paid; a kill leaves it held
                await budget.release(app.runtime, held)
                raise
            usage = response.usage
            tokens = (usage.input_tokens, usage.output_tokens)
            cost = budget.cost(*tokens) if budget.price else _cost(response)
            await budget.settle(
                app.runtime, held, response.model_name or model.model_name, tokens, cost
            )
            return {
                "response": list(ModelMessagesTypeAdapter.dump_python([response], mode="json")),
                "tools": _offered(params),
                "position": current_step().position,
            }

        return model_request

    def effect_of(
        self, tool: str, fn: Callable[..., Any] | None, toolset: str | None = None
    ) -> Effect:
        """The effect a call of `tool` is journaled with: mapping, decorator, its toolset's,
        default."""
        found = self.declared_effect(tool, fn, toolset)
        return found if found is not None else self.default_effect

    def declared_effect(
        self, tool: str, fn: Callable[..., Any] | None, toolset: str | None = None
    ) -> Effect | None:
        if tool in self.tool_effects:
            return self.tool_effects[tool]
        marked: Effect | None = getattr(fn, EFFECT_ATTR, None)
        if marked is not None:
            return marked
        return self.toolset_effects.get(toolset) if toolset is not None else None

    def tool_step(
        self, tool: str, fn: Callable[..., Any] | None, toolset: str | None = None
    ) -> Step[..., Any]:
        """The step `{name}.tool.{tool}` (registered on first use): a renamed tool is a
        different step, so replay against a changed tool list stops at the divergence."""
        step = self._tool_steps.get(tool)
        if step is None:
            effect = self.effect_of(tool, fn, toolset)
            name = f"{self.name}.tool.{tool}"
            found = self.tool_probes.get(tool, getattr(fn, PROBE_ATTR, None))
            probe = None if found is None else step_probe(name, found, _tool_args, _as_value)
            step = self.app.step(name=name, effect=effect, probe=probe)(_call_tool)
            self._tool_steps[tool] = step
        return step

    def _wrap_toolset(self, toolset: AbstractToolset[Any]) -> AbstractToolset[Any]:
        if isinstance(toolset, FunctionToolset):  # known now: registered before any run
            for tool_name, tool in toolset.tools.items():
                self.tool_step(tool_name, tool.function)
        return _PerdureToolset(toolset, durable=self)

    def _check_declared(self, toolset: AbstractToolset[Any]) -> None:
        label = self.name.removeprefix("pydantic_ai:")
        if isinstance(toolset, FunctionToolset):
            for tool_name, tool in toolset.tools.items():
                if self.declared_effect(tool_name, tool.function) is None:
                    raise ConfigError(
                        f"agent {label!r}: tool {tool_name!r} declares no effect "
                        "(require_effects=True): mark it @perdure_tool(effect=...) or add it "
                        "to tool_effects"
                    )
        elif toolset.id is None or toolset.id not in self.toolset_effects:
            raise ConfigError(
                f"agent {label!r}: toolset {toolset.label} declares no effect "
                "(require_effects=True): give it an id and add it to toolset_effects, or "
                "name its tools in tool_effects"
            )


class PerdureStreamedRun:
    """A durable run of the agent read while it runs, from stream offset `offset` on."""

    def __init__(self, durable: PerdureAgent, run_id: str, offset: int = -1) -> None:
        self.durable = durable
        self.run_id = run_id
        self._events = ModelEvents(durable.app.client, run_id, offset)

    @property
    def offset(self) -> int:
        """The stream offset read so far: `durable.stream(run_id, offset=...)` goes on there."""
        return self._events.offset

    async def stream_events(self) -> AsyncIterator[Any]:
        """The model's stream events (`PartStartEvent`, `PartDeltaEvent`, ...) as they come;
        a request retried after a crash streams again from its start."""
        async for item in self._events:
            if not item.retry:
                yield _EVENT.validate_python(item.event)

    async def stream_text(self, *, delta: bool = False) -> AsyncIterator[str]:
        """The text of the model's current response as it grows (`delta=True`: each new
        piece); text of a request cut off by a crash is dropped when it is asked again."""
        text, position = "", -1
        async for item in self._events:
            if item.retry or item.position != position:
                text, position = "", item.position
            piece = _text_of(item.event) if not item.retry else ""
            if piece:
                text += piece
                yield piece if delta else text

    async def result(self, timeout: float | timedelta | None = None) -> PerdureRunResult:
        """The run's result once it is done."""
        handle = self.durable.app.handle(self.run_id)
        return self.durable._result(self.run_id, await handle.result_async(timeout))

    async def get_output(self, timeout: float | timedelta | None = None) -> Any:
        """The run's output once it is done (as pydantic-ai's `get_output`)."""
        return (await self.result(timeout)).output


def _text_of(event: Any) -> str:
    """The text a stream event adds (JSON form), '' for any other event."""
    if not isinstance(event, dict):
        return ""
    if event.get("event_kind") == "part_start":
        part = event.get("part") or {}
        return str(part.get("content") or "") if part.get("part_kind") == "text" else ""
    if event.get("event_kind") == "part_delta":
        change = event.get("delta") or {}
        if change.get("part_delta_kind") == "text":
            return str(change.get("content_delta") or "")
    return ""


async def _streamed(
    model: Model,
    messages: list[ModelMessage],
    settings: ModelSettings | None,
    params: ModelRequestParameters,
) -> ModelResponse:
    """The request streamed: each event to the run's stream as it comes, the whole
    response (what the step journals) at the end."""
    position = current_step().position
    async with model.request_stream(messages, settings, params) as response:
        async for event in response:
            write_event(position, _EVENT.dump_python(event, mode="json"))
    return response.get()


async def _call_tool(
    toolset: AbstractToolset[Any],
    name: str,
    tool_args: dict[str, Any],
    ctx: RunContext[Any],
    tool: ToolsetTool[Any],
) -> Any:  # typed loosely: an operator's resolution is the tool's own output, of any shape
    """One tool call; a `ModelRetry`, or a call deferred to a person, is an outcome too
    (replayed as the same retry or deferral)."""
    try:
        value = await toolset.call_tool(name, tool_args, ctx, tool)
    except ModelRetry as exc:
        return {"retry": exc.message}
    except ApprovalRequired as exc:
        return {"deferred": "approval", "metadata": exc.metadata}
    except CallDeferred as exc:
        return {"deferred": exc.kind, "metadata": exc.metadata}
    try:
        return {"value": to_jsonable_python(value)}
    except PydanticSerializationError:
        raise PayloadError(
            f"tool {name!r} returned a {type(value).__name__}, which is not JSON: return a "
            "str, number, list, dict, dataclass or pydantic model"
        ) from None


def _tool_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Mapping[str, Any]:
    """A tool call's arguments, from its step's (`_call_tool`'s) own."""
    found: Mapping[str, Any] = kwargs.get("tool_args", args[2] if len(args) > 2 else {})
    return found


def _as_value(value: Any) -> dict[str, Any]:
    """A probe's `done` value (what the tool would have returned) as `_call_tool` journals it."""
    return {"value": to_jsonable_python(value)}


_OUTCOMES = ({"value"}, {"retry"}, {"deferred", "metadata"})  # the shapes `_call_tool` journals


def _wrapped(outcome: Any) -> bool:
    """Is a tool step's value one `_call_tool` made, not the tool's output as an operator
    gives it to `perdure resolve --value`?"""
    return isinstance(outcome, dict) and set(outcome) in _OUTCOMES


@dataclass
class _PerdureToolset(WrapperToolset[Any]):
    """A leaf toolset whose every `call_tool()` is a perdure step with the tool's effect."""

    durable: PerdureAgent = field(kw_only=True, repr=False)

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        fn = None
        if isinstance(self.wrapped, FunctionToolset) and name in self.wrapped.tools:
            fn = self.wrapped.tools[name].function
        step = self.durable.tool_step(name, fn, self.wrapped.id)
        outcome = await step(self.wrapped, name, tool_args, ctx, tool)
        if not _wrapped(outcome):  # an operator resolved the step with the tool's output
            return outcome
        if "retry" in outcome:
            raise ModelRetry(outcome["retry"])
        if outcome.get("deferred") == "approval":
            raise ApprovalRequired(outcome.get("metadata"))
        if "deferred" in outcome:
            raise CallDeferred(outcome.get("metadata"), kind=outcome["deferred"])
        return outcome["value"]


class _PerdureModel(WrapperModel):
    """The agent's model, each `request()` a journaled `keyed` step (asked again, at the
    next position, once budget frees up if its reservation was refused)."""

    def __init__(self, wrapped: Model, step: Step[..., Any], agent: str) -> None:
        super().__init__(wrapped)
        self._step = step
        self._agent = agent

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        stream = streaming.get()

        async def call() -> Any:
            return await self._step(
                self.wrapped, messages, model_settings, model_request_parameters, stream
            )

        data = await call_within_budget(self._agent, call)
        if isinstance(data, dict):  # the response, with the tools it was offered
            check_tools(data, _offered(model_request_parameters), f"{self._agent}.model")
            data = data["response"]
        response = ModelMessagesTypeAdapter.validate_python(data)[0]
        assert isinstance(response, ModelResponse)
        return response

    @asynccontextmanager
    async def request_stream(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
        run_context: RunContext[Any] | None = None,
    ) -> AsyncIterator[Any]:
        raise ConfigError(
            "a PerdureAgent's model streams through the run's stream: use "
            "durable.run_stream(...) (or start(stream=True) and durable.stream(run_id)), "
            "not agent.run_stream or event_stream_handler inside the run"
        )
        yield  # pragma: no cover  # an async generator, as the protocol wants


def _offered(params: ModelRequestParameters) -> list[str]:
    """The names of the tools a request offers the model."""
    return [t.name for t in params.function_tools]


def _cost(response: ModelResponse) -> float:
    """The response's price per genai-prices, 0.0 for a model it does not know."""
    try:
        return float(response.cost().total_price)
    except Exception:  # unknown model or provider (a test model): no price, not an error
        return 0.0
