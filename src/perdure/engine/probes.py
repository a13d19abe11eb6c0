"""Probes: the read-only question a `once` step's recovery asks the world before a person.

A step declared with `probe=` (DESIGN.md, "Effects") is not parked at once when recovery
finds it cut off between intent and outcome. Its probe is called with the step's own
arguments, inside the interrupted attempt's step context (`current_step()` gives its run,
position and `idempotency_key`), and answers with a `ProbeAnswer`:

- `done(value)`: the effect happened; `value` (what the step would have returned) becomes
  the step's outcome and the run goes on;
- `not_done()`: it did not; the step runs again (still `once`: cut off again, the probe is
  asked again);
- `cannot_tell(reason)`: the world cannot say; the run waits for a person
  (`needs_attention`) with the reason;
- `not_asked()`: this call has no question to ask (a probe that serves many calls, such
  as the one tool step per effect of agent runs journaled before each tool had its own
  step, and whose tool declares none): the run parks as a step without a probe does, and
  nothing is journaled of the probe.

A probe that raises, outlasts its timeout or returns anything else counts as "cannot
tell", with one line saying what it did. The answer is journaled (`step.probed`) before
anything is done with it, so a replay never asks twice.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ..errors import ConfigError
from .codec import from_json, to_json
from .context import to_loop

if TYPE_CHECKING:
    from .context import RunContext, StepInfo
    from .registry import StepDef

Verdict = Literal["done", "not_done", "cannot_tell", "not_asked"]
VERDICTS = ("done", "not_done", "cannot_tell", "not_asked")
DEFAULT_TIMEOUT = 30.0  # seconds a probe may take before its answer counts as "cannot tell"


@dataclass(frozen=True, slots=True)
class ProbeAnswer:
    """What a probe found: `done` (with the step's value), `not_done`, or `cannot_tell`.

    Build one with `ProbeAnswer.done(value)`, `ProbeAnswer.not_done()` or
    `ProbeAnswer.cannot_tell(reason)`.
    """

    verdict: Verdict
    value: Any = None
    reason: str = ""

    @classmethod
    def done(cls, value: Any = None, reason: str = "") -> ProbeAnswer:
        """The effect happened; `value` is what the step would have returned."""
        return cls("done", value, reason)

    @classmethod
    def not_done(cls, reason: str = "") -> ProbeAnswer:
        """The effect did not happen: the step may run again."""
        return cls("not_done", None, reason)

    @classmethod
    def cannot_tell(cls, reason: str) -> ProbeAnswer:
        """The world cannot say (e.g. the payment provider is down): a person decides."""
        return cls("cannot_tell", None, reason)

    @classmethod
    def not_asked(cls) -> ProbeAnswer:
        """Nothing to ask for this call: recovery goes on as if the step had no probe."""
        return cls("not_asked")


@dataclass(frozen=True, slots=True)
class Probe:
    """A step's probe as registered: the function and how long it may take."""

    fn: Callable[..., Any]
    timeout: float
    name: str

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)


def probe_of(step: str, effect: str, probe: Any, timeout: float | None) -> Probe | None:
    """The probe a step declares, checked: only a `once` step has one, and a probe that is
    itself a registered step must be declared `read` (a probe changes nothing)."""
    if probe is None:
        if timeout is not None:
            raise ConfigError(f"step {step!r}: probe_timeout= without a probe=")
        return None
    if effect != "once":
        raise ConfigError(
            f"step {step!r}: probe= is for once steps; a {effect} step is simply run again "
            "by recovery"
        )
    definition = getattr(probe, "definition", None)  # a registered Step
    if definition is not None:
        if definition.effect != "read":
            raise ConfigError(
                f"step {step!r}: its probe {definition.name!r} is declared {definition.effect!r};"
                " a probe only reads: declare it effect='read'"
            )
        fn, name = definition.fn, definition.name
    elif callable(probe):
        fn, name = probe, getattr(probe, "__qualname__", repr(probe))
    else:
        raise ConfigError(f"step {step!r}: probe={probe!r} is not a function")
    if timeout is not None and timeout <= 0:
        raise ConfigError(f"step {step!r}: probe_timeout must be more than 0")
    return Probe(fn, DEFAULT_TIMEOUT if timeout is None else float(timeout), name)


async def ask(
    ctx: RunContext,
    step: StepDef,
    info: StepInfo,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    info_var: contextvars.ContextVar[StepInfo | None],
) -> dict[str, Any]:
    """Call the step's probe for the interrupted attempt `info`; its answer as the journal
    keeps it: `{"answer", "value"?, "reason"?, "probe", "ms"}` (a probe that fails, hangs or
    answers wrongly is "cannot_tell", the reason saying so; a done value that does not fit
    the step's return type too)."""
    probe = step.probe
    assert probe is not None
    await to_loop()  # from a sync workflow's thread: the loop times the probe
    started = time.monotonic()
    try:
        answer = await asyncio.wait_for(_call(ctx, probe, info, args, kwargs, info_var),
                                        probe.timeout)  # fmt: skip
        record = _record(step, probe, answer)
    except TimeoutError:
        record = _cannot(probe, f"no answer within {probe.timeout:g}s")
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        record = _cannot(probe, f"raised {type(exc).__name__}: {first}")
    record["ms"] = round((time.monotonic() - started) * 1000, 3)
    return record


async def _call(
    ctx: RunContext,
    probe: Probe,
    info: StepInfo,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    info_var: contextvars.ContextVar[StepInfo | None],
) -> Any:
    """The probe's answer: an async probe awaited, a sync one on the step pool."""
    token = info_var.set(info)
    try:
        if probe.is_async:
            return await probe.fn(*args, **kwargs)
        context = contextvars.copy_context()
        return await ctx.loop.run_in_executor(
            ctx.runtime.step_executor, functools.partial(context.run, probe.fn, *args, **kwargs)
        )
    finally:
        info_var.reset(token)


def _record(step: StepDef, probe: Probe, answer: Any) -> dict[str, Any]:
    if not isinstance(answer, ProbeAnswer) or answer.verdict not in VERDICTS:
        return _cannot(
            probe,
            f"returned {type(answer).__name__}, not a ProbeAnswer (return "
            "ProbeAnswer.done(value), .not_done() or .cannot_tell(reason))",
        )
    record: dict[str, Any] = {"answer": answer.verdict, "probe": probe.name}
    if answer.reason:
        record["reason"] = answer.reason
    if answer.verdict == "done":
        try:
            value = to_json(answer.value, f"{step.where} value from probe {probe.name!r}")
            from_json(value, step.return_hint, f"{step.where} value from probe {probe.name!r}")
        except Exception as exc:
            return _cannot(probe, f"said done with a value that does not fit: {exc}")
        record["value"] = value
    return record


def _cannot(probe: Probe, reason: str) -> dict[str, Any]:
    return {"answer": "cannot_tell", "probe": probe.name, "reason": reason}


def said(record: dict[str, Any]) -> str:
    """The probe's answer in a phrase, for a reason or `explain`."""
    answer = record.get("answer", "cannot_tell")
    text = {"done": "done", "not_done": "not done", "cannot_tell": "cannot tell"}.get(
        str(answer), str(answer)
    )
    reason = record.get("reason")
    return f"probe {record.get('probe', '?')}: {text}" + (f" ({reason})" if reason else "")
