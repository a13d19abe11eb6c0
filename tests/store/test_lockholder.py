"""The write-lock holder record: written and blanked by the holder, read by anyone, and a
record whose process is gone (or whose pid was reused) is not believed."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

from hypothesis import example, given, settings
from hypothesis import strategies as st

from perdure.store.lockholder import (
    RECORD_SIZE,
    HolderFile,
    holder_path,
    process_state,
    read_holder,
    start_ticks,
)


def _write_record(path: str, **fields: object) -> None:
    record = {"pid": os.getpid(), "host": socket.gethostname(), "since": 1.0, "what": "write",
              **fields}  # fmt: skip
    Path(path).write_bytes(json.dumps(record).encode().ljust(RECORD_SIZE))


def test_the_record_names_the_holder_until_it_is_freed(tmp_path: Path) -> None:
    """hold() makes read_holder name this pid, the runs and the step; free() blanks it."""
    db = str(tmp_path / "s.db")
    holder = HolderFile(db)
    holder.hold("transactional step", ["r1", "r2", "r1", "r3", "r4"], "charge")
    found = read_holder(holder_path(db))
    assert found is not None
    assert (found.pid, found.host, found.step) == (os.getpid(), socket.gethostname(), "charge")
    assert found.runs == ("r1", "r2", "r3") and found.more_runs == 1
    text = found.describe("w-1")
    assert f"pid {os.getpid()}" in text and "(worker w-1)" in text
    assert "transactional step 'charge' of runs r1, r2, r3 and 1 more" in text
    assert "stopped" not in text  # this process runs
    holder.free()
    assert read_holder(holder_path(db)) is None
    holder.close()


@settings(max_examples=80, deadline=None)
@given(
    runs=st.lists(st.text(min_size=1, max_size=200), max_size=5),
    step=st.none() | st.text(max_size=200),
)
@example(runs=["\U0001f600" * 100 + str(i) for i in range(4)], step='"\\' * 60)
def test_any_run_ids_and_step_name_read_back_as_written(runs: list[str], step: str | None) -> None:
    """Run ids and step names may hold quotes, backslashes and any Unicode (an emoji is 12
    bytes escaped): the record, formatted by hand, still fits and reads back: the first
    three distinct ids and the step, each cut to a prefix of at least 10 characters."""
    db = os.path.join(tempfile.mkdtemp(), "s.db")
    holder = HolderFile(db)
    holder.hold("write", runs, step)
    found = read_holder(holder_path(db))
    holder.close()
    assert found is not None
    distinct = list(dict.fromkeys(runs))[:3]
    assert len(found.runs) == len(distinct)
    assert found.more_runs == max(0, len(dict.fromkeys(runs)) - 3)
    for shown, run in zip(found.runs, distinct, strict=True):
        assert run.startswith(shown) and len(shown) >= min(10, len(run))
    if step is None:
        assert found.step is None
    else:
        assert found.step is not None and step.startswith(found.step)
        assert len(found.step) >= min(10, len(step))


def test_a_record_of_a_gone_or_reused_pid_is_not_believed(tmp_path: Path) -> None:
    """A record left by a process that exited, or naming our pid with another start time, is
    ignored; a torn or foreign file reads as nobody."""
    path = holder_path(str(tmp_path / "s.db"))
    child = subprocess.Popen(["true"])
    child.wait()
    _write_record(path, pid=child.pid)
    assert read_holder(path) is None
    ticks = start_ticks(os.getpid())
    assert ticks is not None
    _write_record(path, started=ticks + 1)
    assert read_holder(path) is None
    _write_record(path, started=ticks)
    assert read_holder(path) is not None
    Path(path).write_bytes(b'{"pid": 12, "ho')
    assert read_holder(path) is None


def test_process_state_tells_stopped_from_alive_and_gone() -> None:
    """/proc says a SIGSTOPped child is stopped, a continued one alive, a reaped one gone."""
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert process_state(child.pid) == "alive"
        os.kill(child.pid, signal.SIGSTOP)
        os.waitpid(child.pid, os.WUNTRACED)
        assert process_state(child.pid) == "stopped (SIGSTOP)"
        os.kill(child.pid, signal.SIGCONT)
        assert process_state(child.pid) == "alive"
    finally:
        os.kill(child.pid, signal.SIGCONT)
        child.kill()
        child.wait()
    assert process_state(child.pid) == "gone"
