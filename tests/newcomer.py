"""The repository as a newcomer meets it: a fresh clone's files in a temp folder, and a
README's shell blocks typed into one terminal there.

A fresh clone has the files git tracks (and, while one edits, the new files git does not
ignore): no `.venv`, no `.perdure` store, no `.state`. A README's ```bash blocks run in
order in one bash session started at the clone's root, as if typed one after the other
(so `source .venv/bin/activate` and `cd` carry over to the next block); a block marked
`<!-- readme: no-run reason="..." -->` (tests/readme_doc.py's markers) is only parsed.
The session runs with `set -euo pipefail`, in a process group of its own, with none of the
test's environment that a fresh shell lacks (its venv on PATH, PYTHONPATH, PERDURE_*).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from readme_doc import Block, parse

ROOT = Path(__file__).resolve().parents[1]
SHELL_LANGS = {"bash", "sh", "shell"}
SESSION_TIMEOUT = 240.0  # under pytest-timeout's 300 s, with the drain
DRAIN_TIMEOUT = 30.0


def fresh_clone(base: Path) -> Path:
    """A copy of the checkout's files as `git clone` would give them, in `base/clone`."""
    git = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
    )
    assert git.returncode == 0, f"git ls-files in {ROOT}: {git.stderr.decode()}"
    listed = git.stdout.decode()
    clone = base / "clone"
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():  # a file deleted in the work tree is not in the clone
            target = clone / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return clone


def newcomer_env() -> dict[str, str]:
    """This process's environment without what the test's own venv and settings add."""
    test_bin = str(Path(sys.executable).parent)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PERDURE_", "OTEL_", "PYTHON", "VIRTUAL_ENV"))
    }
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != test_bin]
    env["PATH"] = os.pathsep.join(path)
    return env


def shell_blocks(readme: Path) -> list[Block]:
    """The README's shell blocks, in order."""
    return [b for b in parse(readme.read_text(encoding="utf-8")) if b.lang in SHELL_LANGS]


@dataclass
class Session:
    """What a README's blocks did: exit code, everything they printed, where it stopped."""

    returncode: int
    output: str
    failed_at: str  # "examples/x/README.md:LINE" of the failing command, or ""
    left_running: list[str]  # processes it started and did not stop ("PID ARGS")


def script_of(readme: Path, blocks: list[Block]) -> tuple[str, list[str]]:
    """One bash script of the blocks that run, and for each script line the README line
    it came from (for the ERR trap's report)."""
    shown = readme.relative_to(ROOT) if readme.is_relative_to(ROOT) else readme
    lines = ["set -euo pipefail", "trap 'echo \"[failed at script line $LINENO]\" >&2' ERR"]
    origin = ["", ""]
    for block in blocks:
        if block.has("no-run"):
            continue
        for number, text in block.lines():
            lines.append(text)
            origin.append(f"{shown}:{number}")
    return "\n".join(lines) + "\n", origin


def run_session(
    clone: Path, readme: Path, blocks: list[Block], log: Path, *, drain: float = DRAIN_TIMEOUT
) -> Session:
    """Run the blocks in one bash session at the clone's root; every process it left behind
    is stopped once it ends (see end_group)."""
    script, origin = script_of(readme, blocks)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["bash", "-c", script],
            cwd=clone,
            env=newcomer_env(),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            returncode = proc.wait(SESSION_TIMEOUT)
        except subprocess.TimeoutExpired:
            returncode = -1
        finally:
            left = end_group(proc.pid, drain)
    output = log.read_text(errors="replace")
    failed_at = ""
    if "[failed at script line " in output:
        number = int(output.rsplit("[failed at script line ", 1)[1].split("]")[0])
        failed_at = origin[number - 1] if number <= len(origin) else f"script line {number}"
    if returncode == -1:
        output += f"\n[the session ran over {SESSION_TIMEOUT:.0f} s]"
    return Session(returncode, output, failed_at, left)


def wait_group(pgid: int, timeout: float) -> bool:
    """Whether the process group empties within `timeout` s."""
    limit = time.monotonic() + timeout
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() > limit:
            return False
        time.sleep(0.1)


def end_group(pgid: int, drain: float) -> list[str]:
    """Give what the session left in its process group (a session of its own) `drain` s to
    finish (a worker it sent SIGTERM drains); then SIGTERM, then SIGKILL what is still
    there. Returns what was left running ("PID ARGS")."""
    if wait_group(pgid, drain):
        return []
    left = subprocess.run(
        ["ps", "-o", "pid=,args=", "-s", str(pgid)], capture_output=True, text=True
    ).stdout.splitlines()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
        if not wait_group(pgid, DRAIN_TIMEOUT):
            os.killpg(pgid, signal.SIGKILL)
    return left
