"""In-process wake-ups across event loops and threads: new work, a run changed."""

from __future__ import annotations

import asyncio
import contextlib
import threading


class Signal:
    """A broadcast any thread can fire and any event loop can wait on (with a timeout)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: dict[asyncio.AbstractEventLoop, asyncio.Event] = {}
        self.fired = 0  # fires so far: a waiter that read state after fire N waits for N + 1

    def fire(self) -> None:
        """Wake every waiting loop: the caller's own directly, others through their
        self-pipe (`call_soon_threadsafe` costs a syscall and a wake-up even for itself)."""
        with self._lock:
            self.fired += 1
            items = list(self._events.items())
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        for loop, event in items:
            if loop is running:
                event.set()
                continue
            if loop.is_closed():
                with self._lock:
                    self._events.pop(loop, None)
                continue
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(event.set)

    def listen(self) -> asyncio.Event:
        """Register the running loop, so fires from now on are not lost before its first wait."""
        loop = asyncio.get_running_loop()
        with self._lock:
            event = self._events.get(loop)
            if event is None:
                event = self._events[loop] = asyncio.Event()
            return event

    async def wait(self, timeout: float, since: int | None = None) -> None:
        """Return when fired (since `listen` or the last wait; with `since`, after the
        `since`-th fire: an older one is not news) or after `timeout` seconds."""
        event = self.listen()
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), max(0.0, end - loop.time()))
            event.clear()
            if since is None or self.fired != since or loop.time() >= end:
                return
