"""`--agent SPEC` on the commands that need workflows: a folder with only a spec and its
store is inspected with no Python module (serve and worker: tests/server/
test_spec_only_browser.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from perdure.cli.main import cli

INBOX = Path(__file__).resolve().parents[2] / "examples" / "inbox" / "agent.toml"


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the inbox example's spec alone in a folder, and a store beside it."""
    shutil.copy(INBOX, tmp_path / "agent.toml")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PERDURE_APP", raising=False)
    monkeypatch.setenv("PERDURE_DB", f"sqlite:///{tmp_path}/agent.db")
    return tmp_path


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def test_effects_triggers_and_schedules_take_an_agent_spec(folder: Path) -> None:
    """effects lists the agent's steps; schedules add stores a schedule of its workflow;
    triggers shows its inbox trigger beside that schedule, exit 0."""
    effects = run("effects", "--agent", "agent.toml")
    assert effects.exit_code == 0, effects.output
    assert "agent:inbox-summariser.model" in effects.stdout and "keyed" in effects.stdout
    added = run("schedules", "add", "again", "agent:inbox-summariser", '[{"prompt": "x"}]',
                "--every", "3600", "--agent", "agent.toml")  # fmt: skip
    assert added.exit_code == 0, added.output
    assert added.stdout.startswith("again: next fire ")
    listed = run("triggers", "--agent", "agent.toml")
    assert listed.exit_code == 0, listed.output
    inbox = next(line for line in listed.stdout.splitlines() if line.startswith("inbox"))
    assert "inbox-summariser" in inbox and str(folder / "inbox") in inbox
    assert any(line.startswith("schedule  again") for line in listed.stdout.splitlines())


def test_a_command_needing_workflows_names_both_ways_to_give_them(folder: Path) -> None:
    """Without --app or --agent, serve, worker, effects and triggers install say to pass
    either, in one line."""
    for args in (["effects"], ["worker"], ["serve"], ["triggers", "install"]):
        refused = run(*args)
        assert refused.exit_code == 2
        assert refused.stderr.strip() == (
            "error: this command needs your workflows: pass --app module:attribute or --agent SPEC"
        )


def test_a_command_without_agent_names_only_app(folder: Path) -> None:
    """`start` takes no --agent, so its refusal names --app only."""
    refused = run("start", "w")
    assert refused.exit_code == 2
    assert refused.stderr.strip() == (
        "error: this command needs your workflows: pass --app module:attribute"
    )


def test_a_broken_spec_is_refused_before_anything_is_served(folder: Path) -> None:
    """A spec with a problem stops serve in one line and creates no store."""
    (folder / "bad.toml").write_text('name = "x"\ngoal = "g"\n')
    refused = run("serve", "--agent", "bad.toml")
    assert refused.exit_code == 2
    assert refused.stderr == "error: bad.toml: models: Field required\n"
    assert not (folder / "agent.db").exists()
