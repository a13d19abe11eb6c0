"""Journals written by earlier perdure versions still replay with today's engine."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import perdure
from golden_journals import seed_journal
from perdure.testing import TestClock, TestWorker

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

from golden_app import build  # noqa: E402


def load_golden(app: perdure.App, name: str) -> str:
    """Seed the store with a checked-in run and its journal; return the run id."""
    return seed_journal(app, json.loads((HERE / name).read_text()))


@pytest.mark.parametrize("golden", sorted(p.name for p in HERE.glob("*.json")))
def test_golden_journal_replays(tmp_path: Path, golden: str) -> None:
    """A checked-in journal replays without re-running recorded steps, then finishes."""
    clock = TestClock()
    clock.advance(3600 * 2)  # after the recorded sleep
    app = perdure.App(f"sqlite:///{tmp_path}/golden.db", clock=clock)
    calls: list[str] = []
    build(app, calls)
    run_id = load_golden(app, golden)
    worker = TestWorker(app)
    worker.run_until_idle()
    assert app.get_run(run_id).status == "waiting"
    assert calls == []  # quote and reserve came from the journal
    app.send_event(run_id, "approved", "ana")
    worker.run_until_idle()
    result = app.handle(run_id).result(timeout=5)
    assert calls == ["charge"]
    assert result.startswith("paid 1250 on hold-o-1 by ana at 2026-01-01 ref ")
    assert result.endswith("audit=True")
    app.close()
