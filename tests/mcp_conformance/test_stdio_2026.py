"""The 2026-07-28 revision over stdio: a real `perdure mcp --worker` answers per-request-_meta
lines itself (no initialize), a task to its result, beside a 2025-11-25 handshake."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import pytest

from extras_needed import needs

pytest.importorskip("mcp", reason=needs("mcp"))

from serving import HERE, modern_meta


def send(pipe: IO[str], request_id: int, method: str, **params: Any) -> None:
    body = {"jsonrpc": "2.0", "id": request_id, "method": method,
            "params": {**params, "_meta": modern_meta()}}  # fmt: skip
    pipe.write(json.dumps(body) + "\n")
    pipe.flush()


def answer(pipe: IO[str], request_id: int) -> dict[str, Any]:
    while True:
        line = pipe.readline()
        assert line, "the server closed its output"
        message: dict[str, Any] = json.loads(line)
        if message.get("id") == request_id:
            return message


def test_stdio_serves_the_stateless_revision(tmp_path: Path) -> None:
    env = {**os.environ, "PERDURE_DB": f"sqlite:///{tmp_path}/stdio.db"}
    argv = [sys.executable, "-m", "perdure", "--app", "mcp_app:app", "mcp", "--worker"]
    with (tmp_path / "stdio.log").open("w") as log:
        proc = subprocess.Popen(argv, cwd=HERE, env=env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=log, text=True)  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    try:
        send(proc.stdin, 1, "server/discover")
        found = answer(proc.stdout, 1)["result"]
        assert "2026-07-28" in found["supportedVersions"]
        send(proc.stdin, 2, "tools/call", name="nap", arguments={"x": 4, "pause": 0.1})
        handle = answer(proc.stdout, 2)["result"]
        assert handle["resultType"] == "task"
        deadline = time.monotonic() + 30
        request_id = 3
        while True:
            send(proc.stdin, request_id, "tasks/get", taskId=handle["taskId"])
            task = answer(proc.stdout, request_id)["result"]
            if task["status"] == "completed":
                break
            assert time.monotonic() < deadline, task
            request_id += 1
            time.sleep(0.05)
        assert task["result"]["structuredContent"] == {"result": 8}
        bad = {"jsonrpc": "2.0", "id": 99, "method": "tools/list", "params": {"_meta": {
            "io.modelcontextprotocol/protocolVersion": "2031-01-01"}}}  # fmt: skip
        proc.stdin.write(json.dumps(bad) + "\n")
        proc.stdin.flush()
        assert answer(proc.stdout, 99)["error"]["code"] == -32022
    finally:
        proc.stdin.close()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
