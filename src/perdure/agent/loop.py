"""The agent loop: an ordinary durable workflow whose model calls and tool calls are steps.

context -> model step (its worst case reserved against the budgets first) -> tool steps
-> completion check -> repeat. Steering messages an operator sent (`perdure steer`) are
taken, journaled, before each model call and join the transcript as user turns. A call
that does not fit an agent budget parks the run, holding no slot, until budget frees up
(agent/budgets.py).
A model call is a `keyed` step (its request fingerprint, response and usage are
journaled, so replay returns the recorded response and spends nothing); each
tool call is its tool's step (`agent:NAME.tool.TOOL`) with the tool's own effect, so
recovery follows that effect's rule (a `once` tool cut short is asked its probe, or
parks the run, never runs twice) and every view names the tool. A call
outside the boundary is refused by a recorded step and shown to the model as an
error. The run completes only when the acceptance check holds; hitting a limit
fails it with the last evidence. A model provider refusing its key (401/403, or no
key set) parks the run, paused with a one-line reason, until `perdure resume`
calls the model again: the key is the operator's to fix, and a failed run would
stay failed after the fix.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shlex
import subprocess
from collections import Counter
from dataclasses import dataclass
from datetime import UTC
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..engine import aborts, durable, observers
from ..engine.effects import Effect
from ..engine.retry import Retry
from ..engine.runtime import runtime_of
from ..engine.steps import current_step
from ..errors import ConfigError, InboxFileChanged, PerdureError, StepError, WaitTimeout
from ..triggers.inbox_files import open_inbox_file, started_for
from . import budgets
from .budget_sql import Budget, Budgets, Reservation, UsageRow
from .budgets import BUDGET_EVENT, BudgetRefused, RunLimitReached
from .facts import MAX_TOKENS as FACTS_MAX_TOKENS
from .facts import check_facts, facts_block, facts_section
from .facts import request_text as facts_request
from .grounding import CUT_OFF, TRIMMED
from .grounding import check as check_grounding
from .memory_sql import AgentMemory
from .messages import Message, ModelRequest, ModelResponse, ToolCall
from .providers.base import ModelAuthError, ModelError, ModelProvider, ModelRetryable
from .providers.registry import provider_class
from .sentences import whole
from .spec import AgentSpec, check_grants, deadline_seconds
from .tool_probes import ToolProbes
from .tools.base import Memory, Tool
from .tools.boundary import Boundary, read_no_links
from .tools.builtins import builtin_tools, gate_event
from .tools.registry import ERROR, REFUSED, PreparedCall, Refusal, Toolbox

TOOL_EFFECTS: tuple[Effect, ...] = ("once", "keyed", "idempotent", "read")

if TYPE_CHECKING:
    from ..engine.handles import Workflow
    from ..engine.runtime import HasRuntime, Runtime

log = logging.getLogger("perdure.agent")

BUDGET_RECHECK = 300.0  # seconds a run parked by the old budget check waits before checking
BUDGET_RECHECK_MAX = 3600.0  # seconds a parked run waits at most (woken sooner by a raise)
RESERVATIONS = "perdure.budget.reservations"  # patch marker: the run reserves per call
# patch marker: tool steps are named after the tool (and the run reserves per call)
TOOL_NAMES = "perdure.agent.tool_names"
COMPACT_AT = 0.75  # of the model's context: beyond this, older turns are summarised
KEEP_TURNS = 6  # recent messages kept verbatim when compacting
MAX_FILE_TOKENS = 4000  # of a task's file put in the transcript (less for a small context)
FRAMING = 64  # tokens of the request around the file: its name, rules, the goal at the end
NOTES_IN_CONTEXT = 5  # lines of progress notes put in the system prompt
NOTES_KEPT = 50  # lines of progress notes an agent keeps


class AgentFailed(PerdureError):
    """The agent stopped without meeting its acceptance: a limit, a loop guard, a failure."""


class StoreMemory:
    """Long-term memory of one agent in the store, written with the run that wrote it."""

    def __init__(self, runtime: Runtime, agent: str, run_id: str | None) -> None:
        self.runtime, self.agent, self.run_id = runtime, agent, run_id

    async def remember(self, text: str, tags: list[str]) -> str:
        memory = AgentMemory(self.runtime.store)
        found = await memory.recall(self.agent, text, 20)
        for row in found:  # idempotent: the same note again (e.g. after a crash) is not kept twice
            if row.text == text and row.tags == " ".join(tags):
                return str(row.id)
        now = self.runtime.clock.now()
        return str(await memory.remember(self.agent, text, " ".join(tags), self.run_id, now))

    async def recall(self, query: str, limit: int) -> list[dict[str, Any]]:
        rows = await AgentMemory(self.runtime.store).recall(self.agent, query, limit)
        return [{"text": r.text, "tags": r.tags, "run_id": r.run_id} for r in rows]


@dataclass
class _Steps:
    """The agent's durable steps, each registered on the App under the agent's name."""

    model: Any
    tools: dict[str, Any]  # by tool (TOOL.EFFECT for a call of another effect than its own)
    by_effect: dict[Effect, Any]  # the tool steps of runs journaled before TOOL_NAMES
    refuse: Any
    file: Any
    context: Any
    escalate: Any
    budget: Any
    accept: Any
    ground: Any
    output: Any
    notes: Any
    facts: Any = None


class Agent:
    """An agent spec made runnable on an App: its workflow `agent:{name}` and its steps.

    Args:
        providers: model providers by tier (default: built from the spec on first use).
        tools: extra tools (e.g. from MCP servers), offered only if the spec grants them.
    """

    def __init__(
        self,
        runtime: Runtime | HasRuntime,
        spec: AgentSpec,
        *,
        providers: dict[str, ModelProvider] | None = None,
        tools: list[Tool] | None = None,
    ) -> None:
        self.runtime = runtime_of(runtime)  # an App is taken too: it holds one
        self.spec = spec
        self.name = f"agent:{spec.name}"
        self.providers: dict[str, ModelProvider] = dict(providers or {})
        self._declared = False  # its spec's budget recorded in the store (at the first call)
        self._given = set(self.providers)  # kept as given; those made from the spec are remade
        # a misspelt grant is refused before anything is made or started, never silently ignored
        check_grants(spec, {t.name: t.effect for t in (*builtin_tools(), *(tools or []))})
        t = spec.tools
        for folder in t.write_paths:  # the agent's own output folders: created if missing
            spec.path(folder).mkdir(parents=True, exist_ok=True)
        self.boundary = Boundary(
            read_paths=[spec.path(p) for p in t.read_paths],
            write_paths=[spec.path(p) for p in t.write_paths],
            commands=t.commands,
            hosts=t.hosts,
            granted=[*t.grant, *(f"{m.name}__{g}" for m in t.mcp for g in m.grant)],
            approval_required=t.approval,
            workdir=spec.workdir(),  # where the spec's paths start: the model's too
        )
        extra = [*(tools or []), *self._mcp_tools()]
        declared = {n: e.effect for n, e in t.effects.items() if e.effect is not None}
        self.toolbox = Toolbox([*builtin_tools(), *extra], self.boundary, declared)
        self.tool_probes = ToolProbes(spec, self.toolbox)  # asked for interrupted once calls
        self.workflow = self._register()

    def _mcp_tools(self) -> list[Tool]:
        """The tools of the spec's MCP servers (listed now; each call opens its session)."""
        if not self.spec.tools.mcp:
            return []
        from .tools.mcp import McpServer, mcp_tools

        found: list[Tool] = []
        for server in self.spec.tools.mcp:
            mcp = McpServer(
                server.name, command=server.command, args=tuple(server.args), url=server.url,
                effect=server.effect, cwd=str(self.spec.folder),
            )  # fmt: skip
            found += self.runtime.sync(mcp_tools(mcp), f"MCP server {server.name!r}")
        return found

    # -- providers --------------------------------------------------------------------

    def provider(self, tier: str) -> ModelProvider:
        if tier not in self.providers:
            from .models import provider_for

            self.providers[tier] = provider_for(self.spec, tier)
        return self.providers[tier]

    def _auth_reason(self, tier: str, exc: ModelAuthError) -> str:
        """One line for a run parked by a refused or missing key: the tier, what failed, the
        variable to fix and the command that continues the run."""
        model = self.spec.tier(tier)
        what = f"model tier {tier!r} ({model.provider}:{model.model or model.script or '-'})"
        default = provider_class(model.provider).api_key_env
        var = model.api_key_env or default or "the spec's api_key_env"
        resume = f"`perdure resume {current_step().run_id}`"
        if exc.status == 403:
            return (f"{what}: permission denied ({exc.detail}); give the key in {var} access "
                    f"to this model, then {resume}")  # fmt: skip
        if exc.status is None:
            return f"{what}: no key in {exc.setting or var}; set it where the workers run, then {resume}"  # noqa: E501
        return (f"{what}: authentication failed ({exc.detail}); set {var} (the spec's "
                f"api_key_env) where the workers run, then {resume}")  # fmt: skip

    # -- steps and the workflow ---------------------------------------------------------

    def _register(self) -> Workflow[..., Any]:
        runtime, spec, name = self.runtime, self.spec, self.name
        model_retry = Retry(
            max_attempts=6, initial=1.0, max_delay=60.0, retry_on=(ModelRetryable,),
            no_retry_on=(ModelError, ModelAuthError),
        )  # fmt: skip

        # commit=True: a model call's answer is committed before any tool runs, so a crash
        # never buys the same turn twice (keyed alone would let recovery call again)
        @runtime.step(name=f"{name}.model", effect="keyed", retry=model_retry, commit=True)
        async def model_call(tier: str, request: dict[str, Any]) -> dict[str, Any]:
            req = ModelRequest.from_dict(request)
            try:
                held = await self._reserve(tier, req)  # or RunLimitReached: the run fails
            except BudgetRefused as refused:  # journaled as the answer: the run parks
                return {"refused": str(refused), "wait": refused.wait}
            try:
                response = await aborts.abortable(self.provider(tier).complete(req), "model call")
            except aborts.CallAborted as cut:  # pause --now: counted at its reservation
                await Budgets(runtime.store).release_reservation(
                    held, "aborted" if cut.sent else None
                )
                await budgets.freed(runtime, spec.name, spec.budget)
                estimate = {"tier": tier, "model": held.model, "tokens": held.tokens,
                            "cost": held.cost, "sent": cut.sent}  # fmt: skip
                what = (f"model call on tier {tier!r} (counted at its reservation: "
                        f"{held.tokens} tokens, cost {held.cost:.4f})" if cut.sent
                        else f"model call on tier {tier!r} (not sent)")  # fmt: skip
                raise cut.with_details(what, estimate=estimate) from None
            except ModelAuthError as exc:  # parks the run (ParkRun) until an operator resumes
                await Budgets(runtime.store).release_reservation(held, None)
                if tier not in self._given:  # the next attempt reads the key again
                    self.providers.pop(tier, None)
                raise ModelAuthError(
                    self._auth_reason(tier, exc), status=exc.status, setting=exc.setting,
                    detail=exc.detail,
                ) from exc  # fmt: skip
            except (ModelError, ModelRetryable) as exc:
                # an error answer was not paid; a reply never read (timeout) may have been
                paid = isinstance(exc, ModelRetryable) and str(exc).endswith("(timeout)")
                await Budgets(runtime.store).release_reservation(held, "unknown" if paid else None)
                await budgets.freed(runtime, spec.name, spec.budget)
                raise
            # cut off otherwise (cancelled, lease lost, crash): the reservation stays held,
            # counted at its estimate, and is marked outcome unknown when the call is retried
            info = current_step()
            tier_spec = spec.tier(tier)
            usage = response.usage
            cost = tier_spec.price.cost(usage.input_tokens, usage.output_tokens)
            row = UsageRow(
                info.run_id, info.position, spec.name, req.model or tier, usage.input_tokens,
                usage.output_tokens, cost, runtime.clock.now(), pool=held.pool,
            )  # fmt: skip
            await Budgets(runtime.store).settle(held, row if usage.total > 0 else None)
            if usage.total > held.tokens:
                log.warning("agent %s: a call used %d tokens, more than the %d reserved",
                            spec.name, usage.total, held.tokens)  # fmt: skip
            if usage.total > 0 and usage.total < held.tokens:
                await budgets.freed(runtime, spec.name, spec.budget)
            observers.emit("model_usage", spec.name, req.model or tier,
                           usage.input_tokens, usage.output_tokens, cost)  # fmt: skip
            return {**response.to_dict(), "fingerprint": req.fingerprint(), "cost": cost,
                    "reserved": held.tokens}  # fmt: skip

        # runs journaled before TOOL_NAMES call their tools through one step per effect
        shared = self.tool_probes.shared() if self.tool_probes else None
        by_effect = {
            e: self._tool_step(f"{name}.tool.{e}", e, shared if e == "once" else None)
            for e in TOOL_EFFECTS
        }
        tool_steps: dict[str, Any] = {}
        for tool in self.toolbox.tools.values():  # a step per tool a call may reach
            if self.toolbox.is_granted(tool.name) and not tool.gate:
                effect = self.toolbox.effects.get(tool.name) or tool.effect
                tool_steps[tool.name] = self._named_step(tool.name, effect, by_effect)

        @runtime.step(name=f"{name}.refuse", effect="read")
        def refuse(call: dict[str, Any], reason: str) -> str:
            return reason  # recorded: the journal shows what was refused and why

        @runtime.step(name=f"{name}.file", effect="read",
                  retry=Retry(no_retry_on=(AgentFailed,)))  # fmt: skip
        def read_task_file(path: str, limit: int = MAX_FILE_TOKENS) -> str:
            real = self.boundary.resolve_read(path)
            if not started_for(path):
                return task_text(real, limit, path)
            try:  # the file an inbox started the run for: the content it was started for
                with open_inbox_file() as dropped:
                    return task_text(real, limit, path, dropped.read())
            except InboxFileChanged as exc:
                raise AgentFailed(str(exc)) from None

        @runtime.step(name=f"{name}.context", effect="read")
        async def read_context(query: str) -> dict[str, Any]:
            memory = AgentMemory(runtime.store)
            notes = await memory.get_notes(spec.name)
            memories: list[str] = []
            if spec.memory.enabled:
                rows = await memory.recall(spec.name, query, spec.memory.recall_limit)
                memories = [r.text for r in rows]
            return {"notes": notes, "memories": memories}

        @runtime.step(name=f"{name}.budget", effect="read")
        async def check_budget() -> dict[str, Any]:  # runs started before reservations only
            return await self._budget_verdict()

        @runtime.step(name=f"{name}.escalate", effect="read")
        def escalate(from_tier: str, to_tier: str, reason: str) -> dict[str, str]:
            return {"from": from_tier, "to": to_tier, "reason": reason}  # shown by show/explain

        @runtime.step(name=f"{name}.accept", effect="read")
        async def accept(context: dict[str, Any]) -> dict[str, Any]:
            return await asyncio.to_thread(self._acceptance, context)

        @runtime.step(name=f"{name}.ground", effect="read")
        def ground(
            answer: str, source: str, stop_reason: str, foreign: list[str], extract: bool = False
        ) -> dict[str, Any]:
            acc = spec.acceptance
            return check_grounding(
                answer, source, stop_reason=stop_reason, min_chars=acc.min_chars,
                max_chars=acc.max_chars, foreign=foreign, extract=extract,
            ).to_dict()  # fmt: skip

        @runtime.step(name=f"{name}.facts", effect="read")
        def facts(answer: str, source: str) -> dict[str, Any]:
            return check_facts(answer, source)

        @runtime.step(name=f"{name}.output", effect="idempotent")
        def write_output(path: str, text: str) -> str:
            real = self.boundary.resolve_write(path)
            real.parent.mkdir(parents=True, exist_ok=True)
            real.write_text(text, encoding="utf-8")
            return str(real)

        @runtime.step(name=f"{name}.notes", effect="idempotent")
        async def write_notes(line: str) -> None:
            run_id = current_step().run_id
            notes = await AgentMemory(runtime.store).add_note(
                spec.name, line, run_id, runtime.clock.now(), NOTES_KEPT
            )
            if spec.workspace is not None:
                await asyncio.to_thread(self._commit_workspace, notes, run_id)

        self.steps = _Steps(
            model=model_call, tools=tool_steps, by_effect=by_effect, refuse=refuse,
            file=read_task_file, context=read_context, escalate=escalate, budget=check_budget,
            accept=accept, ground=ground, output=write_output, notes=write_notes, facts=facts,
        )  # fmt: skip

        @runtime.workflow(name=name, deadline=deadline_seconds(spec))
        async def agent_run(task: dict[str, Any] | str) -> dict[str, Any]:
            """One run of the agent; `task` is {"prompt": ..., "file": ...}, or a file path
            (from an inbox trigger)."""
            return await self._loop({"file": task} if isinstance(task, str) else task)

        return agent_run

    def _tool_step(self, step: str, effect: Effect, probe: tuple[Any, float] | None) -> Any:
        """The step `step` running a tool call with `effect` (and `probe`, with its timeout,
        asked when a `once` call was cut off)."""
        runtime, spec = self.runtime, self.spec
        ask, timeout = probe if probe is not None else (None, None)

        @runtime.step(name=step, effect=effect, probe=ask, probe_timeout=timeout)
        async def tool_call(call: dict[str, Any]) -> str:
            prepared = self.toolbox.prepare(ToolCall(**call))
            if isinstance(prepared, Refusal):
                return prepared.text
            memory: Memory | None = None
            if spec.memory.enabled:
                memory = StoreMemory(runtime, spec.name, current_step().run_id)
            running = self.toolbox.execute(prepared, self.toolbox.context(call["id"], memory))
            if prepared.tool.may_abort(prepared.effect):  # pause --now may cut it off
                return await aborts.abortable(running, f"tool {prepared.tool.name}")
            return await running

        return tool_call

    def _named_step(self, key: str, effect: Effect, by_effect: dict[Effect, Any]) -> Any:
        """The step `agent:NAME.tool.KEY` (KEY: a tool, or TOOL.EFFECT for its calls of
        another effect than its own), with the tool's probe if it is `once`."""
        if key in by_effect:  # a tool named like an effect: older runs' step of that name
            if key != effect:
                raise ConfigError(
                    f"agent {self.spec.name!r}: tool {key!r} is {effect}, but runs from before "
                    f"tool steps were named after their tool call their {key} tools through "
                    f"the step {self.name}.tool.{key}; rename the tool"
                )
            return by_effect[key]
        probe = self.tool_probes.probe(key.partition(".")[0]) if effect == "once" else None
        return self._tool_step(f"{self.name}.tool.{key}", effect, probe)

    def _step_of(self, prepared: PreparedCall) -> Any:
        """The step a prepared call runs as: its tool's, or (a call whose effect depends on
        its arguments, e.g. an HTTP GET) the tool's step for that effect, registered at its
        first call."""
        tool = prepared.tool.name
        own = self.toolbox.effects.get(tool) or prepared.tool.effect
        key = tool if prepared.effect == own else f"{tool}.{prepared.effect}"
        if key not in self.steps.tools:
            self.steps.tools[key] = self._named_step(key, prepared.effect, self.steps.by_effect)
        return self.steps.tools[key]

    # -- the loop ------------------------------------------------------------------------

    async def _loop(self, task: dict[str, Any]) -> dict[str, Any]:
        steps = self.steps
        read_context = steps.context
        spec, limits = self.spec, self.spec.limits
        file = task.get("file")
        query = " ".join(str(v) for v in (spec.goal, task.get("prompt", ""), file or ""))
        # new runs record TOOL_NAMES (which implies RESERVATIONS); older runs replay as they
        # ran: tool steps named after their effect, and before reservations a budget check
        named = durable.patched(TOOL_NAMES)
        legacy = not named and not durable.patched(RESERVATIONS)
        context = await read_context(query)
        try:
            shown = self._shown_notes(context["notes"], task)
            # facts first: both calls share the system and the file, the request at the end,
            # so the model server reads the file once (its prompt cache keeps the prefix)
            facts_first = spec.acceptance.facts_first and bool(file)
            system = self._system(shown, context["memories"], goal=not facts_first)
            messages = [Message("system", system), Message("user", "")]
            user = [str(task["prompt"])] if task.get("prompt") else []
            source = ""
            if file:
                try:
                    source = await steps.file(str(file), self._file_limit(system))
                except StepError as exc:  # binary, empty, unreadable: one line, no retry
                    raise AgentFailed(exc.message) from None
                user.append(f"File {Path(str(file)).name}:\n---\n{source}\n---")
            messages[1].content = "\n\n".join(user) or spec.goal
            source = source or messages[1].content
            foreign = [*shown.splitlines(), *context["memories"]]
            failures: Counter[str] = Counter()
            failed_iterations = rejections = 0
            spend = _Spend()
            checked: list[str] = []  # facts first: the file's facts, each checked
            if facts_first:
                checked = await self._facts_first(messages, source, spend)
                asked = [facts_block(checked)] if checked else []
                messages[1].content = "\n\n".join(
                    [messages[1].content, *asked, f"Goal: {spec.goal.strip()}"]
                )
            evidence = "not checked yet"
            rejected: dict[tuple[str, str], str] = {}  # answers rejected so far, with why
            previous: str | None = None
            for iteration in range(1, limits.max_iterations + 1):
                if legacy:
                    await self._within_budget()
                tier = self._route(failed_iterations)
                if previous is not None and tier != previous:  # journaled, with its reason
                    await steps.escalate(previous, tier, evidence)
                previous = tier
                messages += [Message("user", s.prompt()) for s in await durable.steering()]
                if budgets.messages_tokens(messages) > COMPACT_AT * spec.tier(tier).context_tokens:
                    messages = await self._compact(messages, tier, spend, evidence)
                request = ModelRequest(
                    model=spec.tier(tier).model,
                    messages=messages,
                    tools=self.toolbox.offered(),
                    max_tokens=limits.max_tokens_per_call or spec.tier(tier).max_tokens,
                    temperature=spec.tier(tier).temperature,
                    stop=spec.tier(tier).stop,
                )
                try:
                    raw = await self._model(tier, request, spend, evidence)
                except StepError as exc:  # a tier that cannot answer: the next one may
                    # (a refused key parks the run instead; a run journaled before that fails)
                    if exc.error_type.endswith("ModelAuthError") or self._last_tier(
                        failed_iterations
                    ):
                        raise AgentFailed(f"model tier {tier!r}: {exc.message}") from None
                    evidence = f"model tier {tier!r} failed: {exc.message}"
                    failed_iterations = self._next_tier_start(failed_iterations)
                    continue
                reply = ModelResponse.from_dict(raw)
                tokens, cost = spend.tokens, spend.cost
                messages.append(reply.message)
                if limits.max_tokens is not None and tokens > limits.max_tokens:
                    raise AgentFailed(f"token limit {limits.max_tokens} reached ({tokens}); "
                                      f"last evidence: {evidence}")  # fmt: skip
                if limits.max_cost is not None and cost > limits.max_cost:
                    raise AgentFailed(f"cost limit {limits.max_cost} reached ({cost:.4f}); "
                                      f"last evidence: {evidence}")  # fmt: skip
                finishing = not reply.message.tool_calls
                summary = reply.message.content
                iteration_failed = False
                for call in reply.message.tool_calls:
                    result = await self._call_tool(call, named)
                    messages.append(Message("tool", result, tool_call_id=call.id, name=call.name))
                    tool = self.toolbox.tools.get(call.name)
                    if tool is not None and tool.finish and not result.startswith(REFUSED):
                        finishing, summary = True, result
                    if result.startswith((REFUSED, ERROR)):
                        iteration_failed = True
                        key = f"{call.name}({json.dumps(call.arguments, sort_keys=True)})"
                        failures[key] += 1
                        if failures[key] >= limits.repeat_failures:
                            raise AgentFailed(
                                f"the same failing call {key} repeated {failures[key]} times: "
                                f"{result[:300]}"
                            )
                said = (summary.strip(), reply.stop_reason)
                if finishing and said in rejected:  # said again: not checked again
                    evidence = f"the same answer as before, already rejected: {rejected[said]}"
                    rejections += 1
                    failed_iterations = self._next_tier_start(failed_iterations)
                    messages.pop()  # the repeat is not shown to the next tier
                    continue
                if finishing:
                    attempt = _Attempt(task, tier, reply, summary, source, foreign, tuple(checked))
                    if reply.stop_reason in CUT_OFF and not reply.message.tool_calls:
                        # cut off at the token limit: what it said in whole sentences
                        attempt.trim()
                    done, evidence = await self._complete(attempt)
                    if done:
                        await steps.notes(self._note(task, "done", evidence))
                        return {"status": "done", "evidence": evidence, "iterations": iteration,
                                "tokens": tokens, "cost": round(cost, 6), "tier": tier,
                                "rejections": rejections,
                                "answer": attempt.text}  # fmt: skip
                    rejections += 1
                    iteration_failed = True
                    rejected[said] = evidence
                    messages.append(Message("user", self._feedback(evidence)))
                failed_iterations += int(iteration_failed)
            raise AgentFailed(f"{limits.max_iterations} iterations without meeting the acceptance; "
                              f"last evidence: {evidence}")  # fmt: skip
        except AgentFailed as failed:  # a run ends by writing its progress notes, failed or not
            await steps.notes(self._note(task, "failed", str(failed)))
            raise

    async def _facts_first(self, messages: list[Message], source: str, spend: _Spend) -> list[str]:
        """The file's facts, listed by the first tier (a model step of its own) and each
        checked against the file (the `facts` step); none if the tier cannot answer."""
        tier = self._route(0)
        ask = Message("user", f"{messages[1].content}\n\n{facts_request()}")
        request = ModelRequest(
            model=self.spec.tier(tier).model, messages=[messages[0], ask],
            max_tokens=min(FACTS_MAX_TOKENS, self.spec.limits.max_tokens_per_call
                           or self.spec.tier(tier).max_tokens or FACTS_MAX_TOKENS),
            temperature=self.spec.tier(tier).temperature,
        )  # fmt: skip
        try:
            raw = await self._model(tier, request, spend, "listing the file's facts")
        except StepError as exc:
            log.info("agent %s: no facts listed (%s)", self.spec.name, exc.message)
            return []
        listed = ModelResponse.from_dict(raw)
        answer = listed.message.content
        if listed.stop_reason == "length":  # cut off: its last line is half a fact
            answer = answer.rsplit("\n", 1)[0] if "\n" in answer.strip() else answer
        checked: dict[str, Any] = await self.steps.facts(answer, source)
        return list(checked["facts"])

    def _shown_notes(self, notes: str, task: dict[str, Any]) -> str:
        """The progress notes this run may see (spec `memory.notes`): by default only those
        of earlier runs of the same task, so one file's run never reads another's."""
        mode = self.spec.memory.notes
        if mode == "off" or not notes:
            return ""
        lines = notes.splitlines()
        if mode == "task":
            marker = f": {self._task_key(task)}: "
            lines = [line for line in lines if marker in line]
        return "\n".join(lines[-NOTES_IN_CONTEXT:])

    def _system(self, notes: str, memories: list[str], goal: bool = True) -> str:
        """The spec's instructions, its goal (unless the request ends with it), and what this
        run may see of earlier runs."""
        parts = [self.spec.instructions.strip(), f"Goal: {self.spec.goal.strip()}" if goal else ""]
        if notes:  # the most recent lines: enough to go on, little to echo
            parts.append(f"Progress notes from earlier runs:\n{notes}")
        if memories:
            parts.append("Things you remembered:\n" + "\n".join(f"- {m}" for m in memories))
        return "\n\n".join(p for p in parts if p)

    def _file_limit(self, system: str) -> int:
        """How many tokens of the task's file fit the first tier's context beside the
        system message, the request's framing and the answer (all estimated high)."""
        first = self.spec.tier(self.spec.routing.order()[0])
        answer = self.spec.limits.max_tokens_per_call or first.max_tokens or 512
        around = budgets.messages_tokens([Message("system", system)]) + FRAMING
        if self.spec.acceptance.facts_first:  # the summary's request adds the facts, the goal
            around += FACTS_MAX_TOKENS + int(budgets.estimate_tokens(self.spec.goal))
        return max(200, min(MAX_FILE_TOKENS, first.context_tokens - answer - around))

    def _route(self, failed_iterations: int) -> str:
        """The tier for the next call: one tier further along per `escalate_after_failures`
        failed iterations, staying on the last."""
        order = self.spec.routing.order()
        after = self.spec.routing.escalate_after_failures
        if after is None:
            return order[0]
        return order[min(failed_iterations // after, len(order) - 1)]

    def _last_tier(self, failed_iterations: int) -> bool:
        order = self.spec.routing.order()
        return self._route(failed_iterations) == order[-1]

    def _next_tier_start(self, failed_iterations: int) -> int:
        """The failure count at which the next tier starts (a tier that errors is skipped)."""
        after = self.spec.routing.escalate_after_failures or 1
        return (failed_iterations // after + 1) * after

    @staticmethod
    def _feedback(evidence: str) -> str:
        return (f"Your answer was not accepted: {evidence}. Answer again, using only facts, "
                "numbers, dates and names that appear in the task, and keep it short.")  # fmt: skip

    async def _within_budget(self) -> None:
        """Runs started before reservations: wait (durably) while the budget window is spent."""
        while True:
            verdict = await self.steps.budget()
            if verdict["ok"]:
                return
            log.info("agent %s: %s", self.spec.name, verdict["reason"])
            with contextlib.suppress(WaitTimeout):
                await durable.wait_event(BUDGET_EVENT, timeout=verdict["wait"])

    async def _budget_verdict(self) -> dict[str, Any]:
        stored = await Budgets(self.runtime.store).get_budget(self.spec.name)
        budget = budgets.in_force(self.spec.name, self.spec.budget, stored).budget
        now = self.runtime.clock.now()
        for limit in budgets.window_limits(budget):
            assert limit.window is not None
            used_tokens, used_cost = await Budgets(self.runtime.store).spent(
                self.spec.name, now - limit.window
            )
            if (limit.tokens is not None and used_tokens >= limit.tokens) or (
                limit.cost is not None and used_cost >= limit.cost
            ):
                reason = f"budget spent {limit.what}: {used_tokens} tokens, {used_cost:.4f}"
                return {"ok": False, "reason": reason, "wait": min(BUDGET_RECHECK, limit.window)}
        return {"ok": True, "reason": "", "wait": 0.0}

    async def _model(
        self, tier: str, request: ModelRequest, spend: _Spend, evidence: str
    ) -> dict[str, Any]:
        """A model step; while its worst case does not fit the agent's budget the run waits
        (durably, holding no slot) to be woken when budget frees up, or BUDGET_RECHECK."""
        while True:
            try:
                raw: dict[str, Any] = await self.steps.model(tier, request.to_dict())
            except StepError as exc:
                if exc.error_type.endswith("RunLimitReached"):
                    raise AgentFailed(f"{exc.message}; last evidence: {evidence}") from None
                raise
            if "refused" in raw:  # parked, holding no slot, until woken or the window rolls
                log.info("agent %s: %s", self.spec.name, raw["refused"])
                with contextlib.suppress(WaitTimeout):
                    await durable.wait_event(BUDGET_EVENT, timeout=float(raw["wait"]))
                continue
            reply = ModelResponse.from_dict(raw)
            spend.tokens += reply.usage.total
            spend.cost += float(raw.get("cost", 0.0))
            return raw

    async def _reserve(self, tier: str, req: ModelRequest) -> Reservation:
        """Hold the call's worst case against the run's limits and the agent's windows
        (shrinking its max_tokens to what the run has left), or refuse it."""
        runtime, spec = self.runtime, self.spec
        if not self._declared:
            await budgets.declare(runtime, spec)
            self._declared = True
        info = current_step()
        model = spec.tier(tier)
        prompt = budgets.prompt_tokens(req)
        out = req.max_tokens or max(1, model.context_tokens - prompt)
        run_limits = budgets.run_limit(spec.limits)
        spending = Budgets(runtime.store)
        if spec.limits.max_tokens is not None:
            used, _ = await spending.run_spent(info.run_id)
            room = spec.limits.max_tokens - used - prompt
            if room < 1:
                raise RunLimitReached(
                    f"token limit {spec.limits.max_tokens} reached ({used} used, the next "
                    f"prompt alone is about {prompt})"
                )
            out = min(out, room)
        req.max_tokens = out
        force = budgets.in_force(spec.name, spec.budget, await spending.get_budget(spec.name))
        pool = spec.budget.shared
        shared = None if pool is None else await spending.get_shared_budget(pool)
        held = Reservation(
            info.run_id, info.position, 0, spec.name, tier, req.model or tier, prompt + out,
            model.price.cost(prompt, out), "open", 0.0, pool,
        )  # fmt: skip
        limits = [*run_limits, *budgets.window_limits(force.budget),
                  *budgets.shared_limits(shared)]  # fmt: skip
        refused = await spending.reserve(held, limits, runtime.clock.now())
        if refused is None:
            return held
        if refused.limit.window is None:
            raise RunLimitReached(refused.reason().replace("budget run limit", "run limit"))
        now = runtime.clock.now()
        if refused.free_at is None:
            why = f"{refused.reason()}: more than the whole budget; raise it (perdure budget)"
            raise BudgetRefused(why, BUDGET_RECHECK_MAX)
        wait = min(BUDGET_RECHECK_MAX, max(1.0, refused.free_at - now))
        raise BudgetRefused(refused.reason(), wait)

    async def _compact(
        self, messages: list[Message], tier: str, spend: _Spend, evidence: str
    ) -> list[Message]:
        """Summarise older turns into a note; a tool call and its result stay together."""
        head, rest = messages[:2], messages[2:]
        cut = max(0, len(rest) - KEEP_TURNS)
        while cut > 0 and rest[cut].role == "tool":  # never keep a result without its call
            cut -= 1
        old, recent = rest[:cut], rest[cut:]
        if not old:
            return messages
        transcript = "\n".join(f"{m.role}: {m.content[:500]}" for m in old)
        instruction = "Summarise this work log in a few lines: facts, results, what is left."
        request = ModelRequest(
            model=self.spec.tier(tier).model,
            messages=[Message("system", instruction), Message("user", transcript)],
            max_tokens=300,
        )
        answer = await self._model(tier, request, spend, evidence)  # counted like any call
        note = ModelResponse.from_dict(answer).message.content
        return [*head, Message("user", f"Notes on the work so far: {note}"), *recent]

    async def _call_tool(self, call: ToolCall, named: bool) -> str:
        """Refuse (recorded), wait for a human, or run the call as its tool's step (`named`:
        the run has TOOL_NAMES; else as the step of its effect)."""
        prepared = self.toolbox.prepare(call)
        as_dict = {"id": call.id, "name": call.name, "arguments": call.arguments}
        if isinstance(prepared, Refusal):
            return str(await self.steps.refuse(as_dict, prepared.text))
        if prepared.tool.gate:  # ask_human: wait durably for the answer
            answer = await durable.wait_event(gate_event(call.id))
            return answer if isinstance(answer, str) else json.dumps({"answer": answer})
        if self.toolbox.needs_approval(prepared):
            verdict = await durable.wait_event(f"approve:{call.id}")
            approved = verdict is True or (isinstance(verdict, dict) and verdict.get("approve"))
            if not approved:
                why = verdict.get("comment", "") if isinstance(verdict, dict) else ""
                denied = f"{REFUSED}a human denied this call {why}".strip()
                return str(await self.steps.refuse(as_dict, denied))
        if not named:  # journaled before TOOL_NAMES: its calls replay under their effect
            return str(await self.steps.by_effect[prepared.effect](as_dict))
        return str(await self._step_of(prepared)(as_dict))

    async def _complete(self, attempt: _Attempt) -> tuple[bool, str]:
        """Check the answer's grounding (if the spec asks), write it where the spec says,
        then run the spec's acceptance. A rejected answer is never written."""
        output, acc = self.spec.output, self.spec.acceptance
        text = attempt.text
        if acc.grounded:
            tier = self.spec.tier(attempt.tier)
            extract = (True,) if tier.script == "builtin:extractive" else ()
            verdict = await self.steps.ground(  # an extract's sentences are the file's own
                text, attempt.source, attempt.stop_reason, attempt.foreign, *extract
            )
            if not verdict["ok"]:
                return False, str(verdict["evidence"])
        written = ""
        fields = self._fields(attempt.task, text, attempt.tier, attempt.reply.model)
        fields["facts"] = facts_section(attempt.facts, text, attempt.source)
        if output is not None and not attempt.reply.message.tool_calls:
            path = str(self.spec.path(output.path.format(**fields)))
            written = await self.steps.output(path, output.template.format(**fields))
        if acc.grounded and acc.command is None and acc.python is None:
            where = f"; written to {written}" if written else ""
            return True, f"{verdict['evidence']}{where}"
        context = {"fields": fields, "written": written, "answer": attempt.summary}
        checked = await self.steps.accept(context)
        return bool(checked["done"]), str(checked["evidence"])

    def _fields(self, task: dict[str, Any], answer: str, tier: str, served: str) -> dict[str, str]:
        """What output paths, templates and acceptance commands may use (in the workflow:
        the time is durable, the same on replay)."""
        from ..engine.context import require

        file = Path(str(task.get("file") or "task"))
        model = self.spec.tier(tier)
        served = served or model.model or model.script or "default"
        return {
            "stem": file.stem,
            "name": file.name,
            "source": str(task.get("file") or task.get("prompt") or self.spec.goal)[:200],
            "time": durable.now().astimezone(UTC).isoformat(timespec="seconds"),
            "answer": answer.strip(),
            "run_id": require("agent").run_id,
            "tier": tier,
            "model": f"{model.provider}:{served}",
        }

    def _acceptance(self, context: dict[str, Any]) -> dict[str, Any]:
        """The spec's acceptance, run as a step; no acceptance: the answer or output suffices."""
        acc = self.spec.acceptance
        if acc.command is not None:
            # split first, then fill in: a file name with spaces or dashes stays one
            # argument (`nothing -o x.txt` must not add `-o` to the command)
            argv = [part.format(**context["fields"]) for part in shlex.split(acc.command)]
            command = shlex.join(argv)
            try:
                done = subprocess.run(
                    argv, cwd=self.spec.folder, capture_output=True, text=True,
                    timeout=acc.timeout, check=False,
                )  # fmt: skip
            except (OSError, subprocess.TimeoutExpired) as exc:
                return {"done": False, "evidence": f"acceptance {command!r} could not run: {exc}"}
            out = (done.stdout + done.stderr).strip()[-500:]
            return {"done": done.returncode == 0,
                    "evidence": f"`{command}` exited {done.returncode}" + (f": {out}" if out else "")}  # fmt: skip # noqa: E501
        if acc.python is not None:
            import importlib

            module, _, attr = acc.python.partition(":")
            check = getattr(importlib.import_module(module), attr)
            done, evidence = check(context)
            return {"done": bool(done), "evidence": str(evidence)}
        if context.get("written"):
            return {"done": True, "evidence": f"answer written to {context['written']}"}
        answer = str(context.get("answer") or "")
        return {"done": bool(answer), "evidence": f"the model answered: {answer[:200]}"}

    def _task_key(self, task: dict[str, Any]) -> str:
        """What names a task in progress notes: its file, else its prompt, on one line."""
        what = str(task.get("file") or task.get("prompt") or self.spec.goal)
        return " ".join(what.split())[:200]

    def _note(self, task: dict[str, Any], status: str, evidence: str) -> str:
        """The progress-notes line this run adds (its time is durable: the same on replay)."""
        stamp = durable.now().isoformat(timespec="seconds")
        return f"- {stamp} {status}: {self._task_key(task)}: {' '.join(evidence.split())}"

    def _commit_workspace(self, notes: str, run_id: str) -> None:
        """PROGRESS.md in the workspace, committed if anything changed (idempotent)."""
        assert self.spec.workspace is not None
        root = self.spec.path(self.spec.workspace.path)
        root.mkdir(parents=True, exist_ok=True)
        (root / "PROGRESS.md").write_text(f"# {self.spec.name}: progress\n\n{notes}\n")
        if not self.spec.workspace.git:
            return

        def git(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(["git", *GIT_SAFE, *args], cwd=root, capture_output=True,
                                  text=True, check=False, env=git_env())  # fmt: skip

        if not (root / ".git").exists():
            git("init", "-q")
        git("add", "-A")
        if git("diff", "--cached", "--quiet").returncode != 0:
            git("-c", "user.name=perdure", "-c", "user.email=perdure@localhost",
                "commit", "-q", "--no-verify", "-m", f"{self.spec.name}: run {run_id}")  # fmt: skip


# perdure's own git in a workspace runs no command the repository (or a global or system
# config) names: no hooks, no fsmonitor, no signing program, no pager or editor; the
# agent's boundary refuses `.git` paths, so its local config is not the model's to write.
GIT_SAFE = (
    "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false",
    "-c", "core.untrackedCache=false", "-c", "commit.gpgSign=false",
    "-c", "core.pager=cat", "-c", "core.editor=true", "-c", "protocol.allow=never",
)  # fmt: skip


def git_env() -> dict[str, str]:
    """The environment perdure's git runs with: no system or global configuration."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    return {**env, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_TERMINAL_PROMPT": "0"}  # fmt: skip


@dataclass
class _Spend:
    """What one run's model calls spent so far (from their journaled replies)."""

    tokens: int = 0
    cost: float = 0.0


@dataclass
class _Attempt:
    """One finishing answer of the loop, with what it is checked against."""

    task: dict[str, Any]
    tier: str
    reply: ModelResponse
    summary: str
    source: str
    foreign: list[str]
    facts: tuple[str, ...] = ()  # facts first: the file's checked facts
    text: str = ""  # the answer as checked and written (the reply's, unless trimmed)
    stop_reason: str = ""

    def __post_init__(self) -> None:
        self.text = self.text or self.reply.message.content
        self.stop_reason = self.stop_reason or self.reply.stop_reason

    def trim(self) -> None:
        """Keep an answer cut off at the token limit up to its last whole sentence (none:
        the check says it was cut off before one)."""
        self.text, self.stop_reason = whole(self.text), TRIMMED


def task_text(path: Path, limit: int, given: str | None = None, data: bytes | None = None) -> str:
    """A task file's text (its bytes `data` if already read), cut to about `limit` tokens
    (at a line end, saying so); AgentFailed (one line, not retried) if it is empty or
    binary, since no answer about it could be checked. Failures name the file as `given`
    (as the task named it), not by its absolute server path (a run's error reaches MCP
    callers and the API)."""
    name = path if given is None else given
    try:  # no link followed: the file checked is the file read (a swap is refused)
        data = read_no_links(path) if data is None else data
    except OSError as exc:
        raise AgentFailed(f"cannot read {name}: {exc.strerror}") from None
    if not data.strip():
        raise AgentFailed(f"{name} is empty: nothing to work on")
    head = data[: limit * 16]
    text = head.decode("utf-8", errors="replace")
    if b"\0" in head or text.count("\ufffd") > max(3, len(text) // 100):
        raise AgentFailed(f"{name} is not text (binary or not UTF-8): not sent to a model")
    if budgets.estimate_tokens(text) <= limit:
        return text
    low, high = 0, len(text)  # the longest prefix that fits
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (
            (middle, high) if budgets.estimate_tokens(text[:middle]) <= limit else (low, middle - 1)
        )
    cut = text[:low]
    cut = cut[: cut.rfind("\n")] if "\n" in cut[low // 2 :] else cut
    return f"{cut}\n[... the first {len(cut)} characters of {len(data)} bytes ...]"


async def raise_budget(runtime: Runtime, agent: str, budget: Budget) -> int:
    """Store a new budget and wake the agent's parked runs that now fit; returns how many."""
    return await budgets.set_budget(runtime, agent, budget)
