"""Issue 35 §11 against a real `perdure mcp --http --agent`: a task file the agent's boundary
refuses, or cannot read, fails the task with a message naming paths relative to the agent's
workspace, never the server's absolute paths."""

from __future__ import annotations

from pathlib import Path

import pytest

from extras_needed import needs

pytest.importorskip("mcp", reason=needs("mcp"))

from serving import Raw, Store

SPEC = """
name = "reader"
goal = "Summarise the file"

[models.fast]
provider = "scripted"
script = "replies.jsonl"

[tools]
grant = ["finish"]
read_paths = ["docs"]
"""


def test_refused_task_files_name_no_server_path(store: Store, tmp_path: Path) -> None:
    workspace = tmp_path / "srv" / "agents" / "reader"
    (workspace / "docs").mkdir(parents=True)
    (workspace / "replies.jsonl").write_text('"done"\n')
    (tmp_path / "srv" / "agents" / "secret.txt").write_text("keep out")
    (workspace / "agent.toml").write_text(SPEC)
    server = store.serve("--agent", str(workspace / "agent.toml"))
    raw = Raw(server.url, store.token("a"))
    expected = {
        "../secret.txt": "read '../secret.txt': ../secret.txt is outside the allowed paths (docs)",
        "docs/gone.txt": "cannot read docs/gone.txt: No such file or directory",
    }
    for given, said in expected.items():
        made = raw.call("tools/call", {"name": "agent_reader",
                                       "arguments": {"prompt": "go", "file": given}})  # fmt: skip
        task = raw.until(made["taskId"], lambda t: t["status"] != "working", 60)
        text = task["result"]["content"][0]["text"]
        assert task["result"]["isError"] is True, task
        assert said in text, text
        assert str(tmp_path) not in str(task), task
    raw.close()
