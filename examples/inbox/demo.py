"""The inbox agent demo: serve the agent, drop two files, kill the worker mid-run, resume.

    python examples/inbox/demo.py [--model local|scripted|openai|anthropic]

Works in a fresh folder under examples/inbox/.state/, on the embedded SQLite store.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
SAMPLES = ("meeting-notes.txt", "incident-report.txt")
# --model scripted: the deterministic extractive summariser stands in for the local model,
# answering after 1.5 s as a model would, so that the kill lands in the middle of a call
SCRIPTED_TIER = """[models.local]
provider = "scripted"          # demo --model scripted: no model, the document's first sentences
script = "builtin:extractive"
latency = 1.5                  # seconds per answer, like a small model's
"""


FACTS_OFF, FACTS_ON = "facts_first = false", "facts_first = true"


@dataclass
class Outcome:
    """What the demo saw, for people (printed) and for the test that runs it."""

    workdir: Path
    summaries: dict[str, str] = field(default_factory=dict)
    statuses: dict[str, str] = field(default_factory=dict)
    model_calls: dict[str, int] = field(default_factory=dict)  # journaled model calls per run
    killed_during: str = ""
    recovered: list[str] = field(default_factory=list)
    kept: int = 0  # step outcomes of the killed run committed before the kill
    replayed_answers: int = 0  # model answers journaled before the kill, replayed after it
    anew: list[str] = field(default_factory=list)  # steps of the killed run done after it
    in_flight: list[str] = field(default_factory=list)  # model calls cut by the kill
    tiers: dict[str, str] = field(default_factory=dict)  # the tier whose answer was accepted
    verdicts: dict[str, list[str]] = field(default_factory=dict)  # grounding evidence, in order


def say(text: str) -> None:
    print(f"\n== {text}", flush=True)


def perdure(workdir: Path, *args: str) -> str:
    """Run a `perdure` CLI command against the demo's store; its output."""
    command = [sys.executable, "-m", "perdure", "--db", f"sqlite:///{workdir}/state.db", *args]
    done = subprocess.run(command, cwd=workdir, capture_output=True, text=True, check=False)
    return done.stdout + done.stderr


def fail(message: str, log: Path | None = None) -> None:
    """Stop the demo with one line, after the last lines of the worker's log."""
    if log is not None and log.exists():
        tail = log.read_text(errors="replace").splitlines()[-15:]
        print(f"\n-- the last lines of {log}:", *tail, sep="\n", file=sys.stderr)
    raise SystemExit(f"demo: {message}")


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
            verdicts = [
                json.loads(data) for (data,) in conn.execute(
                    "SELECT data FROM journal WHERE run_id = ? AND final = 1 AND kind = "
                    "'step.outcome' AND name = 'agent:inbox-summariser.ground' ORDER BY seq",
                    (run_id,),
                )
            ]  # fmt: skip
            recovered, first = conn.execute(
                "SELECT COUNT(*), MIN(seq) FROM journal "
                "WHERE run_id = ? AND kind = 'run.recovered'",
                (run_id,),
            ).fetchone()
            kept = conn.execute(  # outcomes the killed worker had committed: replayed, not redone
                "SELECT COUNT(*) FROM journal "
                "WHERE run_id = ? AND kind = 'step.outcome' AND seq < ?",
                (run_id, first if first is not None else -1),
            ).fetchone()[0]
            file = json.loads(text)["args"][0]
            found[run_id] = {"status": status, "file": Path(str(file)).name,
                             "model_calls": calls, "recovered": recovered, "kept": kept,
                             "verdicts": verdicts}  # fmt: skip
        return found
    except sqlite3.OperationalError:
        return {}  # not created yet
    finally:
        conn.close()


def wait_for(
    check: object, timeout: float, what: str, worker: subprocess.Popen[bytes], log: Path
) -> None:
    """Poll `check` until it holds; stop at once if the worker died meanwhile."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        if worker.poll() is not None:
            fail(f"the worker exited with code {worker.returncode} while waiting for {what}", log)
        time.sleep(0.2)
    fail(f"timed out after {timeout:.0f}s waiting for {what}", log)


# each step of the inbox agent and the rule it runs under (agent/loop.py registers them)
EFFECTS = {
    "model": "keyed, committed at once: an answer journaled is never asked again; a call in "
    "flight at a crash is sent again, its reservation kept as 'outcome unknown'",
    "facts": "read: checked again",
    "ground": "read: checked again",
    "context": "read: read again",
    "file": "read: read again",
    "output": "idempotent: written again, same bytes",
    "notes": "idempotent: noted again, once",
}


def resume_story(workdir: Path, run_id: str) -> tuple[int, list[str], list[str]]:
    """From the killed run's journal: how many model answers committed before the kill were
    replayed (never re-done: a position holds one outcome), and the steps done anew, as
    `name (position): rule`, and the model calls that were in flight at the kill."""
    import sqlite3

    conn = sqlite3.connect(f"file:{workdir / 'state.db'}?mode=ro", uri=True, timeout=5)
    try:
        rows = conn.execute(
            "SELECT seq, position, kind, name, final FROM journal WHERE run_id = ? ORDER BY seq",
            (run_id,),
        ).fetchall()
    finally:
        conn.close()
    kill = min((seq for seq, _, kind, _, _ in rows if kind == "run.recovered"), default=None)
    if kill is None:
        return 0, [], []
    done_before = {pos for seq, pos, kind, _, final in rows
                   if seq < kill and kind == "step.outcome" and final}  # fmt: skip
    replayed = sum(1 for seq, pos, kind, name, final in rows if seq < kill and final
                   and kind == "step.outcome" and name.endswith(".model"))  # fmt: skip
    anew = []
    for seq, pos, kind, name, final in rows:
        if seq > kill and kind == "step.outcome" and final:
            assert pos not in done_before  # one outcome per position: never done twice
            short = name.rsplit(".", 1)[-1]
            anew.append(f"{short} (position {pos}): {EFFECTS.get(short, 'its effect rule')}")
    flight = sorted({f"{name.rsplit('.', 1)[-1]} (position {pos})" for seq, pos, kind, name, _
                     in rows if seq < kill and kind == "step.intent" and pos not in done_before
                     and name.endswith(".model")})  # fmt: skip
    return replayed, anew, flight


def verdict_text(verdict: dict[str, object]) -> str:
    value = verdict.get("value", verdict)
    return str(value.get("evidence", value)) if isinstance(value, dict) else str(value)


def run_demo(model: str, workdir: Path, timeout: float = 300.0) -> Outcome:
    if workdir.exists():
        shutil.rmtree(workdir)
    (workdir / "inbox").mkdir(parents=True)
    (workdir / "outbox").mkdir()
    # facts first: two model calls a file (its facts, then the summary), so the kill lands
    # with a model answer journaled and a call still to make (the shipped spec makes one)
    spec = (HERE / "agent.toml").read_text().replace(FACTS_OFF, FACTS_ON, 1)
    agent_model = model
    if model == "scripted":  # the spec's local tier, served by the extractive summariser
        spec = re.sub(r"\[models\.local\]\n(?:[^\[\n].*\n)*", SCRIPTED_TIER, spec)
        agent_model = "spec"
    (workdir / "agent.toml").write_text(spec)
    outcome = Outcome(workdir)
    log = workdir / "worker.log"

    say(
        f"starting the agent (model: {model}) on {workdir / 'state.db'}, facts first: the "
        "model lists a file's facts, then writes its summary, two journaled answers a file"
    )
    print(perdure(workdir, "validate", "agent.toml", "--model", agent_model).strip())
    worker = start_worker(workdir, agent_model, log)
    try:
        say(f"dropping {SAMPLES[0]} into inbox/")
        drop(workdir, SAMPLES[0])
        first = workdir / "outbox" / f"{Path(SAMPLES[0]).stem}_summary.md"
        done = lambda: any(  # noqa: E731
            r["file"] == SAMPLES[0] and r["status"] in ("completed", "failed")
            for r in runs(workdir).values()
        )
        wait_for(done, timeout, f"the run of {SAMPLES[0]}", worker, log)
        print(f"{first.name} written" if first.exists() else f"{SAMPLES[0]}: its run failed")

        say(f"dropping {SAMPLES[1]}, then kill -9 the worker once that run has a model "
            "answer in its journal and is still at work")  # fmt: skip
        drop(workdir, SAMPLES[1])
        wait_for(  # the first answer (the file's facts) is journaled; the summary is asked
            lambda: any(r["file"] == SAMPLES[1] and (r["status"] != "running" or
                        int(str(r["model_calls"])) >= 1) for r in runs(workdir).values()),
            timeout, "the second run's first model answer", worker, log,
        )  # fmt: skip
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
        state = next(r for r in runs(workdir).values() if r["file"] == SAMPLES[1])
        outcome.killed_during = str(state["status"])
        answers = int(str(state["model_calls"]))
        print(f"worker killed (kill -9) while the second run was {state['status']}, "
              f"with {answers} model answer(s) journaled; runs now:")  # fmt: skip
        print(perdure(workdir, "ls").strip())

        say("starting a new worker: unfinished runs resume from their journals")
        worker = start_worker(workdir, agent_model, log)
        wait_for(
            lambda: all(r["status"] in ("completed", "failed") for r in runs(workdir).values()),
            timeout, "both runs to end", worker, log,
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

    for info in runs(workdir).values():
        file = str(info["file"])
        outcome.statuses[file] = str(info["status"])
        outcome.model_calls[file] = int(str(info["model_calls"]))
        if int(str(info["recovered"])):
            outcome.recovered.append(file)
            outcome.kept = int(str(info["kept"]))
            run_id = next(k for k, v in runs(workdir).items() if v["file"] == file)
            story = resume_story(workdir, run_id)
            outcome.replayed_answers, outcome.anew, outcome.in_flight = story
        found = info["verdicts"]
        assert isinstance(found, list)
        outcome.verdicts[file] = [verdict_text(v) for v in found]
    for name in SAMPLES:
        path = workdir / "outbox" / f"{Path(name).stem}_summary.md"
        outcome.summaries[name] = path.read_text() if path.exists() else ""
        tier = re.search(r"model tier (\S+)", outcome.summaries[name])
        outcome.tiers[name] = tier.group(1) if tier else ""

    say("the summaries (each checked against its file before it was written)")
    for name, text in outcome.summaries.items():
        for reason in outcome.verdicts.get(name, []):
            if reason.startswith("not grounded"):
                print(f"rejected answer for {name}: {reason}")
        shown = text.strip() or f"(none: the run {outcome.statuses.get(name, 'did not run')})"
        print(f"--- outbox/{Path(name).stem}_summary.md\n{shown}")
    if SAMPLES[1] in outcome.recovered:
        say(f"what the resume did, from the journal of {SAMPLES[1]}'s run")
        print(f"the new worker took over the killed run (run.recovered in its journal): "
              f"{outcome.kept} step outcome(s) committed before the kill were replayed, not "
              f"done again, among them {outcome.replayed_answers} model answer(s): the model "
              "was not asked those again")  # fmt: skip
        for line in outcome.in_flight:
            print(f"in flight at the kill, sent again: {line}")
        print("done anew after the kill, each under its step's effect rule:")
        for line in outcome.anew:
            print(f"  {line}")
    else:
        print(f"\n{SAMPLES[1]}: its run had ended (or not started) when the worker died; "
              "nothing was resumed")  # fmt: skip
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
        f"{sys.executable} -m perdure --db sqlite:///state.db agent agent.toml "
        f"--model {agent_model} &\n"
        "cp some-file.txt inbox/; kill -9 %1; then start the agent again: the run resumes,\n"
        "and files already summarised are never sent to the model again."
    )
    return outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="local",
                        choices=["local", "local-large", "local-small", "scripted", "openai",
                                 "anthropic"])  # fmt: skip
    parser.add_argument("--workdir", default=str(HERE / ".state" / "demo"))
    args = parser.parse_args()
    outcome = run_demo(args.model, Path(args.workdir))
    ok = all(outcome.summaries.values()) and set(outcome.statuses.values()) == {"completed"}
    if not outcome.replayed_answers:  # the demo is there to show it: fail when it did not
        print(
            f"\ndemo: no model answer journaled before the kill was replayed "
            f"(the killed run was {outcome.killed_during or 'not found'})",
            file=sys.stderr,
        )
        ok = False
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
