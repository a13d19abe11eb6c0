"""perdure as a pydantic-ai durability backend: `PerdureDurability(app)` is a capability on
pydantic-ai's own `durable_exec` surface, so an agent is made durable where it is built:

    agent = Agent("openai:gpt-5", name="support", capabilities=[PerdureDurability(app)])

    @app.workflow(name="support")
    async def support(prompt: str) -> str:
        return (await agent.run(prompt)).output

Inside a perdure workflow, every operation pydantic-ai routes through its durability base is
one perdure step, named by pydantic-ai's `JournalOperationNamer` (an MCP tool call named per
tool too; persisted names, pinned by tests/integrations/test_pydantic_durability_names.py):
each model request (`keyed`, committed before the loop goes on, reserved against the agent's
budgets first), each tool call (the tool's declared effect: `tool_effects=`,
`@perdure_tool`, tool metadata `{"perdure": {"effect": ...}}`, its toolset's, else `once`;
a `once` tool's probe from `tool_probes=`, `@perdure_tool(probe=)` or the metadata's
`"probe"`, asked with the call's arguments by recovery: integrations/tool_probes.py),
each MCP discovery (`read`), and each model call a capability makes from a hook
(`@durable_operation` methods, compaction): a recorded answer is replayed, never asked (nor
billed) again. Deferred tool calls (`requires_approval=True`, `ApprovalRequired`,
`CallDeferred`) wait at perdure gates, and the graph's waits between polls are perdure's
durable timer. Outside a workflow the agent runs as a plain pydantic-ai agent.

The backend is a `CallableOperationBackend`: a perdure step is a callback run at the run's
next journal position, registered on first use, so nothing has to be registered before a
worker starts. Step outcomes are JSON (`JSON_CODEC`); a step's arguments are never
journaled, so a model step records the response, not the whole conversation it was sent
(a tool step takes the call's arguments too, for its probe, and journals only its result).
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, TypedDict, cast

from ..agent.spec import BudgetSpec, Price
from ..agent.tool_probes import TELL_MODEL
from ..engine import durable
from ..engine.context import current
from ..engine.effects import Effect, check_effect
from ..engine.retry import NO_RETRY, Retry
from ..engine.steps import Step, _step_info, current_step
from ..errors import ConfigError, NonDeterminismError, PayloadError, RunSuspended, WorkerStopping
from ..extras import require_extra
from .budget import ModelBudget, call_within_budget, reserved
from .gates import Gates
from .replay import check_tools
from .streaming import write_event
from .tool_probes import step_probe

require_extra("pydantic-ai", "perdure.integrations.pydantic_durability")

from pydantic import TypeAdapter  # noqa: E402
from pydantic_ai.agent import EventStreamHandler  # noqa: E402
from pydantic_ai.capabilities import HandleDeferredToolCalls  # noqa: E402
from pydantic_ai.capabilities.abstract import AbstractCapability  # noqa: E402
from pydantic_ai.durable_exec import (  # noqa: E402
    JSON_CODEC,
    BaseDurabilityCapability,
    CallableOperationBackend,
    DurabilityEngineSpec,
    DurableOperationBackend,
    DurableOperationId,
    JournalOperationNamer,
    ModelRequestId,
    RoleBasedOperationConfig,
    ToolsetCallToolId,
    conversation_id_from_run_id,
)
from pydantic_ai.durable_exec._operation_names import DurableInvocationName  # noqa: E402
from pydantic_ai.messages import (  # noqa: E402
    AgentStreamEvent,
    ModelMessagesTypeAdapter,
    ModelResponse,
    ModelResponseStreamEvent,
    PartDeltaEvent,
    PartEndEvent,
    PartStartEvent,
)
from pydantic_ai.models import Model, ModelRequestParameters  # noqa: E402
from pydantic_ai.tools import (  # noqa: E402
    AgentDepsT,
    DeferredToolRequests,
    DeferredToolResults,
    RunContext,
    ToolApproved,
    ToolDenied,
)
from pydantic_ai.toolsets import FunctionToolset, ToolsetTool  # noqa: E402
from pydantic_core import to_jsonable_python  # noqa: E402

from .pydantic_ai import EFFECT_ATTR, PROBE_ATTR, Steering  # noqa: E402

if TYPE_CHECKING:
    from ..app import App

__all__ = ["PerdureDurability", "StepConfig"]

ENGINE = "perdure"
_RESPONSE: TypeAdapter[ModelResponse] = TypeAdapter(ModelResponse)
_EVENT: TypeAdapter[Any] = TypeAdapter(ModelResponseStreamEvent)
_MODEL_EVENTS = (PartStartEvent, PartDeltaEvent, PartEndEvent)


class StepConfig(TypedDict, total=False):
    """How one operation's perdure step is registered (a tool's `{"perdure": {...}}` metadata
    overrides keys of it): its effect, retry policy, per-attempt timeout, whether its
    outcome is committed before the workflow goes on, and a `once` tool's probe (a function
    called with the call's arguments, or "tell_model")."""

    effect: Effect
    retry: Retry
    timeout: float
    commit: bool
    probe: Callable[..., Any] | str


def _payload_error(exc: Exception) -> BaseException:
    """A value pydantic-ai cannot reduce to JSON: one line, never retried."""
    return PayloadError(f"a pydantic-ai value is not JSON, so perdure cannot journal it: {exc}")


async def _unit(body: Callable[[], Awaitable[object]], tool_args: object = None) -> Any:
    """Every operation's step: run pydantic-ai's encoded body (its outcome is the payload).
    A tool call's step is also given the call's arguments (never journaled): its probe is
    asked with them."""
    return await body()


def _tool_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Mapping[str, Any]:
    """A tool call's arguments, from its step's (`_unit`'s) own."""
    found = kwargs.get("tool_args", args[1] if len(args) > 1 else None)
    return found if isinstance(found, Mapping) else {}


def _tool_return(value: Any) -> dict[str, Any]:
    """A probe's `done` value (what the tool would have returned) as a tool step journals
    it: pydantic-ai's encoded tool return."""
    return {"kind": "tool_return", "result": to_jsonable_python(value)}


class PerdureOperationNamer(JournalOperationNamer):
    """pydantic-ai's journal names, with an MCP server's tool calls named per tool too
    (`{agent}__mcp_server__{id}.call_tool:{tool}`): a perdure step has one effect, and an
    MCP server's tools may each declare their own. Persisted: never rename."""

    def invocation_name(
        self, operation_id: DurableOperationId, *, label: str | None
    ) -> DurableInvocationName:
        found = super().invocation_name(operation_id, label=label)
        mcp = isinstance(operation_id, ToolsetCallToolId) and operation_id.toolset_kind == "mcp"
        if mcp and label is not None:
            return DurableInvocationName(f"{found.operation_name}:{label}")
        return found


class PerdureOperationBackend(CallableOperationBackend[StepConfig]):
    """Runs each pydantic-ai durable operation as a perdure step named after it, registered on
    the app on first use; a model request is reserved against the agent's budgets inside
    its step and waits (durably, holding no slot) while the budget is spent."""

    def __init__(
        self,
        app: App,
        *,
        agent_name: str,
        config: RoleBasedOperationConfig[StepConfig],
        budget: ModelBudget,
        model_name: Callable[[str | None], str],
    ) -> None:
        super().__init__(namer=PerdureOperationNamer(agent_name), config=config)
        self.app = app
        self.budget = budget
        self._model_name = model_name
        self._steps: dict[str, Step[..., Any]] = {}

    def operation_name(self, operation_id: DurableOperationId, label: str | None = None) -> str:
        """The persisted step name of `operation_id` (`label`: a function tool's name)."""
        return self._namer.invocation_name(operation_id, label=label).operation_name

    def execution_attempt(self) -> int:
        info = _step_info.get()
        return 1 if info is None else info.attempt

    def step(self, name: str, config: StepConfig, tool: str | None = None) -> Step[..., Any]:
        """The perdure step `name` (registered the first time it runs; `tool`: the name of
        the tool it calls, if it calls one)."""
        found = self._steps.get(name)
        if found is None:
            effect = config.get("effect", "once")
            known = self.app.runtime.steps.get(name)
            if known is not None and known.effect != effect:
                raise ConfigError(
                    f"step {name!r} is registered with effect {known.effect!r}, "
                    f"not {effect!r}: two agents with one name? give one another name"
                )
            probe = config.get("probe")
            found = self.app.step(
                name=name,
                effect=effect,
                retry=config.get("retry"),
                timeout=config.get("timeout"),
                commit=config.get("commit", False),
                probe=None
                if probe is None
                else step_probe(name, probe, _tool_args, _tool_return, tool=tool),
            )(_unit)
            self._steps[name] = found
        return found

    async def execute(
        self,
        *,
        operation_id: DurableOperationId,
        name: str,
        body: Callable[[], Awaitable[object]],
        cache_key: tuple[object, ...],
        config: StepConfig,
    ) -> object:
        calls_tool = isinstance(operation_id, ToolsetCallToolId) and len(cache_key) > 1
        step = self.step(name, config, str(cache_key[0]) if calls_tool else None)
        if current() is None:  # not in a workflow: a plain call
            return await body()
        if isinstance(operation_id, ModelRequestId):
            return await self._model_request(step, name, body, cache_key)
        if not calls_tool:
            return await step(body)
        # the call's arguments reach the step (not its journal): its probe is asked with them
        outcome = await step(body, cache_key[1])
        if not _tool_payload(outcome):
            # an operator resolved the step with the tool's output, as it is
            return {"kind": "tool_return", "result": outcome}
        return outcome

    async def _model_request(
        self,
        step: Step[..., Any],
        name: str,
        body: Callable[[], Awaitable[object]],
        cache_key: tuple[object, ...],
    ) -> object:
        model_id, messages, settings, params = cache_key[:4]
        offered = _offered(cast(ModelRequestParameters, params))
        app, budget = self.app, self.budget
        model = self._model_name(cast("str | None", model_id))

        async def reserved_body() -> Any:
            # the prompt's JSON text, made in pydantic-core: the reservation only weighs it
            prompt = ModelMessagesTypeAdapter.dump_json(cast(Any, messages)).decode()
            limit = cast(Mapping[str, Any], settings or {}).get("max_tokens")
            held = await reserved(budget, app.runtime, prompt, limit, model)
            if isinstance(held, dict):  # refused: journaled as the outcome, the run waits
                return held
            try:
                payload = await body()
            except Exception:  # an error answer was not paid; a kill leaves it held
                await budget.release(app.runtime, held)
                raise
            response = _RESPONSE.validate_python(payload)
            tokens = (response.usage.input_tokens, response.usage.output_tokens)
            cost = budget.cost(*tokens) if budget.price else _cost(response)
            await budget.settle(app.runtime, held, response.model_name or model, tokens, cost)
            return {"response": payload, "tools": offered, "position": current_step().position}

        async def call() -> Any:
            return await step(reserved_body)

        outcome = await call_within_budget(budget.agent, call)
        check_tools(outcome, offered, name)
        return outcome["response"]


@dataclass(init=False, kw_only=True)
class PerdureDurability(BaseDurabilityCapability[AgentDepsT]):
    """Capability that makes a pydantic-ai agent durable on perdure: inside a perdure
    workflow, its model requests, tool calls and hook-made model calls are journaled steps.

    Args:
        app: the perdure App the steps are registered on (its workflows run the agent).
        name: the agent's durable identity (default: the agent's `name`); it names its steps.
        tool_effects: effect per tool name (`{"lookup_order": "read"}`).
        tool_probes: probe per `once` tool name (`{"issue_refund": find_refund}`): recovery
            asks it, with the cut-off call's arguments, whether the call took effect (a
            `perdure.ProbeAnswer`), or "tell_model"; wins over `@perdure_tool(probe=)`, tool
            metadata `{"perdure": {"probe": ...}}` wins over both.
        toolset_effects: effect of a toolset's tools (an MCP server) by toolset `id`.
        default_effect: the effect of a tool declared nowhere (default `once`: a call cut
            off by a crash parks the run in needs_attention, it never runs twice).
        budget, max_tokens, max_cost, price: as `PerdureAgent`'s (integrations/budget.py);
            the budget is kept under `pydantic_ai:{name}` (`perdure budget pydantic_ai:NAME`).
        models: more models by id, for runs that pick one (pydantic-ai's `models=`).
        gates: answer deferred tool calls at perdure gates (`approve:{call_id}`,
            `human:{call_id}`); False leaves them to the agent's own handler.
        stream: write each model step's stream events, as they come, to the run's durable
            stream (topic `model`, read with `perdure.integrations.streaming.ModelEvents`
            from any offset, across workers); the step journals the whole response once.
        event_stream_handler: pydantic-ai's own handler instead (not with `stream`).

    Raises:
        ConfigError: an effect is unknown, a budget is wrong, or a probe is not a function
            nor "tell_model", or is given to a tool that is not `once`.
    """

    engine_spec = DurabilityEngineSpec(
        engine_name=ENGINE,
        durable_unit_noun="step",
        durable_container_noun="workflow",
        # perdure journals JSON: pydantic-ai reduces each outcome inside the step, so a value
        # that is not JSON fails that step in one line instead of after it ran
        codec=JSON_CODEC,
        serialization_failure=_payload_error,
        # tools passed at run time would run unjournaled; refuse them in a workflow
        unsupported_runtime_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        wrapped_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        # steps run in the workflow's own process: an MCP session is opened by the first
        # step that needs it (its connect covered by that step) and held for the run
        toolset_lifecycles={
            "function": "enter-always",
            "mcp": "enter-in-durable-unit",
            "dynamic": "enter-never",
        },
        tool_call_result_upgrade_lenient=False,  # no earlier recordings in this format
        journal_discovery=True,  # an MCP server's tool list is journaled: replay sees it
        # a step's position is taken when it is called: one tool after another keeps the
        # positions of one response's calls independent of which finished first
        sequential_tools_in_durable_context=True,
        tool_config_key="perdure",
        # a cancelled run unwinds with RunSuspended, as a parked or sleeping one does
        cancellation_error_types=(),
        control_flow_error_types=(RunSuspended, WorkerStopping),
        nondeterminism_error_types=(NonDeterminismError,),
        accepts_cancellation_token=False,
    )

    def __init__(
        self,
        app: App,
        *,
        name: str | None = None,
        tool_effects: Mapping[str, Effect] | None = None,
        tool_probes: Mapping[str, Callable[..., Any] | Literal["tell_model"]] | None = None,
        toolset_effects: Mapping[str, Effect] | None = None,
        default_effect: Effect = "once",
        budget: BudgetSpec | Mapping[str, Any] | None = None,
        max_tokens: int | None = None,
        max_cost: float | None = None,
        price: Price | Mapping[str, float] | None = None,
        models: Mapping[str, Model] | None = None,
        gates: bool = True,
        stream: bool = False,
        event_stream_handler: EventStreamHandler[AgentDepsT] | None = None,
    ) -> None:
        where = f"PerdureDurability({name or ''})"
        if stream and event_stream_handler is not None:
            raise ConfigError(
                f"{where}: stream=True writes the model's events to the run's stream; "
                "pass it or an event_stream_handler, not both"
            )
        handler = _to_run_stream if stream else event_stream_handler
        super().__init__(models=models, event_stream_handler=handler, name=name)
        self.app = app
        self.default_effect = check_effect(default_effect, f"{where} default_effect")
        self.tool_effects = {
            tool: check_effect(effect, f"{where} tool {tool!r}")
            for tool, effect in (tool_effects or {}).items()
        }
        self.toolset_effects = {
            ts: check_effect(effect, f"{where} toolset {ts!r}")
            for ts, effect in (toolset_effects or {}).items()
        }
        self.tool_probes = dict(tool_probes or {})
        for tool, probe in self.tool_probes.items():
            _check_probe(f"{where} tool {tool!r}", probe, self.tool_effects.get(tool, "once"))
        self._budget_args: dict[str, Any] = {
            "budget": budget, "max_tokens": max_tokens, "max_cost": max_cost, "price": price,
        }  # fmt: skip
        self.budget = ModelBudget.of(f"pydantic_ai:{name or '?'}", budget, max_tokens=max_tokens,
                                     max_cost=max_cost, price=price, where=where)  # fmt: skip
        self.use_gates = gates
        self._backend: PerdureOperationBackend | None = None

    # -- where the run is ----------------------------------------------------------------

    @property
    def in_durable_context(self) -> bool:
        return current() is not None

    @property
    def in_durable_unit(self) -> bool:
        return _step_info.get() is not None or super().in_durable_unit

    def _workflow_code(self) -> bool:
        return self.in_durable_context and not self.in_durable_unit

    def get_default_run_id(self) -> str | None:
        """A journaled id: a recovered run's agent run has the id it had the first time."""
        return str(durable.uuid()) if self._workflow_code() else None

    def get_default_conversation_id(self, run_id: str) -> str | None:
        return conversation_id_from_run_id(run_id) if self._workflow_code() else None

    async def get_run_start_time(self, run_id: str) -> datetime | None:
        return durable.now() if self._workflow_code() else None

    async def durable_sleep(self, seconds: float) -> None:
        """perdure's durable timer: the run is parked on a store timer, holding no worker,
        and a recovered run does not wait again through time already passed."""
        await durable.sleep(max(seconds, 0.0))

    # -- gates ---------------------------------------------------------------------------

    def _companion_capabilities(self) -> list[AbstractCapability[AgentDepsT]]:
        found = super()._companion_capabilities()
        found.append(Steering())  # `perdure steer` messages join the next request
        if self.use_gates:
            found.append(HandleDeferredToolCalls[AgentDepsT](handler=self._deferred))
        return found

    async def _deferred(
        self, ctx: RunContext[AgentDepsT], requests: DeferredToolRequests
    ) -> DeferredToolResults:
        """Each call waiting for approval, or for an answer, waits at a perdure gate (in
        workflow code: the wait is the journaled event, replay returns the same decision)."""
        gates = Gates(self.app, f"pydantic_ai:{self.name}")
        results = DeferredToolResults()
        for call in requests.approvals:
            decision = await gates.approve(call.tool_call_id, call.tool_name, call.args)
            results.approvals[call.tool_call_id] = (
                ToolApproved()
                if decision.approved
                else ToolDenied(decision.comment or "A person denied this tool call.")
            )
        for call in requests.calls:
            results.calls[call.tool_call_id] = await gates.ask(
                call.tool_call_id, call.tool_name, call.args
            )
        return results

    # -- the backend ---------------------------------------------------------------------

    def get_durable_operation_backend(self) -> DurableOperationBackend[StepConfig]:
        if self._backend is None:
            self.budget = ModelBudget.of(f"pydantic_ai:{self.name}", **self._budget_args)
            model: StepConfig = {"effect": "keyed", "retry": NO_RETRY, "commit": True}
            self._backend = PerdureOperationBackend(
                self.app,
                agent_name=self.name,
                config=RoleBasedOperationConfig(
                    model=model,
                    event={"effect": "idempotent"},
                    # a hook's own operation may call a model: bought once, like a request
                    capability={"effect": "keyed", "commit": True},
                    tool={"effect": self.default_effect},
                    resolve_tool=self._tool_config,
                ),
                budget=self.budget,
                model_name=self._model_name,
            )
        return self._backend

    def _model_name(self, model_id: str | None) -> str:
        if model_id is not None:
            return model_id
        agent_model = self.agent.model if self.agent is not None else None
        if isinstance(agent_model, Model):
            return agent_model.model_name
        return str(agent_model or "default")

    def _tool_config(
        self, operation_id: DurableOperationId, tool: object | None, tool_name: str
    ) -> StepConfig | Literal[False]:
        """A tool call's step: the tool's effect, then its `{"perdure": ...}` metadata."""
        if not isinstance(operation_id, ToolsetCallToolId):  # validating arguments: pure
            return {"effect": "read"}
        toolset_id = operation_id.toolset_id
        base: StepConfig = {"effect": self.effect_of(tool_name, toolset_id)}
        probe = self.tool_probes.get(
            tool_name, getattr(self._function(tool_name, toolset_id), PROBE_ATTR, None)
        )
        if probe is not None:
            base["probe"] = probe
        resolve = self._build_resolve_tool_config(base)
        config = resolve(cast("ToolsetTool[Any] | None", tool), tool_name)
        if config is False:
            return False
        resolved = cast(StepConfig, config)
        if "effect" in resolved:
            resolved["effect"] = check_effect(resolved["effect"], f"tool {tool_name!r} metadata")
        if "probe" in resolved:
            _check_probe(f"tool {tool_name!r}", resolved["probe"], resolved.get("effect", "once"))
        return resolved

    def _function(self, tool: str, toolset_id: str | None) -> Callable[..., Any] | None:
        """The Python function of `tool`, a function toolset's (None for an MCP tool)."""
        wrapper = self._toolsets_by_id.get(toolset_id or "")
        inner = getattr(wrapper, "wrapped", None)
        if isinstance(inner, FunctionToolset) and tool in inner.tools:
            return inner.tools[tool].function
        return None

    def effect_of(self, tool: str, toolset_id: str | None) -> Effect:
        """The effect a call of `tool` is journaled with: `tool_effects`, `@perdure_tool`,
        its toolset's, else the default."""
        if tool in self.tool_effects:
            return self.tool_effects[tool]
        marked: Effect | None = getattr(self._function(tool, toolset_id), EFFECT_ATTR, None)
        if marked is not None:
            return marked
        if toolset_id is not None and toolset_id in self.toolset_effects:
            return self.toolset_effects[toolset_id]
        return self.default_effect


def _check_probe(where: str, probe: object, effect: str) -> None:
    """A tool's probe is a function or "tell_model", on a `once` tool: else one line."""
    if not callable(probe) and probe != TELL_MODEL:
        raise ConfigError(f"{where}: probe={probe!r} is not a function nor {TELL_MODEL!r}")
    if effect != "once":
        raise ConfigError(f"{where}: a probe is for once tools, this one is {effect!r}")


async def _to_run_stream(ctx: RunContext[Any], events: AsyncIterable[AgentStreamEvent]) -> None:
    """The model's stream events, inside its step, to the run's durable stream (at the
    step's position); the other events (tools called, their results) are in the journal."""
    async for event in events:
        info = _step_info.get()
        if info is not None and isinstance(event, _MODEL_EVENTS):
            write_event(info.position, _EVENT.dump_python(event, mode="json"))


def _tool_payload(outcome: Any) -> bool:
    """Is a tool step's outcome one pydantic-ai encoded (a `CallToolResult`), not the tool's
    output as an operator gave it to `perdure resolve --value`?"""
    return isinstance(outcome, dict) and isinstance(outcome.get("kind"), str)


def _offered(params: ModelRequestParameters) -> list[str]:
    """The names of the tools a request offers the model."""
    return [t.name for t in params.function_tools]


def _cost(response: ModelResponse) -> float:
    """The response's price per genai-prices, 0.0 for a model it does not know."""
    try:
        return float(response.cost().total_price)
    except Exception:  # unknown model or provider (a test model): no price, not an error
        return 0.0
