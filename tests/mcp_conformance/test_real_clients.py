"""Real clients against a real `perdure mcp --http`: the official TypeScript SDK (1.32) and
FastMCP 3.x speak 2025-11-25, FastMCP 4.x speaks 2026-07-28 with the tasks extension; each
runs from its own folder (`clients` fixture) and prints what it saw as JSON."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from extras_needed import needs

pytest.importorskip("mcp", reason=needs("mcp"))

from serving import Store

HERE = Path(__file__).parent / "clients"


def run_client(argv: list[str], cwd: Path) -> dict[str, Any]:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{argv[0]} failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


@pytest.mark.slow
def test_typescript_sdk(store: Store, clients: Path) -> None:
    server = store.serve()
    folder = clients / "ts"
    shutil.copy(HERE / "ts_client.mjs", folder / "ts_client.mjs")  # resolves the SDK there
    seen = run_client(["node", "ts_client.mjs", server.url, store.token("ts")], folder)
    assert ["nap", "optional"] in seen["tools"]
    assert seen["nap"][-1]["result"]["structuredContent"] == {"result": 8}
    *_, status, error = seen["explode"]
    # the error text reaches the TS client as the failed task's statusMessage (its stream's
    # taskStatus message) and in tasks/result; the stream's own error is the SDK's generic text
    assert status == {"type": "taskStatus", "status": "failed",
                      "statusMessage": "ValueError: bad input 7"}  # fmt: skip
    assert error["type"] == "error" and error["message"].endswith("failed")
    assert seen["explodeResult"]["isError"] is True
    assert "ValueError: bad input 7" in seen["explodeResult"]["content"][0]["text"]
    assert seen["ask"][1]["status"] == "input_required"
    assert seen["ask"][-1]["result"]["structuredContent"] == {"result": "amber"}
    assert seen["asked"] == [f"Run {seen['ask'][0]['taskId']} asks for an answer."]
    assert seen["cancelled"]["status"] == "cancelled"
    assert len(seen["listed"]) == 4 and seen["listed"][0][1] == "cancelled"


@pytest.mark.slow
def test_fastmcp_3_speaks_2025_11_25(store: Store, clients: Path) -> None:
    """FastMCP 3 polls tasks/get and never asks tasks/result while a task waits for input:
    the gate reaches it as an elicitation on its session's stream."""
    server = store.serve()
    python = str(clients / "fastmcp3" / "bin" / "python")
    seen = run_client([python, str(HERE / "fastmcp3_client.py"), server.url,
                       store.token("f3")], HERE)  # fmt: skip
    assert seen["version"] == "2025-11-25"
    assert {"ask", "explode", "hold", "nap"} <= set(seen["tools"])
    assert seen["nap"] == {"result": 6}
    assert "ValueError: bad input 7" in seen["explode"]
    assert seen["ask"] == {"result": "indigo"} and len(seen["asked"]) == 1
    assert seen["cancelled"] == "cancelled" and seen["listed"] == 4


@pytest.mark.slow
def test_fastmcp_4_speaks_2026_07_28_with_the_tasks_extension(store: Store, clients: Path) -> None:
    """FastMCP 4 discovers the stateless revision, gets task handles, polls tasks/get to the
    inlined result, answers a question with tasks/update and cancels."""
    server = store.serve()
    python = str(clients / "fastmcp4" / "bin" / "python")
    seen = run_client([python, str(HERE / "fastmcp4_client.py"), server.url,
                       store.token("f4")], HERE)  # fmt: skip
    assert seen["version"] == "2026-07-28"
    assert {"ask", "explode", "hold", "nap"} <= set(seen["tools"])
    assert seen["task_id"].startswith("mcp:") and seen["nap"] == {"result": 12}
    assert seen["plain"] == {"result": 2}
    assert "ValueError: bad input 7" in seen["explode"]
    assert seen["ask"] == {"result": "violet"} and len(seen["asked"]) == 1
    assert seen["cancelled"] == "cancelled"
