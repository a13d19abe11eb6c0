"""The inbox agent demo: serve the agent, drop two files, kill the worker mid-run, resume.

    python examples/inbox/demo.py [--model local|scripted|openai|anthropic]

Works in a fresh folder under examples/inbox/.state/, on the embedded SQLite store.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
SAMPLES = ("meeting-notes.txt", "incident-report.txt")


@dataclass
class Outcome:
    """What the demo saw, for people (printed) and for the test that runs it."""

    workdir: Path
    summaries: dict[str, str] = field(default_factory=dict)
    statuses: dict[str, str] = field(default_factory=dict)
    model_calls: dict[str, int] = field(default_factory=dict)  # journaled model calls per run
    killed_during: str = ""
    recovered: list[str] = field(default_factory=list)


def say(text: str) -> None:
    print(f"\n== {text}", flush=True)


def perdure(workdir: Path, *args: str) -> str:
    """Run a `perdure` CLI command against the demo's store; its output."""
    command = [sys.executable, "-m", "perdure", "--db", f"sqlite:///{workdir}/state.db", *args]
    done = subprocess.run(command, cwd=workdir, capture_output=True, text=True, check=False)
    return done.stdout + done.stderr


def start_worker(workdir: Path, model: str, log: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "perdure", "--db", f"sqlite:///{workdir}/state.db",
               "agent", "agent.toml", "--model", model, "--poll", "0.2"]  # fmt: skip
    out = open(log, "ab")  # noqa: SIM115 - the worker's log, open while it runs
    return subprocess.Popen(command, cwd=workdir, stdout=out, stderr=out, start_new_session=True)


def drop(workdir: Path, name: str) -> None:
    """Write a file the way a careful producer does: under a temp name, then rename."""
    part = workdir / "inbox" / f"{name}.part"
    shutil.copy(HERE / "samples" / name, part)
    part.rename(workdir / "inbox" / name)


def runs(workdir: Path) -> dict[str, dict[str, object]]:
    """Every run of the agent with its status and journal (read-only, straight from SQLite)."""
    import sqlite3

    db = workdir / "state.db"
    if not db.exists():
        return {}
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        rows = conn.execute(
            "SELECT id, status, input FROM runs WHERE workflow = 'agent:inbox-summariser'"
        ).fetchall()
        found: dict[str, dict[str, object]] = {}
        for run_id, status, text in rows:
            calls = conn.execute(
                "SELECT COUNT(*) FROM journal WHERE run_id = ? AND final = 1 AND kind = "
                "'step.outcome' AND name = 'agent:inbox-summariser.model'",
                (run_id,),
            ).fetchone()[0]
            recovered = conn.execute(
                "SELECT COUNT(*) FROM journal WHERE run_id = ? AND kind = 'run.recovered'",
                (run_id,),
            ).fetchone()[0]
            file = json.loads(text)["args"][0]
            found[run_id] = {"status": status, "file": Path(str(file)).name,
                             "model_calls": calls, "recovered": recovered}  # fmt: skip
        return found
    except sqlite3.OperationalError:
        return {}  # not created yet
    finally:
        conn.close()


def wait_for(check: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.2)
    raise SystemExit(f"demo: timed out after {timeout:.0f}s waiting for {what}")


def run_demo(model: str, workdir: Path, timeout: float = 300.0) -> Outcome:
    if workdir.exists():
        shutil.rmtree(workdir)
    (workdir / "inbox").mkdir(parents=True)
    (workdir / "outbox").mkdir()
    shutil.copy(HERE / "agent.toml", workdir / "agent.toml")
    outcome = Outcome(workdir)
    log = workdir / "worker.log"

    say(f"starting the agent (model: {model}) on {workdir / 'state.db'}")
    print(perdure(workdir, "validate", "agent.toml").strip())
    worker = start_worker(workdir, model, log)
    try:
        say(f"dropping {SAMPLES[0]} into inbox/")
        drop(workdir, SAMPLES[0])
        first = workdir / "outbox" / f"{Path(SAMPLES[0]).stem}_summary.md"
        wait_for(first.exists, timeout, f"{first.name} (see {log})")
        print(f"{first.name} written")

        say(f"dropping {SAMPLES[1]}, then kill -9 the worker while that run is in flight")
        drop(workdir, SAMPLES[1])
        wait_for(
            lambda: any(r["file"] == SAMPLES[1] for r in runs(workdir).values()),
            timeout, "the second run to start",
        )  # fmt: skip
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
        state = next(r for r in runs(workdir).values() if r["file"] == SAMPLES[1])
        outcome.killed_during = str(state["status"])
        print(f"worker killed while the second run was {state['status']}; runs now:")
        print(perdure(workdir, "ls").strip())

        say("starting a new worker: unfinished runs resume from their journals")
        worker = start_worker(workdir, model, log)
        second = workdir / "outbox" / f"{Path(SAMPLES[1]).stem}_summary.md"
        wait_for(second.exists, timeout, f"{second.name} (see {log})")
        wait_for(
            lambda: all(r["status"] == "completed" for r in runs(workdir).values()),
            timeout, "both runs to complete",
        )  # fmt: skip
        say("dropping the first file again (same content): nothing new starts")
        (workdir / "inbox" / "copy-of-notes.txt").write_bytes(
            (HERE / "samples" / SAMPLES[0]).read_bytes()
        )
        time.sleep(3)
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(timeout=60)

    for run_id, info in runs(workdir).items():
        outcome.statuses[str(info["file"])] = str(info["status"])
        outcome.model_calls[str(info["file"])] = int(str(info["model_calls"]))
        if int(str(info["recovered"])):
            outcome.recovered.append(str(info["file"]))
        del run_id
    for name in SAMPLES:
        path = workdir / "outbox" / f"{Path(name).stem}_summary.md"
        outcome.summaries[name] = path.read_text() if path.exists() else ""

    say("the summaries")
    for name, text in outcome.summaries.items():
        print(f"--- outbox/{Path(name).stem}_summary.md\n{text.strip()}")
    say("the runs (one per file content; the copy started nothing)")
    print(perdure(workdir, "ls").strip())
    second_run = next((rid for rid, r in runs(workdir).items() if r["file"] == SAMPLES[1]), None)
    if second_run:
        say(f"the journal of the run that was killed: perdure show {second_run}")
        print(perdure(workdir, "show", second_run).strip())
    say("model usage per run")
    print(perdure(workdir, "usage", "--by", "run").strip())
    print(f"progress notes: {workdir / 'PROGRESS.md'}")
    say("try it yourself")
    print(
        f"cd {workdir}\n"
        f"{sys.executable} -m perdure --db sqlite:///state.db agent agent.toml --model {model} &\n"
        "cp some-file.txt inbox/; kill -9 %1; then start the agent again: the run resumes,\n"
        "and files already summarised are never sent to the model again."
    )
    return outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="local",
                        choices=["local", "scripted", "openai", "anthropic"])  # fmt: skip
    parser.add_argument("--workdir", default=str(HERE / ".state" / "demo"))
    args = parser.parse_args()
    outcome = run_demo(args.model, Path(args.workdir))
    ok = all(outcome.summaries.values()) and set(outcome.statuses.values()) == {"completed"}
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
