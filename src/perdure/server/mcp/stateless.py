"""MCP revision 2026-07-28 (stateless) with the tasks extension `io.modelcontextprotocol/tasks`.

No handshake and no session: each request names its protocol version and the client's
capabilities in `_meta`, and any `perdure mcp` process on the store answers it, since a
task is a run and its state lives in the store. Served beside 2025-11-25 on the same
endpoint (`transports.http_app` picks the revision per request):

- `server/discover`: the versions served, the tools and tasks-extension capabilities.
- `tools/list`; `tools/call`: for a client declaring the tasks extension, starts the run
  and returns its handle (`resultType: "task"`); otherwise waits (bounded) for its result.
- `tasks/get`: the task with `pollIntervalMs`, and inlined by status: `inputRequests`
  (a gate, as an `elicitation/create` form) for `input_required`, `result` (the
  `CallToolResult`) for `completed`. A failed workflow is a tool error, so `completed`
  with an `isError` result (the extension keeps `failed` for JSON-RPC errors).
- `tasks/update`: answers the gate of an `input_required` task from `inputResponses`,
  once (the store drops a second delivery of one gate's answer), audited.
- `tasks/cancel`: cancels the run and its children; an empty acknowledgement.
- `subscriptions/listen` with `notifications.taskIds`: an SSE stream of
  `notifications/tasks` (the `tasks/get` answer) whenever a listed task changes.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import mcp.types as types
from mcp.shared.exceptions import McpError
from mcp.shared.version import SUPPORTED_PROTOCOL_VERSIONS

from ...errors import PerdureError, StoreError
from ...store.base import COMPLETED, FAILED, FINISHED, RunRow
from ..operations import Forbidden, require
from .tasks import FOREVER_MS, GateQuestion, error_text, gate_of, status_of, tool_result, ttl_ms

if TYPE_CHECKING:
    from .server import PerdureMcp, Requestor

MODERN = "2026-07-28"
SERVED = (*SUPPORTED_PROTOCOL_VERSIONS, MODERN)  # handshake revisions (the SDK's), then this one
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
META_VERSION = "io.modelcontextprotocol/protocolVersion"
META_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
META_SERVER = "io.modelcontextprotocol/serverInfo"
META_SUBSCRIPTION = "io.modelcontextprotocol/subscriptionId"
MISSING_CAPABILITY = -32021
UNSUPPORTED_VERSION = -32022
METHOD_NOT_FOUND = -32601


@dataclass(frozen=True)
class Rpc:
    """One JSON-RPC request of the stateless revision."""

    id: Any
    method: str
    params: dict[str, Any]

    @property
    def meta(self) -> dict[str, Any]:
        meta = self.params.get("_meta")
        return meta if isinstance(meta, dict) else {}

    @property
    def with_tasks(self) -> bool:
        """Whether the client declares the tasks extension on this request."""
        capabilities = self.meta.get(META_CAPABILITIES)
        extensions = capabilities.get("extensions") if isinstance(capabilities, dict) else None
        return isinstance(extensions, dict) and TASKS_EXTENSION in extensions


def version_of(message: dict[str, Any], header: str | None) -> str | None:
    """The revision a request asks for: its `_meta` protocol version, else the
    MCP-Protocol-Version header when it names the stateless revision, else None (a
    2025-11-25-style request, which the SDK answers)."""
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    asked = str(meta[META_VERSION]) if isinstance(meta, dict) and META_VERSION in meta else None
    if asked is None and (header == MODERN or message.get("method") == "server/discover"):
        asked = header or MODERN
    if asked in SUPPORTED_PROTOCOL_VERSIONS:
        return None  # a handshake revision: the SDK's session answers
    return asked


def unsupported(request_id: Any, requested: str) -> dict[str, Any]:
    """The -32022 error for a revision not served, naming those that are."""
    message = (
        f"unsupported protocol version {requested!r}: this server speaks "
        f"{MODERN} (stateless, per-request _meta) and {', '.join(SUPPORTED_PROTOCOL_VERSIONS)} "
        "(initialize handshake)"
    )
    data = {"supported": list(SERVED), "requested": requested}
    return _failure(request_id, UNSUPPORTED_VERSION, message, data)


def _failure(request_id: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": request_id, "error": error}


def _answer(request_id: Any, result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": {"resultType": "complete", **result}}


def _missing_tasks(what: str) -> McpError:
    error = types.ErrorData(
        code=MISSING_CAPABILITY,
        message=f"{what} needs the client capability extensions[{TASKS_EXTENSION!r}]",
        data={"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}},
    )
    return McpError(error)


def _invalid(message: str) -> McpError:
    return McpError(types.ErrorData(code=types.INVALID_PARAMS, message=message))


class Stateless:
    """The 2026-07-28 methods over a `PerdureMcp` (its tools, store and rules for tasks)."""

    def __init__(self, mcp: PerdureMcp) -> None:
        self.mcp = mcp
        self.app = mcp.app

    async def handle(self, rpc: Rpc, req: Requestor) -> dict[str, Any]:
        """The JSON-RPC response to one request (never raises for the request's faults)."""
        handlers = {
            "server/discover": self._discover,
            "tools/list": self._list_tools,
            "tools/call": self._call_tool,
            "tasks/get": self._get,
            "tasks/update": self._update,
            "tasks/cancel": self._cancel,
        }
        handler = handlers.get(rpc.method)
        if handler is None:
            return _failure(
                rpc.id, METHOD_NOT_FOUND, f"method {rpc.method!r} is not served in {MODERN}"
            )
        try:
            return _answer(rpc.id, await handler(rpc, req))
        except McpError as exc:
            return _failure(rpc.id, exc.error.code, exc.error.message, exc.error.data)
        except Forbidden as exc:
            return _failure(rpc.id, types.INVALID_REQUEST, str(exc))
        except StoreError as exc:
            return _failure(rpc.id, types.INTERNAL_ERROR, str(exc))
        except PerdureError as exc:
            return _failure(rpc.id, types.INVALID_PARAMS, str(exc))

    # -- discovery and tools ----------------------------------------------------------

    def server_info(self) -> dict[str, Any]:
        return {"name": self.mcp.server.name, "version": self.mcp.server.version or "0"}

    async def _discover(self, rpc: Rpc, req: Requestor) -> dict[str, Any]:
        return {
            "supportedVersions": list(SERVED),
            "capabilities": {"tools": {}, "extensions": {TASKS_EXTENSION: {}}},
            "serverInfo": self.server_info(),
            "instructions": self.mcp.server.instructions,
            "cacheScope": "public",
            "ttlMs": 0,
            "_meta": {META_SERVER: self.server_info()},
        }

    async def _list_tools(self, rpc: Rpc, req: Requestor) -> dict[str, Any]:
        require(req.who, "read", "listing tools")
        tools = [
            t.model_dump(by_alias=True, mode="json", exclude_none=True)
            for t in self.mcp.listed_tools()
        ]
        for tool in tools:
            tool.pop("execution", None)  # the extension drops per-tool task support
        return {"tools": tools, "cacheScope": "public", "ttlMs": 0}

    async def _call_tool(self, rpc: Rpc, req: Requestor) -> dict[str, Any]:
        name = rpc.params.get("name")
        arguments = rpc.params.get("arguments") or {}
        if not isinstance(name, str) or not isinstance(arguments, dict):
            raise _invalid("tools/call needs a tool name and an arguments object")
        if (steered := await self.mcp.steered(req, name, arguments, False)) is not None:
            return _dump(steered)  # done at once: a task would only wrap the answer
        try:
            run = await self.mcp.start(req, name, arguments, rpc.with_tasks)
        except (Forbidden, StoreError):
            raise
        except PerdureError as exc:
            if name not in self.mcp.tools:
                raise _invalid(str(exc)) from None
            return _dump(types.CallToolResult(content=[_text(str(exc))], isError=True))
        if rpc.with_tasks:
            return {**await self.task(run), "resultType": "task"}
        with anyio.move_on_after(self.mcp.options.call_wait):
            while run.status not in FINISHED:
                await self.app.runtime.wait_change(self.mcp.options.poll)
                run = await self.mcp._run(run.id)
        if run.status in FINISHED:
            return _dump(await tool_result(self.app, run))
        text = (
            f"run {run.id} is still {run.status} after {self.mcp.options.call_wait:g}s and goes "
            f"on; declare the {TASKS_EXTENSION} extension to follow it as a task"
        )
        result = types.CallToolResult(content=[_text(text)], isError=True)
        result.structuredContent = {"run_id": run.id, "status": run.status}
        return _dump(result)

    # -- tasks ---------------------------------------------------------------------------

    def _task_id(self, rpc: Rpc) -> str:
        if not rpc.with_tasks:
            raise _missing_tasks(rpc.method)
        task_id = rpc.params.get("taskId")
        if not isinstance(task_id, str):
            raise _invalid(f"{rpc.method} needs a taskId (a string)")
        return task_id

    async def task(self, run: RunRow) -> dict[str, Any]:
        """The task a run is, in this revision's shape (`DetailedTask`)."""
        gate = await gate_of(self.app, run)
        status, message = status_of(run, gate)
        if run.status == FAILED:  # a tool error, not a JSON-RPC one: completed, isError
            status, message = types.TASK_STATUS_COMPLETED, error_text(run)
        ttl = ttl_ms(self.app, run)
        found: dict[str, Any] = {
            "taskId": run.id,
            "status": status,
            "createdAt": _iso(run.created_at),
            "lastUpdatedAt": _iso(max(run.updated_at, run.created_at)),
            "ttlMs": None if ttl == FOREVER_MS else ttl,
            "pollIntervalMs": self.mcp.poll_ms,
        }
        if message:
            found["statusMessage"] = message
        if gate is not None and status == types.TASK_STATUS_INPUT_REQUIRED:
            key = await self.gate_key(run, gate)
            form = {"mode": "form", "message": gate.message, "requestedSchema": gate.schema()}
            found["inputRequests"] = {key: {"method": "elicitation/create", "params": form}}
        if run.status in (COMPLETED, FAILED):
            found["result"] = _dump(await tool_result(self.app, run))
        return found

    async def gate_key(self, run: RunRow, gate: GateQuestion) -> str:
        """The inputRequests key of the gate a run waits at (`PerdureMcp.gate_key`): one key
        names one request over the task's life, on any server."""
        return await self.mcp.gate_key(run, gate)

    async def _get(self, rpc: Rpc, req: Requestor) -> dict[str, Any]:
        task_id = self._task_id(rpc)
        require(req.who, "read", "reading a task")
        return await self.task(await self.mcp.task_run(req, task_id))

    async def _update(self, rpc: Rpc, req: Requestor) -> dict[str, Any]:
        """Deliver `inputResponses` to the gate the task waits at. Keys that are not the
        outstanding request's are ignored (the extension's SHOULD); a task that waits for
        no input is refused, so a client learns its answer went nowhere."""
        task_id = self._task_id(rpc)
        responses = rpc.params.get("inputResponses")
        if not isinstance(responses, dict):
            raise _invalid("tasks/update needs inputResponses (an object)")
        require(req.who, "approve", "answering a task's input request")
        run = await self.mcp.task_run(req, task_id)
        gate = await gate_of(self.app, run)
        if gate is None:
            raise _invalid(
                f"task {task_id} is not waiting for input (it is {status_of(run, None)[0]})"
            )
        reply = responses.get(await self.gate_key(run, gate))
        if isinstance(reply, dict):
            content = reply.get("content")
            await self.mcp.deliver(
                req,
                run,
                gate,
                str(reply.get("action")),
                content if isinstance(content, dict) else {},
            )
        return {}

    async def _cancel(self, rpc: Rpc, req: Requestor) -> dict[str, Any]:
        await self.mcp.cancel(req, self._task_id(rpc), ended_ok=True)
        return {}

    # -- subscriptions/listen --------------------------------------------------------------

    async def listen(self, rpc: Rpc, req: Requestor) -> AsyncIterator[dict[str, Any]]:
        """The messages of a `subscriptions/listen` stream: its acknowledgement (the task ids
        agreed to, those of the requestor's tasks), then a `notifications/tasks` each time one
        of them changes, until all have ended (then the request's result closes it)."""
        if not rpc.with_tasks:
            raise _missing_tasks("task notifications on subscriptions/listen")
        require(req.who, "read", "following tasks")
        notifications = rpc.params.get("notifications")
        wanted = notifications.get("taskIds") if isinstance(notifications, dict) else None
        ids = [str(i) for i in wanted] if isinstance(wanted, list) else []
        mine = [i for i in ids if await self.mcp.is_task_of(req, i)]
        meta = {META_SUBSCRIPTION: rpc.id}
        yield {
            "jsonrpc": "2.0",
            "method": "notifications/subscriptions/acknowledged",
            "params": {"notifications": {"taskIds": mine}, "_meta": meta},
        }
        last: dict[str, str] = {}
        while mine:
            for task_id in list(mine):
                run = await self.app.runtime.store.get_run(task_id)
                if run is None:
                    mine.remove(task_id)
                    continue
                task = await self.task(run)
                seen = json.dumps(task, sort_keys=True)
                if last.get(task_id) != seen:
                    last[task_id] = seen
                    yield {"jsonrpc": "2.0", "method": "notifications/tasks",
                           "params": {**task, "_meta": meta}}  # fmt: skip
                if run.status in FINISHED:
                    mine.remove(task_id)
            if mine:
                await self.app.runtime.wait_change(self.mcp.options.poll)
        yield _answer(rpc.id, {"_meta": {**meta, META_SERVER: self.server_info()}})


def _text(text: str) -> types.TextContent:
    return types.TextContent(type="text", text=text)


def _dump(result: types.CallToolResult) -> dict[str, Any]:
    data: dict[str, Any] = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    return data


def _iso(ts: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")
