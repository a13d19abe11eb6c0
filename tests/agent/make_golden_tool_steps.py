"""Regenerate golden_tool_steps_by_effect.json: a spec agent's run journaled by perdure before
tool steps were named after their tool (one step per effect: `agent:refunder.tool.once`),
cut by `kill -9` inside its once refund after the refund was paid.

It only makes sense with that perdure (e.g. commit 048eeca) first on the path, as the
worker's code too:

    git archive 048eeca src | tar -x -C /tmp/old-perdure
    PYTHONPATH=/tmp/old-perdure/src python tests/agent/make_golden_tool_steps.py

The record keeps the spec, the model's replies and the outside world's files (the ledger,
the markers, who was notified, what the probe looked up) as they were at the kill, so a
test can put them back before resuming the run with today's code.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "golden_tool_steps_by_effect.json"
SPEC = """
name = "refunder"
goal = "Refund"
models.fast = { provider = "scripted", script = "replies.jsonl", context_tokens = 100000 }
tools.grant = ["issue_refund", "find_refund", "notify", "finish"]
tools.effects.issue_refund = { probe = "find_refund" }
"""


def call(name: str, **arguments: str) -> dict[str, object]:
    return {"content": "", "tool_calls": [{"name": name, "arguments": arguments}]}


# two once tools (notify, issue_refund) and a read tool, then a second refund and finish
REPLIES = [
    call("notify", order="o1"),
    call("find_refund", order="o1"),
    call("issue_refund", order="o1"),
    call("issue_refund", order="o2"),
    call("finish", summary="refunded o1 and o2"),
]
WORLD = ("ledger", "markers", "notified", "looked")


def main() -> None:
    import perdure

    folder = Path(tempfile.mkdtemp(prefix="golden-tool-steps-"))
    (folder / "agent.toml").write_text(SPEC)
    (folder / "replies.jsonl").write_text("\n".join(json.dumps(r) for r in REPLIES))
    url = f"sqlite:///{folder}/store.db"
    env = {"PROBE_KILL_SPEC": str(folder / "agent.toml"), "PROBE_KILL_DIR": str(folder),
           "PERDURE_DB": url}  # fmt: skip
    os.environ.update(env)
    sys.path.insert(0, str(HERE))
    kill_app = importlib.import_module("probe_kill_app")
    app: perdure.App = kill_app.app
    handle = app.start(kill_app.agent.workflow, {"prompt": "refund o1 and o2"}, run_id="legacy")
    (folder / "pay-o1").touch()  # o1 pays, then waits for `return-o1`: never given
    with (folder / "worker.log").open("ab") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "perdure", "--app", "probe_kill_app:app", "worker"],
            cwd=HERE, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    limit = time.monotonic() + 60
    while kill_app.lines(folder / "ledger") != ["o1"]:
        if time.monotonic() > limit:
            raise SystemExit(f"the refund of o1 was never paid; see {folder / 'worker.log'}")
        time.sleep(0.02)
    worker.kill()  # kill -9 inside the once refund, its effect done, its outcome not journaled
    worker.wait(10)
    record = {
        "perdure": "before tool steps named after the tool (one step per effect)",
        "spec": SPEC,
        "replies": REPLIES,
        "world": {name: kill_app.lines(folder / name) for name in WORLD},
        "run": dataclasses.asdict(app.get_run(handle.id)),
        "journal": [dataclasses.asdict(e) for e in app.journal(handle.id)],
    }
    OUT.write_text(json.dumps(record, indent=1) + "\n")
    app.close()


if __name__ == "__main__":
    main()
