"""How each kind of README or docs block is checked: a sandbox (directory and store), a runner
per language.

Every runner raises `pytest.fail` (or an AssertionError) naming the document and line
when the block does not do what it says; none of them skips.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import click
import pytest

from perdure.extras import EXTRAS
from readme_doc import Block
from readme_setups import PY_CHECKS, PY_SETUPS, PY_WRAPS, SHELL_CHECKS, SHELL_SETUPS

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent  # the venv the tests run in: its python and `perdure`
EXEC = HERE / "readme_exec.py"
PG_URL = os.environ.get("PERDURE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")

# `perdure` subcommands that serve until SIGTERM: started in the background, never awaited.
LONG_RUNNING = {"worker", "serve", "agent", "mcp"}
SHELL_LANGS = {"bash", "sh", "shell"}
PY_TIMEOUT = 120.0
CMD_TIMEOUT = 60.0
BLOCK_TIMEOUT = 180.0  # a whole shell block (the first workflow's kill -9 and resume)
READY_TIMEOUT = 30.0
STOP_TIMEOUT = 20.0
SETTLE = 0.3


@dataclass
class ShellResult:
    returncode: int
    stdout: str
    stderr: str


@dataclass
class Background:
    command: str
    at: str  # `document:line` of the command
    proc: subprocess.Popen[bytes]
    log: Path

    def fail(self, what: str) -> NoReturn:
        pytest.fail(f"{self.at}: `{self.command}` {what}:\n{self.log.read_text()[-3000:]}")


class Sandbox:
    """A fresh directory and store for one block, with the venv first on PATH."""

    def __init__(self, path: Path, store_url: str) -> None:
        self.path = path
        self.store_url = store_url
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("PERDURE_")}
        self.env.update(
            PERDURE_DB=store_url,
            PATH=f"{BIN}{os.pathsep}{self.env.get('PATH', '')}",
            PYTHONUNBUFFERED="1",
            PERDURE_LOG_FORMAT="json",
        )
        self.replacements: list[tuple[str, str]] = []
        self.backgrounds: list[Background] = []

    def replace(self, old: str, new: str) -> None:
        """Have the shell block run with `old` replaced by `new` (a port, say)."""
        self.replacements.append((old, new))

    def apply(self, text: str) -> str:
        for old, new in self.replacements:
            text = text.replace(old, new)
        return text

    def run(self, command: str, timeout: float = CMD_TIMEOUT) -> ShellResult:
        """Run one shell command in the sandbox and capture its output; past `timeout`, it and
        every job it started in the background are killed."""
        proc = subprocess.Popen(
            ["bash", "-c", command],
            cwd=self.path,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
            pytest.fail(
                f"`{command[-300:]}` ran over {timeout:.0f} s:\n{stdout[-3000:]}{stderr[-3000:]}"
            )
        return ShellResult(proc.returncode, stdout, stderr)

    def background(self, command: str, *, at: str, ready_port: int | None = None) -> None:
        """Start a long-running command and wait until it is ready: its port answers, or
        (without a port) it has written its first line, not an `error:` line; and it still runs
        SETTLE s later."""
        log = self.path / f"background-{len(self.backgrounds)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                ["bash", "-c", f"exec {command}"],
                cwd=self.path,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        job = Background(command, at, proc, log)
        self.backgrounds.append(job)
        limit = time.monotonic() + READY_TIMEOUT
        while not self._ready(job, ready_port):
            if proc.poll() is not None:
                job.fail(f"exited {proc.returncode} before it was ready")
            if time.monotonic() > limit:
                job.fail(f"was not ready in {READY_TIMEOUT:.0f} s")
            time.sleep(0.05)
        if ready_port is None and job.log.read_bytes().startswith(b"error:"):
            # perdure's one-line user error is no readiness, however long the process takes
            # to exit on a loaded machine
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(READY_TIMEOUT)
            job.fail(f"exited {proc.returncode} before it was ready")
        time.sleep(SETTLE)
        if proc.poll() is not None:  # its first line was its last: an error
            job.fail(f"exited {proc.returncode} before it was ready")

    @staticmethod
    def _ready(job: Background, port: int | None) -> bool:
        if port is None:
            return job.log.stat().st_size > 0
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            return False

    def stop_backgrounds(self) -> list[str]:
        """SIGTERM every background command (last started first); the ones that did not
        exit 0 within STOP_TIMEOUT, each with its log."""
        problems = []
        for job in reversed(self.backgrounds):
            if job.proc.poll() is None:
                job.proc.send_signal(signal.SIGTERM)
            try:
                code = job.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                os.killpg(job.proc.pid, signal.SIGKILL)
                job.proc.wait()
                code = None
            if code != 0:
                problems.append(
                    f"{job.at}: `{job.command}` "
                    + ("ignored SIGTERM" if code is None else f"exited {code} on SIGTERM")
                    + f":\n{job.log.read_text()[-3000:]}"
                )
        self.backgrounds.clear()
        return problems


# The extra a `perdure` subcommand serves with, and the one each integration module needs.
SERVES_WITH = {"serve": "server", "mcp": "mcp", "top": "observe"}
INTEGRATIONS = {"openai_agents": "openai-agents", "pydantic_ai": "pydantic-ai"}


def extras_needed(block: Block, blocks: list[Block]) -> list[tuple[str, str]]:
    """(extra, module) for each optional extra the block needs to run: for a python block
    (and those it continues), the modules it imports; for a shell block, the `perdure`
    subcommands it serves with (`setup=serve` is `perdure serve`)."""
    owner = {m.split(".")[0]: x for x, modules in reversed(EXTRAS.items()) for m in modules}
    needed: list[tuple[str, str]] = []
    if block.lang == "python":
        for member in chain(block, blocks):
            for name in re.findall(r"^\s*(?:from|import)\s+([\w.]+)", member.source, re.M):
                parts = name.split(".")
                if parts[:2] == ["perdure", "integrations"] and parts[2:3][0] in INTEGRATIONS:
                    extra = INTEGRATIONS[parts[2]]
                    needed.append((extra, EXTRAS[extra][0]))
                elif parts[0] in owner:
                    needed.append((owner[parts[0]], parts[0]))
    elif block.lang in SHELL_LANGS:
        words = {w for _, command in commands(block) for w in command.split()}
        words |= {"serve"} if "serve" in block.names("setup") else set()
        for command, extra in SERVES_WITH.items():
            if command in words:
                needed.append((extra, EXTRAS[extra][0]))
    return list(dict.fromkeys(needed))


# -- python ----------------------------------------------------------------------------


def chain(block: Block, blocks: list[Block]) -> list[Block]:
    """The block and, for `continues`, the python blocks before it that it builds on."""
    members = [block]
    while members[0].has("continues"):
        name = members[0].markers["continues"]
        earlier = [
            b
            for b in blocks[: members[0].index]
            if b.lang == "python" and (not name or b.markers.get("name") == name)
        ]
        assert earlier, f"{members[0].at}: no python block above to continue"
        members.insert(0, earlier[-1])
    return members


def wrapped(block: Block) -> tuple[int, str]:
    """(first line, source) of the block as compiled: inside its `wrap=` template if any."""
    if not block.has("wrap"):
        return block.first_line, block.source
    template = PY_WRAPS[block.markers["wrap"]].strip("\n").splitlines()
    (at,) = [i for i, text in enumerate(template) if text.strip() == "{block}"]
    indent = template[at][: len(template[at]) - len(template[at].lstrip())]
    body = [indent + text if text.strip() else text for text in block.source.splitlines()]
    head, tail = template[:at], template[at + 1 :]
    assert len(head) < block.first_line, "wrap template longer than the document above the block"
    return block.first_line - len(head), "\n".join([*head, *body, *tail]) + "\n"


def python_parts(
    block: Block, blocks: list[Block], *, check: bool = True
) -> list[dict[str, object]]:
    """What readme_exec.py runs for a python block: setups, the chain of blocks, its check."""
    parts: list[dict[str, object]] = []
    done: set[str] = set()
    for member in chain(block, blocks):
        for name in member.names("setup"):
            if name not in done:
                done.add(name)
                setup = PY_SETUPS[name]
                parts.append({"file": f"<readme setup={name}>", "line": 1, "source": setup})
        line, source = wrapped(member)
        parts.append({"file": str(member.path), "line": line, "source": source})
    if check and block.has("check"):
        name = block.markers["check"]
        parts.append({"file": f"<readme check={name}>", "line": 1, "source": PY_CHECKS[name]})
    return parts


def run_python(block: Block, blocks: list[Block], sandbox: Sandbox) -> None:
    """Run the block (with its setups and chain) in a subprocess, then its check."""
    parts_file = sandbox.path / "parts.json"
    parts_file.write_text(json.dumps(python_parts(block, blocks)), encoding="utf-8")
    try:
        done = subprocess.run(
            [sys.executable, str(EXEC), str(parts_file)],
            cwd=sandbox.path,
            env=sandbox.env,
            capture_output=True,
            text=True,
            timeout=PY_TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{block.at}: the python block ran over {PY_TIMEOUT:.0f} s")
    if done.returncode != 0:
        pytest.fail(
            f"{block.at}: the python block failed (exit {done.returncode}):\n{done.stderr[-6000:]}"
        )


def write_app_module(block: Block, blocks: list[Block], sandbox: Sandbox) -> None:
    """shop.py: the nearest python block above (with its setups), for `--app shop:app`."""
    earlier = [b for b in blocks[: block.index] if b.lang == "python"]
    if earlier:
        parts = python_parts(earlier[-1], blocks, check=False)
        text = "\n".join(str(part["source"]) for part in parts)
        (sandbox.path / "shop.py").write_text(text, encoding="utf-8")


def compile_python(block: Block) -> None:
    """Compile only (a declared no-run block): a syntax error still fails."""
    line, source = wrapped(block)
    compile("\n" * (line - 1) + source, str(block.path), "exec", dont_inherit=True,
            flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)  # fmt: skip


# -- shell -----------------------------------------------------------------------------


def commands(block: Block) -> list[tuple[int, str]]:
    """(document line, command) for each logical line (backslash continuations joined)."""
    found: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for number, text in block.lines():
        if pending is not None:
            start, before = pending
            text, pending = before + "\n" + text, None
            number = start
        if text.rstrip().endswith("\\"):
            pending = (number, text)
            continue
        if text.strip() and not text.strip().startswith("#"):
            found.append((number, text))
    assert pending is None, f"{block.at}: the last line continues into nothing"
    return found


def is_long_running(command: str) -> bool:
    """A `perdure` command line whose subcommand serves until SIGTERM (and that the block does
    not itself send to the background with a trailing `&`: the script manages that one)."""
    if command.split(" #", 1)[0].rstrip().endswith("&"):
        return False
    try:
        words = shlex.split(command, comments=True)
    except ValueError:
        return False
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        words = words[1:]  # VAR=value prefixes
    if not words or Path(words[0]).name != "perdure":
        return False
    rest = words[1:]
    while rest and rest[0] in ("--db", "--app"):
        rest = rest[2:]
    return bool(rest) and rest[0] in LONG_RUNNING


def parse_shell(block: Block) -> None:
    """`bash -n`: the block parses as a script."""
    done = subprocess.run(["bash", "-n"], input=block.source, capture_output=True, text=True)
    assert done.returncode == 0, f"{block.at}: bash -n: {done.stderr}"


def run_shell(block: Block, blocks: list[Block], sandbox: Sandbox) -> None:
    """Run the block in bash -euo pipefail: long-running lines in the background first,
    then the rest as one script whose $LINENO is the document line; check its exit code,
    its output (`expect=`), its check, and that every background command stops cleanly."""
    write_app_module(block, blocks, sandbox)
    for assignment in shlex.split(block.markers.get("env", "")):
        key, _, value = assignment.partition("=")
        sandbox.env[key] = value
    try:
        for name in block.names("setup"):
            SHELL_SETUPS[name](sandbox)
        script = [f"set -euo pipefail; trap 'echo \"{block.doc}:$LINENO: exit $?\" >&2' ERR"]
        script += [""] * (block.first_line - 1 - len(script))
        started: set[int] = set()  # document lines of the commands started in the background
        for number, command in commands(block):
            if block.has("background") or is_long_running(command):
                sandbox.background(sandbox.apply(command), at=f"{block.doc}:{number}")
                started |= set(range(number, number + command.count("\n") + 1))
        for number, text in block.lines():
            script.append(":" if number in started else sandbox.apply(text))
        result = sandbox.run("\n".join(script) + "\n", timeout=BLOCK_TIMEOUT)
        expected = int(block.markers.get("exit", "0"))
        assert result.returncode == expected, (
            f"{block.at}: the block exited {result.returncode}, not {expected}:\n"
            f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )
        if block.has("expect"):
            output = result.stdout + result.stderr
            assert block.markers["expect"] in output, (
                f"{block.at}: {block.markers['expect']!r} not in the output:\n{output}"
            )
        if block.has("check"):
            SHELL_CHECKS[block.markers["check"]](sandbox, result)
    finally:
        problems = sandbox.stop_backgrounds()
    assert not problems, "\n".join(problems)


# -- toml, json, synopsis --------------------------------------------------------------


def check_toml(block: Block, sandbox: Sandbox) -> None:
    """Parse the block; a complete agent spec (name and goal) must pass `perdure validate`."""
    try:
        spec = tomllib.loads(block.source)
    except tomllib.TOMLDecodeError as exc:
        pytest.fail(f"{block.at}: not TOML: {exc}")
    if "name" in spec and "goal" in spec:
        (sandbox.path / "agent.toml").write_text(block.source, encoding="utf-8")
        # validate checks an MCP server's command is on PATH; the README names third-party
        # servers (github-mcp-server) a reader installs: stand in for them by name only
        servers = spec.get("tools", {}).get("mcp", [])
        names = [shlex.quote(str(m["command"])) for m in servers if "command" in m]
        stand_ins = "".join(
            f"printf '#!/bin/sh\\nexit 1\\n' > bin/{n} && chmod +x bin/{n} && " for n in names
        )
        setup = f"mkdir -p bin && {stand_ins}PATH=$PWD/bin:$PATH " if names else ""
        result = sandbox.run(f"{setup}perdure validate agent.toml")
        assert result.returncode == 0, (
            f"{block.at}: perdure validate refused the spec:\n{result.stderr}"
        )


def check_json(block: Block) -> None:
    try:
        json.loads(block.source)
    except json.JSONDecodeError as exc:
        pytest.fail(f"{block.doc}:{block.first_line + exc.lineno - 1}: not JSON: {exc.msg}")


def synopsis_entries(block: Block) -> list[tuple[int, list[str], list[str]]]:
    """(document line, command path, the other words) for every command a CLI synopsis names.

    A line `perdure [--db URL] COMMAND` or an indented `name ARGS [--opt V]   description`
    names a command; a deeper-indented line starting with `[` continues the one above;
    ` | ` separates alternatives, and an alternative that starts with an option adds to
    the ones before it on its line.
    """
    entries: list[tuple[int, list[str], list[str]]] = []
    for number, text in block.lines():
        stripped = text.split(" #", 1)[0].strip()
        if not stripped:
            continue
        synopsis = re.split(r"\s{2,}", stripped)[0]
        words = [w.strip("[]") for w in synopsis.split() if w.strip("[].")]
        if stripped.startswith("[") and entries:  # continuation: more options
            entries[-1][2].extend(words)
            continue
        if words[0] == "perdure":
            words = words[1:]
        line_entries: list[tuple[int, list[str], list[str]]] = []
        for alternative in " ".join(words).split(" | "):
            alt = alternative.split()
            if alt and alt[0].startswith("--"):
                for entry in line_entries:
                    entry[2].extend(alt)
                continue
            path = []
            while alt and re.fullmatch(r"[a-z][a-z-]*", alt[0]):
                path.append(alt.pop(0))
            if line_entries and path and len(line_entries[0][1]) > 1:
                path = [*line_entries[0][1][:-1], *path]  # `schedules ls | show NAME`
            line_entries.append((number, path, alt))
        entries.extend(line_entries)
    return entries


def check_synopsis(block: Block) -> int:
    """Every command and option the synopsis shows exists in the CLI, a command takes as
    many arguments as it shows, and a `--opt a|b|c` shows choices the option accepts.
    Returns how many commands were checked."""
    from perdure.cli.main import cli

    checked = 0
    for number, path, words in synopsis_entries(block):
        at = f"{block.doc}:{number}: `perdure {' '.join(path)}`"
        command: click.Command = cli
        for depth, word in enumerate(path):
            assert isinstance(command, click.Group) and word in command.commands, (
                f"{block.doc}:{number}: no command `perdure {' '.join(path[: depth + 1])}`"
            )
            command = command.commands[word]
        params = {opt: param for param in command.params for opt in param.opts}
        if command is not cli:
            params |= {opt: param for param in cli.params for opt in param.opts}
        positional: list[str] = []
        rest = list(words)
        while rest:
            word = rest.pop(0)
            if not word.startswith("--"):
                positional.append(word)
                continue
            option = params.get(word.split("=")[0])
            assert isinstance(option, click.Option), f"{at} has no option {word}"
            if not option.is_flag and "=" not in word and rest:
                rest.pop(0)  # its value
        if not isinstance(command, click.Group):
            arguments = [p for p in command.params if isinstance(p, click.Argument)]
            least = sum(1 for p in arguments if p.required)
            most = None if any(p.nargs == -1 for p in arguments) else len(arguments)
            assert least <= len(positional) and (most is None or len(positional) <= most), (
                f"{at} shows {len(positional)} argument(s) {positional}; it takes "
                f"{least} to {'any' if most is None else most}"
            )
        checked += 1
    for number, text in block.lines():
        for option, values in re.findall(r"(--[a-z-]+) ([a-z]+(?:\|[a-z]+)+)", text):
            params = [p for p in _all_params(cli) if option in p.opts]
            assert params, f"{block.doc}:{number}: no command has {option}"
            for param in params:
                if isinstance(param.type, click.Choice):
                    extra = set(values.split("|")) - set(param.type.choices)
                    assert not extra, f"{block.doc}:{number}: {option} does not accept {extra}"
    return checked


def _all_params(command: click.Command) -> list[click.Parameter]:
    params = list(command.params)
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            params += _all_params(sub)
    return params


def check_block(block: Block, blocks: list[Block], sandbox: Sandbox) -> None:
    """Check one block as its language and markers say (see tests/test_readme.py)."""
    if block.has("no-run"):
        assert block.markers.get("reason"), f"{block.at}: no-run without a reason"
        if block.lang == "python":
            compile_python(block)
        elif block.lang in SHELL_LANGS:
            parse_shell(block)
        elif block.lang == "toml":
            check_toml(block, sandbox)
        elif block.lang == "json":
            check_json(block)
    elif block.has("synopsis"):
        assert check_synopsis(block) > 0, f"{block.at}: the synopsis names no command"
    elif block.lang == "python":
        run_python(block, blocks, sandbox)
    elif block.lang in SHELL_LANGS:
        run_shell(block, blocks, sandbox)
    elif block.lang == "toml":
        check_toml(block, sandbox)
    elif block.lang == "json":
        check_json(block)
    else:
        pytest.fail(f"{block.at}: a ```{block.lang} block must be declared")
