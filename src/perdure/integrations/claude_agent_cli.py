"""The Claude Code CLI of a durable conversation, started so that it dies with its worker.

The SDK runs the CLI as a child process. A worker killed with `kill -9` cannot stop it, and
the CLI does not notice its parent is gone: it would live on, an orphan, holding built-in
tools mid-way. On Linux the conversation starts the CLI through a small launcher that asks
the kernel to kill it when its parent dies (`PR_SET_PDEATHSIG`), then becomes the CLI
(`execv`: same process, same pid). Elsewhere the CLI is started as the SDK starts it.
"""

from __future__ import annotations

import functools
import shutil
import sys
import tempfile
from pathlib import Path

import claude_agent_sdk

__all__ = ["PARENT", "cli", "launcher"]

PARENT = "PERDURE_CLI_PARENT"  # the worker's pid, in the launcher's environment

_SCRIPT = """#!{python}
# perdure: run the Claude Code CLI so that it dies with the process that started it
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
if str(os.getppid()) != os.environ.get({parent!r}, str(os.getppid())):
    sys.exit(1)  # the parent died before the request: nobody wants this CLI
os.execv({cli!r}, [{cli!r}, *sys.argv[1:]])
"""


def cli(configured: str | Path | None) -> str | None:
    """The CLI the SDK would start: the options' `cli_path`, else the bundled one, else
    `claude` on PATH (None: let the SDK say it found none)."""
    if configured is not None:
        return str(configured)
    bundled = Path(claude_agent_sdk.__file__).parent / "_bundled" / "claude"
    if bundled.is_file():
        return str(bundled)
    return shutil.which("claude")


@functools.cache
def launcher(real: str) -> str | None:
    """The path of a launcher that starts `real` as the worker's mortal child (Linux), or
    None where the kernel has no such request."""
    if not sys.platform.startswith("linux"):
        return None
    folder = Path(tempfile.mkdtemp(prefix="perdure-claude-"))
    path = folder / "claude"
    path.write_text(_SCRIPT.format(python=sys.executable, parent=PARENT, cli=real))
    path.chmod(0o755)
    return str(path)
