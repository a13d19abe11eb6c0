"""Triggers as the engine keeps them: one `Trigger` type, one registry per runtime, and the
status row `perdure triggers` shows for each.

A trigger starts runs without a person: a schedule, an event type, an inbox folder, a
webhook, a table change, a message source. Each kind is one class (in `perdure.triggers`,
or a user's own) with a `kind`, a `name` unique among the triggers of its class, and
`statuses(runtime)`; one that watches something also has `run(worker)`, which makes it a
`Service` every worker runs beside its runs. The engine knows no kind: it keeps them in
`Runtime.triggers`, runs their loops and lists them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ..errors import ConfigError, StoreError
from .services import Service

if TYPE_CHECKING:
    from .runtime import Runtime

log = logging.getLogger("perdure.triggers")

T = TypeVar("T", bound="Trigger")


@dataclass(frozen=True, slots=True)
class TriggerStatus:
    """One trigger as `perdure triggers` shows it.

    `lag` is in seconds: how far behind the trigger is (a schedule's due tick not yet
    fired, a table change's oldest change not yet turned into a run); None where the
    idea does not apply.
    """

    kind: str
    name: str
    workflow: str
    state: str
    lag: float | None = None
    last_error: str | None = None
    detail: str = ""  # what it watches: a cron, a folder, a path, a table
    pending: int | None = None  # occasions recorded but not yet turned into runs
    since: float | None = None  # when its state began, where known (a message trigger's)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Trigger(Protocol):
    """What starts runs without a person, as the registry keeps it."""

    @property
    def kind(self) -> str:
        """What it is: `schedule`, `inbox`, `webhook`, `event`, `table_change`, a broker's."""
        ...

    @property
    def name(self) -> str:
        """Its name (unique among the triggers of its class), as `perdure triggers` shows it."""
        ...

    async def statuses(self, runtime: Runtime) -> list[TriggerStatus]:
        """How it is doing now: one row (the scheduler: one per schedule in the store)."""
        ...


class Triggers:
    """The triggers of one runtime, in the order they were added."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._all: list[Trigger] = []

    def __iter__(self) -> Iterator[Trigger]:
        return iter(list(self._all))

    def __len__(self) -> int:
        return len(self._all)

    def add(self, trigger: T) -> T:
        """Keep `trigger` (a watching one runs in every worker started from now on); one equal
        to a kept trigger returns that one, another of its class and name is refused."""
        kept = self.find(type(trigger), trigger.name)
        if kept is not None:
            if kept == trigger:
                return kept
            raise ConfigError(
                f"two {trigger.kind} triggers are named {trigger.name!r}; pass name=... to one"
            )
        self._all.append(trigger)
        return trigger

    def of(self, cls: type[T]) -> dict[str, T]:
        """The triggers of class `cls` by name."""
        return {t.name: t for t in self._all if isinstance(t, cls)}

    def find(self, cls: type[T], name: str) -> T | None:
        """The trigger of class `cls` named `name`, or None."""
        return next((t for t in self._all if isinstance(t, cls) and t.name == name), None)

    def loops(self) -> list[Service]:
        """The triggers that watch something: each worker runs their `run(worker)`."""
        return [t for t in self._all if isinstance(t, Service)]

    async def statuses(self) -> list[TriggerStatus]:
        """Every trigger's rows: kinds in the order they were first added, names sorted
        within a kind. A `statuses()` that fails is its trigger's error row, never raised."""
        runtime = self.runtime
        await runtime.open_store()
        rows: list[TriggerStatus] = []
        for trigger in self:
            try:
                rows.extend(await trigger.statuses(runtime))
            except StoreError:
                raise  # the store failing is the listing's error, not one trigger's
            except Exception as exc:  # a broken status must not hide the other triggers
                log.warning("trigger %s %s: statuses() failed: %s", trigger.kind, trigger.name,
                            exc)  # fmt: skip
                rows.append(TriggerStatus(trigger.kind, trigger.name, "", "error", None,
                                          f"statuses() failed: {exc}"))  # fmt: skip
        order: dict[str, int] = {}
        for row in rows:
            order.setdefault(row.kind, len(order))
        return sorted(rows, key=lambda row: (order[row.kind], row.name))
