"""In-process wake-ups across event loops and threads: new work, a run changed."""

from __future__ import annotations

import asyncio
import contextlib
import threading


class _Flag:
    """One loop's side of a Signal: raised by a fire, lowered by the wait that saw it; the
    futures of that loop's waiters (plain futures and a timer: `asyncio.wait_for` made a
    task per wait, and a worker or a result() waiter waits once per run)."""

    __slots__ = ("raised", "waiters")

    def __init__(self) -> None:
        self.raised = False
        self.waiters: list[asyncio.Future[None]] = []

    def raise_(self) -> None:
        """On its loop: wake every waiter."""
        self.raised = True
        waiters, self.waiters = self.waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class Signal:
    """A broadcast any thread can fire and any event loop can wait on (with a timeout)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._flags: dict[asyncio.AbstractEventLoop, _Flag] = {}
        self.fired = 0  # fires so far: a waiter that read state after fire N waits for N + 1

    def fire(self) -> None:
        """Wake every waiting loop: the caller's own directly, others through their
        self-pipe (`call_soon_threadsafe` costs a syscall and a wake-up even for itself)."""
        with self._lock:
            self.fired += 1
            items = list(self._flags.items())
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        for loop, flag in items:
            if loop is running:
                flag.raise_()
                continue
            if loop.is_closed():
                with self._lock:
                    self._flags.pop(loop, None)
                continue
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(flag.raise_)

    def listen(self) -> _Flag:
        """Register the running loop, so fires from now on are not lost before its first wait."""
        loop = asyncio.get_running_loop()
        with self._lock:
            flag = self._flags.get(loop)
            if flag is None:
                flag = self._flags[loop] = _Flag()
            return flag

    async def wait(self, timeout: float, since: int | None = None) -> None:
        """Return when fired (since `listen` or the last wait; with `since`, after the
        `since`-th fire: an older one is not news) or after `timeout` seconds."""
        flag = self.listen()
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while True:
            if flag.raised:  # fired since: still give the loop a turn, as any wait does (a
                await asyncio.sleep(0)  # caller looping on a signal must not starve it)
            else:
                waiter: asyncio.Future[None] = loop.create_future()
                flag.waiters.append(waiter)
                timer = loop.call_at(end, _wake, waiter)
                try:
                    await waiter
                finally:
                    timer.cancel()
                    with contextlib.suppress(ValueError):  # gone if a fire woke it
                        flag.waiters.remove(waiter)
            flag.raised = False
            if since is None or self.fired != since or loop.time() >= end:
                return
