"""Opening a file without following any symbolic link: the file a check found is the file
read, whatever is swapped in after the check.

`open_no_links` opens a path one component at a time, each folder from its parent's
descriptor (`dir_fd`) with `O_NOFOLLOW`, so a link anywhere on the way (the file itself, or a
folder swapped for a link to elsewhere) raises OSError (ELOOP or ENOTDIR) instead of being
followed; the last component must be a regular file (a FIFO or a device swapped in is
refused without blocking). Plain Python (POSIX: where `O_NOFOLLOW` is missing, links are
followed as `open` does).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
FOLDER = FLAGS | getattr(os, "O_DIRECTORY", 0)
FILE = FLAGS | getattr(os, "O_NONBLOCK", 0)  # a FIFO swapped in cannot hold the open


def open_no_links(path: str | os.PathLike[str], below: str | os.PathLike[str] = "/") -> int:
    """A read-only descriptor of the regular file at `path`, relative to the folder `below`
    (itself opened as named: the trusted root) or absolute under `/`, no link followed.

    Raises:
        OSError: a component is a link (ELOOP, or ENOTDIR for a folder), missing, or the
            last one is not a regular file (EINVAL); `path` leads out of `below`.
    """
    parts = Path(path).parts
    if parts and parts[0] == os.sep:
        parts = parts[1:]
    if not parts or any(part in ("", ".", "..") for part in parts):
        raise OSError(errno.EINVAL, "not a path to a file below its folder", str(path))
    folder = os.open(below, FOLDER & ~getattr(os, "O_NOFOLLOW", 0))
    try:
        for part in parts[:-1]:
            inner = os.open(part, FOLDER, dir_fd=folder)
            os.close(folder)
            folder = inner
        handle = os.open(parts[-1], FILE, dir_fd=folder)
    finally:
        os.close(folder)
    if not stat.S_ISREG(os.fstat(handle).st_mode):
        os.close(handle)
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    os.set_blocking(handle, True)
    return handle
