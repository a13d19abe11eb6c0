"""What recovery asks before parking an agent's interrupted `once` tool call.

Each tool is its own step (`agent:NAME.tool.TOOL`, agent/loop.py), so each `once` tool
that its spec's `[tools.effects]` (agent/spec.py, `ToolEffectSpec`) gives a question has its
own probe, named after that question:

- `probe = "find_refund"`: the read tool `find_refund` is called with the call's arguments
  (those it declares); a result that is JSON `{"done": true, "value": V}` means done (the
  model is told the call returned V: a string as it is, anything else as JSON), `{"done":
  false}` not done (the call runs again), anything else, a refusal or an error cannot tell;
- `probe = "module:function"`: the function is called with the call's arguments and returns
  a `perdure.ProbeAnswer` (a done value that is not a string is given to the model as JSON);
- `on_interrupt = "tell_model"`: the call is settled with a tool result telling the model it
  was cut off and its outcome is unknown (`INTERRUPTED`), journaled as the probe `tell_model`
  answering done with the reason `outcome unknown`: the run goes on, and the model may call
  the tool again (it is told to check first);
- a tool with neither has no probe: its cut call parks the run.

Runs journaled before tool steps were named after their tool share one step per effect
(`agent:NAME.tool.once`); that step's probe (`tools.effects`) asks, for the interrupted
call's tool, the same question, and answers `not_asked` for a tool with none.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from ..engine.probes import DEFAULT_TIMEOUT, ProbeAnswer
from ..errors import ConfigError
from .messages import ToolCall
from .spec import AgentSpec, ToolEffectSpec, probe_function
from .tools.registry import ERROR, REFUSED, Refusal, Toolbox, render

TELL_MODEL = "tell_model"  # the probe name a told interruption is journaled under
SHARED = "tools.effects"  # the probe of the per-effect tool step of older runs
INTERRUPTED = (
    "interrupted: this call of {tool} was cut off (the worker running it stopped) and its "
    "outcome is unknown: it may or may not have taken effect. Check with a read tool before "
    "calling {tool} again."
)

Asker = Callable[[dict[str, Any]], Awaitable[Any]]


class ToolProbes:
    """The probes of an agent's `once` tool steps, built from its spec's `[tools.effects]`."""

    def __init__(self, spec: AgentSpec, toolbox: Toolbox) -> None:
        self.toolbox = toolbox
        self.entries: dict[str, ToolEffectSpec] = {
            name: entry for name, entry in spec.tools.effects.items() if entry.asks
        }
        self.functions: dict[str, Callable[..., Any]] = {}
        for name, entry in self.entries.items():
            if entry.probe is not None and ":" in entry.probe:
                where = f"{spec.file or spec.name}: tools.effects.{name}"

                def fail(message: str, where: str = where) -> ConfigError:
                    return ConfigError(f"{where}: {message}")

                self.functions[name] = probe_function(spec, entry.probe, fail)

    def probe(self, tool: str) -> tuple[Asker, float] | None:
        """The probe of `tool`'s step and the timeout the engine gives it, or None if the
        spec asks nothing for it. The probe is named after its question (`find_refund`,
        `module:function`, `tell_model`), the name its journaled answer carries."""
        entry = self.entries.get(tool)
        if entry is None:
            return None

        async def ask(call: dict[str, Any]) -> Any:
            return await self._ask(tool, entry, call)

        named = TELL_MODEL if entry.on_interrupt == "tell_model" else str(entry.probe)
        ask.__qualname__ = ask.__name__ = named
        return ask, 1.0 + _timeout(entry)  # past its own: its own reason names the probe

    def shared(self) -> tuple[Asker, float]:
        """The probe of older runs' shared `once` tool step, journaled as `tools.effects`:
        for the interrupted call's tool, that tool's question (`not_asked` if none)."""

        async def ask(call: dict[str, Any]) -> Any:
            name = str(call.get("name", ""))
            entry = self.entries.get(name)
            if entry is None:
                return ProbeAnswer.not_asked()
            return await self._ask(name, entry, call)

        ask.__qualname__ = ask.__name__ = SHARED
        longest = max((_timeout(e) for e in self.entries.values()), default=DEFAULT_TIMEOUT)
        return ask, 1.0 + longest

    def __bool__(self) -> bool:
        return bool(self.entries)

    async def _ask(self, name: str, entry: ToolEffectSpec, call: dict[str, Any]) -> Any:
        """The answer for the interrupted call `call` of `name` (the tool step's own
        argument): a ProbeAnswer, or what a `module:function` probe returned (checked by
        the engine)."""
        arguments = call.get("arguments") or {}
        if entry.on_interrupt == "tell_model":
            text = INTERRUPTED.format(tool=name)
            return ProbeAnswer.done(text, f"{TELL_MODEL}: outcome unknown, the model was told")
        assert entry.probe is not None
        if name in self.functions:
            asking = self._function(entry.probe, self.functions[name], arguments)
        else:
            asking = self._tool(entry.probe, str(call.get("id", "")), arguments)
        timeout = _timeout(entry)
        try:
            return await asyncio.wait_for(asking, timeout)
        except TimeoutError:
            return ProbeAnswer.cannot_tell(f"{entry.probe}: no answer within {timeout:g}s")

    async def _function(
        self, probe: str, fn: Callable[..., Any], arguments: Mapping[str, Any]
    ) -> Any:
        if inspect.iscoroutinefunction(fn):
            found = await fn(**arguments)
        else:  # on a thread, as a sync tool runs: the loop keeps heartbeating
            found = await asyncio.to_thread(fn, **arguments)
            if inspect.isawaitable(found):
                found = await found
        if not isinstance(found, ProbeAnswer) or found.verdict == "not_asked":
            return found  # checked, and counted as cannot tell, by the engine
        reason = f"{probe}" + (f": {found.reason}" if found.reason else "")
        if found.verdict == "done":
            return ProbeAnswer.done(render(found.value), reason)
        return ProbeAnswer(found.verdict, None, reason)

    async def _tool(self, probe: str, call_id: str, arguments: Mapping[str, Any]) -> ProbeAnswer:
        """Ask the read tool `probe` with the arguments it declares; its result as an answer."""
        found = self.toolbox.tools.get(probe)
        properties = found.spec().parameters.get("properties") if found is not None else None
        if isinstance(properties, Mapping):
            arguments = {k: v for k, v in arguments.items() if k in properties}
        prepared = self.toolbox.prepare(ToolCall(f"{call_id}:probe", probe, dict(arguments)))
        if isinstance(prepared, Refusal):
            return ProbeAnswer.cannot_tell(f"{probe}: {prepared.text}")
        if prepared.effect != "read":
            return ProbeAnswer.cannot_tell(f"{probe} is {prepared.effect}; a probe only reads")
        text = await self.toolbox.execute(prepared, self.toolbox.context(f"{call_id}:probe"))
        return answer_of(probe, text)


def answer_of(probe: str, text: str) -> ProbeAnswer:
    """A probe tool's result as an answer: `{"done": true, "value": V}` done (V as the text
    the model reads), `{"done": false}` not done, anything else cannot tell."""
    if text.startswith((REFUSED, ERROR)):
        return ProbeAnswer.cannot_tell(f"{probe} answered {text[:200]}")
    try:
        found = json.loads(text)
    except ValueError:
        found = None
    if isinstance(found, dict) and found.get("done") is True:
        return ProbeAnswer.done(render(found.get("value")), f"{probe} found it")
    if isinstance(found, dict) and found.get("done") is False:
        return ProbeAnswer.not_done(f"{probe} found nothing")
    shown = " ".join(text.split())[:200]
    return ProbeAnswer.cannot_tell(
        f'{probe} answered {shown!r}, not {{"done": true, "value": ...}} or {{"done": false}}'
    )


def _timeout(entry: ToolEffectSpec) -> float:
    return entry.probe_timeout or DEFAULT_TIMEOUT
