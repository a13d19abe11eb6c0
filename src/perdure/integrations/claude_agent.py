"""The Claude Agent SDK's own loop (its bundled Claude Code CLI), made durable by perdure.

The CLI runs the agent loop and calls the model itself, so a durable conversation points
its `ANTHROPIC_BASE_URL` at a local endpoint of the run (integrations/claude_agent_proxy.py)
and answers each Messages request with a `keyed` step `{name}.model` that passes it on to
the real API (`commit=True`: a response is never bought twice); with `stream=True` the
step writes the API's server-sent events to the run's durable stream as they arrive
(integrations/streaming.py), so a reader sees the tokens while the CLI waits for the
answer whole. The SDK's in-process MCP tools (`@tool`) run as steps `{name}.tool.{tool}`
with the tool's declared effect (default `once`; a `probe` asks the world after a crash
inside one). Tools that need a person (`approval=`) wait at a perdure gate from the SDK's
permission callback (`can_use_tool`), and the CLI's built-in tools (Bash, Write, ...),
which run inside the CLI where no step can hold them, are let through by a `PreToolUse`
hook only when declared `read` or `idempotent` (re-running them is harmless). Transcripts
go to the store (`PerdureSessionStore`, integrations/claude_agent_session.py).

Recovery replays: a new CLI is started on the same prompt, every recorded model response
and tool outcome is answered from the journal (nothing is requested or run again), and
the conversation goes on live from where the crash left it. An interrupted `once` tool
parks the run in `needs_attention`, or its probe decides.

    agent = ClaudeAgent(app, "refunds", tools=[lookup, refund],
                        effects={"lookup": "read"}, probes={"refund": refund_probe})
    refunds = agent.workflow()              # a perdure workflow: prompt in, result text out
    app.start(refunds, "refund order 42")   # or, inside any workflow: await agent.run(x)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
from collections.abc import AsyncGenerator, Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from ..engine.context import current
from ..engine.effects import Effect, check_effect
from ..engine.retry import Retry
from ..engine.steps import Step, current_step
from ..errors import ConfigError, NonDeterminismError, ParkRun, PerdureError, StepError
from ..extras import require_extra
from .claude_agent_proxy import Reply, Request, serving
from .gates import Gates
from .streaming import write_event

require_extra("claude-agent", "perdure.integrations.claude_agent")

import httpx  # noqa: E402
from claude_agent_sdk import (  # noqa: E402  # only once the extra is known to be there
    ClaudeAgentOptions,
    HookMatcher,
    PermissionResultAllow,
    PermissionResultDeny,
    ResultMessage,
    SdkMcpTool,
    ToolPermissionContext,
    create_sdk_mcp_server,
    query,
)
from claude_agent_sdk.types import HookContext, HookInput, SyncHookJSONOutput  # noqa: E402

from .claude_agent_cli import PARENT, cli, launcher  # noqa: E402  # imports the SDK
from .claude_agent_session import PerdureSessionStore  # noqa: E402  # imports the SDK

if TYPE_CHECKING:
    from ..app import App
    from ..engine.handles import Workflow

__all__ = ["ClaudeAgent", "PerdureSessionStore"]

DEFAULT_UPSTREAM = "https://api.anthropic.com"
MESSAGES = "/v1/messages"
# Headers not passed on: the proxy's own connection, and an encoding httpx would undo.
_HOP = frozenset({"host", "content-length", "connection", "accept-encoding",
                  "transfer-encoding", "keep-alive"})  # fmt: skip
_STOPPED = b'{"type":"error","error":{"type":"api_error","message":"stopped by perdure"}}'
SAFE_BUILTIN: frozenset[str] = frozenset({"read", "idempotent"})


class ModelBusy(PerdureError):
    """The model API answered that it may answer later (429, 5xx) or could not be reached."""


# A model request is retried while the API may answer later; a refused key parks the run.
MODEL_RETRY = Retry(
    max_attempts=6, initial=1.0, max_delay=60.0, retry_on=(ModelBusy,), no_retry_on=(ParkRun,)
)


def _one_line(text: str) -> str:
    return " ".join(text.split())[:300]


def _text(value: Any) -> dict[str, Any]:
    """A tool's outcome as the SDK's MCP result: a string (a probe's or an operator's
    value) becomes one text block."""
    if isinstance(value, dict) and "content" in value:
        return value
    text = value if isinstance(value, str) else json.dumps(value)
    return {"content": [{"type": "text", "text": text}]}


async def _relayed(answer: httpx.Response, position: int) -> str:
    """The body of a server-sent-events answer, whole, each event's JSON written to the run's
    stream (`write_event`) as soon as its `data:` line has arrived."""
    whole: list[str] = []
    pending = ""
    async for piece in answer.aiter_text():
        whole.append(piece)
        *lines, pending = (pending + piece).split("\n")
        for line in lines:
            _relay_line(line, position)
    _relay_line(pending, position)
    return "".join(whole)


def _relay_line(line: str, position: int) -> None:
    if line.startswith("data:"):
        try:
            event = json.loads(line[5:])
        except ValueError:  # not JSON: left to the CLI, which reads the body whole
            return
        write_event(position, event)


def _shape(body: bytes) -> dict[str, Any]:
    """What a replayed Messages request must repeat: how many messages it carries and the
    tools it offers (a request that is not JSON has neither)."""
    try:
        found = json.loads(body or b"{}")
    except ValueError:
        found = None
    if not isinstance(found, dict):
        return {"messages": -1, "tools": []}
    messages = found.get("messages")
    tools = [str(t.get("name")) for t in found.get("tools") or [] if isinstance(t, dict)]
    return {"messages": len(messages) if isinstance(messages, list) else -1, "tools": tools}


class _Conversation:
    """One execution of a conversation: the task that drives the SDK, and the first
    control-flow exception (a suspension, a park, a divergence) one of its callbacks met,
    which stops the CLI and is raised into the workflow."""

    def __init__(self) -> None:
        self.task: asyncio.Future[Any] | None = None
        self.failure: BaseException | None = None

    def stop(self, exc: BaseException) -> None:
        if self.failure is None:
            self.failure = exc
        if self.task is not None and not self.task.done():
            self.task.cancel()


class ClaudeAgent:
    """A Claude Agent SDK agent whose conversations are durable perdure runs.

    Args:
        app: the perdure app whose store journals the runs (and keeps the transcripts).
        name: the agent's name; its steps are `{name}.model`, `{name}.tool.{tool}`,
            `{name}.gate`, its workflow `claude.{name}`.
        options: the SDK's options (model, system prompt, cwd, built-in `tools`, ...);
            perdure adds its MCP server, hooks, permission callback and endpoint.
        tools: the agent's SDK tools (`@tool(...)` functions), served to the CLI as the
            in-process MCP server `server`; the model sees `mcp__{server}__{tool}`.
        effects: effect per tool name (plain or built-in, `{"lookup": "read",
            "Read": "read"}`); an SDK tool without one is `once`, a built-in tool without
            `read` or `idempotent` is refused by the hook.
        probes: per `once` tool, the read-only question recovery asks after a crash
            inside it, called with the tool's arguments (engine/probes.py).
        approval: tools that wait for a person's approval before each call (a gate
            `approve:{tool_use_id}`, answered with `perdure send`).
        upstream: the Messages API the model steps call (default: the options' or the
            environment's `ANTHROPIC_BASE_URL`, else api.anthropic.com).
        stream: write each model step's server-sent events, as they arrive, to the run's
            durable stream (topic `model`, read with
            `perdure.integrations.streaming.ModelEvents`); the answer is journaled whole
            once, so a replay streams nothing again.
    """

    def __init__(
        self,
        app: App,
        name: str,
        *,
        options: ClaudeAgentOptions | None = None,
        tools: Sequence[SdkMcpTool[Any]] = (),
        server: str = "tools",
        effects: Mapping[str, Effect] | None = None,
        probes: Mapping[str, Callable[..., Any]] | None = None,
        approval: Collection[str] = (),
        upstream: str | None = None,
        stream: bool = False,
    ) -> None:
        if not isinstance(name, str) or not name.strip() or "." in name:
            raise ConfigError(f"ClaudeAgent needs a name without dots, not {name!r}")
        self.app = app
        self.name = name
        self.options = options or ClaudeAgentOptions()
        self.server = server
        self.effects = {t: check_effect(e, f"effects[{t!r}]") for t, e in (effects or {}).items()}
        self.tools = {t.name: t for t in tools}
        for what, names in (("probes", probes or {}), ("approval", approval)):
            unknown = sorted(set(names) - set(self.tools))
            if unknown:
                raise ConfigError(f"ClaudeAgent {name!r}: {what} names no tool of it: {unknown}")
        self.approval = frozenset(approval)
        self.stream = stream
        env = self.options.env or {}
        self.upstream = (
            upstream
            or env.get("ANTHROPIC_BASE_URL")
            or os.environ.get("ANTHROPIC_BASE_URL")
            or DEFAULT_UPSTREAM
        ).rstrip("/")
        self._model = self._step(f"{name}.model", self._model_call, "keyed", None)
        self._tool_steps = {
            tool.name: self._step(
                f"{name}.tool.{tool.name}",
                self._tool_body(tool),
                self.effects.get(tool.name, "once"),
                (probes or {}).get(tool.name),
            )
            for tool in tools
        }
        self._gates = Gates(app, name)
        self._workflow: Workflow[..., Any] | None = None

    def _step(
        self, step_name: str, body: Callable[..., Any], effect: Effect, probe: Any
    ) -> Step[..., Any]:
        known = self.app.runtime.steps.get(step_name)
        if known is not None:
            raise ConfigError(f"two Claude agents are named {self.name!r} (step {step_name!r})")
        if effect == "keyed":
            return self.app.step(name=step_name, effect="keyed", commit=True, retry=MODEL_RETRY)(
                body
            )
        return self.app.step(name=step_name, effect=effect, probe=probe)(body)

    # The steps' bodies.
    async def _model_call(self, path: str, headers: dict[str, str], body: bytes) -> Any:
        """Pass one Messages request on to the API; its answer, whole (SSE text included)."""
        send = {k: v for k, v in headers.items() if k not in _HOP}
        position = current_step().position
        try:
            async with (
                httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=30.0)) as http,
                http.stream("POST", self.upstream + path, headers=send, content=body) as answer,
            ):
                sse = "text/event-stream" in answer.headers.get("content-type", "")
                if self.stream and sse and answer.status_code == 200:
                    text = await _relayed(answer, position)
                else:
                    text = (await answer.aread()).decode(answer.encoding or "utf-8", "replace")
        except httpx.TransportError as exc:
            raise ModelBusy(f"{self.upstream}: {type(exc).__name__}: {exc}") from exc
        status = answer.status_code
        if status in (401, 403):
            raise ParkRun(
                f"Claude agent {self.name!r}: the model API refused the key ({status}: "
                f"{_one_line(text)}); fix it where the workers run, then "
                f"`perdure resume {current_step().run_id}`"
            )
        if status == 429 or status >= 500:
            raise ModelBusy(f"{self.upstream} answered {status}: {_one_line(text)}")
        return {
            "status": status,
            "type": answer.headers.get("content-type", "application/json"),
            "body": text,
            **_shape(body),
            "position": position,
        }

    @staticmethod
    def _tool_body(tool: SdkMcpTool[Any]) -> Callable[..., Any]:
        async def call_tool(args: dict[str, Any]) -> Any:
            return await tool.handler(args)

        call_tool.__name__ = call_tool.__qualname__ = tool.name
        return call_tool

    # The SDK's callbacks, each run in the conversation's run.
    def _tool_handler(self, tool: str, conv: _Conversation) -> Callable[..., Any]:
        step = self._tool_steps[tool]

        async def handler(args: dict[str, Any]) -> dict[str, Any]:
            if conv.failure is not None:  # stopping: no step more
                raise asyncio.CancelledError
            try:
                return _text(await step(args))
            except StepError as exc:  # the tool failed (journaled): the model reads why
                return {"content": [{"type": "text", "text": str(exc)}], "is_error": True}
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # a suspension, a park: the run, not the model
                conv.stop(exc)
                raise

        return handler

    def _answer(self, conv: _Conversation) -> Callable[[Request], Any]:
        async def answer(request: Request) -> Reply:
            if request.method != "POST" or request.path.split("?")[0] != MESSAGES:
                return await self._pass(request)  # count_tokens and the like: not journaled
            if conv.failure is not None:  # stopping (a retry of the CLI's): no step more
                return Reply(500, "application/json", _STOPPED)
            try:
                found = await self._model(request.path, request.headers, request.body)
            except asyncio.CancelledError:
                raise
            except BaseException as exc:
                conv.stop(exc)
                return Reply(500, "application/json", _STOPPED)
            sent = _shape(request.body)
            same_tools = sorted(found.get("tools") or []) == sorted(sent["tools"])
            if found.get("messages") != sent["messages"] or not same_tools:
                info = current()
                conv.stop(NonDeterminismError(
                    info.run_id if info is not None else "?", int(found.get("position", -1)),
                    f"{self.name}.model answering {found.get('messages')} messages with tools "
                    f"{sorted(found.get('tools') or [])}",
                    f"a request of {sent['messages']} with tools {sorted(sent['tools'])} "
                    "(the conversation changed)",
                ))  # fmt: skip
                return Reply(500, "application/json", _STOPPED)
            return Reply(int(found["status"]), str(found["type"]), str(found["body"]).encode())

        return answer

    async def _pass(self, request: Request) -> Reply:
        send = {k: v for k, v in request.headers.items() if k not in _HOP}
        async with httpx.AsyncClient(timeout=httpx.Timeout(120.0, connect=30.0)) as http:
            answer = await http.request(
                request.method, self.upstream + request.path, headers=send, content=request.body
            )
        kind = answer.headers.get("content-type", "application/json")
        return Reply(answer.status_code, kind, answer.content)

    def _permission(self, conv: _Conversation) -> Callable[..., Any]:
        async def can_use_tool(
            tool: str, args: dict[str, Any], context: ToolPermissionContext
        ) -> PermissionResultAllow | PermissionResultDeny:
            plain = tool.removeprefix(f"mcp__{self.server}__")
            if conv.failure is not None:  # stopping: no gate more
                return PermissionResultDeny(message="stopped by perdure", interrupt=True)
            if plain not in self.approval:
                return PermissionResultAllow()
            try:
                decision = await self._gates.approve(context.tool_use_id or "", plain, args)
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # the gate waits: the run suspends
                conv.stop(exc)
                raise
            if decision.approved:
                return PermissionResultAllow()
            return PermissionResultDeny(message=decision.comment or "denied by a person")

        return can_use_tool

    def _pre_tool(self) -> Callable[..., Any]:
        ours = f"mcp__{self.server}__"

        async def pre_tool_use(
            data: HookInput, tool_use_id: str | None, context: HookContext
        ) -> SyncHookJSONOutput:
            tool = str(data.get("tool_name", ""))
            if tool.startswith(ours) or self.effects.get(tool) in SAFE_BUILTIN:
                return {}
            reason = (
                f"perdure: {tool} runs inside the CLI, where no step can journal it; only "
                "built-in tools declared 'read' or 'idempotent' (effects=) may run"
            )
            return {"hookSpecificOutput": {"hookEventName": "PreToolUse",
                    "permissionDecision": "deny", "permissionDecisionReason": reason}}  # fmt: skip

        return pre_tool_use

    def _options(self, conv: _Conversation, url: str) -> ClaudeAgentOptions:
        base = self.options
        tools = [
            dataclasses.replace(tool, handler=self._tool_handler(name, conv))
            for name, tool in self.tools.items()
        ]
        servers = dict(base.mcp_servers) if isinstance(base.mcp_servers, dict) else {}
        if tools:
            servers[self.server] = create_sdk_mcp_server(self.server, tools=tools)
        # with gates, every call of ours asks the permission callback (an allowed tool
        # would never reach it); without, ours are allowed outright
        ours = [] if self.approval else [f"mcp__{self.server}__{t}" for t in self.tools]
        allowed = list(base.allowed_tools) + ours
        hooks = dict(base.hooks or {})
        hooks["PreToolUse"] = [HookMatcher(hooks=[self._pre_tool()]),
                               *hooks.get("PreToolUse", [])]  # fmt: skip
        env = dict(base.env or {})
        env["ANTHROPIC_BASE_URL"] = url
        env[PARENT] = str(os.getpid())
        real = cli(base.cli_path)
        mortal = None if real is None else launcher(real)
        env.setdefault("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        store = base.session_store
        flush = base.session_store_flush
        if store is None:
            store, flush = PerdureSessionStore(self.app), "eager"
        return dataclasses.replace(
            base, mcp_servers=servers, allowed_tools=allowed, hooks=hooks, env=env,
            can_use_tool=self._permission(conv) if self.approval else base.can_use_tool,
            session_store=store,
            session_store_flush=flush, cli_path=mortal or base.cli_path,
        )  # fmt: skip

    async def run(self, prompt: str) -> ResultMessage:
        """Run one conversation on `prompt` inside a workflow; the SDK's final
        `ResultMessage`. A recovered run replays the recorded part from the journal."""
        if current() is None:
            raise ConfigError(
                f"ClaudeAgent({self.name!r}).run() runs inside a perdure workflow; start "
                "agent.workflow() instead"
            )
        if not isinstance(prompt, str) or not prompt.strip():
            raise ConfigError(f"Claude agent {self.name!r} needs a prompt, not {prompt!r}")
        conv = _Conversation()
        async with serving(self._answer(conv)) as url:
            options = self._options(conv, url)
            task = asyncio.ensure_future(self._drive(prompt, options))
            conv.task = task
            try:
                await asyncio.wait({task})
            except asyncio.CancelledError:  # the run's own task: the CLI goes with it
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
                raise
        if conv.failure is not None:
            if not task.cancelled():
                task.exception()  # the SDK's teardown of the same failure: seen, not logged
            raise conv.failure
        return task.result()  # its own error, or a cancellation of the run's

    async def _drive(self, prompt: str, options: ClaudeAgentOptions) -> ResultMessage:
        result: ResultMessage | None = None
        messages = cast("AsyncGenerator[Any, None]", query(prompt=prompt, options=options))
        try:
            async for message in messages:
                if isinstance(message, ResultMessage):
                    result = message
        finally:
            with contextlib.suppress(Exception):
                await messages.aclose()
        if result is None:
            raise ConfigError(f"Claude agent {self.name!r}: the CLI ended without a result")
        return result

    def workflow(self, *, name: str | None = None) -> Workflow[..., Any]:
        """Register (once) the perdure workflow `claude.{name}`: a prompt in, the
        conversation's result text out (a failed conversation fails the run in one line).
        Register it at import time, so every worker knows it."""
        if self._workflow is not None:
            return self._workflow

        async def run_claude(prompt: str) -> Any:
            result = await self.run(prompt)
            if result.is_error:
                raise ConfigError(
                    f"Claude agent {self.name!r} ended with an error ({result.subtype}): "
                    f"{_one_line(str(result.result or result.errors or ''))}"
                )
            return result.result

        self._workflow = self.app.workflow(name=name or f"claude.{self.name}")(run_claude)
        return self._workflow
