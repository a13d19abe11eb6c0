"""Issue 12 §6 against a real `perdure worker`: a symlink in an inbox folder that leads out
of it (`ln -s /etc/shadow inbox/x`) starts no run and is logged once; a file dropped
beside it is taken as usual, and a link to a file inside the folder is that file."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from served import HERE

import perdure


def test_a_worker_never_follows_a_link_out_of_its_inbox(tmp_path: Path) -> None:
    inbox, outside = tmp_path / "inbox", tmp_path / "private"
    inbox.mkdir()
    outside.mkdir()
    secret = outside / "shadow"
    secret.write_text("root:$6$secret-hash")
    (inbox / "shadow_link").symlink_to(secret)
    (inbox / "up").symlink_to(Path("..") / "private" / "shadow")
    (inbox / "report.txt").write_text("a real drop")
    (inbox / "same").symlink_to(inbox / "report.txt")
    db = f"sqlite:///{tmp_path}/inbox.db"
    env = {**os.environ, "PERDURE_DB": db, "INBOX_DIR": str(inbox), "PYTHONUNBUFFERED": "1"}
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "perdure", "--app", "sec_app:app", "worker"],
            cwd=HERE, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    reader = perdure.App(db)
    try:
        deadline = time.monotonic() + 60
        runs: list[perdure.RunRow] = []
        while not any(r.status == "completed" for r in runs):
            assert worker.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"the drop was never taken:\n{log.read_text()}"
            time.sleep(0.2)
            runs = reader.list_runs() if Path(db.removeprefix("sqlite:///")).exists() else []
        time.sleep(1.0)  # a few more scans: the links had every chance to be taken
        runs = reader.list_runs()
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)
        reader.close()
    leaked = hashlib.sha256(secret.read_bytes()).hexdigest()[:32]
    assert all(leaked not in r.id for r in runs), [r.id for r in runs]
    assert [(r.workflow, r.status) for r in runs] == [("read_drop", "completed")]
    text = log.read_text()
    assert text.count("leading out of the folder") == 2, text
    assert "secret-hash" not in text
