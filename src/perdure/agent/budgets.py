"""An agent's budgets: the one in force (spec, overridden limit by limit by a stored one),
the worst case of a model call, reserving it before the call, and waking parked runs.

A model call reserves its worst case (the prompt's estimated tokens plus the call's
`max_tokens`; cost at the tier's prices) against the run's limits and the agent's
hour/day windows in one atomic store write, so no number of concurrent calls can pass a
budget together. A call that does not fit parks its run (holding no slot) in the agent's
queue; when budget frees up, only as many parked runs as fit are woken, first parked first.
An agent whose spec says `[budget] shared = NAME` is also held to that shared budget, which
every agent naming it spends from (its limits stored, set by `perdure budget --shared NAME`):
the reservation is taken against the run, the agent's windows and the shared ones at once.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from ..errors import PerdureError
from ..store.base import FINISHED
from .budget_sql import Budget, Budgets, Limit, SharedBudget
from .messages import Message, ModelRequest
from .sentences import WIDE
from .spec import AgentSpec, BudgetSpec, Limits

if TYPE_CHECKING:
    from ..engine.runtime import Runtime

log = logging.getLogger("perdure.agent")

BUDGET_EVENT = "perdure.budget"  # sent to a parked run when its call may now fit
LIMITS = ("tokens_per_hour", "tokens_per_day", "cost_per_hour", "cost_per_day")
WINDOWS = (("this hour", 3600.0, "tokens_per_hour", "cost_per_hour"),
           ("this day", 86400.0, "tokens_per_day", "cost_per_day"))  # fmt: skip
CHARS_PER_TOKEN = 3.3  # of text in Latin script (real tokenizers do ~4: this errs high)
PER_MESSAGE = 8  # tokens a message's framing takes beyond its text


class BudgetRefused(PerdureError):
    """Raised when a model call's worst case does not fit an agent budget window: the run
    parks until budget frees up, at most `wait` seconds (when the window will have room)."""

    def __init__(self, message: str, wait: float) -> None:
        super().__init__(message)
        self.wait = wait


class UnknownAgent(PerdureError):
    """Raised when a budget is read or changed for an agent no worker has served."""


class RunLimitReached(PerdureError):
    """Raised in a model step when the call cannot fit the run's own token or cost limit."""


@dataclass(frozen=True)
class InForce:
    """The budget in force for an agent and where each limit comes from."""

    budget: Budget
    sources: dict[str, str]  # limit -> "spec", "stored" or "none"

    def to_dict(self) -> dict[str, Any]:
        return {k: {"limit": getattr(self.budget, k), "from": self.sources[k]} for k in LIMITS}


def in_force(agent: str, spec: BudgetSpec | None, stored: Budget | None) -> InForce:
    """Each limit from the stored budget where it sets one, else from the spec."""
    budget, sources = Budget(agent), {}
    for name in LIMITS:
        mine = getattr(stored, name) if stored is not None else None
        theirs = getattr(spec, name) if spec is not None else None
        value = mine if mine is not None else theirs
        setattr(budget, name, value)
        sources[name] = "stored" if mine is not None else "spec" if theirs is not None else "none"
    return InForce(budget, sources)


def window_limits(budget: Budget) -> list[Limit]:
    """The agent's hour and day windows that set a limit."""
    found = []
    for what, seconds, tokens, cost in WINDOWS:
        token_limit, cost_limit = getattr(budget, tokens), getattr(budget, cost)
        if token_limit is not None or cost_limit is not None:
            found.append(Limit(what, seconds, token_limit, cost_limit))
    return found


def shared_limits(shared: SharedBudget | None) -> list[Limit]:
    """The shared budget's hour and day windows that set a limit (none if it has none)."""
    if shared is None:
        return []
    found = []
    for what, seconds, tokens, cost in WINDOWS:
        token_limit, cost_limit = getattr(shared, tokens), getattr(shared, cost)
        if token_limit is not None or cost_limit is not None:
            label = f"shared {shared.name!r} {what}"
            found.append(Limit(label, seconds, token_limit, cost_limit, pool=shared.name))
    return found


def run_limit(limits: Limits) -> list[Limit]:
    if limits.max_tokens is None and limits.max_cost is None:
        return []
    return [Limit("run limit", None, limits.max_tokens, limits.max_cost)]


def estimate_tokens(text: str) -> float:
    """The tokens `text` takes, estimated high: a CJK character or a digit each (the
    tokenizers of Qwen and Llama 2 split numbers into digits), CHARS_PER_TOKEN of the rest.
    The one estimate behind every reservation, the cut of a task's file and compaction."""
    single = sum(1 for ch in text if ch.isdigit() or ord(ch) >= WIDE)
    return single + (len(text) - single) / CHARS_PER_TOKEN


def messages_tokens(messages: list[Message]) -> int:
    """The tokens of `messages`, estimated high: their text, tool calls and framing."""
    total = sum(
        estimate_tokens(m.content)
        + sum(estimate_tokens(json.dumps(c.arguments) + c.name) for c in m.tool_calls)
        for m in messages
    )
    return int(total) + 1 + PER_MESSAGE * len(messages)


def prompt_tokens(request: ModelRequest) -> int:
    """The prompt's tokens, estimated high: its messages and the tools it offers."""
    tools = sum(estimate_tokens(json.dumps(t.__dict__, default=str)) for t in request.tools)
    return messages_tokens(request.messages) + int(tools)


async def declare(runtime: Runtime, spec: AgentSpec) -> None:
    """Record in the store that this agent is served, with its spec's budget, so the budget
    command can tell a known agent and show where each limit comes from."""
    text = json.dumps(spec.budget.model_dump())
    await runtime.open_store()
    await Budgets(runtime.store).declare_agent(spec.name, text, runtime.clock.now())


async def declared(runtime: Runtime, agent: str) -> BudgetSpec | None:
    """The spec budget a worker serving `agent` declared (PerdureError if none ever did)."""
    text = await Budgets(runtime.store).declared_agent(agent)
    if text is None:
        raise UnknownAgent(
            f"no agent named {agent!r} (an agent is known once a worker serves it: "
            "perdure agent SPEC)"
        )
    return BudgetSpec(**json.loads(text))


async def current(runtime: Runtime, agent: str) -> InForce:
    """The budget in force for a known agent (PerdureError for an unknown one)."""
    spec = await declared(runtime, agent)
    return in_force(agent, spec, await Budgets(runtime.store).get_budget(agent))


async def headroom(
    runtime: Runtime, budget: Budget, shared: SharedBudget | None = None
) -> tuple[float, float]:
    """Tokens and cost still free in the tightest window, the agent's or the shared budget's
    (inf: no limit)."""
    tokens_left, cost_left = float("inf"), float("inf")
    now = runtime.clock.now()
    for limit in [*window_limits(budget), *shared_limits(shared)]:
        assert limit.window is not None
        since = now - limit.window
        if limit.pool is not None:
            used_tokens, used_cost = await Budgets(runtime.store).pool_spent(limit.pool, since)
        else:
            used_tokens, used_cost = await Budgets(runtime.store).spent(budget.agent, since)
        if limit.tokens is not None:
            tokens_left = min(tokens_left, limit.tokens - used_tokens)
        if limit.cost is not None:
            cost_left = min(cost_left, limit.cost - used_cost)
    return tokens_left, cost_left


async def wake(runtime: Runtime, agent: str, spec: BudgetSpec | None) -> int:
    """Wake, first parked first, as many of the agent's parked runs as fit what is free;
    returns how many. A woken run keeps its place until its reservation is made, so one
    that no longer fits (another took the room) waits on first in line: waking is only a
    hint, the reservation decides."""
    from ..engine.client import Client

    parked = await Budgets(runtime.store).budget_parked(agent)
    if not parked:
        return 0
    force = in_force(agent, spec, await Budgets(runtime.store).get_budget(agent))
    shared = None
    if spec is not None and spec.shared is not None:
        shared = await Budgets(runtime.store).get_shared_budget(spec.shared)
    tokens_left, cost_left = await headroom(runtime, force.budget, shared)
    woken = 0
    for run_id, tokens, cost in parked:
        run = await runtime.store.get_run(run_id)
        if run is None or run.status in FINISHED:  # ended while parked: it waits no more
            await Budgets(runtime.store).budget_unpark(run_id)
            continue
        if tokens > tokens_left or cost > cost_left + 1e-12:
            break
        tokens_left, cost_left = tokens_left - tokens, cost_left - cost
        try:  # it keeps its place in the queue until its reservation is made
            await Client(runtime).send_event(run_id, BUDGET_EVENT, None)
        except PerdureError:  # the run is gone (cancelled, deleted): it waits no more
            await Budgets(runtime.store).budget_unpark(run_id)
            continue
        woken += 1
    return woken


async def freed(runtime: Runtime, agent: str, spec: BudgetSpec) -> int:
    """Budget was freed by a call of `agent`: wake its parked runs that now fit, and those of
    the agents sharing its shared budget, if it has one. Returns how many were woken."""
    woken = await wake(runtime, agent, spec)
    if spec.shared is not None:
        for other, their in await members(runtime, spec.shared):
            if other != agent:
                woken += await wake(runtime, other, their)
    return woken


async def members(runtime: Runtime, shared: str) -> list[tuple[str, BudgetSpec]]:
    """The agents whose declared spec shares `shared`, with their spec budgets."""
    found = []
    for agent, text in await Budgets(runtime.store).declared_agents():
        spec = BudgetSpec(**json.loads(text))
        if spec.shared == shared:
            found.append((agent, spec))
    return found


async def known_shared(runtime: Runtime, name: str) -> list[tuple[str, BudgetSpec]]:
    """The agents sharing `name`; UnknownAgent (one line) if neither any agent's spec names
    it nor limits were stored for it."""
    sharing = await members(runtime, name)
    if not sharing and await Budgets(runtime.store).get_shared_budget(name) is None:
        raise UnknownAgent(
            f"no shared budget named {name!r} (one is known once an agent's spec names it, "
            f'[budget] shared = "{name}", and a worker serves that agent)'
        )
    return sharing


async def set_shared(runtime: Runtime, name: str, shared: SharedBudget | None) -> int:
    """Store a shared budget's limits (None: forget them) and wake the parked runs of its
    agents that now fit; returns how many."""
    sharing = await known_shared(runtime, name)
    if shared is None:
        await Budgets(runtime.store).clear_shared_budget(name)
    else:
        await Budgets(runtime.store).put_shared_budget(shared, runtime.clock.now())
    woken = 0
    for agent, spec in sharing:
        woken += await wake(runtime, agent, spec)
    return woken


def merged_shared(name: str, stored: SharedBudget | None, changes: dict[str, Any]) -> SharedBudget:
    """The stored shared budget with only the limits in `changes` replaced (None: unchanged)."""
    base = merged(name, Budget(name, **{k: getattr(stored, k) for k in LIMITS}) if stored
                  else None, changes)  # fmt: skip
    return SharedBudget(name, **{k: getattr(base, k) for k in LIMITS})


async def describe_shared(runtime: Runtime, name: str) -> dict[str, Any]:
    """What `perdure budget --shared NAME` shows: its limits, what its agents spent (held
    reservations counted) this hour and day, the agents sharing it and how many of their
    runs are parked for budget. UnknownAgent for a shared budget nobody names."""
    await runtime.open_store()
    sharing = await known_shared(runtime, name)
    stored = await Budgets(runtime.store).get_shared_budget(name)
    now = runtime.clock.now()
    spent = {}
    for window, seconds in (("hour", 3600.0), ("day", 86400.0)):
        tokens, cost = await Budgets(runtime.store).pool_spent(name, now - seconds)
        spent[window] = {"tokens": tokens, "cost": cost}
    parked = 0
    for agent, _ in sharing:
        parked += len(await Budgets(runtime.store).budget_parked(agent))
    limits = {k: (getattr(stored, k) if stored is not None else None) for k in LIMITS}
    return {"shared": name, "limits": limits, "spent": spent,
            "agents": [agent for agent, _ in sharing], "parked": parked}  # fmt: skip


def merged(agent: str, stored: Budget | None, changes: dict[str, Any]) -> Budget:
    """The stored budget with only the limits in `changes` replaced (None: unchanged)."""
    base = stored or Budget(agent)
    out = Budget(agent, **{f.name: getattr(base, f.name) for f in fields(Budget)
                            if f.name != "agent"})  # fmt: skip
    for name, value in changes.items():
        if name not in LIMITS:
            raise PerdureError(f"budget: no limit named {name!r} (limits: {', '.join(LIMITS)})")
        if value is not None:
            setattr(out, name, value)
    return out


async def set_budget(runtime: Runtime, agent: str, budget: Budget | None) -> int:
    """Store a budget (None: forget the stored one, the spec's is in force again) and wake
    the parked runs that now fit; returns how many (the operations refuse unknown agents)."""
    text = await Budgets(runtime.store).declared_agent(agent)
    spec = BudgetSpec(**json.loads(text)) if text is not None else None
    if budget is None:
        await Budgets(runtime.store).clear_budget(agent)
    else:
        await Budgets(runtime.store).put_budget(budget, runtime.clock.now())
    queued = {run_id for run_id, _, _ in await Budgets(runtime.store).budget_parked(agent)}
    return await wake(runtime, agent, spec) + await _wake_legacy(runtime, agent, queued)


async def _wake_legacy(runtime: Runtime, agent: str, queued: set[str]) -> int:
    """Runs started before reservations wait for BUDGET_EVENT outside the queue: each is
    woken to check again, as before."""
    from ..engine.client import Client

    waiting = await runtime.store.list_runs(
        statuses=["waiting"], workflow=f"agent:{agent}", limit=10**4
    )
    woken = 0
    for run in waiting:
        if run.waiting_for == f"event:{BUDGET_EVENT}" and run.id not in queued:
            await Client(runtime).send_event(run.id, BUDGET_EVENT, None)
            woken += 1
    return woken


async def describe(runtime: Runtime, agent: str) -> dict[str, Any]:
    """What `perdure budget AGENT` and GET budgets/{agent} show: each limit in force and
    where it comes from, what was spent (held reservations counted) this hour and day, and
    how many runs are parked for budget. PerdureError for an unknown agent."""
    await runtime.open_store()
    spec = await declared(runtime, agent)
    force = in_force(agent, spec, await Budgets(runtime.store).get_budget(agent))
    stored = await Budgets(runtime.store).get_budget(agent)
    now = runtime.clock.now()
    spent = {}
    for window, seconds in (("hour", 3600.0), ("day", 86400.0)):
        tokens, cost = await Budgets(runtime.store).spent(agent, now - seconds)
        spent[window] = {"tokens": tokens, "cost": cost}
    limits = None
    if stored is not None:
        limits = {k: getattr(stored, k) for k in LIMITS}
    return {"agent": agent, "budget": limits, "in_force": force.to_dict(), "spent": spent,
            "parked": len(await Budgets(runtime.store).budget_parked(agent)),
            "shared": spec.shared if spec is not None else None}  # fmt: skip
