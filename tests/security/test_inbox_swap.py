"""Issue 35 §8 against a real `perdure worker`: an inbox file swapped after its run was
created (for a link to a file outside the folder, or for other content) never reaches the
workflow. The run reads through `perdure.open_inbox_file()`, which opens the path once from
the folder's descriptor without following a link and checks the sha256 recorded when the run
was created; a plain `open(path)` read the outside file (the review's `/etc/shadow`).

The race is made deterministic: the workflow is paused while the worker's inbox creates the
runs, the files are swapped, then the workflow is resumed."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from served import perdure, worker

import perdure as pd

SECRET = b"root:$6$secret-hash-that-must-never-be-read\n"
FINISHED = ("completed", "failed", "cancelled")


def run_of(content: bytes) -> str:
    """The run id the inbox gives a content."""
    return f"inbox:read_drop:{hashlib.sha256(content).hexdigest()[:32]}"


def runs_when(app: pd.App, done: object, what: str) -> list[pd.RunRow]:
    """The store's runs once `done(runs)` holds (60 s at most)."""
    deadline = time.monotonic() + 60
    while True:
        runs = app.list_runs()
        if done(runs):  # type: ignore[operator]
            return runs
        assert time.monotonic() < deadline, f"never {what}: {[(r.id, r.status) for r in runs]}"
        time.sleep(0.2)


def test_a_file_swapped_after_its_run_was_created_never_reaches_the_workflow(
    tmp_path: Path,
) -> None:
    inbox, outside = tmp_path / "inbox", tmp_path / "private"
    inbox.mkdir()
    outside.mkdir()
    (outside / "shadow").write_bytes(SECRET)
    (inbox / "report.txt").write_bytes(b"a real drop")
    (inbox / "notes.txt").write_bytes(b"first notes")
    db = f"sqlite:///{tmp_path}/inbox.db"
    env = {**os.environ, "PERDURE_DB": db, "INBOX_DIR": str(inbox), "PYTHONUNBUFFERED": "1"}
    reader = pd.App(db)
    log = tmp_path / "worker.log"
    try:
        assert reader.list_runs() == []  # the store made, for the CLI to find
        perdure(env, "pause", "--workflow", "read_drop")
        with worker(env, log):
            first = runs_when(reader, lambda runs: len(runs) == 2, "two runs created")
            assert {r.status for r in first} == {"pending"}, log.read_text()
            (inbox / "report.txt").unlink()
            (inbox / "report.txt").symlink_to(outside / "shadow")  # the review's swap
            (inbox / "notes.new").write_bytes(b"second notes, edited")
            (inbox / "notes.new").rename(inbox / "notes.txt")  # other content, same name
            perdure(env, "resume", "--workflow", "read_drop")
            runs = runs_when(reader, lambda runs: len(runs) == 3 and all(
                r.status in FINISHED for r in runs), "three runs finished")  # fmt: skip
    finally:
        reader.close()
    by_id = {r.id: r for r in runs}
    report, notes = by_id[run_of(b"a real drop")], by_id[run_of(b"first notes")]
    errors = {r.id: json.loads(r.error or "{}") for r in runs}
    assert report.status == "failed" and notes.status == "failed", errors
    linked = errors[report.id]
    assert linked["type"] == "perdure.errors.InboxFileChanged", linked
    assert "without following a link" in linked["message"], linked
    edited = errors[notes.id]
    assert edited["type"] == linked["type"] and "not the content" in edited["message"], edited
    new = by_id[run_of(b"second notes, edited")]
    assert new.status == "completed" and json.loads(new.result or "null") == 20  # its own run
    assert all(json.loads(r.result or "null") != len(SECRET) for r in runs)
    leaked = hashlib.sha256(SECRET).hexdigest()[:32]
    assert all(leaked not in r.id for r in runs)
    assert "secret-hash" not in log.read_text()
