"""The built-in tools: files, commands, HTTP, long-term memory, asking a human, finishing.

Each checks the boundary before it touches anything (in `guard`, so a refused
call never reaches a gate, and again when it runs). Docstrings are written for
the model: their first paragraph and `Args:` lines are what it is shown.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import Field

from ...extras import require_extra
from .base import Memory, Tool, ToolContext, ToolEffect, ToolFailed, tool
from .boundary import ToolRefused

MAX_OUTPUT = 10_000  # characters of a command's stdout/stderr shown to the model
MAX_LISTING = 500  # directory entries shown
HTTP_TIMEOUT = 30.0
# The environment commands run with: enough to work, no secrets (API keys stay out).
COMMAND_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "USER", "TZ")
GATE_EVENT_PREFIX = "human:"


def gate_event(call_id: str) -> str:
    """The event a gate tool's call waits for: `human:<call id>`."""
    return f"{GATE_EVENT_PREFIX}{call_id}"


# -- files ------------------------------------------------------------------------------


@tool(
    effect="read",
    permissions=("fs.read",),
    guard=lambda boundary, args: boundary.resolve_read(args["path"]),
)
def read_file(
    ctx: ToolContext,
    path: str,
    max_bytes: Annotated[int, Field(ge=1, le=1_000_000)] = 100_000,
) -> str:
    """Read a text file inside the allowed paths.

    Args:
        path: The file, relative to the workspace (where the allowed paths are named from,
            e.g. "tickets/t1.txt") or absolute inside an allowed path.
        max_bytes: Read at most this many bytes; longer files are cut with a note.
    """
    real = ctx.boundary.resolve_read(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
    fd = _open_nofollow(real, flags, path, ctx.boundary.shown(real, real=True))
    info = os.fstat(fd)  # before fdopen, which refuses a directory with an OSError of its own
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        if stat.S_ISDIR(info.st_mode):
            raise ToolFailed(f"{path!r} is a directory; use list_dir")
        raise ToolFailed(f"{path!r} is not a regular file")
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(max_bytes + 1)
    if b"\x00" in data[:8192]:
        return f"[{path} is a binary file of {info.st_size} bytes; not shown]"
    text = data[:max_bytes].decode("utf-8", errors="replace")
    if len(data) > max_bytes:
        text += f"\n[truncated: the first {max_bytes} of {info.st_size} bytes shown]"
    return text


@tool(
    effect="idempotent",
    permissions=("fs.write",),
    destructive=True,
    guard=lambda boundary, args: boundary.resolve_write(args["path"]),
)
def write_file(ctx: ToolContext, path: str, content: str) -> str:
    """Create or overwrite a text file inside the allowed write paths (parents are created).

    Args:
        path: The file, relative to the workspace (e.g. "drafts/reply.md") or absolute
            inside a write path.
        content: The whole new content of the file (UTF-8).
    """
    real = ctx.boundary.resolve_write(path)
    if real.is_dir():
        raise ToolFailed(f"{path!r} is a directory")
    try:
        real.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise ToolFailed(f"{path!r}: a file stands where a folder on the way should be") from None
    # Write a sibling and rename it over: a crash leaves the old or the new file, never
    # half of one, and rename replaces a symlink planted meanwhile instead of following it.
    mode = stat.S_IMODE(real.stat().st_mode) if real.exists() else 0o644
    fd, tmp = tempfile.mkstemp(dir=real.parent, prefix=f".{real.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(content)
        os.replace(tmp, real)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return f"wrote {len(content.encode())} bytes to {path}"


@tool(
    effect="read",
    permissions=("fs.read",),
    guard=lambda boundary, args: boundary.resolve_read(args["path"]),
)
def list_dir(ctx: ToolContext, path: str = ".") -> str:
    """List a directory inside the allowed paths: one entry a line, `/` after directories,
    `@` after symlinks.

    Args:
        path: The directory, relative to the workspace (e.g. "tickets") or absolute.
    """
    real = ctx.boundary.resolve_read(path)
    if not real.is_dir():
        raise ToolFailed(f"{path!r} is not a directory")
    entries = []
    with os.scandir(real) as found:
        for entry in found:
            mark = "@" if entry.is_symlink() else "/" if entry.is_dir() else ""
            entries.append(entry.name + mark)
    entries.sort()
    shown = entries[:MAX_LISTING]
    if len(entries) > MAX_LISTING:
        shown.append(f"[{len(entries) - MAX_LISTING} more entries not shown]")
    return "\n".join(shown) if shown else "[empty directory]"


def _open_nofollow(real: Path, flags: int, shown: str, where: str) -> int:
    """`real` opened without following a link; errors name it as given (`shown`) and where
    it led (`where`, relative to the workspace: `Boundary.shown`)."""
    try:
        return os.open(real, flags | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        raise ToolFailed(f"{shown!r} does not exist ({where})") from None
    except OSError as exc:
        if real.is_symlink():  # swapped for a symlink since the check
            raise ToolRefused(f"{shown!r}: is a symlink") from None
        raise ToolFailed(f"{shown!r}: {exc.strerror}") from None


# -- commands ---------------------------------------------------------------------------


@tool(
    effect="once",
    permissions=("process.run",),
    destructive=True,
    guard=lambda boundary, args: boundary.check_command(args["argv"]),
)
def run_command(
    ctx: ToolContext,
    argv: list[str],
    timeout: Annotated[float, Field(gt=0, le=600)] = 60,
) -> dict[str, Any]:
    """Run an allowed command (no shell) in the working directory; returns its exit code,
    stdout and stderr.

    Args:
        argv: The program and its arguments, e.g. ["git", "status"]; no shell syntax.
        timeout: Seconds before the command is killed.
    """
    args = ctx.boundary.check_command(argv)
    env = {name: os.environ[name] for name in COMMAND_ENV if name in os.environ}
    try:
        process = subprocess.Popen(
            args,
            shell=False,
            cwd=ctx.boundary.workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group, killed whole on timeout
        )
    except OSError as exc:
        raise ToolFailed(f"command {args[0]!r} could not start: {exc.strerror}") from None
    timed_out = False
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
    return {
        "exit_code": process.returncode,
        "timed_out": timed_out,
        "stdout": _clip(out.decode("utf-8", errors="replace")),
        "stderr": _clip(err.decode("utf-8", errors="replace")),
    }


def _clip(text: str, limit: int = MAX_OUTPUT) -> str:
    """The head and the tail of long output (errors tend to be at the end)."""
    if len(text) <= limit:
        return text
    head, tail = limit // 4, limit - limit // 4
    return f"{text[:head]}\n[... {len(text) - limit} characters cut ...]\n{text[-tail:]}"


# -- HTTP -------------------------------------------------------------------------------


def _http_effect(args: Mapping[str, Any]) -> ToolEffect:
    return "read" if str(args.get("method", "GET")).upper() in ("GET", "HEAD") else "once"


@tool(
    effect=_http_effect,
    permissions=("net.http",),
    destructive=True,
    guard=lambda boundary, args: boundary.check_host(args["url"]),
)
async def http_request(
    ctx: ToolContext,
    url: str,
    method: Literal["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"] = "GET",
    body: str | None = None,
) -> dict[str, Any]:
    """Make an HTTP request to an allowed host; returns the status, a few headers and the
    body as text. Redirects are not followed: request the `location` again if needed.

    Args:
        url: An http or https URL on an allowed host.
        method: The HTTP method.
        body: The request body, sent as is (e.g. JSON text).
    """
    require_extra("mcp", "the http_request tool", "httpx")  # httpx comes with mcp (and models)
    import httpx

    checked = ctx.boundary.check_host(url)
    try:
        target = httpx.URL(checked)
    except httpx.InvalidURL as exc:
        raise ToolRefused(f"url {url!r}: {exc}") from None
    if target.userinfo or target.raw_host.decode("ascii").rstrip(".") not in _hosts_seen(checked):
        raise ToolRefused(f"url {url!r}: the host could not be read unambiguously")
    limit = 100_000
    try:
        # trust_env=False: no proxy or .netrc from the environment decides where a call goes.
        async with (
            httpx.AsyncClient(timeout=HTTP_TIMEOUT, follow_redirects=False, trust_env=False) as c,
            c.stream(method, target, content=body) as response,
        ):
            data = b""
            async for chunk in response.aiter_bytes():
                data += chunk
                if len(data) > limit:
                    break
    except httpx.HTTPError as exc:
        raise ToolFailed(f"{method} {url}: {type(exc).__name__}: {exc}") from None
    text = data[:limit].decode(response.encoding or "utf-8", errors="replace")
    if len(data) > limit:
        text += f"\n[truncated: the first {limit} bytes shown]"
    keep = ("content-type", "content-length", "location", "retry-after")
    return {
        "status": response.status_code,
        "headers": {k: v for k, v in response.headers.items() if k.lower() in keep},
        "body": text,
    }


def _hosts_seen(url: str) -> set[str]:
    host = (urlsplit(url).hostname or "").rstrip(".")
    return {host, f"[{host}]"}


# -- memory -----------------------------------------------------------------------------


@tool(effect="idempotent", permissions=("memory",))
async def remember(ctx: ToolContext, text: str, tags: tuple[str, ...] = ()) -> str:
    """Store a fact in long-term memory, kept across runs; returns its id.

    Args:
        text: The fact, written to be understood later without this conversation.
        tags: Words to find it by.
    """
    return await _memory(ctx).remember(text, list(tags))


@tool(effect="read", permissions=("memory",))
async def recall(
    ctx: ToolContext, query: str, limit: Annotated[int, Field(ge=1, le=50)] = 5
) -> list[dict[str, Any]]:
    """Search long-term memory; returns the best matching facts.

    Args:
        query: What to look for.
        limit: At most this many facts.
    """
    return await _memory(ctx).recall(query, limit)


def _memory(ctx: ToolContext) -> Memory:
    if ctx.memory is None:
        raise ToolFailed("this agent has no long-term memory configured")
    return ctx.memory


# -- people and completion --------------------------------------------------------------


@tool(effect="read", permissions=("human",), gate=True)
def ask_human(ctx: ToolContext, question: str) -> dict[str, str]:
    """Ask a person a question and wait (durably, possibly for days) for the answer.

    Args:
        question: The question, with the context a person needs to answer it.
    """
    # The loop does not execute a gate tool: it waits for this event instead.
    return {"wait_event": gate_event(ctx.call_id), "question": question}


@tool(effect="read", finish=True)
def finish(summary: str) -> str:
    """Declare the task complete and stop.

    Args:
        summary: What was done, and anything left for a person to check.
    """
    return summary


BUILTINS: tuple[Tool, ...] = (
    read_file,
    write_file,
    list_dir,
    run_command,
    http_request,
    remember,
    recall,
    ask_human,
    finish,
)


def builtin_tools() -> list[Tool]:
    """Every built-in tool (only those the spec grants are ever offered)."""
    return list(BUILTINS)
