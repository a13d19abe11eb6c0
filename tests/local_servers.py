"""Servers a test runs on 127.0.0.1: a free port for one, the wait until a server process
listens, and the HTTP app (`create_app`) served by uvicorn on a thread of the test's process."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import perdure


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on (the OS's pick)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_listening(
    port: int,
    process: subprocess.Popen[bytes] | None = None,
    within: float = 30.0,
    log: Callable[[], str] | None = None,
) -> None:
    """Until something accepts connections on `port` of 127.0.0.1; fail if `process` exits
    first or `within` seconds pass (showing `log()`, what the server said)."""
    deadline = time.monotonic() + within
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        said = f"\n{log()}" if log is not None else ""
        assert process is None or process.poll() is None, f"the server exited{said}"
        assert time.monotonic() < deadline, f"nothing listens on port {port}{said}"
        time.sleep(0.05)


@contextmanager
def live_server(app: perdure.App) -> Iterator[str]:
    """`create_app(app)` on uvicorn in a thread, on a free port of 127.0.0.1; yields its URL
    once uvicorn has started, and stops it on exit."""
    import uvicorn

    from perdure.server import create_app

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        create_app(app), log_level="warning", lifespan="off", timeout_graceful_shutdown=1
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="uvicorn", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + 20
    try:
        while not server.started:
            assert thread.is_alive(), "uvicorn stopped before it started"
            assert time.monotonic() < deadline, "uvicorn did not start within 20 s"
            time.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
