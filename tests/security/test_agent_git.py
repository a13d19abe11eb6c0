"""Issue 35 §4 with a real `perdure run` process and the scripted model: an agent granted only
`write_file` over a git workspace cannot get a command run through the repository's `.git`
(the boundary refuses every `.git` path, any spelling), and perdure's own workspace commit
runs no hook, fsmonitor or other command a repository's config names even when `.git` was
poisoned by someone else."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import perdure

SPEC = """
name = "writer"
goal = "Write the notes"

[models.fast]
provider = "scripted"
script = "replies.jsonl"

[tools]
grant = ["write_file", "finish"]
write_paths = ["."]

[workspace]
path = "."
git = true
"""


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                          check=True).stdout  # fmt: skip


def run_agent(root: Path, calls: list[dict[str, object]]) -> list[str]:
    """`perdure run agent.toml --wait` in `root` with the model making `calls` then finishing;
    the tool results it journaled."""
    replies = [{"tool_calls": calls},
               {"tool_calls": [{"name": "finish", "arguments": {"summary": "done"}}]}]  # fmt: skip
    (root / "replies.jsonl").write_text("".join(json.dumps(r) + "\n" for r in replies))
    (root / "agent.toml").write_text(SPEC)
    db = f"sqlite:///{root.parent}/s.db"
    env = {**os.environ, "HOME": str(root.parent)}
    done = subprocess.run(
        [sys.executable, "-m", "perdure", "--db", db, "run", "agent.toml", "--prompt", "go",
         "--wait"], cwd=root, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    run_id = done.stdout.split("\n", 1)[0]
    app = perdure.App(db)
    try:
        return [
            str(json.loads(e.data or "{}").get("value"))
            for e in app.journal(run_id)
            if e.kind == "step.outcome" and (".tool." in e.name or e.name.endswith(".refuse"))
        ]
    finally:
        app.close()


def poisoned_config(marker: Path) -> str:
    return f'[core]\n\tfsmonitor = "touch {marker}; false"\n\thooksPath = hooks\n'


@pytest.mark.slow
def test_an_agent_cannot_write_into_git(tmp_path: Path) -> None:
    """`.git/config` with an fsmonitor command, `.GIT/hooks/pre-commit`, `a/../.git/config`:
    each refused; the workspace commit then runs nothing (the marker never appears)."""
    root = tmp_path / "ws"
    root.mkdir()
    git(root, "init", "-q")
    marker = tmp_path / "pwned"
    hook = f"#!/bin/sh\ntouch {marker}\n"
    calls = [
        {"name": "write_file", "arguments": {"path": ".git/config",
                                             "content": poisoned_config(marker)}},
        {"name": "write_file", "arguments": {"path": ".GIT/hooks/pre-commit", "content": hook}},
        {"name": "write_file", "arguments": {"path": "a/../.git/config", "content": "x"}},
        {"name": "write_file", "arguments": {"path": "notes.md", "content": "fine"}},
    ]  # fmt: skip
    results = run_agent(root, calls)
    assert sum(".git" in r and "never granted" in r for r in results) == 3, results
    assert "fsmonitor" not in (root / ".git" / "config").read_text()
    assert not marker.exists()
    assert "notes.md" in git(root, "show", "--name-only", "HEAD")


@pytest.mark.slow
def test_the_workspace_commit_runs_nothing_a_poisoned_repository_names(tmp_path: Path) -> None:
    """The repository's config (fsmonitor, hooksPath) and its hooks were written by someone
    else, and a global config names a hooks folder too: perdure's commit runs none of them
    and still commits."""
    root = tmp_path / "ws"
    root.mkdir()
    git(root, "init", "-q")
    marker = tmp_path / "pwned"
    (root / ".git" / "config").write_text(
        (root / ".git" / "config").read_text() + poisoned_config(marker)
    )
    for folder in (root / "hooks", root / ".git" / "hooks", tmp_path / "global-hooks"):
        folder.mkdir(exist_ok=True)
        for name in ("pre-commit", "post-commit", "commit-msg"):
            (folder / name).write_text(f"#!/bin/sh\ntouch {marker}\n")
            (folder / name).chmod(0o755)
    (tmp_path / ".gitconfig").write_text(f"[core]\n\thooksPath = {tmp_path / 'global-hooks'}\n")
    run_agent(root, [{"name": "write_file", "arguments": {"path": "n.md", "content": "x"}}])
    assert not marker.exists()
    assert "n.md" in git(root, "-c", "core.fsmonitor=false", "show", "--name-only", "HEAD")


@pytest.mark.slow
def test_a_file_name_adds_no_argument_to_the_acceptance_command(tmp_path: Path) -> None:
    """Issue 35 §11: the file `nothing -o x.txt` and the acceptance `test -s missing/{stem}.md`:
    the name is one argument (`test -s 'missing/nothing -o x.md'`: fails, nothing is
    there), not `-o x.md`, which made `test` succeed whatever the agent did."""
    (tmp_path / "in").mkdir()
    task = tmp_path / "in" / "nothing -o x.txt"
    task.write_text("First sentence here. Second one. Third.")
    (tmp_path / "agent.toml").write_text(
        'name = "notes"\ngoal = "Summarise the file"\n\n[models.fast]\nprovider = "scripted"\n'
        'script = "builtin:extractive"\n\n[tools]\nread_paths = ["in"]\nwrite_paths = ["out"]\n'
        '\n[output]\npath = "out/{stem}.md"\n\n[acceptance]\n'
        'command = "test -s missing/{stem}.md"\n'
    )
    done = subprocess.run(
        [sys.executable, "-m", "perdure", "--db", f"sqlite:///{tmp_path}/s.db", "run",
         "agent.toml", "--file", str(task), "--wait"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr  # the run failed its acceptance
    assert "`test -s 'missing/nothing -o x.md'` exited 1" in done.stderr, done.stderr
