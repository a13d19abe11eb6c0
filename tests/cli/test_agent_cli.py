"""perdure validate / run / usage / budget on a spec, and MCP tools granted by a spec."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import perdure
from extras_needed import require
from perdure.agent.loop import Agent
from perdure.agent.spec import load_spec
from perdure.cli.main import cli

SPEC = """
name = "notes"
goal = "Summarise the file"

[models.fast]
provider = "scripted"
script = "builtin:extractive"

[tools]
read_paths = ["in"]
write_paths = ["out"]

[output]
path = "out/{stem}.md"
"""


def test_validate_run_usage_and_budget(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("First sentence here. Second one. Third.")
    spec = tmp_path / "agent.toml"
    spec.write_text(SPEC)
    db = f"sqlite:///{tmp_path}/s.db"
    runner = CliRunner()
    ok = runner.invoke(cli, ["validate", str(spec)])
    assert (
        ok.exit_code == 0 and "ok: agent notes; tiers fast=scripted:builtin:extractive" in ok.output
    )
    assert "acceptance an answer;" in ok.output  # no check configured, one call a task
    first = tmp_path / "first.toml"
    first.write_text(SPEC + "\n[acceptance]\nfacts_first = true\n")
    said = runner.invoke(cli, ["validate", str(first)]).output
    assert "acceptance facts listed first (two model calls a file);" in said, said
    bad = tmp_path / "bad.toml"
    bad.write_text(SPEC.replace('provider = "scripted"', 'provider = "nope"'))
    refused = runner.invoke(cli, ["validate", str(bad)])
    assert refused.exit_code == 2 and f"{bad}:6: models.fast.provider" in refused.output
    done = runner.invoke(
        cli, ["--db", db, "run", str(spec), "--file", str(tmp_path / "in" / "a.txt"), "--wait"]
    )
    assert done.exit_code == 0, done.output
    result = json.loads(done.output.split("\n", 1)[1])
    assert result["status"] == "done" and result["answer"].startswith("Summary: First sentence")
    assert (tmp_path / "out" / "a.md").read_text().startswith("Summary: First sentence here.")
    usage = runner.invoke(cli, ["--db", db, "usage", "--by", "agent"])
    assert usage.exit_code == 0 and usage.output.splitlines()[1].split()[:2] == ["notes", "1"]
    raised = runner.invoke(cli, ["--db", db, "budget", "notes", "--tokens-per-day", "5"])
    assert raised.output.strip().splitlines()[-1] == "notes: budget changed; 0 parked run(s) woken"
    bad_since = runner.invoke(cli, ["--db", db, "usage", "--since", "forever"])
    assert bad_since.exit_code == 2 and "--since" in bad_since.output


def test_a_spec_grants_an_mcp_servers_tools(tmp_path: Path) -> None:
    require("mcp")
    fixture = Path(__file__).parents[1] / "agent" / "mcp_server_fixture.py"
    spec_path = tmp_path / "agent.toml"
    spec_path.write_text(
        SPEC
        + f'\n[[tools.mcp]]\nname = "fx"\ncommand = "{sys.executable}"\n'
        + f'args = ["{fixture}"]\neffect = "read"\ngrant = ["add"]\n'
    )
    app = perdure.App(f"sqlite:///{tmp_path}/s.db")
    try:
        agent = Agent(app.runtime, load_spec(spec_path))
        offered = {t.name for t in agent.toolbox.offered()}
        assert "fx__add" in offered and "fx__touch" not in offered  # only what is granted
    finally:
        app.close()


TRIAGE = """
name = "triage"
goal = "Draft a reply to each ticket"

[models.fast]
provider = "scripted"
script = "replies.jsonl"

[tools]
grant = ["read_file", "write_file", "finish"]
read_paths = ["tickets"]
write_paths = ["drafts"]
"""


@pytest.mark.parametrize(
    "workspace", ["", '[workspace]\npath = "."\n'], ids=["no-workspace", "workspace-dot"]
)
def test_run_resolves_the_models_paths_from_the_spec_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workspace: str
) -> None:
    """`perdure run agent.toml --wait`: the scripted model's `tickets/t1.txt` is read and
    `drafts/ok.txt` written (paths as the spec names them), with and without a workspace."""
    (tmp_path / "tickets").mkdir()
    (tmp_path / "tickets" / "t1.txt").write_text("The printer on floor 2 is jammed.")
    calls = [
        {"name": "read_file", "arguments": {"path": "tickets/t1.txt"}},
        {"name": "write_file", "arguments": {"path": "drafts/ok.txt", "content": "On it."}},
        {"name": "read_file", "arguments": {"path": "t1.txt"}},
    ]
    replies = [{"tool_calls": calls}, {"tool_calls": [{"name": "finish",
               "arguments": {"summary": "drafted"}}]}]  # fmt: skip
    (tmp_path / "replies.jsonl").write_text("".join(json.dumps(r) + "\n" for r in replies))
    (tmp_path / "agent.toml").write_text(TRIAGE + workspace)
    monkeypatch.chdir(tmp_path)
    db = f"sqlite:///{tmp_path}/s.db"
    done = CliRunner().invoke(cli, ["--db", db, "run", "agent.toml", "--prompt", "go", "--wait"])
    assert done.exit_code == 0, done.output
    run_id = done.output.split("\n", 1)[0]
    assert json.loads(done.output.split("\n", 1)[1])["status"] == "done"
    assert (tmp_path / "drafts" / "ok.txt").read_text() == "On it."
    app = perdure.App(db)
    try:
        results = [
            json.loads(e.data or "{}")["value"]
            for e in app.journal(run_id)
            if e.kind == "step.outcome" and (".tool." in e.name or e.name.endswith(".refuse"))
        ]
    finally:
        app.close()
    assert results[0] == "The printer on floor 2 is jammed."
    assert results[1] == "wrote 6 bytes to drafts/ok.txt"
    assert results[2] == (  # a path from the first read root is not the spec's folder
        "refused: read 't1.txt': t1.txt is outside the allowed paths (tickets, drafts)"
    )


def test_validate_and_run_refuse_a_grant_of_no_tool(tmp_path: Path) -> None:
    """`grant = ["rm_rf"]`: validate and run exit 2 in one line naming the known tools and
    MCP servers; no run is started. A declared MCP server's SERVER__TOOL grant is valid."""
    spec = tmp_path / "agent.toml"
    mcp = '\n[[tools.mcp]]\nname = "gh"\ncommand = "python3"\n'  # a command on PATH
    spec.write_text(SPEC.replace("[tools]", '[tools]\ngrant = ["read_file", "rm_rf"]') + mcp)
    db = f"sqlite:///{tmp_path}/s.db"
    runner = CliRunner()
    for args in (["validate", str(spec)], ["--db", db, "run", str(spec), "--prompt", "go"]):
        refused = runner.invoke(cli, args)
        assert refused.exit_code == 2, refused.output
        assert refused.output.strip().splitlines() == [
            f"error: {spec}:10: tools.grant: no tool 'rm_rf' (known tools: ask_human, finish, "
            "http_request, list_dir, read_file, recall, remember, run_command, write_file; "
            "MCP servers: gh (grant their tools as SERVER__TOOL))"
        ]
    assert not (tmp_path / "s.db").exists()  # nothing started: not even a store made
    spec.write_text(SPEC.replace("[tools]", '[tools]\ngrant = ["read_file", "gh__*"]') + mcp)
    assert runner.invoke(cli, ["validate", str(spec)]).exit_code == 0


def test_run_takes_file_from_the_callers_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`perdure run project/agent.toml --file project/in/a.txt` from the parent folder: the
    file is the one the caller named, not a path inside the agent's workspace."""
    project = tmp_path / "project"
    (project / "in").mkdir(parents=True)
    (project / "in" / "a.txt").write_text("First sentence here. Second one. Third.")
    (project / "agent.toml").write_text(SPEC)
    monkeypatch.chdir(tmp_path)
    db = f"sqlite:///{tmp_path}/s.db"
    args = ["--db", db, "run", "project/agent.toml", "--file", "project/in/a.txt", "--wait"]
    done = CliRunner().invoke(cli, args)
    assert done.exit_code == 0, done.output
    assert json.loads(done.output.split("\n", 1)[1])["status"] == "done"
    assert (project / "out" / "a.md").read_text().startswith("Summary: First sentence here.")
