"""Regenerate golden journals (only when the journal format changes on purpose):
`python tests/golden/make_golden.py`."""

from __future__ import annotations

import dataclasses
import json
import sys
from datetime import timedelta
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

from golden_app import build  # noqa: E402

import perdure  # noqa: E402
from perdure.testing import TestClock, TestWorker  # noqa: E402


def main() -> None:
    clock = TestClock()
    app = perdure.App("sqlite:///:memory:", clock=clock)
    workflow = build(app, [])
    handle = app.start(workflow, "o-1", run_id="golden-1")
    worker = TestWorker(app)
    worker.run_until_idle()
    clock.advance(timedelta(hours=1, seconds=1))
    worker.run_until_idle()  # now waiting for "approved"
    run = app.get_run(handle.id)
    entries = [dataclasses.asdict(e) for e in app.journal(handle.id)]
    record = {"perdure": perdure.__version__, "run": dataclasses.asdict(run), "journal": entries}
    (HERE / "checkout_waiting_v0_1.json").write_text(json.dumps(record, indent=1) + "\n")
    app.close()


if __name__ == "__main__":
    main()
