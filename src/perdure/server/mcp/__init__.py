"""`perdure mcp`: workflows and agents as MCP tools that run as MCP tasks: spec 2025-11-25
(`server`) and, over HTTP on the same endpoint, 2026-07-28 with the tasks extension
(`stateless`), chosen per request (`transports.Revisions`).

Needs the `mcp` extra: `pip install 'perdure[mcp]'`. A task is a perdure run, so
it survives the server: a client that reconnects to any server on the same store,
even after the one it used was killed, can still poll the task and fetch its result.
"""

from __future__ import annotations

from .operator import OperatorTool, operator_tools, skill
from .server import McpOptions, PerdureMcp
from .tasks import TASK_PREFIX, status_of, task_of, tool_result
from .tools import WorkflowTool, tool_name, workflow_tools
from .transports import http_app, serve_http, serve_stdio

__all__ = [
    "TASK_PREFIX",
    "McpOptions",
    "OperatorTool",
    "PerdureMcp",
    "WorkflowTool",
    "http_app",
    "operator_tools",
    "serve_http",
    "serve_stdio",
    "skill",
    "status_of",
    "task_of",
    "tool_name",
    "tool_result",
    "workflow_tools",
]
