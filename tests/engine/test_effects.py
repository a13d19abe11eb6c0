"""Effects: what recovery does with a step that crashed between its intent and its outcome."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

import perdure
from crash_steps import crash_after, recover
from perdure.testing import SimulatedCrash, TestClock, TestWorker


def kinds(app: perdure.App, run_id: str, position: int) -> list[str]:
    """The journal entry kinds recorded at one position, in order."""
    return [e.kind for e in app.journal(run_id) if e.position == position]


class CrashOnce:
    """A step body that does its effect, then dies (as a kill -9 would) the first time only."""

    def __init__(self) -> None:
        self.effects: list[str] = []
        self.keys: list[str] = []

    def __call__(self, label: str) -> str:
        self.effects.append(label)
        self.keys.append(perdure.current_step().idempotency_key)
        if len(self.effects) == 1:
            raise SimulatedCrash("killed after the effect, before the outcome")
        return f"did {label}"


# -- read and idempotent -----------------------------------------------------------------


def test_read_step_journals_no_intent(app: perdure.App, worker: TestWorker) -> None:
    """A read step records only its outcome: it has no intent because it changes nothing."""

    @app.step(name="look", effect="read")
    def look() -> int:
        return 7

    @app.workflow
    def wf() -> int:
        return look()

    handle = app.start(wf)
    worker.run_until_idle()
    assert handle.result(timeout=5) == 7
    assert kinds(app, handle.id, 0) == ["step.outcome"]


@pytest.mark.parametrize("effect", ["read", "idempotent"])
def test_rerunnable_step_reruns_after_mid_effect_crash(
    app: perdure.App, clock: TestClock, effect: str
) -> None:
    """A read or idempotent step whose worker died mid-effect is simply run again on recovery."""
    body = CrashOnce()
    app.step(name="work", effect=effect)(body)  # type: ignore[call-overload]
    work = app.runtime.steps["work"]

    @app.workflow
    def wf() -> str:
        return str(perdure.Step(work)("x"))

    handle = app.start(wf)
    dead = TestWorker(app)
    with pytest.raises(SimulatedCrash):
        dead.run_until_idle()
    assert handle.status() == "running"
    recover(app, clock, dead)
    assert handle.result(timeout=5) == "did x"
    assert body.effects == ["x", "x"]


def test_idempotent_step_reruns_after_crash_injection(app: perdure.App, clock: TestClock) -> None:
    """After a crash right after an idempotent step's intent, recovery executes the step."""
    calls: list[str] = []

    @app.step(name="write_file", effect="idempotent")
    def write_file(text: str) -> int:
        calls.append(text)
        return len(text)

    @app.workflow
    def wf() -> int:
        return write_file("hello")

    handle = app.start(wf)
    dead = crash_after(app, "write_file")
    assert calls == []
    assert kinds(app, handle.id, 0) == ["step.intent"]
    recover(app, clock, dead)
    assert handle.result(timeout=5) == 5
    assert calls == ["hello"]
    *intents, last = kinds(app, handle.id, 0)
    assert last == "step.outcome"
    assert intents and set(intents) == {"step.intent"}


def test_crash_injection_on_read_step_crashes(app: perdure.App, clock: TestClock) -> None:
    """crash_after_intent on a read step crashes before the step runs, and recovery re-runs it."""
    calls: list[int] = []

    @app.step(name="peek", effect="read")
    def peek() -> int:
        calls.append(1)
        return 1

    @app.workflow
    def wf() -> int:
        return peek()

    handle = app.start(wf)
    dead = crash_after(app, "peek")
    assert calls == []
    recover(app, clock, dead)
    assert handle.result(timeout=5) == 1
    assert calls == [1]


# -- keyed -------------------------------------------------------------------------------


def test_keyed_step_reruns_with_same_key(app: perdure.App, clock: TestClock) -> None:
    """A keyed step re-run after a mid-effect crash sees the same idempotency key both times."""
    body = CrashOnce()
    app.step(name="charge", effect="keyed")(body)
    charge = perdure.Step(app.runtime.steps["charge"])

    @app.step(name="before", effect="read")
    def before() -> None:
        return None

    @app.workflow
    def wf() -> str:
        before()
        return str(charge("card"))

    handle = app.start(wf)
    recover(app, clock, crash_after(app))
    assert handle.result(timeout=5) == "did card"
    assert body.effects == ["card", "card"]
    assert body.keys == [f"{handle.id}:1", f"{handle.id}:1"]


def test_keyed_intent_records_key_seen_on_recovery(app: perdure.App, clock: TestClock) -> None:
    """The key journaled with a keyed step's intent is the key the step gets after recovery."""
    keys: list[str] = []

    @app.step(name="send", effect="keyed")
    def send() -> str:
        keys.append(perdure.current_step().idempotency_key)
        return "sent"

    @app.workflow
    def wf() -> str:
        return send()

    handle = app.start(wf)
    dead = crash_after(app, "send")
    (intent,) = [e for e in app.journal(handle.id) if e.kind == "step.intent"]
    recorded = json.loads(intent.data or "{}")
    assert recorded["effect"] == "keyed"
    recover(app, clock, dead)
    assert handle.result(timeout=5) == "sent"
    assert keys == [recorded["key"]]


def test_keyed_keys_differ_by_position(app: perdure.App, worker: TestWorker) -> None:
    """Two calls of one keyed step in a run get different idempotency keys."""
    keys: list[str] = []

    @app.step(name="send", effect="keyed")
    def send() -> None:
        keys.append(perdure.current_step().idempotency_key)

    @app.workflow
    def wf() -> None:
        send()
        send()

    handle = app.start(wf)
    worker.run_until_idle()
    assert handle.status() == "completed"
    assert keys == [f"{handle.id}:0", f"{handle.id}:1"]


def test_keyed_key_stable_across_retries(app: perdure.App, worker: TestWorker) -> None:
    """A keyed step's idempotency key stays the same on every retry attempt."""
    seen: list[tuple[int, str]] = []

    @app.step(name="send", effect="keyed", retry=perdure.Retry(initial=0))
    def send() -> str:
        info = perdure.current_step()
        seen.append((info.attempt, info.idempotency_key))
        if info.attempt < 3:
            raise ConnectionError("flaky network")
        return "sent"

    @app.workflow
    def wf() -> str:
        return send()

    handle = app.start(wf)
    worker.run_until_idle()
    assert handle.result(timeout=5) == "sent"
    assert seen == [(1, f"{handle.id}:0"), (2, f"{handle.id}:0"), (3, f"{handle.id}:0")]


def test_db_only_for_transactional_steps(app: perdure.App, worker: TestWorker) -> None:
    """current_step().db is None in a step that is not transactional."""
    seen: list[object] = []

    @app.step(name="look", effect="read")
    def look() -> None:
        seen.append(perdure.current_step().db)

    @app.workflow
    def wf() -> None:
        look()

    app.start(wf)
    worker.run_until_idle()
    assert seen == [None]


# -- once --------------------------------------------------------------------------------


def _once_workflow(app: perdure.App, calls: list[str]) -> perdure.Workflow[[], str]:
    @app.step(name="pay", effect="once")
    def pay(amount: int) -> str:
        calls.append(f"pay {amount}")
        return f"receipt {amount}"

    @app.step(name="notify")
    def notify(receipt: str) -> str:
        calls.append(f"notify {receipt}")
        return receipt

    @app.workflow
    def wf() -> str:
        return notify(pay(10))

    return wf


def test_once_step_needs_attention_after_crash(app: perdure.App, clock: TestClock) -> None:
    """A once step that crashed after its intent is not re-run: the run needs attention."""
    calls: list[str] = []
    handle = app.start(_once_workflow(app, calls))
    dead = crash_after(app, "pay")
    recover(app, clock, dead)
    assert handle.status() == "needs_attention"
    assert calls == []
    assert kinds(app, handle.id, 0) == ["step.intent", "step.needs_attention"]
    # Parked: further workers leave it alone.
    clock.advance(3600)
    assert TestWorker(app).run_until_idle() == 0
    assert calls == []


@pytest.mark.parametrize("sync", [True, False])
def test_once_body_never_starts_once_the_lease_may_have_ended(
    app: perdure.App, clock: TestClock, sync: bool
) -> None:
    """A once intent acknowledged after the worker's lease ran out (its answer held up, as
    in a partition; here the clock moves on inside the step before) must not start its
    body: another worker may have the run by now. Its recovery then parks the run."""
    calls: list[str] = []
    worker = TestWorker(app)

    @app.step(name="slow", effect="keyed")
    def slow() -> None:
        clock.advance(worker.lease + 1)  # the lease ends while the worker waits

    @app.step(name="pay", effect="once")
    def pay() -> None:
        calls.append("paid")

    if sync:

        @app.workflow(name="w")
        def w_sync() -> None:
            slow()
            pay()

    else:

        @app.workflow(name="w")
        async def w_async() -> None:
            await slow()
            await pay()

    handle = app.start("w")
    worker.run_until_idle()  # it claims the run again once the lease lapsed: it parks it
    assert calls == []  # the intent is journaled, the body never started
    assert kinds(app, handle.id, 1) == ["step.intent", "step.needs_attention"]
    assert handle.status() == "needs_attention"


def test_once_step_mid_effect_crash_never_repeats(app: perdure.App, clock: TestClock) -> None:
    """A once step that did its effect and then crashed is never executed a second time."""
    body = CrashOnce()
    app.step(name="pay", effect="once")(body)
    pay = perdure.Step(app.runtime.steps["pay"])

    @app.workflow
    def wf() -> str:
        return str(pay("x"))

    handle = app.start(wf)
    recover(app, clock, crash_after(app))
    assert handle.status() == "needs_attention"
    assert body.effects == ["x"]


def test_once_outcome_survives_crash_in_later_step(app: perdure.App, clock: TestClock) -> None:
    """A once step that completed is not reported stuck after a crash in a later read step."""
    calls: list[str] = []
    body = CrashOnce()
    app.step(name="look", effect="read")(body)
    look = perdure.Step(app.runtime.steps["look"])

    @app.step(name="pay")
    def pay() -> str:
        calls.append("pay")
        return "paid"

    @app.workflow
    def wf() -> str:
        return f"{pay()} {look('x')}"

    handle = app.start(wf)
    recover(app, clock, crash_after(app))
    assert calls == ["pay"]
    assert handle.status() == "completed"
    assert handle.result(timeout=5) == "paid did x"


def test_once_outcome_survives_crash_in_workflow_code(app: perdure.App, clock: TestClock) -> None:
    """A once step's outcome is committed within a few ms even if the workflow writes nothing
    more, so a crash in the workflow's own code after that does not park the run."""
    calls: list[str] = []
    crashed: list[bool] = []

    @app.step(name="pay")
    def pay() -> str:
        calls.append("pay")
        return "paid"

    @app.workflow
    def wf() -> str:
        receipt = pay()
        if not crashed:  # the process dies while the workflow digests the receipt
            crashed.append(True)
            time.sleep(0.05)  # workflow code that takes a while (the engine's linger is 5 ms)
            raise SimulatedCrash("killed in workflow code")
        return receipt

    handle = app.start(wf)
    recover(app, clock, crash_after(app))
    assert calls == ["pay"]
    assert handle.status() == "completed"


def test_later_once_outcome_survives_crash_in_workflow_code(
    app: perdure.App, clock: TestClock
) -> None:
    """The linger timer armed by one once outcome is not reset by the next step's write: it
    fires early for the second outcome, arms itself again, and still commits that one."""
    calls: list[str] = []
    crashed: list[bool] = []

    @app.step(name="pay")
    async def pay(n: int) -> str:
        calls.append(f"pay {n}")
        if n == 2:  # holds the loop past the first outcome's timer, which then fires late
            time.sleep(0.01)
        return f"paid {n}"

    @app.workflow
    async def wf() -> str:
        first = await pay(1)
        second = await pay(2)  # its intent's write took the first outcome; its own waits
        if not crashed:
            crashed.append(True)
            await asyncio.sleep(0.05)
            raise SimulatedCrash("killed in workflow code")
        return f"{first}, {second}"

    handle = app.start(wf)
    recover(app, clock, crash_after(app))
    assert calls == ["pay 1", "pay 2"]
    assert handle.result(timeout=5) == "paid 1, paid 2"


def test_resolve_with_value(app: perdure.App, clock: TestClock) -> None:
    """Resolving a stuck once step with a value continues the run as if the step returned it."""
    calls: list[str] = []
    handle = app.start(_once_workflow(app, calls))
    recover(app, clock, crash_after(app, "pay"))
    assert app.resolve(handle.id, "pay", value="receipt by hand") == "pending"
    TestWorker(app).run_until_idle()
    assert handle.result(timeout=5) == "receipt by hand"
    assert calls == ["notify receipt by hand"]


def test_resolve_value_decoded_as_step_type(app: perdure.App, clock: TestClock) -> None:
    """An operator's value for a stuck step reaches the workflow as the step's annotated type."""
    seen: list[object] = []

    @app.step(name="book")
    def book() -> datetime:
        return datetime.now(UTC)

    @app.workflow
    def wf() -> str:
        when = book()
        seen.append(when)
        return when.isoformat()

    handle = app.start(wf)
    recover(app, clock, crash_after(app, "book"))
    app.resolve(handle.id, "book", value="2026-05-06T07:08:09+00:00")
    TestWorker(app).run_until_idle()
    assert handle.result(timeout=5) == "2026-05-06T07:08:09+00:00"
    assert seen == [datetime(2026, 5, 6, 7, 8, 9, tzinfo=UTC)]


def test_resolve_by_position(app: perdure.App, clock: TestClock) -> None:
    """A stuck step can be named by its journal position instead of its name."""
    calls: list[str] = []
    handle = app.start(_once_workflow(app, calls))
    recover(app, clock, crash_after(app, "pay"))
    app.resolve(handle.id, 0, value="r0")
    TestWorker(app).run_until_idle()
    assert handle.result(timeout=5) == "r0"


def test_resolve_retry(app: perdure.App, clock: TestClock) -> None:
    """Resolving with retry=True executes the once step again, this time to completion."""
    calls: list[str] = []
    handle = app.start(_once_workflow(app, calls))
    recover(app, clock, crash_after(app, "pay"))
    assert app.resolve(handle.id, "pay", retry=True) == "pending"
    TestWorker(app).run_until_idle()
    assert handle.result(timeout=5) == "receipt 10"
    assert calls == ["pay 10", "notify receipt 10"]


def test_resolve_retry_then_crash_again(app: perdure.App, clock: TestClock) -> None:
    """A retried once step that crashes again needs attention again, and can then be settled."""
    calls: list[str] = []
    handle = app.start(_once_workflow(app, calls))
    recover(app, clock, crash_after(app, "pay"))
    app.resolve(handle.id, "pay", retry=True)
    recover(app, clock, crash_after(app, "pay"))
    assert handle.status() == "needs_attention"
    assert calls == []
    app.resolve(handle.id, "pay", value="second time lucky")
    TestWorker(app).run_until_idle()
    assert handle.result(timeout=5) == "second time lucky"
    assert calls == ["notify second time lucky"]


def test_resolve_fail(app: perdure.App, clock: TestClock) -> None:
    """Resolving with fail=True ends the run failed without executing the step."""
    calls: list[str] = []
    handle = app.start(_once_workflow(app, calls))
    recover(app, clock, crash_after(app, "pay"))
    assert app.resolve(handle.id, "pay", fail=True) == "failed"
    assert handle.status() == "failed"
    with pytest.raises(perdure.RunFailed, match="pay"):
        handle.result(timeout=5)
    TestWorker(app).run_until_idle()
    assert calls == []


def test_resolve_refuses_run_not_needing_attention(app: perdure.App, worker: TestWorker) -> None:
    """resolve() on a run that is not needs_attention raises a PerdureError and changes nothing."""
    calls: list[str] = []
    handle = app.start(_once_workflow(app, calls))
    worker.run_until_idle()
    with pytest.raises(perdure.PerdureError, match="not needs_attention"):
        app.resolve(handle.id, "pay", value="x")
    assert handle.status() == "completed"


def test_resolve_unknown_step(app: perdure.App, clock: TestClock) -> None:
    """resolve() naming a step that is not stuck raises and lists the stuck one."""
    calls: list[str] = []
    handle = app.start(_once_workflow(app, calls))
    recover(app, clock, crash_after(app, "pay"))
    with pytest.raises(perdure.PerdureError, match="pay"):
        app.resolve(handle.id, "notify", value="x")
    assert handle.status() == "needs_attention"


def test_resolve_needs_exactly_one_choice(app: perdure.App, clock: TestClock) -> None:
    """resolve() with both retry and fail is refused as a ConfigError."""
    calls: list[str] = []
    handle = app.start(_once_workflow(app, calls))
    recover(app, clock, crash_after(app, "pay"))
    with pytest.raises(perdure.ConfigError):
        app.resolve(handle.id, "pay", retry=True, fail=True)


def test_undeclared_effect_is_once(app: perdure.App, clock: TestClock) -> None:
    """A step declared without an effect is `once`: after a crash it is not re-run."""
    calls: list[int] = []

    @app.step(name="plain")
    def plain() -> int:
        calls.append(1)
        return 1

    @app.workflow
    def wf() -> int:
        return plain()

    assert app.runtime.steps["plain"].effect == "once"
    handle = app.start(wf)
    recover(app, clock, crash_after(app, "plain"))
    assert handle.status() == "needs_attention"
    assert calls == []


# -- intents -----------------------------------------------------------------------------


def test_once_intent_committed_before_step_runs(app: perdure.App, worker: TestWorker) -> None:
    """A once step's intent is already in the store's journal while the step body runs."""
    seen: list[list[tuple[str, int | None, str]]] = []

    @app.step(name="first", effect="read")
    def first() -> int:
        return 1

    @app.step(name="act")
    def act() -> None:
        run_id = perdure.current_step().run_id
        seen.append([(e.kind, e.position, e.name) for e in app.journal(run_id)])

    @app.workflow
    def wf() -> None:
        first()
        act()

    handle = app.start(wf)
    worker.run_until_idle()
    assert handle.status() == "completed"
    assert seen == [[("step.outcome", 0, "first"), ("step.intent", 1, "act")]]
    intent = next(e for e in app.journal(handle.id) if e.kind == "step.intent")
    assert json.loads(intent.data or "{}") == {"effect": "once", "key": f"{handle.id}:1"}


@pytest.mark.parametrize("effect", ["idempotent", "keyed", "once"])
def test_intent_precedes_outcome(app: perdure.App, worker: TestWorker, effect: str) -> None:
    """Every non-read step journals an intent (effect, key) before its outcome at its position."""

    def act() -> int:
        return 3

    app.step(name="act", effect=effect)(act)  # type: ignore[call-overload]
    step = perdure.Step(app.runtime.steps["act"])

    @app.workflow
    def wf() -> int:
        return int(step())

    handle = app.start(wf)
    worker.run_until_idle()
    entries = [e for e in app.journal(handle.id) if e.position == 0]
    assert [e.kind for e in entries] == ["step.intent", "step.outcome"]
    assert all(e.name == "act" for e in entries)
    assert entries[0].seq < entries[1].seq
    assert json.loads(entries[0].data or "{}")["effect"] == effect
    assert json.loads(entries[1].data or "{}")["value"] == 3


# -- transactional -----------------------------------------------------------------------


def db_path(app: perdure.App) -> Path:
    return Path(app.url.removeprefix("sqlite:///"))


def ledger(app: perdure.App) -> list[str]:
    """Rows of the user's `ledger` table in the store's own database file."""
    with sqlite3.connect(db_path(app)) as conn:
        try:
            return [r[0] for r in conn.execute("SELECT item FROM ledger ORDER BY item")]
        except sqlite3.OperationalError:
            return []


def _insert(item: str) -> None:
    db = perdure.current_step().db
    db.execute("CREATE TABLE IF NOT EXISTS ledger (item TEXT)")
    db.execute("INSERT INTO ledger (item) VALUES (?)", (item,))


def test_transactional_write_commits_with_outcome(app: perdure.App, worker: TestWorker) -> None:
    """A transactional step's writes through current_step().db are committed with its outcome."""

    @app.step(name="record", effect="transactional")
    def record(item: str) -> str:
        assert isinstance(perdure.current_step().db, sqlite3.Connection)
        _insert(item)
        return f"recorded {item}"

    @app.workflow
    def wf() -> str:
        return record("apple")

    handle = app.start(wf)
    worker.run_until_idle()
    assert handle.result(timeout=5) == "recorded apple"
    assert ledger(app) == ["apple"]
    outcome = next(e for e in app.journal(handle.id) if e.kind == "step.outcome")
    assert json.loads(outcome.data or "{}")["value"] == "recorded apple"


def test_transactional_write_rolled_back_when_step_raises(
    app: perdure.App, worker: TestWorker
) -> None:
    """A raising transactional step leaves no trace of its writes; the workflow gets StepError."""

    @app.step(name="record", effect="transactional", retry=perdure.Retry(max_attempts=1))
    def record(item: str) -> None:
        _insert(item)
        raise RuntimeError("constraint violated")

    @app.workflow
    def wf() -> str:
        try:
            record("apple")
        except perdure.StepError as exc:
            return f"caught {exc.error_type}"
        return "not caught"

    handle = app.start(wf)
    worker.run_until_idle()
    assert handle.result(timeout=5) == "caught RuntimeError"
    assert ledger(app) == []


def test_transactional_retry_keeps_only_successful_attempt(
    app: perdure.App, worker: TestWorker
) -> None:
    """Writes of a failed transactional attempt are rolled back; the retry's writes are kept."""
    attempts: list[int] = []

    @app.step(name="record", effect="transactional", retry=perdure.Retry(initial=0, jitter=0))
    def record(item: str) -> int:
        attempt = perdure.current_step().attempt
        attempts.append(attempt)
        _insert(f"{item}-{attempt}")
        if attempt == 1:
            raise RuntimeError("transient")
        return attempt

    @app.workflow
    def wf() -> int:
        return record("apple")

    handle = app.start(wf)
    worker.run_until_idle()
    assert handle.result(timeout=5) == 2
    assert attempts == [1, 2]
    assert ledger(app) == ["apple-2"]


def test_transactional_crash_mid_transaction_runs_exactly_once(
    app: perdure.App, clock: TestClock
) -> None:
    """A crash inside a transactional step commits nothing; recovery writes the effect once."""
    bodies: list[int] = []

    @app.step(name="record", effect="transactional")
    def record() -> str:
        bodies.append(1)
        _insert("apple")
        if len(bodies) == 1:
            raise SimulatedCrash("killed inside the transaction")
        return "ok"

    @app.workflow
    def wf() -> str:
        return record()

    handle = app.start(wf)
    dead = TestWorker(app)
    with pytest.raises(SimulatedCrash):
        dead.run_until_idle()
    assert ledger(app) == []
    assert kinds(app, handle.id, 0) == []
    recover(app, clock, dead)
    assert handle.result(timeout=5) == "ok"
    assert ledger(app) == ["apple"]


def test_transactional_step_not_reexecuted_on_replay(
    app: perdure.App, worker: TestWorker, clock: TestClock
) -> None:
    """A committed transactional step is replayed from the journal, its write not repeated."""

    @app.step(name="record", effect="transactional")
    def record(item: str) -> str:
        _insert(item)
        return item

    @app.workflow
    def wf() -> str:
        item = record("apple")
        perdure.sleep(60)
        return item

    handle = app.start(wf)
    worker.run_until_idle()
    clock.advance(61)
    worker.run_until_idle()
    assert handle.result(timeout=5) == "apple"
    assert ledger(app) == ["apple"]


def test_effects_listed() -> None:
    """perdure.EFFECTS lists the five effects."""
    assert set(perdure.EFFECTS) == {"read", "idempotent", "keyed", "once", "transactional"}


def test_async_transactional_step_is_refused_at_registration(app: perdure.App) -> None:
    """A transactional step must be a plain function: it runs inside the store's transaction."""
    with pytest.raises(perdure.ConfigError, match="must be plain"):

        @app.step(effect="transactional")
        async def credit() -> None:
            return None


def test_failed_once_outcome_is_committed_before_the_next_step(
    app: perdure.App, clock: TestClock
) -> None:
    """A once step that failed for good is not reported stuck after a crash in a later step."""
    calls: list[str] = []

    @app.step(name="pay_fails")
    def pay_fails() -> str:
        calls.append("pay")
        raise ValueError("card declined")

    body = CrashOnce()  # dies inside the read step, flushing nothing on the way
    app.step(name="after_decline", effect="read")(body)
    after_decline = perdure.Step(app.runtime.steps["after_decline"])

    @app.workflow
    def wf() -> str:
        with contextlib.suppress(perdure.StepError):
            pay_fails()
        return str(after_decline("x"))

    handle = app.start(wf)
    recover(app, clock, crash_after(app))
    assert handle.status() == "completed"
    assert calls == ["pay"]
    assert body.effects == ["x", "x"]
