"""examples/first_workflow/README.md followed literally on a fresh clone: its install makes
a fresh venv, a worker is `kill -9`ed while the run is in its `pack` step, a new worker
finishes the run, and no step that had completed ran again (slow: it installs perdure)."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from newcomer import ROOT, fresh_clone, newcomer_env, run_session, shell_blocks

pytestmark = pytest.mark.slow

README = ROOT / "examples" / "first_workflow" / "README.md"


def test_the_readme_runs_as_written_kill_9_and_resume(tmp_path: Path) -> None:
    """The README's blocks run in one terminal of a fresh clone; the run completes after
    the kill, each stand-in that completed printed once, and the journal holds one outcome
    per step, one intent of the `once` charge and the recovery between two `pack` intents."""
    clone = fresh_clone(tmp_path)
    blocks = shell_blocks(README)
    assert [b.has("no-run") for b in blocks] == [False, False], "install, then the demo"
    assert "bash scripts/setup.sh" in blocks[0].source and "kill -9" in blocks[1].source
    session = run_session(clone, README, blocks, tmp_path / "session.log")
    assert session.returncode == 0, f"{session.failed_at}\n{session.output[-6000:]}"
    assert session.left_running == [], session.left_running
    assert '"order-42: ch_order-42, parcel-order-42"' in session.output

    here = clone / "examples" / "first_workflow"
    assert (clone / ".venv" / "bin" / "perdure").is_file(), "the README's install made .venv"
    printed = Counter(
        line.split()[0]
        for line in (here / "worker.log").read_text().splitlines()
        if line.split()[0] in {"loading", "charging", "packing", "mailing"}
    )
    assert printed == {"loading": 1, "charging": 1, "packing": 2, "mailing": 1}, printed

    shown = subprocess.run(
        [str(clone / ".venv" / "bin" / "perdure"), "--app", "shop:app", "show", "order-42",
         "--json"],
        cwd=here, env=newcomer_env(), capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    journal = json.loads(shown.stdout)
    assert journal["run"]["status"] == "completed" and journal["run"]["recoveries"] == 1
    entries = journal["entries"]
    outcomes = Counter(e["name"] for e in entries if e["kind"] == "step.outcome")
    assert outcomes == {"load_order": 1, "charge": 1, "pack": 1, "send_receipt": 1}
    intents = [(e["name"], e["seq"]) for e in entries if e["kind"] == "step.intent"]
    assert [name for name, _ in intents] == ["charge", "pack", "pack", "send_receipt"]
    [recovered] = [e["seq"] for e in entries if e["kind"] == "run.recovered"]
    assert intents[1][1] < recovered < intents[2][1], "the kill landed inside pack"
