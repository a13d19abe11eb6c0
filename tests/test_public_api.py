"""The public surface: perdure exports exactly the names users may touch, and nothing else."""

from __future__ import annotations

import inspect
import typing

import perdure
import perdure.testing
from perdure.engine.runtime import Runtime

EXPECTED = [
    # application and registration
    "App",
    "Workflow",
    "Step",
    "Retry",
    "Effect",
    "EFFECTS",
    "ProbeAnswer",
    "Retention",
    "QueueSpec",
    # runs
    "Client",
    "RunHandle",
    "ChildHandle",
    "RunRow",
    "RunStatus",
    "Entry",
    "GcReport",
    # triggers
    "ScheduleRow",
    "TickRow",
    "sources",
    "MessageTrigger",
    "open_inbox_file",
    # inside a workflow
    "now",
    "uuid",
    "random",
    "sleep",
    "wait_event",
    "steering",
    "Steer",
    "patched",
    "continue_as_new",
    "current_run",
    "RunInfo",
    "current_step",
    "StepInfo",
    "stream",
    "StreamChunk",
    "abortable",
    # workers and time
    "Worker",
    "WorkerOptions",
    "Clock",
    "SystemClock",
    # errors
    "PerdureError",
    "ConfigError",
    "StoreError",
    "StoreUnavailable",
    "SchemaVersionError",
    "LeaseLost",
    "RunNotFound",
    "PayloadError",
    "NonDeterminismError",
    "StepError",
    "StepTimeout",
    "RunFailed",
    "DeadlineExceeded",
    "WaitTimeout",
    "SyncInAsyncError",
    "InboxFileChanged",
    "__version__",
]


def test_all_matches_expected() -> None:
    """perdure.__all__ lists exactly the expected public names (update both on purpose)."""
    assert sorted(perdure.__all__) == sorted(EXPECTED)
    assert len(perdure.__all__) == len(set(perdure.__all__)), "no name listed twice"


def test_all_names_resolve() -> None:
    """Every name in perdure.__all__ is an attribute of the package."""
    missing = [name for name in perdure.__all__ if not hasattr(perdure, name)]
    assert missing == []


def test_no_unlisted_public_names() -> None:
    """Every public, non-module attribute of perdure is listed in __all__."""
    public = {
        name
        for name, value in vars(perdure).items()
        if not name.startswith("_") and not inspect.ismodule(value) and name != "annotations"
    }
    assert public <= set(perdure.__all__)


def test_errors_share_one_root() -> None:
    """Every exported error class derives from PerdureError."""
    errors = [
        getattr(perdure, name)
        for name in perdure.__all__
        if name.endswith(("Error", "Lost", "NotFound", "Timeout", "Failed", "Exceeded"))
    ]
    assert len(errors) == 14  # StoreUnavailable ends in none of the suffixes
    assert all(issubclass(cls, perdure.PerdureError) for cls in errors)


def test_testing_module_exports() -> None:
    """perdure.testing exports the driven clock, the test worker and the crash signal."""
    assert sorted(perdure.testing.__all__) == ["SimulatedCrash", "TestClock", "TestWorker"]
    assert all(hasattr(perdure.testing, name) for name in perdure.testing.__all__)


def test_version_is_a_string() -> None:
    """perdure.__version__ is a dotted version string."""
    assert isinstance(perdure.__version__, str)
    assert perdure.__version__.count(".") >= 1


def test_run_status_names_every_status() -> None:
    """`RunStatus` is the literal of exactly the statuses a run can have."""
    from perdure.store.base import ALL_STATUSES

    assert sorted(typing.get_args(perdure.RunStatus)) == sorted(ALL_STATUSES)


def test_what_the_api_returns_or_raises_is_exported() -> None:
    """`App.journal` returns `Entry`s, `App.queue` a `QueueSpec`; the store being down
    raises `StoreUnavailable`, a `StoreError`; `app.client` is the public async `Client`."""
    app = perdure.App("sqlite:///:memory:")
    try:
        assert isinstance(app.queue("q", concurrency=1), perdure.QueueSpec)
        assert isinstance(app.client, perdure.Client)
        assert issubclass(perdure.StoreUnavailable, perdure.StoreError)
        hints = typing.get_type_hints(perdure.App.journal)
        assert hints["return"] == list[perdure.Entry]
    finally:
        app.close()


APP_NAMES = [
    # registration and the store
    "workflow", "step", "queue", "open", "close", "url", "clock",
    # its parts: the engine it runs on, and the async API
    "runtime", "client",
    # triggers
    "schedule", "inbox", "webhook", "on_event", "on_table_change", "on_message", "plan",
    "emit", "pause_schedule", "resume_schedule", "delete_schedule", "schedules",
    "schedule_ticks", "triggers", "install_triggers",
    # runs
    "start", "start_async", "handle", "get_run", "list_runs", "statuses", "journal",
    "send_event", "cancel", "pause", "resume", "pause_workflow", "resume_workflow",
    "pause_worker", "resume_worker", "pauses", "resolve", "gc", "fork",
    # workers
    "worker", "run_worker",
]  # fmt: skip


def test_an_app_shows_its_user_surface_only() -> None:
    """An App's public names are the listed user-facing ones, at most 45 (a new one is a
    deliberate choice); the engine's plumbing is on `app.runtime`, which a `Client` built
    from the App uses."""
    app = perdure.App()
    try:
        public = [name for name in dir(app) if not name.startswith("_")]
        assert len(public) <= 45
        assert sorted(public) == sorted(APP_NAMES)
        assert not hasattr(app, "store") and not hasattr(app, "claimed")
        assert isinstance(app.runtime, Runtime) and app.client.runtime is app.runtime
        assert perdure.Client(app).runtime is app.runtime
    finally:
        app.close()
