"""The sync facade: a blocking call runs the async core on the calling thread's own loop.

Each thread that makes sync calls gets one private event loop, kept between
calls, so a call costs no hand-off to another thread; the store answers that
loop directly. Inside a running event loop a blocking call is refused at once.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from ..errors import SyncInAsyncError

T = TypeVar("T")


class Portal:
    """Runs coroutines to completion for sync callers; refuses to block a running loop."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._lock = threading.Lock()
        self._loops: list[asyncio.AbstractEventLoop] = []

    def _loop(self) -> asyncio.AbstractEventLoop:
        loop: asyncio.AbstractEventLoop | None = getattr(self._local, "loop", None)
        if loop is None or loop.is_closed():
            loop = asyncio.new_event_loop()
            self._local.loop = loop
            with self._lock:
                self._loops.append(loop)
        return loop

    def call(self, coro: Coroutine[Any, Any, T], what: str) -> T:
        """Block until `coro` finishes; `what` names the sync call in the misuse error."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            coro.close()
            raise SyncInAsyncError(
                f"{what} blocks and was called inside a running event loop; "
                f"in async code use the awaitable form (`await app.client...` or `..._async`)"
            )
        return self._loop().run_until_complete(coro)

    def close(self) -> None:
        """Close the private loops not in use (a thread calling again gets a new one)."""
        with self._lock:
            loops, self._loops = self._loops, []
        for loop in loops:
            if loop.is_running():
                with self._lock:
                    self._loops.append(loop)
            else:
                loop.close()
