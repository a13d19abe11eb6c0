"""The OpenAI Agents SDK's own loop, made durable by perdure.

Every model call of the SDK goes through a `Model` wrapper whose `get_response` is a
`keyed` step (the `ModelResponse` is journaled once, never requested again on replay or
recovery), and every function tool's `on_invoke_tool` is a step with the tool's effect
(default `once`: an interrupted call parks the run in `needs_attention`, never re-runs).

    runner = Runner(app, tool_effects={"lookup_order": "read"})
    refunds = runner.workflow(agent)        # a perdure workflow running `agent` on its input
    app.start(refunds, "refund order 42")   # or, inside any workflow: await runner.run(agent, x)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from ..engine.context import current
from ..engine.effects import Effect, check_effect
from ..engine.retry import Retry
from ..engine.steps import Step, current_step
from ..errors import ConfigError, ParkRun
from ..extras import require_extra
from ..store.agent_sql import UsageRow

require_extra("openai-agents", "perdure.integrations.openai_agents")

import agents  # noqa: E402  # only once the extra is known to be there
import openai  # noqa: E402  # the SDK's own dependency
from agents import Agent, FunctionTool, Model, ModelResponse, RunConfig, RunResult  # noqa: E402
from pydantic import TypeAdapter  # noqa: E402

if TYPE_CHECKING:
    from ..app import App
    from ..engine.handles import Workflow
    from ..engine.runtime import Runtime

__all__ = ["Runner", "tool_effect"]

T = TypeVar("T", bound=FunctionTool)

# A ModelResponse is a dataclass of pydantic items (a discriminated union) and a Usage
# dataclass: one adapter dumps it to JSON and validates it back to the same objects.
_RESPONSE: TypeAdapter[ModelResponse] = TypeAdapter(ModelResponse)
_EFFECT_ATTR = "__perdure_effect__"


def tool_effect(effect: Effect) -> Callable[[T], T]:
    """Declare a function tool's effect: `@tool_effect("read")` above `@function_tool`."""
    kind = check_effect(effect, "tool_effect()")

    def mark(tool: T) -> T:
        if not isinstance(tool, FunctionTool):
            raise ConfigError(
                f"@tool_effect({kind!r}) goes above @function_tool, not on {type(tool).__name__}"
            )
        setattr(tool, _EFFECT_ATTR, kind)
        return tool

    return mark


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _model_body(
    runtime: Runtime, agent: str
) -> Callable[[Callable[[], Awaitable[ModelResponse]], str], Awaitable[dict[str, Any]]]:
    """The body of `agent`'s model step: the SDK's request, its usage recorded for
    `perdure usage` (once per position), its response as JSON. A refused key parks the run."""

    async def model_call(
        call: Callable[[], Awaitable[ModelResponse]], model: str
    ) -> dict[str, Any]:
        info = current_step()
        try:
            response = await call()
        except (openai.AuthenticationError, openai.PermissionDeniedError) as exc:
            raise ParkRun(
                f"agent {agent!r}, model {model!r}: the provider refused the key "
                f"({_one_line(exc)}); fix it where the workers run, then "
                f"`perdure resume {info.run_id}`"
            ) from exc
        usage = response.usage
        await runtime.store.record_usage(
            UsageRow(
                info.run_id, info.position, agent, model, usage.input_tokens,
                usage.output_tokens, 0.0, runtime.clock.now(),
            )
        )  # fmt: skip
        return _RESPONSE.dump_python(response, mode="json")  # type: ignore[no-any-return]

    return model_call


# A model call is retried when the provider may answer later; a refused key parks the run
# (ParkRun) and any other error (a bad request) fails it at once, in one line.
MODEL_RETRY = Retry(
    max_attempts=6,
    initial=1.0,
    max_delay=60.0,
    retry_on=(openai.APIConnectionError, openai.RateLimitError, openai.InternalServerError),
    no_retry_on=(ParkRun,),
)


async def _tool_call(call: Callable[[], Awaitable[Any]]) -> Any:
    """The body of a tool step: the SDK's own invoker (schema check, failure handler)."""
    return await call()


class _DurableModel(Model):
    """A Model whose responses come from the journal when they are there."""

    def __init__(self, inner: Model, step: Step[..., Any]) -> None:
        self.inner = inner
        self.step = step

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        async def call() -> ModelResponse:
            return await self.inner.get_response(*args, **kwargs)

        model = str(getattr(self.inner, "model", type(self.inner).__name__))
        return _RESPONSE.validate_python(await self.step(call, model))

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        # A streamed response is not journaled yet: refused rather than silently not durable.
        raise ConfigError(
            "perdure.integrations.openai_agents does not stream yet: use Runner.run, "
            "not agents.Runner.run_streamed, with a durable agent"
        )


class Runner:
    """The SDK's `Runner`, with model and function-tool calls as journaled perdure steps.

    Args:
        app: the perdure app whose store journals the runs.
        tool_effects: effect per tool name (`{"lookup_order": "read"}`); it wins over a
            tool's `@tool_effect` mark; a tool with neither is `once`.
        require_effects: refuse (one line, when the agent is registered or run) a tool
            with neither, instead of defaulting it to `once`.
    """

    def __init__(
        self,
        app: App,
        *,
        tool_effects: Mapping[str, Effect] | None = None,
        require_effects: bool = False,
    ) -> None:
        self.app = app
        self.tool_effects = {
            name: check_effect(kind, f"tool_effects[{name!r}]")
            for name, kind in (tool_effects or {}).items()
        }
        self.require_effects = require_effects
        self._steps: dict[str, Step[..., Any]] = {}
        self._workflows: dict[str, Workflow[..., Any]] = {}

    # -- the durable agent ------------------------------------------------------------

    def _step(
        self, name: str, fn: Callable[..., Any], effect: Effect, *, model: bool = False
    ) -> Step[..., Any]:
        """Register (once) a step; a model step retries per MODEL_RETRY and commits its
        outcome before the loop goes on, so a billed response is never bought twice."""
        step = self._steps.get(name)
        if step is None:
            known = self.app.steps.get(name)  # another Runner on this app registered it
            if known is not None:
                step = Step(known)
            else:
                retry = MODEL_RETRY if model else None
                step = self.app.step(name=name, effect=effect, retry=retry, commit=model)(fn)
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
        return self._step(
            f"agents.{agent}.model", _model_body(self.app, agent), "keyed", model=True
        )

    def _tool_step(self, agent: str, tool: FunctionTool) -> Step[..., Any]:
        return self._step(f"agents.{agent}.tool.{tool.name}", _tool_call, self.effect_of(tool))

    def _tool(self, agent: str, tool: FunctionTool) -> FunctionTool:
        step = self._tool_step(agent, tool)
        invoke = tool.on_invoke_tool

        async def durable(context: Any, arguments: str) -> Any:
            return await step(lambda: invoke(context, arguments))

        return dataclasses.replace(tool, on_invoke_tool=durable)

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
            copy = one.clone(model=_DurableModel(inner, self._model_step(one.name)))
            done[id(one)] = copy
            copy.tools = [
                self._tool(one.name, t) if isinstance(t, FunctionTool) else t for t in one.tools
            ]
            copy.handoffs = [wrap(h) if isinstance(h, Agent) else h for h in one.handoffs]
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
        if kwargs.get("session") is not None:
            # an SDK session keeps history outside the journal: a replay would add it twice
            raise ConfigError(
                "openai_agents.Runner.run(session=...) is not durable yet: the journal "
                "already keeps the conversation; pass the earlier items as input instead"
            )
        if current() is None:
            raise ConfigError(
                "openai_agents.Runner.run() runs inside a perdure workflow; outside one, "
                "start runner.workflow(agent) or call runner.run_sync(agent, input)"
            )
        config = dataclasses.replace(run_config or RunConfig(), model=None)
        durable = self.durable(agent, run_config)
        return await agents.Runner.run(durable, input, run_config=config, **kwargs)

    def workflow(self, agent: Agent[Any], *, name: str | None = None) -> Workflow[..., Any]:
        """Register (once) the perdure workflow `agents.{agent.name}` that runs `agent` on its
        input and returns the final output. Register it at import time, so that every worker
        knows the agent by its name."""
        agent = _agent(agent)
        wf_name = name or f"agents.{agent.name}"
        found = self._workflows.get(wf_name)
        if found is not None:
            return found

        async def run_agent(input: Any) -> Any:
            return (await self.run(agent, input)).final_output

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
            self._model_step(one.name)
            for tool in one.tools:
                if isinstance(tool, FunctionTool):
                    self._tool_step(one.name, tool)
            todo.extend(h for h in one.handoffs if isinstance(h, Agent))

    def run_sync(
        self,
        starting_agent: Agent[Any],
        input: Any,
        *,
        run_id: str | None = None,
        timeout: float | None = None,
    ) -> Any:
        """Start `starting_agent`'s durable run (idempotent by `run_id`) and wait for its
        final output; a worker (`perdure worker`, `app.run_worker()`) runs it."""
        workflow = self.workflow(starting_agent)
        return self.app.start(workflow, input, run_id=run_id).result(timeout=timeout)


def _agent(agent: object) -> Agent[Any]:
    if not isinstance(agent, Agent):
        raise ConfigError(
            f"openai_agents.Runner needs an agents.Agent, not {type(agent).__name__}: "
            "build it with agents.Agent(name=..., instructions=..., tools=[...])"
        )
    return agent
