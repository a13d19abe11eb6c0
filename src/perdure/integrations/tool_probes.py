"""A framework tool's probe as its step's probe: asked with the tool call's own arguments.

A tool step of an integration takes the framework's invoker (and bookkeeping) as its
arguments, not the tool's; the probe a user declares for the tool (`tool_effect("once",
probe=find_refund)`, `perdure_tool(effect="once", probe=...)`) is written against the
tool's arguments, as the model gave them. `step_probe` adapts one to the other:

    async def find_refund(order: str, amount: float) -> ProbeAnswer:
        found = await payments.refunds(order=order)
        return ProbeAnswer.done(found[0]) if found else ProbeAnswer.not_done()

The probe runs inside the interrupted call's step context (`perdure.current_step()` gives
its run id and `idempotency_key`), may be sync or async, and must be read-only (a
registered perdure step used as a probe must be declared `read`). Its `done` value is what
the tool would have returned; `shape` turns it into what the step journals.

`probe="tell_model"` instead (opt-in, for a tool with no look-up whose agent has read
tools) settles a cut-off call with a tool result telling the model the call was cut off and
its outcome is unknown, so it can check before calling again; it may also call again.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from ..agent.tool_probes import INTERRUPTED, TELL_MODEL
from ..engine.probes import ProbeAnswer, probe_of

# the tool call's arguments, from the step's own (args, kwargs)
Pick = Callable[[tuple[Any, ...], dict[str, Any]], Mapping[str, Any]]
Shape = Callable[[Any], Any]


def step_probe(
    step: str,
    probe: Callable[..., Any] | str,
    pick: Pick,
    shape: Shape | None = None,
    *,
    tool: str | None = None,
) -> Any:
    """The probe of the tool step `step`: `probe` called with the tool call's arguments
    (`pick` finds them among the step's), its `done` value passed through `shape`; or, for
    `probe="tell_model"`, one that settles the cut-off call with a tool result telling the
    model its outcome is unknown (agent/tool_probes.py, `INTERRUPTED`; opt-in: the model
    may call the tool again). `tool`: the tool's name the model is told (default: the step
    name's last dotted part).

    Raises:
        ConfigError: `probe` is not a function nor "tell_model", or is a perdure step not
            declared `read`.
    """
    if probe == TELL_MODEL:
        name = tool or step.rsplit(".", 1)[-1]

        def told(*args: Any, **kwargs: Any) -> ProbeAnswer:
            text = INTERRUPTED.format(tool=name)
            value = shape(text) if shape is not None else text
            return ProbeAnswer.done(value, f"{TELL_MODEL}: outcome unknown, the model was told")

        told.__qualname__ = told.__name__ = TELL_MODEL
        return told
    checked = probe_of(step, "once", probe, None)
    assert checked is not None
    fn = checked.fn

    def answer(found: Any) -> Any:
        if shape is not None and isinstance(found, ProbeAnswer) and found.verdict == "done":
            return ProbeAnswer.done(shape(found.value), found.reason)
        return found

    if inspect.iscoroutinefunction(fn):

        async def asked(*args: Any, **kwargs: Any) -> Any:
            return answer(await fn(**dict(pick(args, kwargs))))

    else:

        def asked(*args: Any, **kwargs: Any) -> Any:  # type: ignore[misc]
            return answer(fn(**dict(pick(args, kwargs))))

    asked.__qualname__ = asked.__name__ = checked.name  # journaled as the user's probe
    return asked
