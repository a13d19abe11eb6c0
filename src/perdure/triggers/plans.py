"""Plans: one long goal as ordered batches of runs, batch k+1 started when batch k is done.

A plan is itself a durable run (of the built-in workflow `perdure.plan`) whose
children are the batch's runs, so it survives crashes and restarts like any
run: a finished batch is never started again. After a batch, an optional check
workflow receives (batch index, results) and must return true; a batch with a
failed run or a failed check stops the plan (`on_failure="stop"`, the plan run
fails naming them) or is recorded and passed (`"continue"`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, PerdureError, RunFailed

if TYPE_CHECKING:
    from ..engine.handles import RunHandle, Workflow
    from ..engine.runtime import Runtime

PLAN_WORKFLOW = "perdure.plan"
ON_FAILURE = ("stop", "continue")

Item = tuple[Any, ...] | dict[str, Any] | str  # (workflow, args[, kwargs]) or {...} or "name"


class PlanStopped(PerdureError):
    """A plan's batch had a failed run or check, and the plan's policy is to stop."""


def _name(workflow: Workflow[..., Any] | str) -> str:
    return workflow if isinstance(workflow, str) else workflow.name


def _item(runtime: Runtime, item: Item, where: str) -> dict[str, Any]:
    """One run of a batch in the plan's JSON form, checked against its workflow now."""
    workflow: Any
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    if isinstance(item, str) or hasattr(item, "definition"):
        workflow = item
    elif isinstance(item, dict):
        workflow, args, kwargs = item.get("workflow"), item.get("args", []), item.get("kwargs", {})
    elif isinstance(item, tuple) and 1 <= len(item) <= 3:
        workflow = item[0]
        args = list(item[1]) if len(item) > 1 else []
        kwargs = dict(item[2]) if len(item) > 2 else {}
    else:
        raise ConfigError(f"{where}: give (workflow, args, kwargs), a dict, or a workflow name")
    if not isinstance(workflow, str) and not hasattr(workflow, "definition"):
        raise ConfigError(f"{where}: {workflow!r} is not a workflow or a workflow's name")
    name = _name(workflow)
    definition = runtime.workflows.get(name)
    if definition is None:
        raise ConfigError(f"{where}: no workflow named {name!r} is registered")
    try:
        definition.signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise ConfigError(f"{where}: workflow {name!r}: {exc}") from None
    return {"workflow": name, "args": list(args), "kwargs": dict(kwargs)}


def make_spec(
    runtime: Runtime,
    batches: Sequence[Sequence[Item]],
    check: Workflow[..., Any] | str | None,
    on_failure: str,
) -> dict[str, Any]:
    if on_failure not in ON_FAILURE:
        raise ConfigError(f"plan: on_failure={on_failure!r}; use stop or continue")
    if not batches or any(not batch for batch in batches):
        raise ConfigError("plan: give at least one batch, and at least one run in each")
    spec_batches = [
        [_item(runtime, item, f"plan batch {k} item {i}") for i, item in enumerate(batch)]
        for k, batch in enumerate(batches)
    ]
    check_name = None
    if check is not None:
        check_name = _name(check)
        definition = runtime.workflows.get(check_name)
        if definition is None:
            raise ConfigError(f"plan check: no workflow named {check_name!r} is registered")
        try:
            definition.signature.bind(0, [])
        except TypeError:
            raise ConfigError(
                f"plan check {check_name!r} must take (batch index, list of results)"
            ) from None
    return {"batches": spec_batches, "check": check_name, "on_failure": on_failure}


def register(runtime: Runtime) -> None:
    """Register the built-in plan workflow, so every worker of the app can run plans."""
    from ..engine.handles import Workflow

    @runtime.workflow(name=PLAN_WORKFLOW)
    async def plan(spec: dict[str, Any]) -> dict[str, Any]:
        report: list[dict[str, Any]] = []
        for k, batch in enumerate(spec["batches"]):
            handles = []
            for item in batch:
                child: Workflow[..., Any] = Workflow(runtime, runtime.workflows[item["workflow"]])
                handles.append(await child.start(*item["args"], **item["kwargs"]))
            results: list[Any] = []
            failed: list[str] = []
            for handle in handles:
                try:
                    results.append(await handle.result())
                except RunFailed:
                    results.append(None)
                    failed.append(handle.id)
            passed: bool | None = None
            if not failed and spec["check"] is not None:
                checker: Workflow[..., Any] = Workflow(runtime, runtime.workflows[spec["check"]])
                passed = bool(await checker(k, results))
            report.append(
                {"batch": k, "runs": [h.id for h in handles], "failed": failed, "check": passed}
            )
            if (failed or passed is False) and spec["on_failure"] == "stop":
                why = (
                    f"{len(failed)} run(s) failed: {', '.join(failed)}"
                    if failed
                    else (f"check {spec['check']!r} returned false")
                )
                raise PlanStopped(
                    f"plan stopped at batch {k} of {len(spec['batches'])}: {why}; "
                    f"report {json.dumps(report, separators=(',', ':'))}"
                )
        troubled = any(b["failed"] or b["check"] is False for b in report)
        return {"status": "completed_with_failures" if troubled else "completed",
                "batches": report}  # fmt: skip

    del plan


def start(
    runtime: Runtime,
    name: str,
    batches: Sequence[Sequence[Item]],
    *,
    check: Workflow[..., Any] | str | None = None,
    on_failure: str = "stop",
) -> RunHandle:
    """Start (or find) the plan run `plan:{name}`: each batch's runs (items `(workflow,
    args, kwargs)`, a dict, or a workflow) start once the previous batch finished and its
    `check(index, results)` returned true; `on_failure`: `stop` or `continue`."""
    from ..engine.client import Client
    from ..engine.handles import RunHandle

    spec = make_spec(runtime, batches, check, on_failure)
    client = Client(runtime)
    start = client.start(PLAN_WORKFLOW, (spec,), run_id=f"plan:{name}", origin={"plan": name})
    run = runtime.sync(start, "App.plan()")
    return RunHandle(client, run.id)
