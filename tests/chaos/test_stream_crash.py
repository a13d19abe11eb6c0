"""A reader of a run's stream lives through `kill -9` of the worker in the middle of a
streaming step: it keeps reading after recovery, sees the `retry` marker, then the whole
output of the new attempt; within an attempt no chunk is lost or seen twice (both stores)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import stream_app

import perdure
from fresh_stores import fresh_store_url

HERE = Path(__file__).resolve().parent


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with fresh_store_url(request.param, tmp_path) as url:
        yield url


def worker(url: str, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PERDURE_DB": url, "PYTHONUNBUFFERED": "1"}
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "perdure", "--app", "stream_app:app", "worker",
             "--poll", "0.05"],
            cwd=HERE, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_reader_lives_through_kill_minus_nine_mid_stream(
    store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reader_app = stream_app.register(perdure.App(store_url))
    log = tmp_path / "workers.log"
    first = worker(store_url, log)
    second: subprocess.Popen[bytes] | None = None
    seen: list[Any] = []
    failure: list[BaseException] = []
    try:
        handle = reader_app.start("talks", run_id="talker")

        def read() -> None:
            try:
                for chunk in handle.stream():
                    seen.append(chunk)
            except BaseException as exc:  # surfaced by the main thread
                failure.append(exc)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        deadline = time.monotonic() + 60
        while sum(c.kind == "chunk" for c in seen) < 15:
            assert first.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.01)
        first.send_signal(signal.SIGKILL)  # mid-step: the stream has about 15 words of it
        first.wait()
        cut_at = sum(c.kind == "chunk" for c in seen)
        second = worker(store_url, log)
        reader.join(90)
        assert not reader.is_alive(), f"the reader never saw the end:\n{log.read_text()}"
        assert not failure, failure
        assert handle.result(timeout=30) == stream_app.WORDS
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(30)
        reader_app.close()
    kinds = [c.kind for c in seen]
    assert [c.seq for c in seen] == list(range(len(seen)))  # nothing lost between reads
    retry = kinds.index("retry")
    before, after = seen[1:retry], seen[retry + 1 :]
    assert kinds[0] == "attempt" and seen[retry].data["position"] == 0
    assert [c.data for c in before] == [f"w{i}" for i in range(len(before))]  # a prefix
    assert [c.data for c in after] == [f"w{i}" for i in range(stream_app.WORDS)]  # all of it
    summary = {"store": store_url.split(":")[0], "words_before_kill": len(before),
               "seen_at_kill": cut_at, "words_after_retry": len(after),
               "rows": len(seen)}  # fmt: skip
    with capsys.disabled():
        print(f"\nstream crash summary: {json.dumps(summary)}")
