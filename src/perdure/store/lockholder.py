"""Who holds an SQLite store's write lock: a record the holder writes beside the database.

SQLite lets one connection write at a time and cannot say which. So a process that
takes the write lock writes one fixed-size record into `<db>-holder` (its pid, host,
since when, what it writes: which runs, which transactional step) and blanks it again
just before it commits. Only the lock holder writes, so writes never race, and nothing
needs the lock itself: a waiter, `perdure stuck` and `/readyz` read the record to name
the holder, and /proc says whether that process is still there or stopped (SIGSTOP).
A record left by a process that died is recognised (pid gone or reused) and ignored.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass

log = logging.getLogger("perdure.store")

RECORD_SIZE = 1024  # one pwrite both writes and blanks it (names and ids are cut to fit)
_BLANK = b" " * RECORD_SIZE
_MOST_RUNS = 3  # runs named in a record; more are counted
_quoted = json.encoder.encode_basestring_ascii  # a JSON string literal, as json.dumps writes it
_TAIL_ROOM = RECORD_SIZE - 400  # what the pid, host and times leave of a record (hosts <= 255)


def holder_path(db_path: str) -> str:
    """The side file of the SQLite file `db_path`."""
    return f"{db_path}-holder"


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command name (state first), or None without /proc or pid."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rsplit(")", 1)[-1].split()
    except OSError:
        return None


def start_ticks(pid: int) -> int | None:
    """When the process started (clock ticks since boot), to tell a reused pid apart."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields and len(fields) > 19 and fields[19].isdigit() else None


def process_state(pid: int) -> str:
    """What this host knows of `pid`: "stopped (SIGSTOP)", "stopped by a debugger", "gone"
    or "alive"."""
    fields = _stat_fields(pid)
    if fields is None:  # no such pid, or no /proc (not Linux): ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return "gone"
        except OSError:
            return "alive"  # someone else's live process
        return "alive"
    state = fields[0] if fields else ""
    if state == "T":
        return "stopped (SIGSTOP)"
    if state == "t":
        return "stopped by a debugger"
    if state in ("Z", "X"):
        return "gone"
    return "alive"


@dataclass(frozen=True, slots=True)
class Holder:
    """The record of the process that holds (or held) the write lock."""

    pid: int
    host: str
    since: float  # wall-clock seconds (time.time()) when it took the lock
    what: str  # "transactional step", "write" or "migration"
    runs: tuple[str, ...] = ()
    more_runs: int = 0
    step: str | None = None
    started: int | None = None  # start_ticks of the pid, to tell reuse apart

    def current(self) -> bool:
        """False when the record was left by a process that is gone (or whose pid is reused)."""
        if self.host != socket.gethostname():
            return True  # another host: nothing here can tell
        if process_state(self.pid) == "gone":
            return False
        ticks = start_ticks(self.pid)
        return self.started is None or ticks is None or ticks == self.started

    def describe(self, worker: str | None = None, now: float | None = None) -> str:
        """One phrase: who, doing what, since when, and whether the process is stopped."""
        held = (now if now is not None else time.time()) - self.since
        at = time.strftime("%H:%M:%S", time.gmtime(self.since))
        who = f"pid {self.pid} on host {self.host}" + (f" (worker {worker})" if worker else "")
        doing = self.what
        if self.step:
            doing += f" {self.step!r}"
        if self.runs:
            runs = ", ".join(self.runs) + (f" and {self.more_runs} more" if self.more_runs else "")
            doing += f" of run {runs}" if len(self.runs) == 1 else f" of runs {runs}"
        text = f"{who}, {doing}, since {at} UTC ({held:.0f}s)"
        if self.host == socket.gethostname():
            state = process_state(self.pid)
            if state != "alive":
                text += f"; pid {self.pid} is {state}"
        return text


def parse(raw: bytes) -> Holder | None:
    """The record in `raw`, or None if it is blank (nobody holds the lock) or unreadable."""
    text = raw.decode("utf-8", errors="replace").strip()
    if not text:
        return None
    try:
        d = json.loads(text)
        return Holder(
            pid=int(d["pid"]), host=str(d["host"]), since=float(d["since"]), what=str(d["what"]),
            runs=tuple(str(r) for r in d.get("runs", ())), more_runs=int(d.get("more", 0)),
            step=None if d.get("step") is None else str(d["step"]),
            started=None if d.get("started") is None else int(d["started"]),
        )  # fmt: skip
    except (ValueError, KeyError, TypeError):
        return None


def read_holder(path: str, older_than: float = 0.0) -> Holder | None:
    """The current holder recorded in the side file `path`, or None (none, stale, unreadable,
    or holding for less than `older_than` seconds: then /proc is not even asked).

    A reader may meet a record half rewritten: it reads again a few times before giving up.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        for _ in range(3):
            raw = os.pread(fd, RECORD_SIZE, 0)
            if not raw.strip():
                return None
            found = parse(raw)
            if found is not None:
                young = older_than > 0 and time.time() - found.since < older_than
                return None if young or not found.current() else found
            time.sleep(0.001)
        return None
    finally:
        os.close(fd)


def _tail(what: str, runs: tuple[str, ...], step: str | None, cut: int = 100) -> str:
    """The record's fields after `since`: what is written, of which runs, by which step;
    names cut to `cut` characters, shorter still if escaped they would not fit the record."""
    names = list(dict.fromkeys(runs))
    shown = ",".join(_quoted(r[:cut]) for r in names[:_MOST_RUNS])  # json.dumps: 4x slower
    more = max(0, len(names) - _MOST_RUNS)
    named = "null" if step is None else _quoted(step[:cut])
    tail = f'"what":"{what}","runs":[{shown}],"more":{more},"step":{named}}}'
    if len(tail) > _TAIL_ROOM and cut > 10:  # e.g. ids of emoji, 12 bytes each escaped
        return _tail(what, runs, step, 10)
    return tail


class HolderFile:
    """This process's writer of the side file: `hold` after taking the lock, `free` before
    giving it up. Cheap (one pwrite each); a file that cannot be written is given up on."""

    def __init__(self, db_path: str) -> None:
        self.path = holder_path(db_path)
        self._fd: int | None = None
        self._broken = False
        self._held = False
        self._me = (os.getpid(), socket.gethostname(), start_ticks(os.getpid()))
        self._prefix = self._record_prefix()
        self._said: tuple[str, tuple[str, ...], str | None] | None = None
        self._tail = ""

    def hold(self, what: str, runs: Iterable[str] = (), step: str | None = None) -> None:
        if self._me[0] != os.getpid():  # forked: this is another process now
            self._me = (os.getpid(), socket.gethostname(), start_ticks(os.getpid()))
            self._prefix = self._record_prefix()
        fd = self._fd if self._fd is not None else self._open()
        if fd is None:
            return
        said = (what, tuple(runs), step)
        if said != self._said:  # a worker's writes are mostly of the run it wrote last
            self._said, self._tail = said, _tail(*said)
        # formatted by hand: this runs in every write transaction, json.dumps of it is slower
        data = f'{self._prefix},"since":{time.time():.3f},{self._tail}'.encode()
        try:
            os.pwrite(fd, data[:RECORD_SIZE].ljust(RECORD_SIZE), 0)
        except OSError as exc:
            self._give_up(fd, exc)
            return
        self._held = True

    def free(self) -> None:
        fd = self._fd
        if self._held and fd is not None:
            self._held = False
            try:
                os.pwrite(fd, _BLANK, 0)
            except OSError as exc:
                self._give_up(fd, exc)

    def close(self) -> None:
        self.free()
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def _open(self) -> int | None:
        if not self._broken:
            try:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                self._broken = True
                log.info("store %s: cannot record the write lock's holder: %s", self.path, exc)
        return self._fd

    def _record_prefix(self) -> str:
        pid, host, started = self._me
        return f'{{"pid":{pid},"host":{json.dumps(host)},"started":{json.dumps(started)}'

    def _give_up(self, fd: int, exc: OSError) -> None:
        """The record cannot be written: stop trying (the lock's holder stays unnamed)."""
        self._broken = True
        log.info("store %s: cannot record the write lock's holder: %s", self.path, exc)
        with contextlib.suppress(OSError):
            os.close(fd)
        self._fd = None
