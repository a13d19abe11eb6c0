"""Handles on workflows and runs: start a run (or a child run inside a workflow), ask a run's
status, wait for its result, signal it. Each holds the `Runtime` and a `Client` over it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from typing import Any, Generic, ParamSpec, TypeVar

from ..errors import ConfigError
from ..store.blobs import in_row_or_blob
from ..store.names import check_run_id
from .client import Client, encode_input, origin_entry
from .context import current
from .durable import child_result
from .registry import WorkflowDef
from .retry import seconds
from .runtime import Runtime
from .streams import StreamChunk, follow, follow_sync

P = ParamSpec("P")
R = TypeVar("R")


class RunHandle:
    """A run, by id: ask its status, wait for its result, signal it. A run that continued as
    a new one (`continue_as_new`) stands for its lineage: each call reaches the last run."""

    def __init__(self, client: Client, run_id: str) -> None:
        self.client = client
        self.id = run_id

    def __repr__(self) -> str:
        return f"RunHandle({self.id!r})"

    def _sync(self, coro: Any, what: str) -> Any:
        return self.client.runtime.sync(coro, what)

    def status(self) -> str:
        return self._sync(self.status_async(), "RunHandle.status()")  # type: ignore[no-any-return]

    async def status_async(self) -> str:
        return (await self.client.latest(self.id)).status

    def latest(self) -> str:
        """The id of the lineage's last run (this run's id unless it continued as new)."""
        return self._sync(self.latest_async(), "RunHandle.latest()")  # type: ignore[no-any-return]

    async def latest_async(self) -> str:
        return (await self.client.latest(self.id)).id

    def result(self, timeout: float | timedelta | None = None) -> Any:
        """Block until the run finishes: its result, or `RunFailed`; `WaitTimeout` on timeout."""
        return self._sync(self.result_async(timeout), "RunHandle.result()")

    async def result_async(self, timeout: float | timedelta | None = None) -> Any:
        return await self.client.result(self.id, seconds(timeout))

    def stream(self, after: int = -1) -> Iterator[StreamChunk]:
        """The run's stream after offset `after`, live until the run is finished (see
        `perdure.stream`): chunks and the markers `attempt`, `retry` and `dropped`."""
        return follow_sync(self.client, self.id, after)

    def astream(self, after: int = -1) -> AsyncIterator[StreamChunk]:
        """`stream` for async code."""
        return follow(self.client, self.id, after)

    def send_event(self, name: str, payload: Any = None) -> None:
        self._sync(self.client.send_event(self.id, name, payload), "RunHandle.send_event()")

    def cancel(self) -> str:
        return self._sync(self._cancel(), "RunHandle.cancel()")  # type: ignore[no-any-return]

    async def _cancel(self) -> str:
        return await self.client.cancel((await self.client.latest(self.id)).id)


class Workflow(Generic[P, R]):
    """A registered workflow. Outside a workflow, `.start()` starts a run; inside, a child run."""

    def __init__(self, runtime: Runtime, definition: WorkflowDef) -> None:
        self.runtime = runtime
        self.definition = definition
        self.__doc__ = definition.fn.__doc__
        self.__name__ = definition.name

    @property
    def name(self) -> str:
        return self.definition.name

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Any:
        """Inside a workflow: start this as a child run and wait for its result."""
        ctx = current()
        if ctx is None:
            return self.definition.fn(*args, **kwargs)
        pos = ctx.next_position()
        handle = ctx.call(self._start_child(ctx, pos, args, kwargs, None))
        if ctx.sync_mode:
            return handle.result()

        async def both() -> Any:
            child = await handle
            return await child.result()

        return both()

    def start(
        self,
        *args: Any,
        run_id: str | None = None,
        deadline: float | timedelta | None = None,
        queue: str | None = None,
        priority: int = 0,
        partition_key: str | None = None,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> Any:
        """Start a run of this workflow (a child run when called inside a workflow); the
        options are those of `App.start`."""
        ctx = current()
        if ctx is None:
            client = Client(self.runtime)
            run = self.runtime.sync(
                client.start(
                    self.name, args, kwargs, run_id=run_id, deadline=seconds(deadline),
                    queue=queue, priority=priority, partition_key=partition_key,
                    timeout=timeout,
                ),
                "Workflow.start()",
            )  # fmt: skip
            return RunHandle(client, run.id)
        if (
            deadline is not None or queue is not None or priority or partition_key is not None
            or timeout is not None
        ):  # fmt: skip
            raise ConfigError(
                f"{self.name}.start() inside a workflow starts a child run, which takes "
                "run_id= only (its queue and deadline are its workflow's)"
            )
        pos = ctx.next_position()
        return ctx.call(self._start_child(ctx, pos, args, kwargs, run_id))

    async def _start_child(
        self,
        ctx: Any,
        pos: int,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        run_id: str | None,
    ) -> ChildHandle:
        from ..store.base import NewRun

        entries = ctx.recorded(pos, "child", self.name)
        final = ctx.final(entries)
        if final is None:
            await ctx.checkpoint()
            child_id = check_run_id(run_id or f"{ctx.run_id}.{pos}")  # raised into the workflow
            text, blob = in_row_or_blob(
                encode_input(self.name, args, kwargs), self.runtime.blob_threshold
            )
            new = NewRun(
                queue=self.definition.queue,
                id=child_id,
                workflow=self.name,
                input=text,
                code_version=self.definition.version,
                now=ctx.now(),
                parent_id=ctx.run_id,
            )
            new.entries.append(origin_entry({"parent": ctx.run_id, "position": pos}, ctx.now()))
            if blob is not None:
                new.blobs.append(blob)
            final = ctx.entry(
                "child.started", self.name, position=pos, final=True, data={"run_id": child_id}
            )
            await ctx.write(final, new_runs=[new])
            self.runtime.notify()
        return ChildHandle(ctx.data(final)["run_id"], self.definition.hints.get("return"))


class ChildHandle:
    """A child run started from a workflow; `result()` waits for it durably."""

    def __init__(self, run_id: str, hint: Any) -> None:
        self.id = run_id
        self._hint = hint

    def result(self) -> Any:
        from .context import require

        ctx = require("ChildHandle.result")
        pos = ctx.next_position()
        return ctx.call(child_result(ctx, pos, self.id, self._hint))
