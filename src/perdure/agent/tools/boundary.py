"""The agent's boundary: the paths it may read and write, the commands and hosts it may use.

Everything is denied unless the spec grants it. A check that fails raises
`ToolRefused`; the call is then journaled as refused, shown to the model as an
error and never executed.

Paths are checked twice: lexically (`..` may not climb out of a root) and on the
real, symlink-resolved path of the target and of every existing component on the
way to it, so a symlink inside a root that points outside gives nothing away.

No path with a `.git` component is read or written, whatever the roots: a repository's
`.git` holds its configuration and hooks, which run commands (`core.fsmonitor`, hooks,
filters) the next time git runs there, perdure's own workspace commit included; a
write root over it would equal granting every command.
"""

from __future__ import annotations

import ipaddress
import os
import shlex
from collections.abc import Iterable, Sequence
from fnmatch import fnmatchcase
from pathlib import Path
from urllib.parse import urlsplit

from ...errors import PerdureError
from ...nofollow import open_no_links

# Characters a shell would interpret; commands given as one string may contain none.
_SHELL_META = frozenset(";&|<>`$(){}[]*?!~#\\\"'\n\r\t")
_DEFAULT_PORTS = {"http": 80, "https": 443}


class ToolRefused(PerdureError):
    """Raised when a tool call is not granted, has invalid arguments or leaves the boundary;
    the call is journaled as refused and shown to the model, never executed."""


class Boundary:
    """What an agent may touch. Empty means nothing: deny by default.

    Args:
        read_paths: Roots the agent may read (write roots are readable too).
        write_paths: Roots the agent may create and overwrite files in.
        commands: Allowed commands: an executable name (`"git"`, matched exactly against
            argv[0], so `./git` is not `git`) or an argv prefix (`"git status"` or
            `("git", "status")`), which is tighter: `"python"` allows any Python code.
        hosts: Allowed hosts for HTTP: `"api.github.com"`, `"*.example.com"` (subdomains
            only), `"127.0.0.1:8080"` (that port only). IP literals only if listed.
        granted: Tool names the model may be offered; `fnmatch` patterns such as
            `"github__*"` grant every tool of one MCP server.
        approval_required: Tools that open a gate before they execute; `"*"` means every
            destructive tool.
        workdir: Where relative paths start and commands run; defaults to the first read
            root, else the first write root. An agent passes its workspace (the spec's
            folder by default), where the spec's own paths start.
    """

    def __init__(
        self,
        read_paths: Iterable[str | os.PathLike[str]] = (),
        write_paths: Iterable[str | os.PathLike[str]] = (),
        commands: Iterable[str | Sequence[str]] = (),
        hosts: Iterable[str] = (),
        granted: Iterable[str] = (),
        approval_required: Iterable[str] = (),
        *,
        workdir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.write_paths = tuple(Path(os.path.abspath(p)) for p in write_paths)
        self.read_paths = tuple(Path(os.path.abspath(p)) for p in read_paths)
        self.commands = tuple(_command_prefix(c) for c in commands)
        self.hosts = tuple(_host_entry(h) for h in hosts)
        self.granted = frozenset(granted)
        self.approval_required = frozenset(approval_required)
        roots = self.read_paths + self.write_paths
        start = workdir if workdir is not None else (roots[0] if roots else os.getcwd())
        self.workdir = Path(os.path.abspath(start))

    # -- tools and permissions ----------------------------------------------------------

    def grants(self, tool_name: str) -> bool:
        """Whether the spec grants the tool of that name."""
        return any(fnmatchcase(tool_name, pattern) for pattern in self.granted)

    def allows(self, permission: str) -> bool:
        """Whether the boundary gives anything a permission needs (no roots, no fs.read)."""
        if permission == "fs.read":
            return bool(self.read_paths or self.write_paths)
        if permission == "fs.write":
            return bool(self.write_paths)
        if permission == "process.run":
            return bool(self.commands)
        if permission == "net.http":
            return bool(self.hosts)
        return True  # memory, human, mcp:*: granting the tool is the whole permission

    # -- paths --------------------------------------------------------------------------

    def resolve_read(self, path: str) -> Path:
        """The real absolute path of `path` if it lies inside a read (or write) root.

        Raises:
            ToolRefused: `..` escapes, absolute paths outside the roots, symlinks leading
                outside, or roots that do not exist.
        """
        return self._resolve(path, self.read_paths + self.write_paths, "read")

    def resolve_write(self, path: str) -> Path:
        """The real absolute path of `path` if it lies inside a write root (see resolve_read)."""
        return self._resolve(path, self.write_paths, "write")

    def _resolve(self, path: str, roots: tuple[Path, ...], verb: str) -> Path:
        if not isinstance(path, str) or not path or "\x00" in path:
            raise ToolRefused(f"{verb} {path!r}: not a valid path")
        if not roots:
            raise ToolRefused(f"{verb} {path!r}: no paths are granted for {verb}ing")
        candidate = Path(path) if os.path.isabs(path) else self.workdir / path
        lexical = Path(os.path.normpath(candidate))
        if _in_git_dir(lexical) or _in_git_dir(Path(os.path.realpath(candidate))):
            raise ToolRefused(f"{verb} {path!r}: paths in a repository's .git are never "
                              "granted (its config and hooks run commands)")  # fmt: skip
        live = [r for r in roots if r.is_dir()]
        real_roots = [Path(os.path.realpath(r)) for r in live]
        # Every refusal names the path as resolved and the roots it was checked against,
        # so the model (and the journal) can see why, whatever the working directory; both
        # relative to the workspace (`shown`): a refusal tells no absolute server path.
        shown = self.shown
        allowed = f"the allowed paths ({', '.join(dict.fromkeys(shown(r) for r in roots))})"
        if not any(_inside(lexical, r) for r in (*roots, *real_roots)):
            raise ToolRefused(f"{verb} {path!r}: {shown(lexical)} is outside {allowed}")
        if not any(_inside(lexical, r) for r in (*live, *real_roots)):
            missing = next(r for r in roots if _inside(lexical, r))
            raise ToolRefused(f"{verb} {path!r}: its allowed root {shown(missing)} does not exist")
        # Every existing step at or below a root, and the target itself, must stay inside
        # once symlinks are followed (a dangling symlink resolves to where it points).
        step = Path(candidate.anchor)
        for part in candidate.parts[1:]:
            step = step / part
            below = Path(os.path.normpath(step))
            if not any(_inside(below, r) for r in (*live, *real_roots)):
                continue  # an ancestor of the root: the root's own realpath covers it
            target = Path(os.path.realpath(step))
            if os.path.lexists(step) and not _within(target, real_roots):
                raise ToolRefused(
                    f"{verb} {path!r}: the symlink {shown(below)} leads to "
                    f"{shown(target, real=True)}, outside {allowed}"
                )
        real = Path(os.path.realpath(candidate))
        if not _within(real, real_roots):
            raise ToolRefused(f"{verb} {path!r}: {shown(lexical)} resolves to "
                              f"{shown(real, real=True)}, outside {allowed}")  # fmt: skip
        return real

    def shown(self, path: Path, *, real: bool = False) -> str:
        """`path` as a refusal names it: relative to the workspace (`workdir`; `real`: to
        the workspace's symlink-resolved path, for a resolved `path`), `..` included for a
        place outside it, never absolute, so what a model, a journal or an MCP caller is
        shown of a refusal tells no server path."""
        base = os.path.realpath(self.workdir) if real else self.workdir
        return os.path.relpath(path, base)

    # -- commands -----------------------------------------------------------------------

    def check_command(self, argv: Sequence[str] | str) -> list[str]:
        """The argv to execute (without a shell) if the allowlist permits it.

        A string is split like a shell would but may contain no shell syntax at all.

        Raises:
            ToolRefused: empty argv, shell syntax, or no allowlist entry matches.
        """
        if isinstance(argv, str):
            bad = sorted(set(argv) & _SHELL_META)
            if bad:
                raise ToolRefused(
                    f"command {argv!r}: shell syntax {''.join(bad)!r} is not allowed; "
                    "pass the command as a list of arguments"
                )
            argv = shlex.split(argv)
        args = list(argv)
        if not args or not all(isinstance(a, str) for a in args) or not args[0]:
            raise ToolRefused("command: argv must be a non-empty list of strings")
        if any("\x00" in a for a in args):
            raise ToolRefused("command: arguments may not contain NUL characters")
        if any(tuple(args[: len(prefix)]) == prefix for prefix in self.commands):
            return args
        allowed = ", ".join(" ".join(p) for p in self.commands) or "none"
        raise ToolRefused(f"command {args[0]!r} is not allowed (allowed: {allowed})")

    # -- hosts --------------------------------------------------------------------------

    def check_host(self, url: str) -> str:
        """`url` if its scheme is http(s) and its host (and port) are allowlisted.

        Raises:
            ToolRefused: other schemes, userinfo (`http://allowed@evil`), unlisted hosts,
                IP literals that are not listed, malformed URLs.
        """
        if not isinstance(url, str) or any(c.isspace() or ord(c) < 32 or c == "\\" for c in url):
            raise ToolRefused(f"url {url!r}: contains whitespace, control or backslash characters")
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in _DEFAULT_PORTS:
            raise ToolRefused(f"url {url!r}: only http and https are allowed")
        if "@" in parts.netloc:
            raise ToolRefused(f"url {url!r}: credentials in the URL (user@host) are not allowed")
        try:
            host, port = (parts.hostname or "").rstrip("."), parts.port
        except ValueError:
            raise ToolRefused(f"url {url!r}: malformed host or port") from None
        if not host:
            raise ToolRefused(f"url {url!r}: no host")
        port = port or _DEFAULT_PORTS[scheme]
        if any(_host_matches(host, port, entry) for entry in self.hosts):
            return url
        if _is_ip(host):
            raise ToolRefused(f"url {url!r}: IP addresses are refused unless allowlisted")
        allowed = ", ".join(h if p is None else f"{h}:{p}" for h, p in self.hosts) or "none"
        raise ToolRefused(f"url {url!r}: host {host!r} is not allowed (allowed: {allowed})")


def read_no_links(path: Path) -> bytes:
    """The bytes of the file at the absolute `path`, opened from `/` without following any
    symbolic link (`nofollow.open_no_links`): a path checked by `Boundary.resolve_read`
    (which gives a real path) then swapped, wholly or in part, for a link to somewhere else
    raises OSError (ELOOP or ENOTDIR) instead of being read."""
    if not path.is_absolute():
        raise OSError(22, "not an absolute path to a file", str(path))
    with os.fdopen(open_no_links(path), "rb") as opened:
        return opened.read()


def _in_git_dir(path: Path) -> bool:
    """`path` has a `.git` component (any case: some file systems ignore it; a trailing dot
    or space too: Windows drops them)."""
    return any(part.casefold().rstrip(". ") == ".git" for part in path.parts)


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _within(path: Path, roots: list[Path]) -> bool:
    return any(_inside(path, r) for r in roots)


def _command_prefix(entry: str | Sequence[str]) -> tuple[str, ...]:
    prefix = tuple(shlex.split(entry)) if isinstance(entry, str) else tuple(entry)
    if not prefix or not all(isinstance(p, str) and p for p in prefix):
        from ...errors import ConfigError

        raise ConfigError(f"boundary: command entry {entry!r} is empty")
    return prefix


def _host_entry(entry: str) -> tuple[str, int | None]:
    parts = urlsplit("//" + entry.strip().lower())
    if not parts.hostname or parts.username is not None or parts.path:
        from ...errors import ConfigError

        raise ConfigError(f"boundary: host entry {entry!r} is not a host or host:port")
    return parts.hostname.rstrip("."), parts.port


def _host_matches(host: str, port: int, entry: tuple[str, int | None]) -> bool:
    allowed, allowed_port = entry
    if allowed_port is not None and allowed_port != port:
        return False
    if allowed.startswith("*.") and not _is_ip(host):
        return host.endswith(allowed[1:])
    return host == allowed


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
