"""The sync facade's event loop: blocking calls run the async core on one background thread."""

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
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None

    def _ensure(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="perdure-portal", daemon=True
                )
                thread.start()
                self._loop = loop
            return self._loop

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
        return asyncio.run_coroutine_threadsafe(coro, self._ensure()).result()

    def close(self) -> None:
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
