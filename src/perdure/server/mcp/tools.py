"""MCP tools from an App's workflows and agents: their names, input schemas and arguments.

Each registered workflow is one tool whose input schema pydantic generates from
the workflow's parameter hints (a parameter with a default is optional); each
agent (`agent:{name}`) is one tool taking `{"prompt": str, "file"?: str}`.
perdure's own workflows (`perdure.plan`) are hidden unless asked for. Every tool
declares `execution.taskSupport = "optional"`: a task-augmented call returns at
once with a task, a plain call waits (bounded) for the result.
"""

from __future__ import annotations

import inspect
import re
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import mcp.types as types
from pydantic import ConfigDict, Field, TypeAdapter, create_model

from ...engine.registry import WorkflowDef
from ...errors import ConfigError

AGENT_PREFIX = "agent:"
BUILTIN_PREFIX = "perdure."
WORKFLOW_META = "perdure/workflow"  # the workflow a tool runs, in the tool's `_meta`
_INVALID = re.compile(r"[^A-Za-z0-9._-]")
_AGENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "prompt": {"type": "string", "description": "The task, in words."},
        "file": {"type": "string", "description": "A file for the agent to work on."},
    },
    "required": ["prompt"],
    "additionalProperties": False,
}


def tool_name(workflow: str) -> str:
    """The MCP name of a workflow: characters outside `A-Za-z0-9._-` become `_`
    (`agent:triage` → `agent_triage`), at most 128 of them."""
    return _INVALID.sub("_", workflow)[:128] or "_"


@dataclass(frozen=True)
class WorkflowTool:
    """One tool: the MCP tool definition and the workflow it starts."""

    workflow: str
    definition: WorkflowDef
    tool: types.Tool
    agent: bool = field(default=False)

    @property
    def name(self) -> str:
        return self.tool.name

    def arguments(self, given: Mapping[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        """The run's positional and keyword arguments from the call's JSON object.

        Type errors are found by `Client.start_run`, which checks the arguments
        against the workflow's signature and hints before anything is recorded.
        """
        if self.agent:
            unknown = sorted(set(given) - {"prompt", "file"})
            if unknown:
                raise ConfigError(f"tool {self.name!r}: unknown argument(s) {', '.join(unknown)}")
            if not isinstance(given.get("prompt"), str):
                raise ConfigError(f"tool {self.name!r}: 'prompt' (a string) is required")
            task = {"prompt": given["prompt"]}
            if given.get("file") is not None:
                task["file"] = str(given["file"])
            return [task], {}
        args: list[Any] = []
        kwargs: dict[str, Any] = dict(given)
        for param in self.definition.signature.parameters.values():
            if param.kind is inspect.Parameter.POSITIONAL_ONLY and param.name in kwargs:
                args.append(kwargs.pop(param.name))
            elif param.kind is inspect.Parameter.POSITIONAL_ONLY:
                break  # a later positional-only one cannot be given without this one
        return args, kwargs


def workflow_tools(
    workflows: Mapping[str, WorkflowDef],
    *,
    only: Iterable[str] = (),
    builtin: bool = False,
    descriptions: Mapping[str, str] | None = None,
) -> dict[str, WorkflowTool]:
    """The tools for `workflows`, by tool name.

    Args:
        only: expose just these workflows (by registered name); default all.
        builtin: also expose perdure's own workflows (`perdure.plan`).
        descriptions: a description per workflow name (e.g. an agent's goal).

    Raises:
        ConfigError: a name in `only` is not registered, or two workflows map to one tool name.
    """
    wanted = list(only)
    missing = sorted(set(wanted) - set(workflows))
    if missing:
        raise ConfigError(
            f"no workflow named {', '.join(map(repr, missing))} "
            f"(known: {', '.join(sorted(workflows)) or 'none'})"
        )
    tools: dict[str, WorkflowTool] = {}
    for name in sorted(workflows):
        if wanted and name not in wanted:
            continue
        if not builtin and not wanted and name.startswith(BUILTIN_PREFIX):
            continue
        made = make_tool(workflows[name], (descriptions or {}).get(name))
        clash = tools.get(made.name)
        if clash is not None:
            raise ConfigError(
                f"workflows {clash.workflow!r} and {name!r} both become MCP tool {made.name!r}; "
                "rename one (name=...)"
            )
        tools[made.name] = made
    return tools


def make_tool(definition: WorkflowDef, description: str | None = None) -> WorkflowTool:
    """The tool for one workflow (an agent's when its name starts with `agent:`)."""
    name = definition.name
    agent = name.startswith(AGENT_PREFIX)
    if agent:
        schema = dict(_AGENT_SCHEMA)
        text = description or f"Run the perdure agent {name[len(AGENT_PREFIX) :]!r} on a task."
    else:
        schema = input_schema(definition)
        doc = inspect.getdoc(definition.fn) or ""
        text = description or doc.split("\n\n", 1)[0].strip() or f"Run workflow {name!r}."
    text += " Runs durably as a perdure run; call it as a task to follow it across reconnects."
    tool = types.Tool(
        name=tool_name(name),
        title=name,
        description=text,
        inputSchema=schema,
        execution=types.ToolExecution(taskSupport=types.TASK_OPTIONAL),
        _meta={WORKFLOW_META: name},
    )
    return WorkflowTool(name, definition, tool, agent)


def input_schema(definition: WorkflowDef) -> dict[str, Any]:
    """The JSON schema of a workflow's arguments, as one object (pydantic, from the hints).

    `*args` cannot be given by name and is left out; `**kwargs` allows extra
    properties. A hint pydantic cannot describe is given as "any value".
    """
    fields: dict[str, Any] = {}
    extra = False
    for index, param in enumerate(definition.signature.parameters.values()):
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            continue
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            extra = True
            continue
        hint = definition.hints.get(param.name, Any)
        if not _describable(hint):
            hint = Any
        if param.default is inspect.Parameter.empty:
            info = Field(alias=param.name)
        else:
            info = Field(default=param.default, alias=param.name)
        fields[f"p{index}"] = (hint, info)  # aliases: any parameter name works, even `_x`
    model = create_model("Input", __config__=ConfigDict(arbitrary_types_allowed=True), **fields)
    with warnings.catch_warnings():  # a default that is not JSON is left out of the schema
        warnings.simplefilter("ignore")
        schema: dict[str, Any] = model.model_json_schema(by_alias=True)
    schema.pop("title", None)
    schema["additionalProperties"] = extra
    return schema


def _describable(hint: Any) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            TypeAdapter(hint).json_schema()
    except Exception:  # pydantic raises several kinds for types it cannot describe
        return False
    return True
