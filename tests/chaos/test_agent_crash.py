"""Real processes: an agent's worker is killed between a model call and its tool call, and
between a tool call and its journal write, for each tool effect; a new worker resumes.

The agent (agent_crash_app.py) runs in `perdure worker` processes on SQLite stores; its
model is a fake OpenAI-compatible server in this process that answers by transcript
position (turn 0: call the run's tool; turn 1: call finish) and counts requests and tokens
per run. Its four tools, one per effect, mark that they started, hold, append the effect
to a ledger file, hold, and return.

Three stores, each with its own worker, run at once:

- `ref`: one uninterrupted run per effect, the reference;
- `A`: one run per effect; the worker is killed once every run's tool has started and
  none has written its ledger line (the model call is journaled, the effect not done);
- `B`: one run per effect; the worker is killed once every run's tool has written its
  ledger line and no tool's outcome is in the journal (effect done, not journaled).

After the kill a new worker takes over. A `once` tool cut short parks its run in
needs_attention and is never repeated; the test resolves it as an operator would (retry
if the ledger shows the effect did not happen, the tool's value if it did). Then every
crashed run must: have completed; show the model the same transcript as the reference;
have asked the model each turn once (replay spends zero tokens: the server's and the
store's token counts equal the reference's); and have left the ledger per its effect's
rule: exactly once at A; at B exactly once for `once` (resolved with its value), and for
`keyed`/`idempotent`/`read` re-run by recovery, twice, under the same idempotency key.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import perdure
from extras_needed import require
from perdure.agent.budget_sql import Budgets
from perdure.store.base import COMPLETED, NEEDS_ATTENTION, TERMINAL
from waits import wait_for

HERE = Path(__file__).resolve().parent
APP_FILE = HERE / "agent_crash_app.py"
EFFECTS = ("once", "keyed", "idempotent", "read")
GROUPS = ("ref", "A", "B")  # the reference, and the two kill points
AGENT = "crash"
WORKFLOW = f"agent:{AGENT}"
HOLD = 1.0  # seconds a tool waits before and after its effect where no gate is used
LEASE = 2.0
KEY_ENV = "FAKE_KEY"
SPEC = """
name = "{agent}"
goal = "Record one effect with the tool the task names, then finish."
instructions = "Call the named tool once with the run's name, then call finish."

[models.fast]
provider = "openai"
model = "fake-model"
base_url = "{base_url}"
api_key_env = "{key_env}"
context_tokens = 100000

[tools]
grant = ["ledger_once", "ledger_keyed", "ledger_idempotent", "ledger_read", "finish"]

[limits]
max_iterations = 4

[memory]
enabled = false
"""


# -- the model ---------------------------------------------------------------------------


@dataclass
class Seen:
    """One chat completion request: whose run, which turn, what it sent, what it cost."""

    run: str
    turn: int
    messages: list[dict[str, Any]]
    tokens: int


def run_effect(run: str) -> str:
    return run.rsplit("-", 1)[1]


def usage_of(turn: int) -> tuple[int, int]:
    """The tokens reported for a turn: the same for every run, so totals compare."""
    return 100 + 50 * turn, 10 + turn


class FakeModel:
    """`POST /v1/chat/completions` on 127.0.0.1, answering by transcript position.

    The run is the first user message (the task's prompt is the run's name); the turn is
    the number of assistant messages in the request. Turn 0 calls the run's tool, turn 1
    calls `finish`, so any process asking for a turn of a run gets the same answer.
    """

    def __init__(self) -> None:
        self.seen: list[Seen] = []
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def base_url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def start(self) -> FakeModel:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def of(self, run: str) -> list[Seen]:
        with self.lock:
            return [s for s in self.seen if s.run == run]

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body.get("messages") or []
        users = [m for m in messages if m.get("role") == "user"]
        run = str(users[0].get("content") or "") if users else ""
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        prompt_tokens, completion_tokens = usage_of(turn)
        with self.lock:
            self.seen.append(Seen(run, turn, messages, prompt_tokens + completion_tokens))
        if turn == 0:
            call = ("ledger_" + run_effect(run), {"run": run})
        elif turn == 1:
            call = ("finish", {"summary": f"recorded the effect of {run}"})
        else:
            call = None
        message: dict[str, Any] = {"role": "assistant", "content": None}
        if call is None:
            message["content"] = f"unexpected turn {turn}"
        else:
            message["tool_calls"] = [
                {
                    "id": f"call-{run}-{turn}",
                    "type": "function",
                    "function": {"name": call[0], "arguments": json.dumps(call[1])},
                }
            ]
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:8]}",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": body.get("model", "fake-model"),
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "stop" if call is None else "tool_calls",
                    "logprobs": None,
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path.rstrip("/") != "/v1/chat/completions":
                    status, data = 404, {"error": {"message": f"no route {self.path}"}}
                else:
                    status, data = 200, server.answer(json.loads(raw or b"{}"))
                payload = json.dumps(data).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        return Handler


# -- processes, files, journals -----------------------------------------------------------


class Workers:
    """`perdure worker` processes, one store each; any still alive is killed at the end."""

    def __init__(self, workdir: Path, env: dict[str, str]) -> None:
        self.workdir = workdir
        self.env = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
        self.env.pop("PERDURE_APP", None)
        self.procs: list[tuple[str, subprocess.Popen[bytes], Path]] = []

    def gate(self, group: str) -> Path:
        """The folder whose files open `group`'s tool gates (see agent_crash_app)."""
        folder = self.workdir / f"gates-{group}"
        folder.mkdir(exist_ok=True)
        return folder

    def open_gates(self, group: str, *names: str) -> None:
        for name in names:
            (self.gate(group) / name).touch()

    def spawn(self, group: str, url: str) -> subprocess.Popen[bytes]:
        args = [
            sys.executable, "-m", "perdure", "--app", "agent_crash_app:app", "worker",
            "--lease", str(LEASE), "--poll", "0.1", "--grace", "2",
        ]  # fmt: skip
        log = self.workdir / f"worker-{group}-{len(self.procs)}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                args,
                cwd=HERE,  # the CLI imports agent_crash_app from the working directory
                env={**self.env, "PERDURE_DB": url, "AGENT_CRASH_GATE": str(self.gate(group))},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs.append((group, proc, log))
        return proc

    def check_alive(self, killed: set[int]) -> None:
        for group, proc, log in self.procs:
            if proc.pid not in killed and proc.poll() is not None:
                pytest.fail(
                    f"worker {proc.pid} ({group}) exited by itself with {proc.returncode}:\n"
                    + log.read_text(errors="replace")[-4000:]
                )

    def stop_all(self) -> None:
        for _, proc, _ in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for _, proc, _ in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
                proc.wait()

    def reap(self) -> None:
        for _, proc, _ in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait()


def lines(path: Path, prefix: str = "") -> list[str]:
    if not path.exists():
        return []
    return [x for x in path.read_text().splitlines() if x and x.startswith(prefix)]


def ledger_of(ledger: Path, run: str) -> list[str]:
    """The ledger lines of one run: `<run>:<tool>:<key>`."""
    return lines(ledger, f"{run}:")


def normalised(value: Any, run: str) -> Any:
    """`value` with the run's name (in prompts, call ids, keys, results) made `<RUN>`."""
    return json.loads(json.dumps(value, sort_keys=True).replace(run, "<RUN>"))


def transcript(messages: list[dict[str, Any]], run: str) -> list[dict[str, Any]]:
    """What the model was shown: roles, contents, tool calls (id, name, arguments) and the
    call each tool result answers."""
    shown = []
    for m in messages:
        calls = [
            {
                "id": c.get("id"),
                "name": c["function"]["name"],
                "arguments": json.loads(c["function"]["arguments"] or "{}"),
            }
            for c in m.get("tool_calls") or []
        ]
        shown.append(
            {
                "role": m.get("role"),
                "content": m.get("content"),
                "tool_calls": calls,
                "tool_call_id": m.get("tool_call_id"),
            }
        )
    return normalised(shown, run)  # type: ignore[no-any-return]


def tool_outcomes(app: perdure.App, run: str) -> list[Any]:
    return [
        e
        for e in app.journal(run)
        if e.kind == "step.outcome" and e.name.startswith(f"{WORKFLOW}.tool.")
    ]


def load_app_module(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> ModuleType:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    spec = importlib.util.spec_from_file_location(f"agent_crash_app_{uuid.uuid4().hex}", APP_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class Case:
    group: str
    effect: str
    parked: int = 0  # needs_attention entries in its journal
    before_resolve: int | None = None  # ledger lines when a parked run was resolved
    resolution: str = "-"
    model_at_kill: str = "-"  # was the model's answer (turn 0) in the journal at the kill?

    @property
    def run(self) -> str:
        return f"{self.group}-{self.effect}"


# -- the test -----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_agent_crash_at_each_kill_point_for_each_tool_effect(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require("models", "openai")
    model = FakeModel().start()
    spec_path = tmp_path / "agent.toml"
    spec_path.write_text(SPEC.format(agent=AGENT, base_url=model.base_url, key_env=KEY_ENV))
    ledger, markers = tmp_path / "ledger.txt", tmp_path / "markers.txt"
    urls = {g: f"sqlite:///{tmp_path / f'{g}.db'}" for g in GROUPS}
    env = {
        "AGENT_CRASH_SPEC": str(spec_path),
        "AGENT_CRASH_LEDGER": str(ledger),
        "AGENT_CRASH_MARKERS": str(markers),
        "AGENT_CRASH_HOLD": str(HOLD),
        KEY_ENV: "fake-key",
    }
    mod = load_app_module(monkeypatch, {**env, "PERDURE_DB": urls["ref"]})
    apps: dict[str, perdure.App] = {"ref": mod.app}
    for group in GROUPS[1:]:
        apps[group] = mod.build(urls[group])[0]
    cases = [Case(g, e) for g in GROUPS for e in EFFECTS]
    workers = Workers(tmp_path, env)
    killed: set[int] = set()
    started_at = time.monotonic()
    try:
        # Every run of a store is started before its worker: each reads the same (empty)
        # progress notes, so the transcripts compare.
        for case in cases:
            apps[case.group].start(WORKFLOW, {"prompt": case.run}, run_id=case.run)
        workers.open_gates("ref", "effect", "return")  # the reference runs straight through
        workers.open_gates("B", "effect")  # B's tools do their effect, then wait
        first = {g: workers.spawn(g, urls[g]) for g in GROUPS}

        def runs(group: str) -> list[str]:
            return [c.run for c in cases if c.group == group]

        def at_kill_point(group: str) -> bool:
            if group == "A":  # every tool started, no effect yet
                return all(lines(markers, f"started:{r}:") for r in runs(group))
            return all(ledger_of(ledger, r) for r in runs(group))  # every effect done

        pending = {"A", "B"}
        while pending:
            workers.check_alive(killed)
            for group in sorted(pending):
                if at_kill_point(group):
                    first[group].send_signal(signal.SIGKILL)  # kill -9: nothing flushed
                    first[group].wait()
                    killed.add(first[group].pid)
                    pending.discard(group)
                    # the kill must have landed where it was meant to
                    for case in (c for c in cases if c.group == group):
                        app, run = apps[group], case.run
                        done = ledger_of(ledger, run)
                        if group == "A":
                            assert not done, (
                                f"kill point A missed for {run}: the effect already happened "
                                f"({done}); its gate did not hold"
                            )
                        else:
                            assert len(done) == 1, f"{run}: ledger {done} at the kill"
                            assert not tool_outcomes(app, run), (
                                f"kill point B missed for {run}: its tool's outcome is "
                                "journaled already; its gate did not hold"
                            )
                        journaled = any(
                            e.kind == "step.outcome" and e.name == f"{WORKFLOW}.model"
                            for e in app.journal(run)
                        )
                        case.model_at_kill = "yes" if journaled else "no"
                    workers.open_gates(group, "effect", "return")  # the recovery runs on
                    workers.spawn(group, urls[group])  # waits for the dead lease to expire
            if time.monotonic() - started_at > 45:
                pytest.fail(f"the kill points of {sorted(pending)} never came")
            time.sleep(0.02)

        # A `once` tool cut short parks its run; resolve it as an operator would.
        for case in cases:
            if case.group == "ref" or case.effect != "once":
                continue
            app, run = apps[case.group], case.run

            def settled(app: perdure.App = app, run: str = run) -> str | None:
                workers.check_alive(killed)
                status = app.get_run(run).status
                return status if status == NEEDS_ATTENTION or status in TERMINAL else None

            status = wait_for(f"{run} to park in needs_attention", settled, timeout=30, every=0.05)
            assert status == NEEDS_ATTENTION, (
                f"{run}: a once tool interrupted at kill point {case.group} must park the run "
                f"in needs_attention, but the run is {status}; ledger {ledger_of(ledger, run)}"
            )
            [stuck] = [e for e in app.journal(run) if e.kind == "step.needs_attention"]
            assert stuck.name == f"{WORKFLOW}.tool.ledger_once", stuck
            done = ledger_of(ledger, run)
            case.before_resolve = len(done)
            if not done:  # the effect did not happen: run it (once)
                app.resolve(run, stuck.position or 0, retry=True)
                case.resolution = "retry"
            else:  # it did: mark the step done with the value the tool returned
                _, tool, key = done[0].split(":", 2)
                app.resolve(
                    run, stuck.position or 0, value=mod.result_text(run, tool, key)
                )  # fmt: skip
                case.resolution = "value"

        def all_finished() -> bool:
            workers.check_alive(killed)
            return all(apps[c.group].get_run(c.run).status in TERMINAL for c in cases)

        wait_for("every run to finish", all_finished, timeout=45, every=0.1)
        workers.stop_all()
        elapsed = time.monotonic() - started_at

        # -- what happened -----------------------------------------------------------------
        facts: dict[str, dict[str, Any]] = {}
        for case in cases:
            app, run = apps[case.group], case.run
            row = app.get_run(run)
            entries = app.journal(run)
            case.parked = sum(1 for e in entries if e.kind == "step.needs_attention")
            seen = model.of(run)
            outcomes = tool_outcomes(app, run)
            facts[run] = {
                "status": row.status,
                "error": row.error,
                "result": app.handle(run).result(timeout=1) if row.status == COMPLETED else None,
                "turns": [s.turn for s in seen],
                "tokens": sum(s.tokens for s in seen),
                "stored_tokens": app.runtime.sync(
                    Budgets(app.runtime.store).run_spent(run), "run_spent"
                )[0],
                "transcript": transcript(seen[-1].messages, run) if seen else None,
                "ledger": ledger_of(ledger, run),
                # the ledger tool's step: the first tool call (the second is finish)
                "keys": {f"{run}:{min(e.position for e in outcomes)}"} if outcomes else set(),
                "model_outcomes": sum(
                    1 for e in entries if e.kind == "step.outcome" and e.name == f"{WORKFLOW}.model"
                ),
            }

        print(f"\nagent crash test: {elapsed:.1f}s")
        print(
            f"{'effect':<11}{'kill':<6}{'model calls':<13}{'tokens':<8}{'stored':<8}"
            f"{'ledger':<8}{'parked':<8}{'resolution':<12}{'model@kill':<12}status"
        )
        for case in cases:
            f = facts[case.run]
            print(
                f"{case.effect:<11}{case.group:<6}{len(f['turns']):<13}{f['tokens']:<8}"
                f"{f['stored_tokens']:<8}{len(f['ledger']):<8}{case.parked:<8}"
                f"{case.resolution:<12}{case.model_at_kill:<12}{f['status']}"
            )

        # -- the reference: an uninterrupted run per effect ----------------------------------
        for effect in EFFECTS:
            ref = facts[f"ref-{effect}"]
            assert ref["status"] == COMPLETED, ref
            assert ref["turns"] == [0, 1], ref
            assert ref["tokens"] == sum(sum(usage_of(t)) for t in (0, 1)), ref
            assert len(ref["ledger"]) == 1, ref

        # -- every crashed run against its reference and its effect's rule -------------------
        problems: list[str] = []
        for case in cases:
            if case.group == "ref":
                continue
            f, ref, run = facts[case.run], facts[f"ref-{case.effect}"], case.run
            where = f"{case.effect} tool killed at {case.group}"
            if f["status"] != COMPLETED:
                problems.append(f"{where}: run is {f['status']}, not completed: {f['error']}")
                continue
            if f["transcript"] != ref["transcript"]:
                problems.append(
                    f"{where}: the transcript differs from the reference's:\n"
                    f"  crashed:   {json.dumps(f['transcript'])}\n"
                    f"  reference: {json.dumps(ref['transcript'])}"
                )
            if normalised(f["result"], run) != normalised(ref["result"], f"ref-{case.effect}"):
                problems.append(f"{where}: result {f['result']} != reference {ref['result']}")
            # replay spends zero tokens: a model answer is committed before any tool runs
            if f["turns"] != ref["turns"]:
                problems.append(
                    f"{where}: the model was asked turns {f['turns']} (reference "
                    f"{ref['turns']}); its answer was journaled at the kill: "
                    f"{case.model_at_kill}"
                )
            if f["tokens"] != ref["tokens"] or f["stored_tokens"] != f["tokens"]:
                problems.append(
                    f"{where}: tokens reported by the model {f['tokens']}, recorded in the "
                    f"store {f['stored_tokens']}, reference {ref['tokens']}"
                )
            if f["model_outcomes"] != len(ref["turns"]):
                problems.append(f"{where}: {f['model_outcomes']} model outcomes journaled")
            done, keys = f["ledger"], {x.split(":", 2)[2] for x in f["ledger"]}
            if keys != f["keys"] or len(f["keys"]) != 1:
                problems.append(
                    f"{where}: ledger keys {sorted(keys)} != the tool step's key {f['keys']}"
                )
            if case.effect == "once":
                expected = 0 if case.group == "A" else 1
                if case.parked != 1 or case.before_resolve != expected or len(done) != 1:
                    problems.append(
                        f"{where}: parked {case.parked} times, {case.before_resolve} effects "
                        f"before the operator resolved it (expected {expected}), {len(done)} "
                        f"in the end (expected exactly 1): {done}"
                    )
            else:
                # A: the effect never happened, recovery runs it once; B: it happened and
                # was not journaled, so recovery re-runs it, with the same key
                expected = 1 if case.group == "A" else 2
                if case.parked or len(done) != expected:
                    problems.append(
                        f"{where}: {len(done)} effects (expected {expected}), parked "
                        f"{case.parked} times: {done}"
                    )
        assert not problems, "\n".join(problems)
    finally:
        workers.reap()
        for app in apps.values():
            app.close()
        model.stop()
