"""Definitions of registered steps and workflows: the function plus its declared policy."""

from __future__ import annotations

import hashlib
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .effects import RECOVERY, Effect
from .pace import Pace
from .retention import Retention
from .retry import Retry

if TYPE_CHECKING:
    from .probes import Probe


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn)
    except Exception:  # unresolvable forward references: fall back to plain JSON
        return {}


@dataclass(slots=True)
class StepDef:
    """A step: a function whose outcome is journaled, with its effect and retry policy."""

    name: str
    fn: Callable[..., Any]
    effect: Effect
    retry: Retry
    timeout: float | None
    commit: bool = False  # commit the outcome before the workflow goes on (see App.step)
    probe: Probe | None = None  # a once step's question to the world on recovery (probes.py)
    is_async: bool = field(init=False)
    return_hint: Any = field(init=False)
    # its outcome is committed before the next step runs: a `once` step's (losing it would
    # park the run), or a `commit=True` step's (re-running it is costly)
    commit_first: bool = field(init=False)
    where: str = field(init=False)  # how errors name it: "step 'name'"
    result_where: str = field(init=False)
    pace: Pace = field(init=False, default_factory=Pace, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.is_async = inspect.iscoroutinefunction(self.fn)
        self.return_hint = _hints(self.fn).get("return")
        self.commit_first = self.effect == "once" or self.commit
        self.where = f"step {self.name!r}"
        self.result_where = f"{self.where} result"

    @property
    def recovery(self) -> str:
        return RECOVERY[self.effect]


@dataclass(slots=True)
class WorkflowDef:
    """A workflow: a function whose progress is durable, and the code version it carries."""

    name: str
    fn: Callable[..., Any]
    version: str
    deadline: float | None
    retention: Retention | None = None
    queue: str = "default"
    upgrade: str = "auto"  # runs of another version: "auto", "pinned", "latest" (versions.py)
    is_async: bool = field(init=False)
    signature: inspect.Signature = field(init=False)
    hints: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        self.is_async = inspect.iscoroutinefunction(self.fn)
        self.signature = inspect.signature(self.fn)
        self.hints = _hints(self.fn)
        if not self.version:
            self.version = source_version(self.fn)


def typed_arguments(
    definition: WorkflowDef, args: list[Any], kwargs: dict[str, Any], where: str
) -> tuple[list[Any], dict[str, Any]]:
    """Rebuild a workflow's arguments from their JSON form using its parameter hints."""
    from .codec import from_json

    params = list(definition.signature.parameters.values())
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    typed = [
        from_json(
            value, definition.hints.get(params[i].name), f"{where}, argument {params[i].name}"
        )
        if i < len(params) and params[i].kind in positional
        else value
        for i, value in enumerate(args)
    ]
    named = {
        k: from_json(v, definition.hints.get(k), f"{where}, argument {k}")
        for k, v in kwargs.items()
    }
    return typed, named


def source_version(fn: Callable[..., Any]) -> str:
    """A short hash of a function's source: the default code version of a workflow."""
    try:
        text = inspect.getsource(fn)
    except (OSError, TypeError):
        text = getattr(fn, "__qualname__", repr(fn))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def qualified_name(fn: Callable[..., Any]) -> str:
    """The default registered name of a function: its `__qualname__` (module-independent)."""
    return str(getattr(fn, "__qualname__", getattr(fn, "__name__", repr(fn))))
