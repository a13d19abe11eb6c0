"""The named setups, wraps and checks that README markers refer to (`setup=`, `wrap=`, `check=`).

Python setups and checks are source text run in the snippet's own namespace, before
and after the README block; a wrap is a template whose `{block}` line the block
replaces (indented to match). They define only what the README takes as given
(`payments`, `mailer`, a waiting `run`, ...) and check what the block claims to do.
Shell setups and checks are functions of the sandbox the block runs in.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from local_servers import free_port

if TYPE_CHECKING:
    from readme_support import Sandbox, ShellResult

PY_SETUPS: dict[str, str] = {
    # A model that "generates" a reply word by word, and a worker running in this process.
    "live-worker": """
import asyncio as _asyncio, threading as _threading

def generate(topic):
    yield from (f"{word} " for word in f"a post about {topic}".split())

_worker = app.worker(perdure.WorkerOptions(poll=0.05, gc_every=None))
_loop = _asyncio.new_event_loop()
_thread = _threading.Thread(target=_loop.run_until_complete, args=(_worker.run(),), daemon=True)
_thread.start()
""",
    # The imports and App every snippet after "A first workflow" takes as given.
    "app": """
from datetime import timedelta
from typing import Any
import perdure

app = perdure.App()
""",
    # The outside services of "A first workflow": fakes that record their calls.
    "stubs": """
class _Payments:
    def __init__(self): self.calls = []
    def charge(self, order, idempotency_key):
        assert idempotency_key, "charge() got no idempotency key"
        self.calls.append((order, idempotency_key))
        return f"receipt-{order}"

class _Mailer:
    def __init__(self): self.sent = []
    def send(self, order, receipt): self.sent.append((order, receipt))

payments, mailer = _Payments(), _Mailer()
""",
    # The workflow the `every=` schedule names.
    "poll-inbox": """
@app.workflow()
def poll_inbox() -> None: ...
""",
    # `run`: a run parked in wait_event("approved"), for `app.emit(..., run_id=run.id)`.
    "waiting-run": """
from perdure.testing import TestWorker

@app.workflow()
async def approval() -> Any:
    return await perdure.wait_event("approved")

_worker = TestWorker(app)
run = app.start(approval, run_id="approval-1")
_worker.run_until_idle()
assert run.status() == "waiting", run.status()
""",
    # What a plan's batches run and its check.
    "plan-steps": """
@app.workflow()
def migrate(user: str) -> str:
    return f"migrated {user}"

@app.workflow()
def verify(batch: int, results: list[str]) -> bool:
    return all(r.startswith("migrated ") for r in results)
""",
}

PY_WRAPS: dict[str, str] = {
    # A fragment written as the body of an async workflow taking `order`, with a step `send_sms`.
    "checkout-body": """
sent_sms: list[str] = []

@app.step()
async def send_sms(order: str) -> None:
    sent_sms.append(order)

@app.workflow()
async def notify(order: str) -> None:
    {block}
""",
}

PY_CHECKS: dict[str, str] = {
    # The reader saw the step's marker, every token in order, the progress, and the end.
    "streamed": """
_seen = [(c.kind, c.topic, c.data) for c in app.handle(run.id).stream()]
assert _seen[0][0] == "attempt" and _seen[-1] == ("chunk", "progress", {"done": 1, "of": 3})
assert "".join(d for k, t, d in _seen if t == "out") == "a post about durable streams ", _seen
assert run.result(timeout=10) == "a post about durable streams "
_loop.call_soon_threadsafe(_worker.stop)
_thread.join(20)
""",
    # Drive the checkout: charged once, asleep a day, waiting, then the receipt is sent.
    "checkout-completes": """
from datetime import UTC, datetime
from perdure.testing import TestClock, TestWorker

clock = TestClock(datetime.now(UTC) + timedelta(seconds=1))
app.clock = clock
worker = TestWorker(app)
worker.run_until_idle()
assert handle.status() == "sleeping", handle.status()
clock.advance(timedelta(days=1))
worker.run_until_idle()
assert handle.status() == "waiting", handle.status()
app.send_event("checkout-order-42", "approved", {"by": "ana"})
worker.run_until_idle()
assert handle.result(timeout=5) == "receipt-order-42"
assert app.start(checkout, "order-42", run_id="checkout-order-42").id == handle.id
assert [order for order, _ in payments.calls] == ["order-42"], payments.calls
assert mailer.sent == [("order-42", "receipt-order-42")], mailer.sent
""",
    # The transactional step's UPDATE commits with its outcome.
    "credit-commits": """
from perdure.testing import TestWorker

@app.step(effect="transactional")
def open_account(user: str, n: int) -> None:
    db = perdure.current_step().db
    db.execute("CREATE TABLE credit (user TEXT PRIMARY KEY, n INTEGER NOT NULL)")
    db.execute("INSERT INTO credit VALUES (?, ?)", (user, n))

@app.step(effect="transactional")
def balance(user: str) -> int:
    row = perdure.current_step().db.execute("SELECT n FROM credit WHERE user = ?", (user,))
    return int(row.fetchone()[0])

@app.workflow()
def top_up(user: str) -> list[int]:
    open_account(user, 10)
    return [add_credit(user, 5), balance(user)]

handle = app.start(top_up, "ana")
TestWorker(app).run_until_idle()
assert handle.result(timeout=5) == [5, 15], handle.status()
""",
    # A worker stores both schedules: on a Friday at 12:01 UTC the cron one next fires on
    # Monday at 09:00 Paris time with its args, the `every=` one at 12:05 (epoch-aligned).
    "schedules-stored": """
import json
from datetime import UTC, datetime
from perdure.testing import TestClock, TestWorker

app.clock = TestClock(datetime(2026, 3, 6, 12, 1, tzinfo=UTC))
TestWorker(app).run_until_idle()
stored = {s.name: s for s in app.schedules()}
assert sorted(stored) == ["digest", "poll_inbox"], sorted(stored)
digest, poll = stored["digest"], stored["poll_inbox"]
assert (digest.cron, digest.tz, json.loads(digest.input)["args"]) == (
    "0 9 * * 1-5", "Europe/Paris", ["daily"]), digest
assert digest.next_fire == datetime(2026, 3, 9, 8, 0, tzinfo=UTC).timestamp(), digest
assert (poll.every, poll.overlap) == (300, "skip"), poll
assert poll.next_fire == datetime(2026, 3, 6, 12, 5, tzinfo=UTC).timestamp(), poll
""",
    # The event starts `thank` once, however often it is emitted; the waiting run gets True.
    "events-delivered": """
_worker.run_until_idle()
assert app.get_run("event:thank:evt_123").status == "completed"
assert run.result(timeout=5) is True
app.emit("invoice.paid", {"invoice": "A-1"}, event_id="evt_123")
_worker.run_until_idle()
assert [r.id for r in app.list_runs() if r.workflow == "thank"] == ["event:thank:evt_123"]
""",
    # A real worker watching `incoming/` starts one run for a dropped PDF, none for a .txt.
    "inbox-starts-run": """
import asyncio, hashlib, time
from pathlib import Path

assert Path("incoming").is_dir(), "app.inbox() did not create incoming/"

async def drop_and_wait() -> list[str]:
    worker = app.worker(concurrency=2, lease=5, poll=0.05, gc_every=None)
    task = asyncio.create_task(worker.run())
    try:
        await asyncio.sleep(0.3)
        Path("incoming/notes.txt").write_text("not a pdf")
        Path("incoming/report.pdf").write_bytes(b"%PDF-1.4 report")
        limit = time.monotonic() + 60
        while not (done := await app.client.list_runs(statuses=["completed"])):
            assert time.monotonic() < limit, "no inbox run completed within 60 s"
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        return [r.id for r in await app.client.list_runs()]
    finally:
        worker.stop()
        await asyncio.wait_for(task, 10)

digest = hashlib.sha256(b"%PDF-1.4 report").hexdigest()
assert asyncio.run(drop_and_wait()) == [f"inbox:summarise:{digest[:32]}"]
""",
    # The hook is registered under its name (the next block posts to it).
    "webhook-registered": """
from perdure.triggers.webhooks import Webhook
assert "push" in app.runtime.triggers.of(Webhook), list(app.runtime.triggers)
""",
    # The table change trigger is kept with the app's triggers (installed at worker start).
    "table-change-registered": """
from perdure.triggers.table_changes import TableChange
assert "orders" in app.runtime.triggers.of(TableChange), list(app.runtime.triggers)
""",
    # The plan runs both batches and its check, and completes.
    "plan-completes": """
from perdure.testing import TestWorker

TestWorker(app).run_until_idle()
report = handle.result(timeout=5)
assert report["status"] == "completed", report
assert [b["check"] for b in report["batches"]] == [True, True], report
assert sorted(app.get_run(r).result for b in report["batches"] for r in b["runs"]) == [
    '"migrated ana"', '"migrated bo"', '"migrated cy"']
""",
    # The policy is the workflow's; gc deletes nothing that the policy keeps.
    "retention-policy": """
from perdure.testing import TestWorker

kept = app.runtime.workflows["nightly_upgrade"].retention
assert kept == perdure.Retention(keep_days=30, keep_last=100)
handle = app.start(nightly_upgrade, "repo")
TestWorker(app).run_until_idle()
assert handle.status() == "completed"
app.gc()
assert app.get_run(handle.id).status == "completed"
""",
    # The queued run is claimed and completes, in its queue and partition.
    "queue-run-completes": """
from perdure.testing import TestWorker

TestWorker(app).run_until_idle()
(run,) = app.list_runs()
assert (run.workflow, run.status, run.queue) == ("send_digest", "completed", "emails"), run
""",
    # A new run takes the patched path.
    "patched-new-run": """
from perdure.testing import TestWorker

handle = app.start(notify, "o-7")
TestWorker(app).run_until_idle()
assert handle.status() == "completed", handle.status()
assert sent_sms == ["o-7"], sent_sms
""",
}


def serve(sandbox: Sandbox) -> None:
    """`perdure --app shop:app serve` on a free port, which replaces the block's 8000."""
    port = free_port()
    sandbox.replace("127.0.0.1:8000", f"127.0.0.1:{port}")
    sandbox.background(
        f"perdure --app shop:app serve --port {port}", at="setup=serve", ready_port=port
    )


def hook_run_completes(sandbox: Sandbox, result: ShellResult) -> None:
    """The delivery started `hook:push:push-1`; a `perdure worker` completes it."""
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert answer == {"run_id": "hook:push:push-1", "duplicate": False}, answer
    sandbox.background("perdure --app shop:app worker", at="check=hook-run-completes")
    limit = time.monotonic() + 60
    while True:
        shown = sandbox.run("perdure show hook:push:push-1")
        assert shown.returncode == 0, shown.stderr
        if re.search(r"^status\s+completed$", shown.stdout, re.MULTILINE):
            return
        assert time.monotonic() < limit, f"hook:push:push-1 did not complete:\n{shown.stdout}"
        time.sleep(0.3)


def first_workflow_resumed(sandbox: Sandbox, result: ShellResult) -> None:
    """The run completed after its worker was killed, and no step that had completed ran
    again: the stand-ins printed loading, charging and mailing once each (packing once or,
    when the kill landed inside it, twice); the journal holds each step's outcome once."""
    words = [line.split()[0] for line in (sandbox.path / "worker.log").read_text().splitlines()]
    counts = {word: words.count(word) for word in ("loading", "charging", "packing", "mailing")}
    assert counts["loading"] == counts["charging"] == counts["mailing"] == 1, counts
    assert counts["packing"] in (1, 2), counts
    assert '"order-42: ch_order-42, parcel-order-42"' in result.stdout, result.stdout
    shown = json.loads(sandbox.run("perdure show order-42 --json").stdout)
    assert shown["run"]["status"] == "completed", shown["run"]
    outcomes = [e["name"] for e in shown["entries"] if e["kind"] == "step.outcome"]
    assert outcomes == ["load_order", "charge", "pack", "send_receipt"], outcomes


def spec_agent_summarised(sandbox: Sandbox, result: ShellResult) -> None:
    """The inbox file became one completed run whose summary keeps the file's facts."""
    summary = (sandbox.path / "outbox" / "release_summary.md").read_text()
    assert "12 March" in summary and "Ana Lima" in summary, summary
    runs = json.loads(sandbox.run("perdure ls --json").stdout)["runs"]
    assert [r["id"].split(":")[:2] for r in runs] == [["inbox", "summariser"]], runs
    assert runs[0]["status"] == "completed", runs


SHELL_SETUPS: dict[str, Callable[[Sandbox], None]] = {"serve": serve}
SHELL_CHECKS: dict[str, Callable[[Sandbox, ShellResult], None]] = {
    "hook-run-completes": hook_run_completes,
    "first-workflow-resumed": first_workflow_resumed,
    "spec-agent-summarised": spec_agent_summarised,
}
