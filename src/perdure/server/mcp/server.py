"""The MCP server: workflows and agents as tools whose calls are perdure runs, as MCP tasks.

Built on the official SDK's low-level `Server` (mcp 1.x), with the task methods
of the MCP specification 2025-11-25 registered as its request handlers over the
store, not over the SDK's in-memory task store, so a task outlives the process:

- `tools/list`: one tool per workflow and agent, `execution.taskSupport: optional`; with
  `operator`, the operator tools too (`operator.py`: stuck, explain, resolve, cancel, pause,
  resume, fork, steer, under the requestor's scopes; answered at once, never as tasks);
  serving an agent, `perdure_steer` even without `operator`.
- `tools/call` with `task`: starts the run `mcp:<uuid>` (its id is the task id) and
  returns `CreateTaskResult` at once. Without `task`: starts the run and waits for
  its result (at most `call_wait` seconds; after that the result says the run goes
  on, with its id, and `isError`).
- `tasks/get`: the run as a task (status mapping: `perdure.server.mcp.tasks`); over
  HTTP answered as plain JSON, never an SSE stream (the spec's SHOULD NOT).
- `tasks/result`: blocks until the run is completed, failed or cancelled, however
  long (the spec's MUST; the SSE stream's pings keep the connection alive) and
  returns what `tools/call` would have (`isError` for failed and cancelled), with the
  `io.modelcontextprotocol/related-task` metadata. While it blocks, a gate the run
  waits at is put to the client as an `elicitation/create` on this request's
  stream (the task's side channel, with the related-task metadata); the answer is
  delivered with `operations.decide` / `operations.answer` as the client's principal.
- `tasks/list`: the requestor's tasks, newest first, cursor-paginated. A run is a task
  of a requestor when a tools/call of that authorization context started it; every
  task method applies that one rule (`PerdureMcp.task_run`), so tasks/list lists what
  tasks/get answers, and any other run id is "not found".
- `tasks/cancel`: cancels the run (and its children); -32602 if it already ended.
- `notifications/tasks/status`: sent while a session is connected, for the tasks it
  created or asked about, whenever their status or message changes (store polled
  every `poll` seconds).

Who acts: over Streamable HTTP, the holder of the bearer token (its scopes
apply: `read` to look, `operate` to call and cancel, `approve` to answer gates);
over stdio the local client, as `mcp:<client name>` with read, operate, approve.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import math
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.abc
import mcp.types as types
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.session import ServerSession
from mcp.shared.exceptions import McpError
from mcp.shared.experimental.tasks.helpers import RELATED_TASK_METADATA_KEY
from mcp.shared.message import ServerMessageMetadata

from ...engine.client import origin_of
from ...engine.streams import StreamChunk, chunk_of
from ...errors import ConfigError, PerdureError, StoreError
from ...observe.redact import Redactor
from ...store.base import CANCELLING, FINISHED, WAITING, RunRow
from .. import operations as ops
from ..access import Principal, digest
from ..access_sql import Access
from ..operations import Action, Forbidden, answer, decide, require
from ..sse import REVOKED, Recheck
from .operator import STEER, OperatorTool, call_operator, operator_tools
from .tasks import TASK_PREFIX, GateQuestion, gate_of, task_of, tool_result
from .tools import WorkflowTool

if TYPE_CHECKING:
    from ...app import App

log = logging.getLogger("perdure.mcp")

LOCAL_SCOPES = frozenset({"read", "operate", "approve"})  # the stdio client: the local user
_TERMINAL = (types.TASK_STATUS_COMPLETED, types.TASK_STATUS_FAILED, types.TASK_STATUS_CANCELLED)


@dataclass
class McpOptions:
    """How the MCP server waits and pages.

    Args:
        call_wait: seconds a plain (not task-augmented) tools/call waits for the result.
        elicit_wait: seconds a gate put to the client (elicitation/create) waits for its
            answer; unanswered, the gate stays open and is put again on the next tasks/result.
        poll: seconds between store reads of a followed run; also the pollInterval hint.
        page_size: tasks per tasks/list page.
        list_limit: tasks/list looks at this many of the most recent runs.
        cancel_wait: seconds tasks/cancel waits for a running run to stop.
    """

    call_wait: float = 60.0
    elicit_wait: float = 3600.0
    poll: float = 0.5
    page_size: int = 50
    list_limit: int = 10_000
    cancel_wait: float = 5.0


@dataclass
class Progress:
    """A task whose client gave a progress token: what of the run's stream it was sent."""

    token: str | int
    after: int = -1
    sent: int = 0


PROGRESS_TEXT = 1000  # characters of new output one progress notification carries at most


def progress_message(chunks: list[StreamChunk], redactor: Redactor) -> str:
    """New stream rows as one human-readable line: text as it is, other topics as JSON,
    markers in brackets (a retry says the step began again); each row masked by the
    redactor before the line is cut to its last PROGRESS_TEXT characters (as every view of
    a run's stream masks it: a secret is never shown, nor a piece of one cut short)."""
    parts: list[str] = []
    for chunk in chunks:
        if chunk.kind == "chunk":
            data = redactor.value(chunk.data)
            text = data if isinstance(data, str) else json.dumps(data)
            parts.append(text if chunk.topic == "out" else f"{chunk.topic}: {text} ")
        elif chunk.kind == "retry" and isinstance(chunk.data, dict):
            parts.append(f"[step {chunk.data.get('step')} began again] ")
    return "".join(parts)[-PROGRESS_TEXT:]


@dataclass
class SessionState:
    """One client session: its SDK session and the tasks it follows (for status notifications)."""

    session: ServerSession | None = None
    asker: Requestor | None = None  # who uses the session (set by each request)
    group: anyio.abc.TaskGroup | None = None  # the session's tasks (gates put to the client)
    watched: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    # task id -> what its client asked progress on: its progress token, the stream offset
    # read so far, the progress value sent so far (it only grows)
    progress: dict[str, Progress] = field(default_factory=dict)

    def watch(self, task: types.Task) -> None:
        """Follow a task; one already waiting for input counts as a change, so the watcher
        puts its gate to the client at once."""
        if task.status not in _TERMINAL and task.taskId not in self.watched:
            seen = "" if task.status == types.TASK_STATUS_INPUT_REQUIRED else task.status
            self.watched[task.taskId] = (seen, task.statusMessage)


@dataclass(frozen=True)
class Requestor:
    """Who sends a request: the principal (scopes apply), the authorization context its
    tasks are bound to (`token:<digest>` over HTTP, `stdio` for the local client) and, over
    HTTP, the SHA-256 of its token (how a long response asks again whether it still holds)."""

    who: Principal
    owner: str
    credential: str = field(default="", compare=False)


class _TaskServer(Server[SessionState, Any]):
    """The low-level Server, declaring the tasks capability of spec 2025-11-25 (list,
    cancel, task-augmented tools/call) for handlers registered directly, not through
    the SDK's deprecated in-memory `experimental.enable_tasks()`."""

    def get_capabilities(
        self,
        notification_options: NotificationOptions,
        experimental_capabilities: dict[str, dict[str, Any]],
    ) -> types.ServerCapabilities:
        capabilities = super().get_capabilities(notification_options, experimental_capabilities)
        capabilities.tasks = types.ServerTasksCapability(
            list=types.TasksListCapability(),
            cancel=types.TasksCancelCapability(),
            requests=types.ServerTasksRequestsCapability(
                tools=types.TasksToolsCapability(call=types.TasksCallCapability())
            ),
        )
        return capabilities


def _error(code: int, message: str) -> McpError:
    return McpError(types.ErrorData(code=code, message=message))


Handler = Callable[[Any], Awaitable[types.ServerResult]]


class PerdureMcp:
    """The MCP server for an App's tools; `server` is the SDK Server to run on a transport.

    Args:
        http: requests come over Streamable HTTP and must carry a bearer token's principal.
        operator: also offer the operator tools (`operator.operator_tools`).

    Raises:
        ConfigError: a workflow's tool has the name of an operator tool.
    """

    def __init__(
        self,
        app: App,
        tools: dict[str, WorkflowTool],
        options: McpOptions | None = None,
        *,
        http: bool = False,
        operator: bool = False,
    ) -> None:
        self.app = app
        self.tools = tools
        # with `operator`, every operator tool; serving an agent, the steering tool (its
        # runs take steering) without the rest
        every = operator_tools()
        agents = any(t.agent for t in tools.values())
        self.operators = every if operator else ({STEER: every[STEER]} if agents else {})
        clash = sorted(set(tools) & set(self.operators))
        if clash:
            raise ConfigError(
                f"workflow tool(s) {', '.join(clash)} have an operator tool's name; rename "
                "the workflow (name=...) or serve without --operator"
            )
        self.options = options or McpOptions()
        self.http = http
        self._asking: set[str] = set()  # gates being put to a client by this process
        self.redactor = Redactor()  # what a client is sent of a run's stream is masked
        self._sessions: dict[str, SessionState] = {}  # HTTP sessions by Mcp-Session-Id
        # ends an HTTP session (its streams closed), set by `transports.http_app`
        self.end_session: Callable[[str], Awaitable[None]] | None = None
        try:
            perdure_version = version("perdure")
        except PackageNotFoundError:  # pragma: no cover - running from a source tree
            perdure_version = "0"
        self.server = _TaskServer(
            "perdure",
            perdure_version,
            instructions=(
                "Each tool starts a durable perdure run. Call tools as tasks (tasks/get, "
                "tasks/result) to follow a run across reconnects and server restarts."
            ),
            lifespan=self._lifespan,
        )
        handlers: dict[type, Handler] = {
            types.ListToolsRequest: self._list_tools,
            types.CallToolRequest: self._call_tool,
            types.GetTaskRequest: self._get_task,
            types.GetTaskPayloadRequest: self._task_result,
            types.ListTasksRequest: self._list_tasks,
            types.CancelTaskRequest: self._cancel_task,
        }
        for kind, handler in handlers.items():
            self.server.request_handlers[kind] = _translated(handler)

    @property
    def poll_ms(self) -> int:
        return max(1, int(self.options.poll * 1000))

    # -- sessions and status notifications ------------------------------------------

    @asynccontextmanager
    async def _lifespan(self, _server: Server[SessionState, Any]) -> AsyncIterator[SessionState]:
        """Per session (stdio: the process; HTTP: each Mcp-Session-Id): its state and watcher."""
        await self.app.runtime.open_store()
        state = SessionState()
        async with anyio.create_task_group() as group:
            state.group = group
            group.start_soon(self._watch, state)
            try:
                yield state
            finally:
                group.cancel_scope.cancel()
                for sid in [k for k, v in self._sessions.items() if v is state]:
                    del self._sessions[sid]

    def session_state(self, session_id: str) -> SessionState | None:
        """The state of the HTTP session `session_id` (Mcp-Session-Id), once it has asked
        something, so requests answered outside the SDK follow tasks for it too."""
        return self._sessions.get(session_id)

    async def _watch(self, state: SessionState) -> None:
        """Send notifications/tasks/status when a followed task's status or message changes,
        and notifications/progress with what its run wrote to its stream meanwhile; once the
        session's token is revoked, end the session (its streams close, nothing more is sent)."""
        check = Recheck(lambda: self._session_holds(state))
        while True:
            await anyio.sleep(self.options.poll)
            session = state.session
            if session is None:
                continue
            if not await check.still():
                await self._end(state)
                return
            if state.progress and not await self._progress(state, session):
                return  # the client went away
            if not state.watched:
                continue
            for task_id, last in list(state.watched.items()):
                try:
                    run = await self.app.runtime.store.get_run(task_id)
                    if run is None:  # deleted (retention)
                        state.watched.pop(task_id, None)
                        continue
                    task = await task_of(self.app, run, self.poll_ms)
                except PerdureError as exc:  # the store is away: try again next time
                    log.warning("mcp: reading task %s failed: %s", task_id, exc)
                    continue
                if (task.status, task.statusMessage) == last:
                    continue
                if task.status in _TERMINAL:
                    state.watched.pop(task_id, None)
                else:
                    state.watched[task_id] = (task.status, task.statusMessage)
                if task.status == types.TASK_STATUS_INPUT_REQUIRED:
                    self._put_gate(state, session, run)
                note = types.TaskStatusNotification(
                    params=types.TaskStatusNotificationParams(**task.model_dump())
                )
                try:
                    await session.send_notification(types.ServerNotification(note))
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    return  # the client went away

    async def _session_holds(self, state: SessionState) -> bool:
        return state.asker is None or await self.holds(state.asker)

    async def _end(self, state: SessionState) -> None:
        """A session whose token was revoked: follow nothing more, and end it over HTTP."""
        state.watched.clear()
        state.progress.clear()
        who = state.asker.who.name if state.asker is not None else "?"
        for session_id in [k for k, v in self._sessions.items() if v is state]:
            log.info("mcp: ending a session of %s: %s", who, REVOKED)
            if self.end_session is not None:
                await self.end_session(session_id)

    def _put_gate(self, state: SessionState, session: ServerSession, run: RunRow) -> None:
        """A followed task reached a gate: put it to the client at once, on the session's own
        stream (the spec lets a server use any stream, the GET one too), for clients that
        poll tasks/get and never ask tasks/result while the task waits for input."""
        asker, group = state.asker, state.group
        key = f"{run.id}\n{run.waiting_for}"
        if asker is None or group is None or key in self._asking:
            return
        if not _can_elicit(session, asker.who):
            return

        async def put() -> None:
            gate = await gate_of(self.app, run)
            if gate is None or key in self._asking:
                return
            self._asking.add(key)
            try:
                await self._ask(gate, run, asker, session, None, True, self.options.elicit_wait)
            finally:
                self._asking.discard(key)

        group.start_soon(put)

    async def _progress(self, state: SessionState, session: ServerSession) -> bool:
        """One progress notification per task with new stream rows (rate-limited by the poll);
        False once the session is closed."""
        for task_id, progress in list(state.progress.items()):
            try:
                rows = await self.app.runtime.store.read_stream(task_id, progress.after, 500)
                run = None if rows else await self.app.runtime.store.get_run(task_id)
            except PerdureError as exc:
                log.warning("mcp: reading the stream of task %s failed: %s", task_id, exc)
                continue
            if not rows:
                if run is None or run.status in FINISHED:
                    state.progress.pop(task_id, None)  # done: no more notifications for it
                continue
            chunks = [chunk_of(row) for row in rows]
            progress.after = rows[-1].seq
            progress.sent += sum(c.kind == "chunk" for c in chunks) or 1
            try:
                message = progress_message(chunks, self.redactor) or None
                await session.send_progress_notification(
                    progress.token, progress.sent, message=message
                )
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                return False
        return True

    # -- who asks -------------------------------------------------------------------

    def _context(self) -> tuple[Requestor, SessionState, ServerSession, types.RequestId]:
        """Who asks (2025-11-25, through the SDK), their session state, session and request id."""
        ctx = self.server.request_context
        state = ctx.lifespan_context
        state.session = ctx.session
        request = ctx.request
        user = getattr(request, "scope", {}).get("user") if request is not None else None
        params = ctx.session.client_params
        name = params.clientInfo.name if params is not None else "client"
        state.asker = self.requestor(user, name)
        headers = getattr(request, "headers", None)
        session_id = headers.get("mcp-session-id") if headers is not None else None
        if session_id:
            self._sessions[session_id] = state
        return state.asker, state, ctx.session, ctx.request_id

    def requestor(self, user: object, client: str = "client") -> Requestor:
        """The requestor of an HTTP request whose scope's user is `user` (the bearer token's),
        or of the stdio client named `client`."""
        if isinstance(user, AuthenticatedUser):
            token = user.access_token
            who = Principal(token.client_id, frozenset(token.scopes))
            return Requestor(who, f"token:{token.subject}", digest(token.token))
        if self.http:
            raise _error(types.INVALID_REQUEST, "a bearer token is required")
        return Requestor(Principal(f"mcp:{client}", LOCAL_SCOPES), "stdio")

    async def holds(self, req: Requestor) -> bool:
        """Whether the requestor's token is still valid (not revoked); the stdio client's
        always is. Asked by every long response: a bearer check at the request's start does
        not cover what it sends minutes later."""
        if not req.credential:
            return True
        try:
            return await Access(self.app.runtime.store).find_token(req.credential) is not None
        except PerdureError:  # the store is away: deliver nothing rather than unchecked
            return False

    def recheck(self, req: Requestor) -> Recheck:
        """A check of `holds` at most every `sse.RECHECK` seconds, for a long wait's loop."""
        return Recheck(lambda: self.holds(req))

    async def still_holds(self, req: Requestor) -> None:
        """Raises the JSON-RPC error that ends a long response once the token was revoked."""
        if not await self.holds(req):
            raise _error(types.INVALID_REQUEST, f"{REVOKED}: this response ends here")

    # -- which runs are tasks, for whom ------------------------------------------------

    async def _is_task(self, run_id: str, owner: str) -> bool:
        """Whether run `run_id` is a task of `owner`: a run a tools/call started (`mcp:` id)
        under that authorization context. Runs started any other way (the CLI, the API, a
        schedule) are not MCP tasks; tasks/get, tasks/result, tasks/cancel, tasks/update and
        tasks/list all apply this one rule, so what one answers the others do too."""
        if not run_id.startswith(TASK_PREFIX):
            return False
        return origin_of(await self.app.runtime.store.journal(run_id, limit=1)).get("mcp") == owner

    async def is_task_of(self, req: Requestor, run_id: str) -> bool:
        return await self._is_task(run_id, req.owner)

    async def task_run(self, req: Requestor, task_id: str) -> RunRow:
        """The run of task `task_id` if it is one of the requestor's tasks; any other id, of
        another token's task too, is "not found" (saying "forbidden" would confirm the id)."""
        run = await self.app.runtime.store.get_run(task_id)
        if run is None or not await self._is_task(task_id, req.owner):
            raise _error(types.INVALID_PARAMS, f"Task not found: {task_id}")
        return run

    async def task_runs(
        self, req: Requestor, cursor: str | None
    ) -> tuple[list[RunRow], str | None]:
        """One page of the requestor's tasks, newest first, and the cursor of the next."""
        after = _decode_cursor(cursor) if cursor else None
        runs = await self.app.runtime.store.list_runs(limit=self.options.list_limit)
        mine = [r for r in runs if await self._is_task(r.id, req.owner)]
        keyed = sorted(((-r.created_at, r.id), r) for r in mine)
        if after is not None:
            keyed = [(k, r) for k, r in keyed if k > after]
        page = keyed[: self.options.page_size]
        following = _encode_cursor(page[-1][0]) if len(keyed) > len(page) else None
        return [r for _, r in page], following

    # -- calls, cancels, answers: both revisions ------------------------------------------

    async def start(
        self, req: Requestor, name: str, arguments: dict[str, Any], as_task: bool
    ) -> RunRow:
        """Start the run of a tools/call (audited as `run.start`, refusals too).

        Raises:
            PerdureError: an unknown tool or bad arguments (no run was made).
        """
        tool = self.tools.get(name)
        run_id = TASK_PREFIX + uuid.uuid4().hex
        workflow = tool.workflow if tool is not None else name
        action = Action("run.start", f"run:{run_id}", "operate",
                        {"workflow": workflow, "via": "mcp", "task": as_task})  # fmt: skip

        async def start() -> RunRow:
            if tool is None:
                raise PerdureError(f"unknown tool {name!r}")
            args, kwargs = tool.arguments(arguments)
            run, _ = await self.app.client.start_run(
                tool.workflow, args, kwargs, run_id=run_id, origin={"mcp": req.owner}
            )
            return run

        return await ops.perform(self.app, req.who, action, start)

    async def cancel(self, req: Requestor, task_id: str, *, ended_ok: bool = False) -> RunRow:
        """Cancel a task's run and its children (audited), waiting a little for a running one
        to stop. A task already ended is refused (2025-11-25's MUST), or with `ended_ok`
        (2026-07-28, whose cancel is an acknowledgement) left as it is."""
        action = Action("run.cancel", f"run:{task_id}", "operate",
                        {"comment": "tasks/cancel over MCP"})  # fmt: skip

        async def cancel() -> str:
            found = await self.app.runtime.store.get_run(task_id)
            if found is None or not await self._is_task(task_id, req.owner):
                raise PerdureError(f"Task not found: {task_id}")
            if found.status in FINISHED:
                if ended_ok:
                    return found.status
                raise PerdureError(f"task {task_id} already ended ({found.status})")
            return await self.app.client.cancel(task_id)

        await ops.perform(self.app, req.who, action, cancel)
        # a run held by a worker elsewhere stops at its next step (its heartbeat: ≤ 1 s)
        with anyio.move_on_after(self.options.cancel_wait):
            while (run := await self._run(task_id)).status == CANCELLING:
                await self.app.runtime.wait_change(self.options.poll)
        return run

    async def gate_key(self, run: RunRow, gate: GateQuestion) -> str:
        """The name of the gate a run waits at, the same on every server: the gate and the
        journal position the run parked at (a later gate of the same call is another)."""
        entries = await self.app.runtime.store.journal(run.id)
        seq = entries[-1].seq if entries else 0
        return f"{gate.kind}:{gate.call_id}:{seq}"

    async def deliver(
        self, req: Requestor, run: RunRow, gate: GateQuestion, action: str, content: dict[str, Any]
    ) -> bool:
        """Deliver a client's answer (`action` accept/decline/cancel, the form's `content`) to
        the gate `run` waits at, durably and audited (`gate.approve`/`gate.deny`/`gate.answer`)
        as the requestor. An approval accepted with approve=false, or declined, denies the
        call; a question takes only an accepted answer; a cancelled (dismissed) form leaves
        the gate open. False when nothing was delivered (dismissed, or answered meanwhile:
        a gate is answered once)."""
        comment = str(content.get("comment") or "")
        key = f"mcp:{await self.gate_key(run, gate)}"  # one answer per gate, whoever sends it
        try:
            if gate.kind == "approval" and action in ("accept", "decline"):
                approve = action == "accept" and content.get("approve") is True
                if action == "decline" and not comment:
                    comment = f"declined by {req.who.name}"
                await decide(self.app, req.who, run.id, gate.call_id, approve, comment, key=key)
                return True
            if gate.kind == "question" and action == "accept" and "answer" in content:
                text = str(content["answer"])
                await answer(self.app, req.who, run.id, gate.call_id, text, key=key)
                return True
        except Forbidden:
            raise
        except PerdureError as exc:  # answered meanwhile elsewhere
            log.info("mcp: answer for run %s not delivered: %s", run.id, exc)
        return False

    # -- tools (2025-11-25, through the SDK) ------------------------------------------------

    def listed_tools(self) -> list[types.Tool]:
        """What tools/list answers: the workflows' tools, then the operator tools."""
        return [t.tool for t in self.tools.values()] + [t.tool for t in self.operators.values()]

    async def operate(
        self, req: Requestor, tool: OperatorTool, arguments: dict[str, Any], as_task: bool
    ) -> types.CallToolResult:
        """A tools/call of an operator tool: done at once, never as a task."""
        if as_task:
            raise _error(types.INVALID_PARAMS, f"tool {tool.name!r} cannot be called as a task")
        return await call_operator(self.app, req.who, tool, arguments)

    async def _list_tools(self, req: types.ListToolsRequest) -> types.ServerResult:
        asker, *_ = self._context()
        require(asker.who, "read", "listing tools")
        return types.ServerResult(types.ListToolsResult(tools=self.listed_tools()))

    async def _call_tool(self, req: types.CallToolRequest) -> types.ServerResult:
        asker, state, session, request_id = self._context()
        as_task = req.params.task is not None
        operator = self.operators.get(req.params.name)
        if operator is not None:
            arguments = req.params.arguments or {}
            return types.ServerResult(await self.operate(asker, operator, arguments, as_task))
        try:
            run = await self.start(asker, req.params.name, req.params.arguments or {}, as_task)
        except (Forbidden, StoreError):
            raise
        except PerdureError as exc:  # an unknown tool, bad arguments: no run was made
            if as_task or req.params.name not in self.tools:
                raise _error(types.INVALID_PARAMS, str(exc)) from None
            return types.ServerResult(_text_error(str(exc)))
        token = req.params.meta.progressToken if req.params.meta else None
        if token is not None:  # progress for the task's lifetime, from the run's stream
            state.progress[run.id] = Progress(token)
        if as_task:
            task = await task_of(self.app, run, self.poll_ms)
            asked = req.params.task.ttl if req.params.task is not None else None
            if asked is not None and asked > task.ttl:  # type: ignore[operator]
                task.statusMessage = (
                    f"requested ttl {asked} ms is beyond the maximum {task.ttl} ms (the "
                    f"workflow's retention); clamped to {task.ttl} ms. {task.statusMessage}"
                )
            state.watch(task)
            return types.ServerResult(types.CreateTaskResult(task=task))
        run = await self._follow(run.id, asker, session, request_id, self.options.call_wait, False)
        if run.status in FINISHED:
            return types.ServerResult(await tool_result(self.app, run))
        waited = f"{self.options.call_wait:g}s"
        result = _text_error(
            f"run {run.id} is still {run.status} after {waited} and goes on; follow it as "
            f"task {run.id} (tasks/get, tasks/result) or call the tool as a task"
        )
        result.structuredContent = {"run_id": run.id, "status": run.status}
        return types.ServerResult(result)

    # -- tasks (2025-11-25) -----------------------------------------------------------------

    async def _run(self, task_id: str) -> RunRow:
        run = await self.app.runtime.store.get_run(task_id)
        if run is None:
            raise _error(types.INVALID_PARAMS, f"Task not found: {task_id}")
        return run

    async def get_task(self, req: Requestor, task_id: str) -> types.GetTaskResult:
        """tasks/get of 2025-11-25 (the SDK's handler, and the HTTP endpoint's plain-JSON one)."""
        require(req.who, "read", "reading a task")
        task = await task_of(self.app, await self.task_run(req, task_id), self.poll_ms)
        return types.GetTaskResult(**task.model_dump())

    async def _get_task(self, req: types.GetTaskRequest) -> types.ServerResult:
        asker, state, *_ = self._context()
        result = await self.get_task(asker, req.params.taskId)
        state.watch(types.Task(**result.model_dump()))
        return types.ServerResult(result)

    async def _task_result(self, req: types.GetTaskPayloadRequest) -> types.ServerResult:
        """Blocks until the task ends, however long (the spec's MUST: no timeout; over HTTP its
        SSE stream carries pings meanwhile), putting the gates it reaches to the client."""
        asker, state, session, request_id = self._context()
        require(asker.who, "read", "reading a task's result")
        task_id = req.params.taskId
        state.watch(await task_of(self.app, await self.task_run(asker, task_id), self.poll_ms))
        run = await self._follow(task_id, asker, session, request_id, None, True)
        data = (await tool_result(self.app, run)).model_dump(
            by_alias=True, mode="json", exclude_none=True
        )
        data["_meta"] = {**data.get("_meta", {}), RELATED_TASK_METADATA_KEY: {"taskId": task_id}}
        return types.ServerResult(types.GetTaskPayloadResult.model_validate(data))

    async def list_tasks(self, req: Requestor, cursor: str | None) -> types.ListTasksResult:
        require(req.who, "read", "listing tasks")
        runs, following = await self.task_runs(req, cursor)
        tasks = [await task_of(self.app, r, self.poll_ms) for r in runs]
        return types.ListTasksResult(tasks=tasks, nextCursor=following)

    async def _list_tasks(self, req: types.ListTasksRequest) -> types.ServerResult:
        asker, *_ = self._context()
        cursor = req.params.cursor if req.params is not None else None
        return types.ServerResult(await self.list_tasks(asker, cursor))

    async def cancel_task(self, req: Requestor, task_id: str) -> types.CancelTaskResult:
        run = await self.cancel(req, task_id)
        task = await task_of(self.app, run, self.poll_ms)
        return types.CancelTaskResult(**task.model_dump())

    async def _cancel_task(self, req: types.CancelTaskRequest) -> types.ServerResult:
        asker, *_ = self._context()
        return types.ServerResult(await self.cancel_task(asker, req.params.taskId))

    # -- following a run, and its gates -----------------------------------------------

    async def _follow(
        self,
        run_id: str,
        asker: Requestor,
        session: ServerSession,
        request_id: types.RequestId,
        wait: float | None,
        related_task: bool,
    ) -> RunRow:
        """Wait for the run to end (at most `wait` seconds; None: however long), putting each
        gate it reaches to the client once, on this request's stream; returns the run as
        last seen."""
        deadline = None if wait is None else anyio.current_time() + wait
        asked: set[str] = set()
        check = self.recheck(asker)
        while True:
            if not await check.still():  # revoked while it waits: the response ends
                await self.still_holds(asker)
            run = await self._run(run_id)
            remaining = math.inf if deadline is None else deadline - anyio.current_time()
            if run.status in FINISHED or remaining <= 0:
                await self.still_holds(asker)  # nothing written after a revoke is delivered
                return run
            gate = await gate_of(self.app, run)
            key = f"{run.id}\n{run.waiting_for}"
            if gate and key not in (asked | self._asking) and _can_elicit(session, asker.who):
                asked.add(key)
                self._asking.add(key)
                try:
                    timeout = min(remaining, self.options.elicit_wait)
                    await self._ask(gate, run, asker, session, request_id, related_task, timeout)
                finally:
                    self._asking.discard(key)
                continue
            await self.app.runtime.wait_change(min(self.options.poll, remaining))

    async def _ask(
        self,
        gate: GateQuestion,
        run: RunRow,
        asker: Requestor,
        session: ServerSession,
        request_id: types.RequestId | None,
        related_task: bool,
        timeout: float,
    ) -> None:
        """Put a gate to the client (elicitation/create) and deliver the answer to the run
        (`deliver`); a form left unanswered leaves the gate open for anyone else."""
        params: dict[str, Any] = {"message": gate.message, "requestedSchema": gate.schema()}
        if related_task:
            params["_meta"] = {RELATED_TASK_METADATA_KEY: {"taskId": run.id}}
        request = types.ServerRequest(
            types.ElicitRequest(params=types.ElicitRequestFormParams.model_validate(params))
        )
        try:
            reply = await session.send_request(
                request,
                types.ElicitResult,
                request_read_timeout_seconds=timedelta(seconds=max(timeout, 1.0)),
                metadata=None
                if request_id is None
                else ServerMessageMetadata(related_request_id=request_id),
            )
        except McpError as exc:  # the client failed or took too long: leave the gate open
            log.info("mcp: elicitation for run %s got no answer: %s", run.id, exc.error.message)
            return
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            return  # the client went away
        if await self.deliver(asker, run, gate, reply.action, dict(reply.content or {})):
            # hold the gate as being asked until the run has moved past it, so the other
            # path (the watcher, or a tasks/result) does not put the answered gate again
            with anyio.move_on_after(self.options.cancel_wait):
                while (now := await self._run(run.id)).status == WAITING and (
                    now.waiting_for == run.waiting_for
                ):
                    await self.app.runtime.wait_change(self.options.poll)


def _can_elicit(session: ServerSession, who: Principal) -> bool:
    params = session.client_params
    return (
        who.allows("approve") and params is not None and params.capabilities.elicitation is not None
    )


def _text_error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], isError=True)


T = TypeVar("T")


async def translated(work: Awaitable[T]) -> T:
    """Refusals as JSON-RPC errors: scopes -32600, the store -32603, other perdure errors
    (bad ids, arguments, states) -32602; McpErrors as they are."""
    try:
        return await work
    except Forbidden as exc:
        raise _error(types.INVALID_REQUEST, str(exc)) from None
    except McpError:
        raise
    except StoreError as exc:  # not the request's fault: the store is away or busy
        raise _error(types.INTERNAL_ERROR, str(exc)) from None
    except PerdureError as exc:
        raise _error(types.INVALID_PARAMS, str(exc)) from None


def _translated(handler: Handler) -> Handler:
    async def handle(req: Any) -> types.ServerResult:
        return await translated(handler(req))

    return handle


def _encode_cursor(key: tuple[float, str]) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(key)).encode()).decode()


def _decode_cursor(cursor: str) -> tuple[float, str]:
    try:
        created, run_id = json.loads(base64.urlsafe_b64decode(cursor.encode()))
        return float(created), str(run_id)
    except (ValueError, TypeError, binascii.Error):
        raise _error(types.INVALID_PARAMS, f"invalid cursor {cursor!r}") from None
