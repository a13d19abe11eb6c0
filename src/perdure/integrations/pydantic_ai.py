"""pydantic-ai agents made durable: `PerdureAgent` runs an existing `pydantic_ai.Agent` as a
perdure workflow whose model requests and tool calls are journaled steps.

The framework's loop stays pydantic-ai's. The agent's model is wrapped so that each
`request()` is a `keyed` step committed before the loop goes on (a recorded response is
never requested, nor billed, again); each toolset is wrapped so that each `call_tool()`
is a step with the tool's declared effect (`tool_effects=`, `@perdure_tool`, else
`once`: an interrupted call parks the run in `needs_attention`, never runs twice).
Responses go through pydantic-ai's own `ModelMessagesTypeAdapter`, so the journal is JSON.

    agent = Agent("openai:gpt-5", name="support")
    durable = PerdureAgent(agent, app, tool_effects={"lookup_order": "read"})
    result = await durable.run("Where is order 42?", deps=Deps(shop="eu"))
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from ..engine.context import current
from ..engine.effects import Effect, check_effect
from ..engine.handles import RunHandle
from ..engine.retry import NO_RETRY
from ..engine.steps import Step, current_step
from ..errors import ConfigError, PayloadError
from ..extras import require_extra
from ..store.agent_sql import UsageRow

require_extra("pydantic-ai", "perdure.integrations.pydantic_ai")

from pydantic import TypeAdapter  # noqa: E402
from pydantic_ai import Agent, ModelRetry  # noqa: E402
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ModelResponse  # noqa: E402
from pydantic_ai.models import Model, ModelRequestParameters, infer_model  # noqa: E402
from pydantic_ai.models.wrapper import WrapperModel  # noqa: E402
from pydantic_ai.settings import ModelSettings  # noqa: E402
from pydantic_ai.tools import RunContext  # noqa: E402
from pydantic_ai.toolsets import AbstractToolset, FunctionToolset, WrapperToolset  # noqa: E402
from pydantic_ai.toolsets.abstract import ToolsetTool  # noqa: E402
from pydantic_core import PydanticSerializationError, to_jsonable_python  # noqa: E402

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from ..app import App

__all__ = ["PerdureAgent", "PerdureRunResult", "perdure_tool"]

F = TypeVar("F", bound=Callable[..., Any])
EFFECT_ATTR = "__perdure_effect__"


def perdure_tool(*, effect: Effect) -> Callable[[F], F]:
    """Declare a tool function's effect (above or below `@agent.tool`): what recovery may do
    with a call cut off between intent and outcome (see `perdure.Effect`)."""
    kind = check_effect(effect, "perdure_tool")

    def mark(fn: F) -> F:
        setattr(fn, EFFECT_ATTR, kind)
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
        default_effect: the effect of a tool declared nowhere (default `once`).

    Raises:
        ConfigError: `agent` is not a pydantic-ai Agent, it has no name or no model, or an
            effect is unknown.
    """

    def __init__(
        self,
        agent: Any,
        app: App,
        *,
        name: str | None = None,
        tool_effects: Mapping[str, Effect] | None = None,
        default_effect: Effect = "once",
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
        self._tool_steps: dict[str, Step[..., Any]] = {}
        self._model = _PerdureModel(infer_model(agent.model), self._model_step())
        self._toolsets = [ts.visit_and_replace(self._wrap_toolset) for ts in agent.toolsets]
        self.workflow = app.workflow(name=self.name)(self._workflow())

    # -- running ----------------------------------------------------------------------

    async def start_async(
        self, prompt: str, *, deps: Any = None, run_id: str | None = None
    ) -> RunHandle:
        """Start a run of the agent on `prompt` (an existing `run_id` returns that run);
        `deps` must be JSON (a dataclass or pydantic model): a worker rebuilds it from it."""
        return await self.app.start_async(self.workflow, prompt, deps=deps, run_id=run_id)

    def start(self, prompt: str, *, deps: Any = None, run_id: str | None = None) -> RunHandle:
        """`start_async` for sync code."""
        return self.app.start(self.workflow, prompt, deps=deps, run_id=run_id)

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
        async def run_agent(prompt: str, deps: Any = None) -> dict[str, Any]:
            return await self._run_here(prompt, self._deps(deps))

        return run_agent

    async def _run_here(self, prompt: str, deps: Any) -> dict[str, Any]:
        """The agent's own loop, with the durable model and toolsets, in the current run."""
        agent = self.agent
        with agent.override(model=self._model, toolsets=self._toolsets, tools=[]):
            result = await agent.run(prompt, deps=deps)
        return {
            "output": to_jsonable_python(result.output),
            "messages": ModelMessagesTypeAdapter.dump_python(result.all_messages(), mode="json"),
        }

    def _deps(self, data: Any) -> Any:
        deps_type = getattr(self.agent, "deps_type", object)
        if data is None or deps_type in (object, type(None), Any):
            return data
        return TypeAdapter(deps_type).validate_python(data)

    def _model_step(self) -> Step[..., Any]:
        app, label = self.app, self.name

        # keyed and committed: a response that arrived is journaled before any tool runs,
        # so neither replay nor recovery requests (and pays for) it again
        @app.step(name=f"{self.name}.model", effect="keyed", retry=NO_RETRY, commit=True)
        async def model_request(
            model: Model,
            messages: list[ModelMessage],
            settings: ModelSettings | None,
            params: ModelRequestParameters,
        ) -> list[Any]:
            response = await model.request(messages, settings, params)
            info = current_step()
            usage = response.usage
            await app.store.record_usage(
                UsageRow(
                    info.run_id, info.position, label, response.model_name or model.model_name,
                    usage.input_tokens, usage.output_tokens, _cost(response), app.clock.now(),
                )
            )  # fmt: skip
            return list(ModelMessagesTypeAdapter.dump_python([response], mode="json"))

        return model_request

    def effect_of(self, tool: str, fn: Callable[..., Any] | None) -> Effect:
        """The effect a call of `tool` is journaled with: mapping, decorator, default."""
        if tool in self.tool_effects:
            return self.tool_effects[tool]
        marked = getattr(fn, EFFECT_ATTR, None)
        return marked if marked is not None else self.default_effect

    def tool_step(self, tool: str, fn: Callable[..., Any] | None) -> Step[..., Any]:
        """The step `{name}.tool.{tool}` (registered on first use): a renamed tool is a
        different step, so replay against a changed tool list stops at the divergence."""
        step = self._tool_steps.get(tool)
        if step is None:
            step = self.app.step(name=f"{self.name}.tool.{tool}", effect=self.effect_of(tool, fn))(
                _call_tool
            )
            self._tool_steps[tool] = step
        return step

    def _wrap_toolset(self, toolset: AbstractToolset[Any]) -> AbstractToolset[Any]:
        return _PerdureToolset(toolset, durable=self)


async def _call_tool(
    toolset: AbstractToolset[Any],
    name: str,
    tool_args: dict[str, Any],
    ctx: RunContext[Any],
    tool: ToolsetTool[Any],
) -> dict[str, Any]:
    """One tool call; a `ModelRetry` is an outcome too (replayed as the same retry)."""
    try:
        value = await toolset.call_tool(name, tool_args, ctx, tool)
    except ModelRetry as exc:
        return {"retry": exc.message}
    try:
        return {"value": to_jsonable_python(value)}
    except PydanticSerializationError:
        raise PayloadError(
            f"tool {name!r} returned a {type(value).__name__}, which is not JSON: return a "
            "str, number, list, dict, dataclass or pydantic model"
        ) from None


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
        step = self.durable.tool_step(name, fn)
        outcome = await step(self.wrapped, name, tool_args, ctx, tool)
        if "retry" in outcome:
            raise ModelRetry(outcome["retry"])
        return outcome["value"]


class _PerdureModel(WrapperModel):
    """The agent's model, each `request()` a journaled `keyed` step."""

    def __init__(self, wrapped: Model, step: Step[..., Any]) -> None:
        super().__init__(wrapped)
        self._step = step

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        data = await self._step(self.wrapped, messages, model_settings, model_request_parameters)
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
            "PerdureAgent does not stream model responses yet: use run() or run_sync(), "
            "without event_stream_handler"
        )
        yield  # pragma: no cover  # an async generator, as the protocol wants


def _cost(response: ModelResponse) -> float:
    """The response's price per genai-prices, 0.0 for a model it does not know."""
    try:
        return float(response.cost().total_price)
    except Exception:  # unknown model or provider (a test model): no price, not an error
        return 0.0
