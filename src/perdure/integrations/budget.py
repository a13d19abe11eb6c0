"""Budgets for framework agents: each model call's worst case is reserved before it is sent,
through the agent layer's reservations (agent/budgets.py), and a call that does not fit parks
the run until budget frees up (`perdure budget AGENT ...` or the window rolling by).

The reservation is made inside the model step; a refusal is that step's journaled outcome,
so the workflow-side `call_within_budget` waits (durably, holding no slot) for the budget
event and asks again at the next position. The run's own limits (`max_tokens`, `max_cost`)
fail the run in one line instead: waiting would not make room.
"""

from __future__ import annotations

import contextlib
import json
import logging
import weakref
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from ..agent import budgets
from ..agent.budget_sql import Budgets, Reservation, UsageRow
from ..agent.budgets import BUDGET_EVENT, BudgetRefused, RunLimitReached
from ..agent.spec import BudgetSpec, Limits, Price
from ..engine import durable
from ..engine.steps import current_step
from ..errors import ConfigError, WaitTimeout

if TYPE_CHECKING:
    from ..engine.runtime import Runtime

__all__ = ["ModelBudget", "call_within_budget"]

log = logging.getLogger("perdure.integrations")
CALL_TOKENS = 1024  # output tokens a call is reserved for when its settings name no max_tokens
WAIT_MAX = 3600.0  # seconds a parked run waits at most before asking again (woken sooner)


def _budget_spec(budget: BudgetSpec | Mapping[str, Any] | None, where: str) -> BudgetSpec:
    if budget is None or isinstance(budget, BudgetSpec):
        return budget or BudgetSpec()
    try:
        return BudgetSpec(**dict(budget))
    except (ValidationError, TypeError) as exc:
        first = exc.errors()[0] if isinstance(exc, ValidationError) else {"msg": str(exc)}
        field = ".".join(str(p) for p in first.get("loc", ())) or "budget"
        raise ConfigError(f"{where} budget: {field}: {first['msg']} (limits: "
                          f"{', '.join(budgets.LIMITS)})") from None  # fmt: skip


@dataclass
class ModelBudget:
    """What one framework agent's model calls are held to: its budget per rolling hour and
    day (a stored one, `perdure budget AGENT`, wins limit by limit), a run's own token and
    cost limits, and the price its calls are reserved and counted at."""

    agent: str
    spec: BudgetSpec
    max_tokens: int | None = None  # per run
    max_cost: float | None = None  # per run
    price: Price | None = None
    call_tokens: int = CALL_TOKENS

    @classmethod
    def of(
        cls,
        agent: str,
        budget: BudgetSpec | Mapping[str, Any] | None,
        *,
        max_tokens: int | None = None,
        max_cost: float | None = None,
        price: Price | Mapping[str, float] | None = None,
        where: str | None = None,
    ) -> ModelBudget:
        """Check the arguments a user gave (one line each, naming `where`, when wrong)."""
        where = where or f"agent {agent!r}"
        spec = _budget_spec(budget, where)
        try:
            Limits(max_tokens=max_tokens, max_cost=max_cost)
            cost = Price(**price) if isinstance(price, Mapping) else price
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first["loc"]) or exc.title
            raise ConfigError(f"{where}: {exc.title.lower()} {field}: {first['msg']}") from None
        except TypeError as exc:
            raise ConfigError(f"{where}: price: {exc}") from None
        return cls(agent, spec, max_tokens, max_cost, cost)

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        return self.price.cost(input_tokens, output_tokens) if self.price else 0.0

    async def reserve(
        self, runtime: Runtime, prompt: Any, max_output: int | None, model: str
    ) -> Reservation:
        """Hold the call's worst case (the prompt's JSON, estimated high, plus its output
        limit) against every budget, or raise BudgetRefused / RunLimitReached."""
        await _declare(runtime, self)
        info = current_step()
        text = json.dumps(prompt, default=str)
        prompt_tokens = int(budgets.estimate_tokens(text)) + 1
        out = max_output or self.call_tokens
        limits = budgets.run_limit(Limits(max_tokens=self.max_tokens, max_cost=self.max_cost))
        stored = await Budgets(runtime.store).get_budget(self.agent)
        force = budgets.in_force(self.agent, self.spec, stored)
        held = Reservation(
            info.run_id, info.position, 0, self.agent, "default", model, prompt_tokens + out,
            self.cost(prompt_tokens, out), "open", 0.0,
        )  # fmt: skip
        now = runtime.clock.now()
        refused = await Budgets(runtime.store).reserve(
            held, [*limits, *budgets.window_limits(force.budget)], now
        )
        if refused is None:
            return held
        if refused.limit.window is None:
            raise RunLimitReached(
                f"agent {self.agent!r}: "
                + refused.reason().replace("budget run limit", "run limit")
                + "; the run stops here"
            )
        if refused.free_at is None:
            why = f"{refused.reason()}: more than the whole budget; raise it (perdure budget)"
            raise BudgetRefused(why, WAIT_MAX)
        raise BudgetRefused(refused.reason(), min(WAIT_MAX, max(1.0, refused.free_at - now)))

    async def settle(
        self, runtime: Runtime, held: Reservation, model: str, tokens: tuple[int, int], cost: float
    ) -> None:
        """Replace the reservation by what the call used (recorded once per position, for
        `perdure usage`), waking parked runs if it used less than was held."""
        info = current_step()
        used_in, used_out = tokens
        row = UsageRow(info.run_id, info.position, self.agent, model, used_in, used_out, cost,
                       runtime.clock.now())  # fmt: skip
        await Budgets(runtime.store).settle(held, row if used_in + used_out > 0 else None)
        if 0 < used_in + used_out < held.tokens:
            await budgets.wake(runtime, self.agent, self.spec)

    async def release(self, runtime: Runtime, held: Reservation) -> None:
        """The call failed before it was paid: let its reservation go."""
        await Budgets(runtime.store).release_reservation(held, None)
        await budgets.wake(runtime, self.agent, self.spec)


_declared: weakref.WeakKeyDictionary[Runtime, set[tuple[str, str]]] = weakref.WeakKeyDictionary()


async def _declare(runtime: Runtime, budget: ModelBudget) -> None:
    """Record once per runtime that this agent is served, so `perdure budget AGENT` knows it."""
    text = json.dumps(budget.spec.model_dump())
    done = _declared.setdefault(runtime, set())
    if (budget.agent, text) not in done:
        await Budgets(runtime.store).declare_agent(budget.agent, text, runtime.clock.now())
        done.add((budget.agent, text))


async def call_within_budget(agent: str, call: Callable[[], Awaitable[Any]]) -> Any:
    """Workflow side: run the model step `call`; while its outcome is a refusal, wait for
    budget (durably, at most the refusal's wait) and call it again at the next position."""
    while True:
        outcome = await call()
        if not (isinstance(outcome, dict) and "refused" in outcome):
            return outcome
        log.info("agent %s: %s", agent, outcome["refused"])
        with contextlib.suppress(WaitTimeout):
            await durable.wait_event(BUDGET_EVENT, timeout=float(outcome["wait"]))


async def reserved(
    budget: ModelBudget,
    runtime: Runtime,
    prompt: Any,
    max_output: int | None,
    model: str,
) -> Reservation | dict[str, Any]:
    """Step side: the reservation, or the refusal the step returns as its outcome."""
    try:
        return await budget.reserve(runtime, prompt, max_output, model)
    except BudgetRefused as refused:
        return {"refused": str(refused), "wait": refused.wait}
