"""The agent's task spec: a TOML file read into checked pydantic models.

An error names the file, the line and the field (`spec.toml:12: limits.max_iterations:
Input should be greater than 0`), so `perdure validate` points at what to fix.
Relative paths in the spec are relative to the spec's folder.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import sys
import tomllib
from collections.abc import Callable, Iterable, Mapping
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ..errors import ConfigError
from .providers.registry import PROVIDERS, provider_class


class SpecProblems(ConfigError):
    """Raised when a spec has problems: every one of them, each `file:line: field: message`."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)\s*$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Price(_Strict):
    """Per million tokens, in the spec's currency."""

    input_per_mtok: float = Field(0.0, ge=0)
    output_per_mtok: float = Field(0.0, ge=0)

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        return (input_tokens * self.input_per_mtok + output_tokens * self.output_per_mtok) / 1e6


class ModelSpec(_Strict):
    """One model tier: who serves it and what it costs."""

    provider: str  # a name of providers.registry.PROVIDERS
    model: str = ""
    base_url: str | None = None
    api_key_env: str | None = None  # the variable holding the key (never the key itself)
    context_tokens: int = Field(4096, gt=0)
    max_tokens: int | None = Field(None, gt=0)
    temperature: float | None = Field(None, ge=0, le=2)
    stop: list[str] = []  # sequences that end an answer (e.g. "\n\n": one paragraph)
    stream: bool = False
    # seconds the server may stay silent (a whole reply unless streamed) / to connect;
    # None: the provider's default (its class's default_timeout, CONNECT_TIMEOUT)
    timeout: float | None = Field(None, gt=0, allow_inf_nan=False)
    connect_timeout: float | None = Field(None, gt=0, allow_inf_nan=False)
    price: Price = Price()
    script: str | None = None  # scripted: a JSON/JSONL file of responses
    latency: float = Field(0.0, ge=0, le=60)  # scripted: seconds per answer, like a real model

    @field_validator("provider", mode="before")
    @classmethod
    def _registered(cls, value: Any) -> Any:
        """A registered provider's name, refused in the words pydantic uses for a Literal."""
        if isinstance(value, str) and value in PROVIDERS:
            return value
        raise PydanticCustomError(
            "literal_error", "Input should be {expected}", {"expected": _either(PROVIDERS)}
        )


class Routing(_Strict):
    """Which tier answers: `default` first; after `escalate_after_failures` failed
    iterations on a tier (a refused or failing tool call, a rejected answer, a model
    error), the next tier of `escalate` (by default `strong`, if the spec has one)."""

    default: str = "fast"
    escalate_after_failures: int | None = Field(None, gt=0)
    escalate: list[str] = []

    def order(self) -> list[str]:
        """The tiers in the order they are tried."""
        later = self.escalate or (["strong"] if self.escalate_after_failures else [])
        return [self.default, *(t for t in later if t != self.default)]


class McpServerSpec(_Strict):
    name: str
    command: str | None = None
    args: list[str] = []
    url: str | None = None
    effect: Literal["once", "keyed", "idempotent", "read"] = "once"
    grant: list[str] = ["*"]


class ToolEffectSpec(_Strict):
    """What recovery does with an interrupted call of one tool (`[tools.effects]`):

        [tools.effects]
        issue_refund = { effect = "once", probe = "find_refund" }
        send_email = { effect = "once", on_interrupt = "tell_model" }
        files__write = "idempotent"

    `effect` overrides the tool's own (an MCP server's default for its tools). A `once`
    tool may name a `probe`: another granted `read` tool of the agent, called with the
    interrupted call's arguments (those it declares), whose result is read as JSON:
    `{"done": true, "value": ...}` (the call happened; `value` is what the model is told it
    returned), `{"done": false}` (it did not: the call runs again), anything else (cannot
    tell: the run waits for a person); or a Python `module:function` called with the same
    arguments and returning a `perdure.ProbeAnswer`. A `once` tool without a probe may say
    `on_interrupt = "tell_model"`: the model is told (a journaled tool result) that the call
    was cut off and its outcome is unknown, and the run goes on instead of parking; the
    model may act again, so grant it a read tool to check with first."""

    effect: Literal["once", "keyed", "idempotent", "read"] | None = None
    probe: str | None = Field(None, min_length=1)
    probe_timeout: float | None = Field(None, gt=0, allow_inf_nan=False)
    on_interrupt: Literal["park", "tell_model"] = "park"

    @model_validator(mode="before")
    @classmethod
    def _effect_alone(cls, value: Any) -> Any:
        """`tool = "once"` is `tool = { effect = "once" }`."""
        return {"effect": value} if isinstance(value, str) else value

    @property
    def asks(self) -> bool:
        """Whether recovery asks something (a probe, or the model) before parking."""
        return self.probe is not None or self.on_interrupt == "tell_model"


class ToolsSpec(_Strict):
    """Deny by default: only `grant`ed tools are offered, within these boundaries."""

    grant: list[str] = []
    effects: dict[str, ToolEffectSpec] = {}  # by tool name (MCP: SERVER__TOOL)
    read_paths: list[str] = []
    write_paths: list[str] = []
    commands: list[str] = []
    hosts: list[str] = []
    approval: list[str] = []  # tools needing a human's approval per call ("*": all destructive)
    mcp: list[McpServerSpec] = []


class Acceptance(_Strict):
    """When the run is done: the answer is grounded in the task's file (every number,
    date, time, amount and name in it occurs there; not cut off; within the length
    bounds), and/or a shell command exits 0, or a Python `module:function` holds."""

    grounded: bool = False
    facts_first: bool = False  # the model lists the file's facts, checked, then writes
    min_chars: int = Field(1, ge=0)
    max_chars: int | None = Field(None, gt=0)
    command: str | None = None
    python: str | None = None
    timeout: float = Field(60.0, gt=0)


class Limits(_Strict):
    max_iterations: int = Field(20, gt=0)
    deadline: str | None = None  # e.g. "30m", "2h"
    max_tokens_per_call: int | None = Field(None, gt=0)
    max_tokens: int | None = Field(None, gt=0)  # per run
    max_cost: float | None = Field(None, gt=0)  # per run
    repeat_failures: int = Field(3, gt=0)  # the same failing tool call this often stops the loop

    @field_validator("deadline")
    @classmethod
    def _duration(cls, value: str | None) -> str | None:
        if value is not None:
            duration(value)
        return value


class BudgetSpec(_Strict):
    """Spending across all runs of the agent, per rolling hour/day (None: unlimited), and
    `shared`: the name of a budget it shares with other agents (a team's, a tenant's), whose
    limits are set with `perdure budget --shared NAME`."""

    tokens_per_hour: int | None = Field(None, gt=0)
    tokens_per_day: int | None = Field(None, gt=0)
    cost_per_hour: float | None = Field(None, gt=0)
    cost_per_day: float | None = Field(None, gt=0)
    shared: str | None = Field(None, pattern=r"^[A-Za-z0-9_.:-]{1,64}$")


class TriggerSpec(_Strict):
    """What starts runs of the agent (at most one kind)."""

    inbox: str | None = None
    pattern: str = "*"
    stable: float = Field(1.0, ge=0)
    cron: str | None = None
    every: float | None = Field(None, gt=0)
    tz: str = "UTC"
    event: str | None = None
    webhook: str | None = None
    secret_env: str | None = None


class MemorySpec(_Strict):
    """Long-term memory (`enabled`), and whose progress notes a run sees in its prompt:
    `task` those of earlier runs of the same task (file or prompt), `agent` all of the
    agent's (shared notes), `off` none."""

    enabled: bool = True
    recall_limit: int = Field(5, gt=0)
    notes: Literal["task", "agent", "off"] = "task"


class WorkspaceSpec(_Strict):
    """A git working directory: PROGRESS.md kept there, each finished iteration committed."""

    path: str
    git: bool = True


class OutputSpec(_Strict):
    """Where a run's final answer is written when the model answers in text (no tool call):
    `path` and `template` may use {stem}, {name} (of the task's file), {source}, {time},
    {answer}, {run_id}, {tier}, {model}; `template` also {facts}: up to five facts of the
    file the answer does not state, as a list after a blank line (with
    `acceptance.facts_first` the model's checked facts first, then the file's own lines
    that name the most facts; empty when the answer states them all)."""

    path: str
    template: str = "{answer}\n\n---\nsource: {source}\nwritten: {time} by run {run_id}\n"


class AgentSpec(_Strict):
    """A whole agent: its goal, models, tools and limits; every key: docs/reference/spec.md."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    goal: str
    instructions: str = ""
    models: dict[str, ModelSpec]
    routing: Routing = Routing()
    tools: ToolsSpec = ToolsSpec()
    acceptance: Acceptance = Acceptance()
    limits: Limits = Limits()
    budget: BudgetSpec = BudgetSpec()
    trigger: TriggerSpec | None = None
    memory: MemorySpec = MemorySpec()
    workspace: WorkspaceSpec | None = None
    output: OutputSpec | None = None

    # not in the file: where it came from, to resolve relative paths and name lines
    folder: Path = Field(default=Path("."), exclude=True)
    file: Path | None = Field(default=None, exclude=True)

    def path(self, relative: str) -> Path:
        """A path of the spec, relative to the spec's folder."""
        return (self.folder / relative).resolve()

    def workdir(self) -> Path:
        """Where the paths the model gives start and its commands run: the workspace if
        the spec has one, else the spec's folder (where `read_paths` are named from, so
        `tickets/t1.txt` means the same to the spec and to the model)."""
        return self.path(self.workspace.path if self.workspace is not None else ".")

    def tier(self, name: str) -> ModelSpec:
        return self.models[name]


def _either(names: Iterable[str], quote: bool = True) -> str:
    """'a', 'b' or 'c' (or a, b or c)."""
    shown = [repr(n) if quote else n for n in names]
    return " or ".join(filter(None, (", ".join(shown[:-1]), shown[-1]))) if shown else ""


def duration(text: str) -> float:
    """Seconds in "90s", "30m", "2h", "1d"."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a duration like 90s, 30m, 2h or 1d")
    unit = {"s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]
    return float(match.group(1)) * unit


def _line_of(text: str, loc: tuple[Any, ...]) -> int | None:
    """The line where the field at `loc` is written (or its table starts), if found."""
    lines = text.splitlines()
    keys = [str(k) for k in loc if not isinstance(k, int)]
    section_line = 0
    for depth in range(len(keys) - 1, 0, -1):  # the deepest [table] header present
        header = re.compile(r"^\s*\[+\s*" + re.escape(".".join(keys[:depth])) + r"\s*\]+\s*$")
        for i, line in enumerate(lines):
            if header.match(line):
                section_line = i + 1
                break
        if section_line:
            break
    if keys:
        key = re.compile(r"^\s*" + re.escape(keys[-1]) + r"\s*=")
        for i in range(section_line, len(lines)):
            if key.match(lines[i]):
                return i + 1
    return section_line or None


def load_spec(path: str | Path) -> AgentSpec:
    """Read and check a spec file; SpecProblems (a ConfigError) with every problem as
    file:line: field: message otherwise."""
    spec, text = _parse(Path(path))
    problems = _reference_problems(spec, Path(path), text)
    if problems:
        raise SpecProblems(problems)
    return spec


def validate_spec(path: str | Path, tools: Iterable[str]) -> AgentSpec:
    """Everything `perdure validate` checks, every problem at once (SpecProblems): the
    fields, the rules across them, the grants against `tools` and the MCP servers'
    commands, which must exist where the agent starts them (its spec's folder)."""
    spec, text = _parse(Path(path))
    problems = _reference_problems(spec, Path(path), text)
    problems += grant_problems(spec, tools) + mcp_problems(spec)
    if not problems:
        try:
            check_effects(spec, _effects_of(tools))
        except ConfigError as exc:
            problems.append(str(exc))
    if problems:
        raise SpecProblems(problems)
    return spec


def mcp_problems(spec: AgentSpec) -> list[str]:
    """An MCP server whose command cannot be found: on PATH, or (with a slash) from the
    spec's folder, where the agent starts it."""
    problems = []
    text = _text_of(spec)
    for i, server in enumerate(spec.tools.mcp):
        command = server.command
        if command is None:
            continue
        if "/" in command:
            found = os.access(spec.path(command), os.X_OK) and spec.path(command).is_file()
        else:
            found = shutil.which(command) is not None
        if not found:
            line = _line_of(text, ("tools", "mcp", i, "command")) if text else None
            where = f"{spec.file}:{line}" if line else str(spec.file or spec.name)
            problems.append(
                f"{where}: tools.mcp.{i}.command: MCP server {server.name!r}: no command "
                f"{command!r} " + ("from " + str(spec.folder) if "/" in command else "on PATH")
            )
    return problems


def _parse(file: Path) -> tuple[AgentSpec, str]:
    """The spec's fields checked one by one (SpecProblems for every one that fails)."""
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read the spec ({exc.strerror})") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: not valid TOML: {exc}") from None
    try:
        spec = AgentSpec.model_validate(data)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            loc = tuple(error["loc"])
            field = ".".join(str(k) for k in loc) or "(top)"
            line = _line_of(text, loc)
            where = f"{file}:{line}" if line else str(file)
            problems.append(f"{where}: {field}: {error['msg']}")
        raise SpecProblems(problems) from None
    spec.folder = file.resolve().parent
    spec.file = file
    return spec, text


def _text_of(spec: AgentSpec) -> str:
    if spec.file is None:
        return ""
    try:
        return spec.file.read_text(encoding="utf-8")
    except OSError:
        return ""


def _reference_problems(spec: AgentSpec, file: Path, text: str) -> list[str]:
    """Cross-field rules pydantic cannot see (tiers exist, one trigger kind, one
    acceptance): every one broken, in the file's order."""
    problems: list[str] = []

    def fail(loc: tuple[str, ...], message: str) -> None:
        line = _line_of(text, loc)
        where = f"{file}:{line}" if line else str(file)
        problems.append(f"{where}: {'.'.join(loc)}: {message}")

    if not spec.models:
        fail(("models",), "define at least one model tier, e.g. [models.fast]")
    for field_loc, tier in ((("routing", "default"), spec.routing.default),):
        if tier not in spec.models:
            fail(field_loc, f"no model tier {tier!r} (tiers: {', '.join(spec.models)})")
    routing = spec.routing
    if routing.escalate and routing.escalate_after_failures is None:
        fail(("routing", "escalate"), "say after how many failures: escalate_after_failures")
    for tier in routing.order()[1:]:
        if tier not in spec.models:
            field_name = "escalate" if routing.escalate else "escalate_after_failures"
            fail(("routing", field_name),
                       f"no model tier {tier!r} (tiers: {', '.join(spec.models)})")  # fmt: skip
    for name, model in spec.models.items():
        builtin = (model.script or "").startswith("builtin:")
        if model.script is not None and not builtin and not spec.path(model.script).is_file():
            fail(("models", name, "script"), f"no file {model.script!r}")
        provider = provider_class(model.provider)
        if provider.default_timeout is None:
            networked = [p for p in PROVIDERS if provider_class(p).default_timeout is not None]
            for field_name in ("timeout", "connect_timeout"):
                if getattr(model, field_name) is not None:
                    fail(("models", name, field_name),
                               f"a {model.provider} tier makes no network call; set it on "
                               f"{_either(networked, quote=False)} tiers")  # fmt: skip
        if provider.needs_model and not model.model:
            fail(("models", name, "model"), 'name the model, e.g. model = "gpt-4o-mini"')
    costed = [k for k in ("cost_per_hour", "cost_per_day") if getattr(spec.budget, k)]
    costed += ["max_cost"] if spec.limits.max_cost is not None else []
    for name in [t for t in routing.order() if t in spec.models] if costed else ():
        price = spec.models[name].price
        if not price.input_per_mtok and not price.output_per_mtok:
            fail(("models", name, "price"),
                       f"a cost limit is set ({costed[0]}) but this tier has no price, so its "
                       "calls would cost nothing against it; set price = { input_per_mtok = "
                       "..., output_per_mtok = ... }")  # fmt: skip
    for tool_name, entry in spec.tools.effects.items():
        loc = ("tools", "effects", tool_name)
        if entry.effect not in (None, "once") and entry.asks:
            what = "a probe" if entry.probe is not None else "on_interrupt"
            fail(loc, f"{what} is for once tools; a {entry.effect} call is simply run "
                       "again by recovery")  # fmt: skip
        if entry.probe is not None and entry.on_interrupt == "tell_model":
            fail(loc, "give a probe or on_interrupt = \"tell_model\", not both "
                       "(the model is told only when there is no probe)")  # fmt: skip
        if entry.probe_timeout is not None and entry.probe is None:
            fail(loc, "probe_timeout without a probe")
        if entry.probe == tool_name:
            fail(loc, "a tool cannot be its own probe: name a read tool that looks "
                       "the effect up")  # fmt: skip
    acceptance = spec.acceptance
    if acceptance.command is not None and acceptance.python is not None:
        fail(("acceptance", "python"), "give command or python, not both")
    if acceptance.python is not None and ":" not in acceptance.python:
        fail(("acceptance", "python"), "write it as module:function")
    trigger = spec.trigger
    if trigger is not None:
        kinds = [k for k in ("inbox", "cron", "every", "event", "webhook") if getattr(trigger, k)]
        if len(kinds) > 1 and set(kinds) != {"cron"}:
            fail(("trigger", kinds[1]), f"one trigger kind per agent (also {kinds[0]})")
        if trigger.webhook and not trigger.secret_env:
            fail(("trigger", "webhook"), 'a webhook needs secret_env = "VARIABLE"')
    return problems


def check_grants(spec: AgentSpec, tools: Iterable[str] | Mapping[str, str]) -> None:
    """Refuse a `tools.grant` entry that names no tool (see `grant_problems`), then a
    `[tools.effects]` entry that cannot work (see `check_effects`).

    Raises:
        SpecProblems: file:line: tools.grant: the entry, the known tools and the MCP servers.
    """
    problems = grant_problems(spec, tools)
    if problems:
        raise SpecProblems(problems)
    check_effects(spec, _effects_of(tools))


def grant_problems(spec: AgentSpec, tools: Iterable[str] | Mapping[str, str]) -> list[str]:
    """Every `tools.grant` entry that names no tool: not one of `tools` (the built-in
    tools, and any the agent is given in Python), and not `SERVER__TOOL` of a declared MCP
    server (whose tools are only known once it runs). A pattern (`"*"`, `"gh__*"`) must
    match at least one of these."""
    known = sorted(set(tools))
    servers = [m.name for m in spec.tools.mcp]
    problems = []
    text = _text_of(spec)
    for entry in spec.tools.grant:
        server, sep, _ = entry.partition("__")
        if any(fnmatchcase(name, entry) for name in known):
            continue
        if sep and any(fnmatchcase(name, server) for name in servers):
            continue
        line = _line_of(text, ("tools", "grant")) if text else None
        where = f"{spec.file}:{line}" if line else str(spec.file or spec.name)
        mcp = (
            f"MCP servers: {', '.join(servers)} (grant their tools as SERVER__TOOL)"
            if servers
            else "no MCP servers declared"
        )
        problems.append(
            f"{where}: tools.grant: no tool {entry!r} (known tools: {', '.join(known)}; {mcp})"
        )
    return problems


def _effects_of(tools: Iterable[str] | Mapping[str, str]) -> dict[str, str]:
    """Tool names with their effects: as given, or the built-in tools' own ('' unknown)."""
    if isinstance(tools, Mapping):
        return dict(tools)
    from .tools.builtins import builtin_tools

    builtin = {t.name: t.effect for t in builtin_tools()}
    return {name: builtin.get(name, "") for name in tools}


def _spec_line(spec: AgentSpec, loc: tuple[str, ...]) -> str:
    text = ""
    if spec.file is not None:
        try:
            text = spec.file.read_text(encoding="utf-8")
        except OSError:
            text = ""
    line = _line_of(text, loc) if text else None
    return f"{spec.file}:{line}" if line else str(spec.file or spec.name)


# read tools that cannot look anything up: answering, asking a person
_NOT_CHECKS = ("finish", "ask_human")


def check_effects(spec: AgentSpec, tools: Mapping[str, str]) -> None:
    """Refuse a `[tools.effects]` entry that cannot work: it names no tool; it gives a probe
    or `on_interrupt` to a tool whose effect is not `once`; its probe is not a granted
    `read` tool of the agent nor an importable `module:function`; it tells the model of an
    interrupted call although the agent has no read tool to check with. `tools`: the known
    tools' effects by name ('' unknown); an MCP server's tools (SERVER__TOOL) are known by
    the server's declaration.

    Raises:
        ConfigError: file:line: tools.effects.TOOL: what is wrong, in one line.
    """
    servers = {m.name: m for m in spec.tools.mcp}
    grants = [*spec.tools.grant, *(f"{m.name}__{g}" for m in spec.tools.mcp for g in m.grant)]

    def effect_of(name: str) -> str | None:
        """The effect calls of `name` run with; None: no such tool."""
        entry = spec.tools.effects.get(name)
        if entry is not None and entry.effect is not None and _exists(name):
            return entry.effect
        if name in tools:
            return tools[name]
        server, sep, _ = name.partition("__")
        return servers[server].effect if sep and server in servers else None

    def _exists(name: str) -> bool:
        server, sep, _ = name.partition("__")
        return name in tools or bool(sep and server in servers)

    def granted(name: str) -> bool:
        return any(fnmatchcase(name, pattern) for pattern in grants)

    for name, entry in spec.tools.effects.items():
        loc = ("tools", "effects", name)

        def fail(message: str, loc: tuple[str, ...] = loc) -> ConfigError:
            return ConfigError(f"{_spec_line(spec, loc)}: {'.'.join(loc)}: {message}")

        effect = effect_of(name)
        if effect is None:
            raise fail(f"no tool {name!r} (known tools: {', '.join(sorted(tools))}; MCP "
                       "tools are named SERVER__TOOL)")  # fmt: skip
        if entry.asks and effect not in ("once", ""):
            what = "a probe" if entry.probe is not None else "on_interrupt"
            raise fail(f"{what} is for once tools, and {name!r} is {effect} (recovery runs "
                       "it again)")  # fmt: skip
        if entry.probe is not None and ":" in entry.probe:
            probe_function(spec, entry.probe, fail)
        elif entry.probe is not None:
            probe, found = entry.probe, effect_of(entry.probe)
            if found is None:
                raise fail(f"probe {probe!r} is no tool of the agent (a granted read tool, "
                           "or module:function)")  # fmt: skip
            if not granted(probe):
                raise fail(f"probe {probe!r} is not granted: add it to tools.grant")
            if found not in ("read", ""):
                raise fail(f"probe {probe!r} is {found}; a probe only reads: declare a read "
                           "tool (or give it effect = \"read\" here if it only reads)")  # fmt: skip
        if entry.on_interrupt == "tell_model":
            readers = [t for t in [*tools, *spec.tools.effects] if granted(t)
                       and effect_of(t) == "read" and t not in _NOT_CHECKS]  # fmt: skip
            readers += [m.name for m in spec.tools.mcp if m.effect == "read" and m.grant]
            if not readers:
                raise fail("on_interrupt = \"tell_model\" needs a granted read tool to "
                           "check the outcome with; grant one (or give a probe)")  # fmt: skip


def probe_function(
    spec: AgentSpec, text: str, fail: Callable[[str], ConfigError]
) -> Callable[..., Any]:
    """The function a `module:function` probe names, imported (the spec's folder is on the
    import path, after what is there already)."""
    module_name, _, attr = text.partition(":")
    folder = str(spec.folder)
    if folder not in sys.path:
        sys.path.append(folder)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise fail(f"probe {text!r}: cannot import {module_name!r}: {exc}") from None
    found = getattr(module, attr, None)
    if not callable(found):
        raise fail(f"probe {text!r}: {module_name!r} has no function {attr!r}")
    definition = getattr(found, "definition", None)  # a registered perdure step
    if definition is not None and definition.effect != "read":
        raise fail(f"probe {text!r} is a {definition.effect} step; a probe only reads")
    return found  # type: ignore[no-any-return]


def deadline_seconds(spec: AgentSpec) -> float | None:
    return None if spec.limits.deadline is None else duration(spec.limits.deadline)
