"""The app of the rolling-deploy tests: three workflows in two builds.

Build A: `nap` sleeps, `approval` waits for an event, `gate` waits at a gate (the event
`approve:refund`). Build B: `nap` unchanged (the same version), `approval` changed
compatibly (an `audit` step behind patched()), `gate` changed incompatibly (an unguarded
`check` step first). Every step body appends one line to WORKDIR/effects.log: which run,
which step, which build and worker ran it.

Run as a worker: python deploy_app.py WORKDIR STORE_URL BUILD WORKER_ID [BUILD_NAME]
(BUILD_NAME: the worker's --build, default build-BUILD)
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import perdure


def install(app: perdure.App, build: str, effects: Path) -> None:
    """Register build `build`'s workflows on `app`, their steps logging to `effects`."""
    worker = os.environ.get("DEPLOY_WORKER", "test")

    def record(run: str, step: str) -> None:
        line = json.dumps({"run": run, "step": step, "build": build, "worker": worker}) + "\n"
        fd = os.open(effects, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())  # one write: lines of several processes never mix
        finally:
            os.close(fd)

    @app.step(name="prep")
    def prep(run: str) -> str:
        record(run, "prep")
        return run

    @app.step(name="finish", effect="idempotent")
    def finish(run: str, got: str) -> str:
        record(run, "finish")
        return f"{run}:{got}"

    @app.step(name="audit")
    def audit(run: str) -> str:
        record(run, "audit")
        return run

    @app.step(name="check")
    def check(run: str) -> str:
        record(run, "check")
        return run

    @app.workflow(name="nap", version="nap-1")
    def nap(run: str, seconds: float) -> str:
        prep(run)
        perdure.sleep(seconds)
        return finish(run, "slept")

    if build == "A":

        @app.workflow(name="approval", version="approval-1")
        def approval(run: str) -> str:
            prep(run)
            got = perdure.wait_event("go")
            return finish(run, str(got))

        @app.workflow(name="gate", version="gate-1")
        def gate(run: str) -> str:
            prep(run)
            got = perdure.wait_event("approve:refund")
            return finish(run, str(got))

        return

    @app.workflow(name="approval", version="approval-2")
    def approval_b(run: str) -> str:
        prep(run)
        if perdure.patched("audit"):
            audit(run)
        got = perdure.wait_event("go")
        return finish(run, str(got))

    @app.workflow(name="gate", version="gate-2")
    def gate_b(run: str) -> str:
        check(run)
        prep(run)
        got = perdure.wait_event("approve:refund")
        return finish(run, str(got))


if __name__ == "__main__":
    workdir, url, build, worker_id = sys.argv[1:5]
    name = sys.argv[5] if len(sys.argv) > 5 else f"build-{build}"
    os.environ["DEPLOY_WORKER"] = worker_id
    app = perdure.App(url)
    install(app, build, Path(workdir) / "effects.log")
    options = perdure.WorkerOptions(id=worker_id, build=name, concurrency=16,
                                    lease=6.0, poll=0.05, grace=3.0, announce=True)  # fmt: skip
    try:
        app.run_worker(options)
    except perdure.PerdureError as exc:  # as `perdure worker` says it: one line, exit 2
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
