"""Event triggers: an event type starts a workflow, once per event id however often it arrives.

`App.on_event("invoice.paid")` maps a type to a workflow (an `EventTrigger`, kept with
the runtime's triggers); `App.emit(type, payload, event_id=...)` starts one run per
trigger of that type with the run id `event:{trigger}:{event_id}`, so a
redelivered event finds its run and starts nothing. With `run_id=`, the same
call delivers the event to that run instead (for a run parked in
`wait_event(type)`), deduplicated by the event id too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from ..engine.client import Client
from ..engine.triggers import TriggerStatus
from ..errors import ConfigError
from .ids import check_id
from .targets import check_one_argument

if TYPE_CHECKING:
    from ..engine.handles import Workflow
    from ..engine.runtime import Runtime


@dataclass(frozen=True)
class EventTrigger:
    """Runs of `workflow` for events of type `event_type`; each run gets the payload."""

    kind: ClassVar[str] = "event"
    name: str
    event_type: str
    workflow: str

    async def statuses(self, runtime: Runtime) -> list[TriggerStatus]:
        return [TriggerStatus("event", self.name, self.workflow, "ready",
                              detail=f"type {self.event_type}")]  # fmt: skip


@dataclass(frozen=True)
class Emitted:
    """What one emit did: the runs it started or found (ids), and which were new."""

    run_ids: list[str]
    started: list[str]


def add_event_trigger(
    runtime: Runtime,
    event_type: str,
    workflow: Workflow[..., Any] | str,
    *,
    name: str | None = None,
) -> EventTrigger:
    """Map `event_type` to `workflow` (which takes the event's payload as its one argument)."""
    wf_name = workflow if isinstance(workflow, str) else workflow.name
    check_id(event_type, "event type")
    where = f"event trigger for {event_type!r}"
    check_one_argument(runtime, wf_name, where, "the event's payload")
    trigger = EventTrigger(name or wf_name, event_type, wf_name)
    check_id(trigger.name, "trigger name")
    kept = runtime.triggers.find(EventTrigger, trigger.name)
    if kept is not None and kept != trigger:
        raise ConfigError(f"two event triggers are named {trigger.name!r}; pass name=... to one")
    return runtime.triggers.add(trigger)


def on_event(
    runtime: Runtime, event_type: str, *, name: str | None = None
) -> Callable[[Workflow[..., Any]], Workflow[..., Any]]:
    """Decorator over a workflow: each event of `event_type` starts one run of it."""

    def decorator(workflow: Workflow[..., Any]) -> Workflow[..., Any]:
        add_event_trigger(runtime, event_type, workflow, name=name)
        return workflow

    return decorator


async def emit(
    runtime: Runtime, event_type: str, payload: Any, *, event_id: str, run_id: str | None = None
) -> Emitted:
    """Start the runs `event_type` triggers (or deliver to `run_id`), once per `event_id`."""
    check_id(event_id, "event id")
    client = Client(runtime)
    if run_id is not None:
        await client.send_event(run_id, event_type, payload, key=event_id)
        return Emitted([run_id], [])
    known = runtime.triggers.of(EventTrigger).values()
    matching = [t for t in known if t.event_type == event_type]
    if not matching:
        types = sorted({t.event_type for t in known}) or ["none"]
        raise ConfigError(
            f"no trigger listens to event type {event_type!r} (known: {', '.join(types)}); "
            "pass --run RUN_ID (Python: run_id=...) to deliver it to one run"
        )
    ids: list[str] = []
    started: list[str] = []
    for trigger in matching:
        target = f"event:{trigger.name}:{event_id}"
        origin = {"event": trigger.name, "type": event_type, "id": event_id}
        run, created = await client.start_run(
            trigger.workflow, (payload,), {}, run_id=target, origin=origin
        )
        ids.append(run.id)
        if created:
            started.append(run.id)
    return Emitted(ids, started)
