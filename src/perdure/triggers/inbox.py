"""Inbox folders: one run per file content dropped in a folder, found by watchfiles or polling.

    @app.workflow()
    def summarise(path: str) -> str: ...

    app.inbox("incoming/", summarise, pattern="*.pdf", stable=1.0)

The occasion is the file's *content*: the run id is `inbox:{name}:{sha256[:32]}`
(`name` defaults to the workflow's name). So a restarted worker, or a second one
on any host, never starts a file again; a modified file is processed again (new
content, new run); a renamed or copied identical file is not (two files with the
same content are one occasion). The workflow gets the file's path as first found
(a str) as its first argument, and the full sha256 hex digest as `sha256=` if it
has a parameter of that name. The file may change after its run was created (be
edited, or swapped for a link to `/etc/shadow` by anyone who may write in the folder):
read it with `perdure.open_inbox_file()`, which opens it once without following a link
and gives its content only if its sha256 is the one the run was started for
(`InboxFileChanged` otherwise); a plain `open(path)` has no such guard.

A symlink is taken as the file it leads to (that file's path is the one given) if that file
is inside the folder; one leading out is skipped and logged once. Files are hashed through
descriptors opened from the folder's without following links.

A file is taken once its size, mtime and inode have not changed for `stable`
seconds, so a file still being written is not picked up half-written (a writer
that pauses longer than that mid-file should write under a temporary name and
rename when done). Hidden files and temporary names (`.*`, `*.tmp`, `*.part`,
`*.partial`, `*~`, `*.crdownload`) are never taken, nor anything `pattern` (a
glob on the file name, or several) does not match.

Every worker process watches the folder (an inbox is a service, see
`perdure.engine.services`): watchfiles wakes a scan when something changes, and a
full scan runs every 30 s anyway; without watchfiles, when it fails, or with
`force_polling=True`, the folder is scanned every `poll` seconds. A scan lists the
folder with `os.scandir`; each process hashes a file once per (size, mtime, inode)
it sees, in a thread, and asks the store about a content once while the file stays
in the folder. Thousands of files cost one listing per scan and nothing more.

Runs guard their contents only while they exist: if retention lets gc delete the
run of a file still in the folder, the next worker start processes it again. Move
or delete processed files, or keep their runs longer than the files stay.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import hashlib
import logging
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..engine.client import Client
from ..engine.retry import seconds
from ..engine.triggers import TriggerStatus
from ..errors import ConfigError
from ..nofollow import open_no_links

if TYPE_CHECKING:
    from ..engine.handles import Workflow
    from ..engine.runtime import Runtime
    from ..engine.worker import Worker

__all__ = ["Inbox", "add_inbox"]

log = logging.getLogger("perdure.inbox")

TEMP_SUFFIXES = (".tmp", ".part", ".partial", "~", ".crdownload")
RESCAN_EVERY = 30.0  # full scan even with notifications: an event lost is a file found late
START_BATCH = 64  # starts in flight at once: they share the store's commits
DIGEST_CHARS = 32  # 128 bits of the sha256 in the run id
CHANGED = (-1, -1, -1)  # a signature no file has: the file changed while it was hashed

Signature = tuple[int, int, int]  # size, mtime_ns, inode


@dataclass(slots=True)
class _File:
    """What this process knows of one path in the folder."""

    sig: Signature
    since: float  # engine time at which `sig` was first seen
    digest: str | None = None  # sha256 hex, once hashed while stable
    unreadable: bool = False  # hashing failed; retried when the file changes


class Inbox:
    """A folder watched by every worker; each new file content starts one run.

    Built by `App.inbox` / `add_inbox`. `name` scopes the run ids (`inbox:{name}:...`);
    `scan(now)` is one pass, which workers repeat.
    """

    kind = "inbox"

    def __init__(
        self,
        runtime: Runtime,
        folder: str | os.PathLike[str],
        workflow: str,
        *,
        name: str,
        pattern: str | Sequence[str] = "*",
        recursive: bool = False,
        stable: float | timedelta = 1.0,
        poll: float | timedelta = 2.0,
        force_polling: bool = False,
    ) -> None:
        where = f"inbox {name!r}"
        self.runtime = runtime
        self.workflow = workflow
        self.name = name
        self.scope = f"inbox:{name}"  # the run-id prefix, also in logs
        self.folder = _prepare_folder(Path(folder).expanduser().absolute(), where)
        self.patterns = (pattern,) if isinstance(pattern, str) else tuple(pattern)
        self.recursive = recursive
        self.stable = seconds(stable) or 0.0
        self.poll = seconds(poll) or 0.0
        self.force_polling = force_polling
        if self.stable < 0:
            raise ConfigError(f"{where}: stable={stable!r} must be 0 seconds or more")
        if self.poll <= 0:
            raise ConfigError(f"{where}: poll={poll!r} must be more than 0 seconds")
        if not self.patterns:
            raise ConfigError(f"{where}: pattern is empty; pass a glob such as '*.pdf'")
        self._files: dict[str, _File] = {}
        self._started: set[str] = set()  # digests this process handed to the engine
        self._refused_links: set[str] = set()  # symlinks out of the folder, logged once
        self._check_workflow(where)

    def __repr__(self) -> str:
        return f"Inbox({self.scope!r}, {str(self.folder)!r}, workflow={self.workflow!r})"

    def run_id(self, digest: str) -> str:
        """The run id of a file content: the occasion is the content, scoped by the inbox."""
        return f"{self.scope}:{digest[:DIGEST_CHARS]}"

    async def statuses(self, runtime: Runtime) -> list[TriggerStatus]:
        ok = self.folder.is_dir()
        error = None if ok else f"{self.folder} is not a folder"
        return [TriggerStatus("inbox", self.name, self.workflow, "watching" if ok else "error",
                              None, error, str(self.folder))]  # fmt: skip

    # -- the service ---------------------------------------------------------------

    async def run(self, worker: Worker) -> None:
        """Scan on every change (or every `poll` seconds) until the worker stops."""
        wake, halt = asyncio.Event(), asyncio.Event()
        watcher = None if self.force_polling else asyncio.create_task(self._watch(wake, halt))
        try:
            while not worker.stopping.is_set():
                wake.clear()
                now = worker.clock.now()
                await self.scan(now)
                watching = watcher is not None and not watcher.done()
                delay = self._delay(now, RESCAN_EVERY if watching else self.poll)
                await _first_of(delay, wake, worker.stopping)
        finally:
            halt.set()  # the watcher's thread sees it within 50 ms and returns
            if watcher is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(watcher, 2.0)

    async def _watch(self, wake: asyncio.Event, halt: asyncio.Event) -> None:
        """Set `wake` whenever watchfiles reports a change; return (polling takes over)
        if it is missing or fails."""
        try:
            from watchfiles import awatch
        except ImportError:
            log.info("%s: watchfiles is not installed; polling every %.1fs", self.scope, self.poll)
            return
        try:
            changes = awatch(
                self.folder, watch_filter=None, stop_event=halt, recursive=self.recursive
            )
            async for _ in changes:
                wake.set()
        except Exception as exc:
            log.warning(
                "%s: cannot watch %s (%s); polling every %.1fs",
                self.scope,
                self.folder,
                exc,
                self.poll,
            )
        finally:
            wake.set()  # the scan loop recomputes its delay without the watcher

    def _delay(self, now: float, idle: float) -> float:
        """Seconds until the next scan: `idle`, or sooner when a file is due to be stable."""
        due = [
            f.since + self.stable - now
            for f in self._files.values()
            if f.digest is None and not f.unreadable
        ]
        return max(0.01, min([idle, *due]))

    # -- one pass --------------------------------------------------------------------

    async def scan(self, now: float) -> list[str]:
        """List the folder, hash the files that became stable, start runs for new contents.

        Args:
            now: engine time (`clock.now()`); a file is stable once its signature has
                been seen unchanged for `stable` seconds of it.

        Returns:
            The run ids handed to the engine in this pass (each new to this process;
            an id that already exists in the store is left as it is).
        """
        listing = await asyncio.to_thread(self._list)
        for path in self._files.keys() - listing.keys():
            del self._files[path]
        fresh: dict[str, str] = {}  # digest -> path first found with it
        for path, sig in sorted(listing.items()):  # of identical files, the first by name
            known = self._files.get(path)
            if known is None or known.sig != sig:
                known = self._files[path] = _File(sig, now)
            if known.digest is None and not known.unreadable and now - known.since >= self.stable:
                await self._hash(path, known, now)
            if known.digest is not None and known.digest not in self._started:
                fresh.setdefault(known.digest, path)
        self._started &= {f.digest for f in self._files.values() if f.digest}
        return await self._start(fresh)

    def _list(self) -> dict[str, Signature]:
        """Every candidate file under the folder with its signature (runs in a thread)."""
        found: dict[str, Signature] = {}
        root = os.path.realpath(self.folder)
        pending = [str(self.folder)]
        while pending:
            top = pending.pop()
            try:
                entries = list(os.scandir(top))
            except OSError as exc:
                if top == str(self.folder):
                    raise OSError(f"{self.scope}: cannot list {top} ({exc.strerror})") from None
                continue  # a subfolder removed while listed, or not readable
            for entry in entries:
                if _ignored(entry.name):
                    continue
                try:
                    if entry.is_dir(follow_symlinks=False):
                        if self.recursive:
                            pending.append(entry.path)
                        continue
                    if not entry.is_file() or not self._matches(entry.name):
                        continue
                    path: str | None = entry.path
                    if entry.is_symlink():  # taken as the file it leads to, if inside
                        path = self._link_inside(entry.path, root)
                    if path is None or _ignored(os.path.basename(path)):
                        continue
                    st = os.stat(path, follow_symlinks=False)
                except OSError:  # removed between listing and stat, or a dangling symlink
                    continue
                if stat.S_ISREG(st.st_mode):
                    found[path] = (st.st_size, st.st_mtime_ns, st.st_ino)
        return found

    def _link_inside(self, path: str, root: str) -> str | None:
        """The path (under the folder as named) of the file a symlink leads to, if inside the
        folder: one leading out (to /etc/shadow, say) is never followed, since its run id
        would reveal the target's sha256 to anyone who may read runs; it is skipped (None)
        and logged once."""
        target = os.path.realpath(path)
        if os.path.commonpath([root, target]) == root:
            return os.path.join(self.folder, os.path.relpath(target, root))
        if path not in self._refused_links:
            self._refused_links.add(path)
            log.warning("%s: skipped %s: a symlink leading out of the folder (to %s)",
                        self.scope, path, target)  # fmt: skip
        return None

    def _matches(self, filename: str) -> bool:
        return any(fnmatch.fnmatch(filename, p) for p in self.patterns)

    async def _hash(self, path: str, known: _File, now: float) -> None:
        try:
            digest = await asyncio.to_thread(_digest, self.folder, path, known.sig)
        except FileNotFoundError:
            del self._files[path]
            return
        except OSError as exc:
            log.warning("%s: cannot read %s (%s); skipped until it changes", self.scope, path, exc)
            known.unreadable = True
            return
        if digest is None:  # it changed while read: stable again before it is taken
            known.sig, known.since = CHANGED, now
        else:
            known.digest = digest

    async def _start(self, fresh: dict[str, str]) -> list[str]:
        """Start one run per new digest, `START_BATCH` at a time; raise the first failure
        after recording the starts that landed (the supervisor retries the rest)."""
        items = list(fresh.items())
        started: list[str] = []
        failure: BaseException | None = None
        for i in range(0, len(items), START_BATCH):
            batch = items[i : i + START_BATCH]
            results = await asyncio.gather(
                *(self._start_one(digest, path) for digest, path in batch),
                return_exceptions=True,
            )
            for (digest, _), result in zip(batch, results, strict=True):
                if isinstance(result, BaseException):
                    failure = failure or result
                else:
                    self._started.add(digest)
                    started.append(result)
        if started:
            log.info(
                "%s: started (or found) the runs of %d file content(s)", self.scope, len(started)
            )
        if failure is not None:
            raise failure
        return started

    async def _start_one(self, digest: str, path: str) -> str:
        kwargs: dict[str, Any] = {"sha256": digest} if self._wants_digest() else {}
        origin = {"inbox": self.name, "path": path, "sha256": digest, "folder": str(self.folder)}
        run = await Client(self.runtime).start(
            self.workflow, (path,), kwargs, run_id=self.run_id(digest), origin=origin
        )
        return run.id

    def _wants_digest(self) -> bool:
        definition = self.runtime.workflows.get(self.workflow)
        return definition is not None and "sha256" in definition.signature.parameters

    def _check_workflow(self, where: str) -> None:
        """Refuse now a registered workflow that cannot take a path (one registered later
        is checked at its first start)."""
        definition = self.runtime.workflows.get(self.workflow)
        if definition is None:
            return
        kwargs = {"sha256": "0" * 64} if self._wants_digest() else {}
        try:
            definition.signature.bind("path", **kwargs)
        except TypeError as exc:
            raise ConfigError(
                f"{where}: workflow {self.workflow!r} must take the file path as its only "
                f"required argument ({exc})"
            ) from None


def add_inbox(
    runtime: Runtime,
    folder: str | os.PathLike[str],
    workflow: Workflow[..., Any] | str,
    *,
    name: str | None = None,
    pattern: str | Sequence[str] = "*",
    recursive: bool = False,
    stable: float | timedelta = 1.0,
    poll: float | timedelta = 2.0,
    force_polling: bool = False,
) -> Inbox:
    """Start one run of `workflow` per file content dropped in `folder`, from every worker.

    Args:
        app: the app whose workers watch the folder.
        folder: the folder to watch; created if missing.
        workflow: the workflow (or its name); it gets the file's path as its first
            argument, and `sha256=` if it has a parameter of that name.
        name: scopes the run ids (`inbox:{name}:{sha256[:32]}`); default the workflow's
            name. Two inboxes of one app need different names.
        pattern: a glob on the file name (`"*.pdf"`), or several.
        recursive: watch subfolders too (hidden ones are skipped).
        stable: seconds a file's size and mtime must stay unchanged before it is taken.
        poll: seconds between scans when there are no notifications.
        force_polling: scan every `poll` seconds instead of using watchfiles.

    Returns:
        The `Inbox`, kept with the runtime's triggers.

    Raises:
        ConfigError: `folder` is not a directory (or cannot be created), a name is
            taken, an option is out of range, or the workflow cannot take a path.
    """
    wf_name = workflow if isinstance(workflow, str) else workflow.name
    label = name or wf_name
    if runtime.triggers.find(Inbox, label) is not None:
        raise ConfigError(f"two inboxes are named {label!r}; pass name=... to one")
    inbox = Inbox(
        runtime,
        folder,
        wf_name,
        name=label,
        pattern=pattern,
        recursive=recursive,
        stable=stable,
        poll=poll,
        force_polling=force_polling,
    )
    return runtime.triggers.add(inbox)


def _prepare_folder(path: Path, where: str) -> Path:
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{where}: {path} exists and is not a directory; pass a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{where}: cannot create folder {path} ({exc.strerror})") from None
    return path


def _ignored(filename: str) -> bool:
    """Hidden and temporary names: files still being written, by convention."""
    return filename.startswith(".") or filename.lower().endswith(TEMP_SUFFIXES)


def _digest(folder: Path, path: str, sig: Signature) -> str | None:
    """The sha256 of a file of the folder, opened without following a link (a file swapped
    for one since it was listed raises OSError), or None if it is not the file listed or
    changed while read."""
    with os.fdopen(open_no_links(os.path.relpath(path, folder), below=folder), "rb") as f:
        if _signature(os.fstat(f.fileno())) != sig:
            return None
        digest = hashlib.file_digest(f, "sha256").hexdigest()
        if _signature(os.fstat(f.fileno())) != sig:
            return None
    if _signature(os.stat(path, follow_symlinks=False)) != sig:  # replaced while read
        return None
    return digest


def _signature(st: os.stat_result) -> Signature:
    return (st.st_size, st.st_mtime_ns, st.st_ino)


async def _first_of(timeout: float, *events: asyncio.Event) -> None:
    """Wait until one of `events` is set, or `timeout` seconds."""
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
