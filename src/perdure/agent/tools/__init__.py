"""Agent tools and their boundaries: typed functions with an effect and permissions, the
built-ins, MCP servers' tools, and the toolbox that offers only what the spec grants."""

from .base import Memory, Tool, ToolContext, ToolEffect, ToolFailed, tool
from .boundary import Boundary, ToolRefused
from .builtins import BUILTINS, builtin_tools, gate_event
from .registry import PreparedCall, Refusal, Toolbox

__all__ = [
    "BUILTINS",
    "Boundary",
    "Memory",
    "PreparedCall",
    "Refusal",
    "Tool",
    "ToolContext",
    "ToolEffect",
    "ToolFailed",
    "ToolRefused",
    "Toolbox",
    "builtin_tools",
    "gate_event",
    "tool",
]
