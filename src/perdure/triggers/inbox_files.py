"""`perdure.open_inbox_file()`: the file that started an inbox run, exactly as it was.

An inbox records, when it starts a run, the folder, the file's path and the sha256 of its
content (the run's `origin`). Between that moment and the moment the run reads the file,
anyone who may write in the folder can swap it: for a link to `/etc/shadow`, for other
content. `open_inbox_file` opens the path once, from the folder's descriptor, following no
link (`nofollow.open_no_links`), copies what it reads while hashing it, and hands the copy
over only if its sha256 is the one recorded; otherwise `InboxFileChanged`, and the run never
sees a byte of the other content. A plain `open(path)` in a workflow has no such guard.

    @app.step(effect="read")
    def load(path: str) -> str:
        with perdure.open_inbox_file() as dropped:
            return dropped.read().decode()

In a step, the content read is journaled with its outcome; read in the workflow itself, it is
read again at each replay (a file moved away since then fails the recovered run).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from typing import IO

from ..engine.context import current, require
from ..errors import InboxFileChanged, PerdureError
from ..nofollow import open_no_links

__all__ = ["open_inbox_file", "started_for"]

IN_MEMORY = 8 * 1024 * 1024  # bytes of the copy kept in memory; larger ones spill to disk
READ = 1024 * 1024  # bytes read at a time


def started_for(path: str | os.PathLike[str]) -> bool:
    """Whether the calling run is an inbox run started for the file at `path` (then read it
    with `open_inbox_file`); False outside a run."""
    ctx = current()
    if ctx is None or "inbox" not in ctx.origin or "sha256" not in ctx.origin:
        return False
    started = str(ctx.origin.get("path", ""))
    return os.path.abspath(path) == os.path.abspath(started)


def open_inbox_file() -> IO[bytes]:
    """The content of the file that started the calling run (an inbox run), as a binary
    file positioned at its start (a checked copy: close it, or use `with`).

    Callable in the workflow or in any of its steps.

    Raises:
        InboxFileChanged: the file is gone, is (or lies behind) a symbolic link, is not a
            regular file, or its sha256 is not the one recorded when the run was started.
        PerdureError: outside a workflow, or in a run no inbox started.
    """
    ctx = require("open_inbox_file")
    origin = ctx.origin
    if "inbox" not in origin or "sha256" not in origin:
        raise PerdureError(
            f"perdure.open_inbox_file(): run {ctx.run_id!r} was not started by an inbox "
            "folder (it reads the file an inbox run was started for)"
        )
    path, digest = str(origin["path"]), str(origin["sha256"])
    folder = str(origin.get("folder") or os.path.dirname(path))  # older runs: its own folder
    shown = os.path.relpath(path, folder)  # never the server's absolute path: errors reach MCP
    where = f"inbox {origin['inbox']!r}: run {ctx.run_id!r}"
    copy = tempfile.SpooledTemporaryFile(max_size=IN_MEMORY)  # noqa: SIM115 (handed to the caller)
    try:
        try:
            handle = open_no_links(shown, below=folder)
        except OSError as exc:
            raise InboxFileChanged(
                f"{where}: cannot open {shown} without following a link ({exc.strerror}): "
                "it was moved, or swapped for a link or a folder, since the run was started"
            ) from None
        found = hashlib.sha256()
        with os.fdopen(handle, "rb") as dropped:
            while block := dropped.read(READ):
                found.update(block)
                copy.write(block)
        if found.hexdigest() != digest:
            raise InboxFileChanged(
                f"{where}: {shown} is not the content the run was started for (sha256 "
                f"{found.hexdigest()[:16]}..., started for {digest[:16]}...): it was replaced "
                "or edited since; its new content starts a run of its own"
            )
    except BaseException:
        copy.close()
        raise
    copy.seek(0)
    return copy
