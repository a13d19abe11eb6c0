"""perdure validate / run / usage / budget on a spec, and MCP tools granted by a spec."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from click.testing import CliRunner

import perdure
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
    assert raised.output.strip() == "notes: budget set; 0 waiting run(s) woken"
    bad_since = runner.invoke(cli, ["--db", db, "usage", "--since", "forever"])
    assert bad_since.exit_code == 2 and "--since" in bad_since.output


def test_a_spec_grants_an_mcp_servers_tools(tmp_path: Path) -> None:
    fixture = Path(__file__).parents[1] / "agent" / "mcp_server_fixture.py"
    spec_path = tmp_path / "agent.toml"
    spec_path.write_text(
        SPEC
        + f'\n[[tools.mcp]]\nname = "fx"\ncommand = "{sys.executable}"\n'
        + f'args = ["{fixture}"]\neffect = "read"\ngrant = ["add"]\n'
    )
    app = perdure.App(f"sqlite:///{tmp_path}/s.db")
    try:
        agent = Agent(app, load_spec(spec_path))
        offered = {t.name for t in agent.toolbox.offered()}
        assert "fx__add" in offered and "fx__touch" not in offered  # only what is granted
    finally:
        app.close()
