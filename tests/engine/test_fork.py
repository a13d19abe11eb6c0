"""Fork: a new run that reuses a prefix of another run's journal and executes the rest anew."""

from __future__ import annotations

import pytest

import perdure
from perdure.testing import TestWorker


class Pipeline:
    """Three keyed steps a, b, c; each call is logged with its idempotency key."""

    def __init__(self, app: perdure.App) -> None:
        self.calls: list[tuple[str, str]] = []
        self.fail_c = False

        def log(name: str) -> None:
            self.calls.append((name, perdure.current_step().idempotency_key))

        @app.step(name="a", effect="keyed")
        def a(x: int) -> int:
            log("a")
            return x + 1

        @app.step(name="b", effect="keyed")
        def b(x: int) -> int:
            log("b")
            return x * 10

        @app.step(name="c", effect="keyed", retry=perdure.Retry(max_attempts=1))
        def c(x: int) -> int:
            log("c")
            if self.fail_c:
                raise RuntimeError("c is broken")
            return x - 1

        @app.workflow(name="pipeline")
        def pipeline(x: int) -> int:
            return c(b(a(x)))

        self.workflow = pipeline

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]


def test_fork_reuses_prefix(app: perdure.App, worker: TestWorker) -> None:
    """A fork from step 2 replays steps 0-1 from the original and executes step 2 again."""
    p = Pipeline(app)
    original = app.start(p.workflow, 1)
    worker.run_until_idle()
    assert original.result(timeout=5) == 19
    p.calls.clear()

    fork = app.fork(original.id, from_step=2)
    assert fork.id != original.id
    worker.run_until_idle()
    assert fork.result(timeout=5) == 19
    assert p.names() == ["c"]
    assert [e.position for e in app.journal(fork.id) if e.kind == "step.outcome"] == [0, 1, 2]


def test_fork_uses_new_idempotency_keys(app: perdure.App, worker: TestWorker) -> None:
    """Steps a fork executes anew get keys of the new run, not of the original."""
    p = Pipeline(app)
    original = app.start(p.workflow, 1)
    worker.run_until_idle()
    (original_key,) = [key for name, key in p.calls if name == "c"]
    p.calls.clear()

    fork = app.fork(original.id, from_step=2, new_id="retry-1")
    worker.run_until_idle()
    assert fork.id == "retry-1"
    assert p.calls == [("c", "retry-1:2")]
    assert original_key == f"{original.id}:2"


def test_fork_of_failed_run_after_fix(app: perdure.App, worker: TestWorker) -> None:
    """A run failed at its last step, forked after the fix, completes without redoing a and b."""
    p = Pipeline(app)
    p.fail_c = True
    original = app.start(p.workflow, 2)
    worker.run_until_idle()
    assert original.status() == "failed"
    p.calls.clear()

    p.fail_c = False
    fork = app.fork(original.id, from_step=2)
    worker.run_until_idle()
    assert fork.result(timeout=5) == 29
    assert p.names() == ["c"]
    assert original.status() == "failed", "the original run is left as it was"


def test_fork_from_zero_reruns_everything(app: perdure.App, worker: TestWorker) -> None:
    """A fork from step 0 executes every step again, with the original input."""
    p = Pipeline(app)
    original = app.start(p.workflow, 5)
    worker.run_until_idle()
    p.calls.clear()

    fork = app.fork(original.id, from_step=0)
    worker.run_until_idle()
    assert fork.result(timeout=5) == 59
    assert p.names() == ["a", "b", "c"]


def test_fork_of_unfinished_run(app: perdure.App, worker: TestWorker) -> None:
    """A sleeping run can be forked; the fork reuses its prefix and does not disturb it."""
    calls: list[str] = []

    @app.step(name="prepare")
    def prepare() -> str:
        calls.append("prepare")
        return "ready"

    @app.workflow(name="waits")
    def waits() -> str:
        state = prepare()
        perdure.sleep(3600)
        return state

    original = app.start(waits)
    worker.run_until_idle()
    fork = app.fork(original.id, from_step=1)
    worker.run_until_idle()
    assert calls == ["prepare"]
    assert fork.status() == "sleeping"
    assert original.status() == "sleeping"


def test_fork_from_the_end_reuses_everything_and_past_it_is_refused(
    app: perdure.App, worker: TestWorker
) -> None:
    """A fork from the journal's end reuses every outcome and executes nothing; a step
    number past the end is refused in one line naming the range (issue 34: an operator's
    typo is not a silent copy)."""
    p = Pipeline(app)
    original = app.start(p.workflow, 3)
    worker.run_until_idle()
    p.calls.clear()
    steps = 1 + max(e.position for e in app.journal(original.id) if e.position is not None)

    with pytest.raises(perdure.PerdureError, match=f"it has {steps} step"):
        app.fork(original.id, from_step=100)
    fork = app.fork(original.id, from_step=steps)
    worker.run_until_idle()
    assert fork.result(timeout=5) == 39
    assert p.calls == []


def test_fork_refuses_existing_id(app: perdure.App, worker: TestWorker) -> None:
    """Forking into a run id that already exists raises a PerdureError."""
    p = Pipeline(app)
    original = app.start(p.workflow, 1, run_id="taken")
    worker.run_until_idle()
    with pytest.raises(perdure.PerdureError, match="taken"):
        app.fork(original.id, from_step=1, new_id="taken")


def test_fork_refuses_negative_step(app: perdure.App) -> None:
    """A negative from_step is refused with a ConfigError."""
    p = Pipeline(app)
    original = app.start(p.workflow, 1)
    with pytest.raises(perdure.ConfigError):
        app.fork(original.id, from_step=-1)


def test_fork_of_unknown_run(app: perdure.App) -> None:
    """Forking a run id that does not exist raises RunNotFound."""
    Pipeline(app)
    with pytest.raises(perdure.RunNotFound):
        app.fork("no-such-run", from_step=1)
