"""Every error perdure raises, rooted at `PerdureError`.

    PerdureError
    ├── ConfigError             bad URL, bad option
    │   └── MissingExtra        a feature whose optional extra is not installed
    ├── StoreError
    │   ├── SchemaVersionError  store written by a newer perdure
    │   ├── StoreUnavailable    the database cannot be reached (outcome unknown)
    │   └── LeaseLost           an append from a worker whose lease moved on
    ├── RunNotFound
    ├── PayloadError            a value that is not JSON
    ├── NonDeterminismError     replay found another step than the journal holds
    ├── StepError               a step failed after its last attempt
    │   └── StepTimeout         an attempt took longer than its timeout
    ├── ParkRun                 a step that needs an operator's fix first (run paused)
    ├── RunFailed               waited-for run ended failed, cancelled or dead
    ├── DeadlineExceeded        the run passed its deadline
    ├── WaitTimeout             handle.result(timeout) gave up waiting
    ├── SyncInAsyncError        the sync facade was called inside an event loop
    └── InboxFileChanged        an inbox run's file is not the content it was started for

`RunSuspended` and `WorkerStopping` derive from BaseException on purpose: they
unwind user workflow code and must not be swallowed by a bare `except Exception`.
"""

from __future__ import annotations


class PerdureError(Exception):
    """Root of every error perdure raises."""


class ConfigError(PerdureError):
    """Raised when an option, URL or environment setting is invalid."""


class MissingExtra(ConfigError):
    """Raised when a feature needs an optional extra that is not installed (one line: which)."""

    def __init__(self, what: str, extra: str, missing: str | None = None) -> None:
        because = f" ({missing} is missing)" if missing else ""
        super().__init__(f"{what} needs the {extra} extra{because}: pip install 'perdure[{extra}]'")
        self.what = what
        self.extra = extra
        self.missing = missing


class StoreError(PerdureError):
    """Raised when the store cannot do what was asked."""


class SchemaVersionError(StoreError):
    """Raised when a store was written by a newer perdure than this one."""


class StoreUnavailable(StoreError):
    """Raised when the database cannot be reached; the operation may or may not have landed."""


class LeaseLost(StoreError):
    """Raised when a worker writes for a run whose lease another worker took."""

    def __init__(self, run_id: str, epoch: int) -> None:
        super().__init__(f"run {run_id!r}: lease epoch {epoch} was taken over; write refused")
        self.run_id = run_id
        self.epoch = epoch


class RunNotFound(PerdureError):
    """Raised when a run id names no run in the store."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"no run with id {run_id!r} (list runs with `perdure ls`)")
        self.run_id = run_id


class PayloadError(PerdureError):
    """Raised when a value cannot be stored as JSON; names where it came from and the path."""


class NonDeterminismError(PerdureError):
    """Raised when replay reaches a position whose journal holds another step."""

    def __init__(self, run_id: str, position: int, expected: str, found: str) -> None:
        super().__init__(
            f"run {run_id!r} diverged from its journal at position {position}: "
            f"journal has {expected!r}, code called {found!r} "
            "(guard new code with perdure.patched(...), or fork the run)"
        )
        self.run_id = run_id
        self.position = position
        self.expected = expected
        self.found = found


class StepError(PerdureError):
    """Raised into a workflow when a step failed after its last attempt (same on replay)."""

    def __init__(self, step: str, error_type: str, message: str, attempts: int = 1) -> None:
        super().__init__(
            f"step {step!r} failed after {attempts} attempt(s): {error_type}: {message}"
        )
        self.step = step
        self.error_type = error_type
        self.message = message
        self.attempts = attempts


class StepTimeout(StepError):
    """Raised when a step attempt exceeded the step's timeout."""


class ParkRun(PerdureError):
    """Raised by a step that cannot succeed until an operator fixes something outside the
    run (an expired key): the run is paused with this message as its reason, holding no
    slot, and `perdure resume` runs the step again (the attempt is journaled, not final)."""


class RunFailed(PerdureError):
    """Raised by `result()` when the run ended failed, cancelled or dead."""

    def __init__(self, run_id: str, status: str, error: str | None) -> None:
        super().__init__(f"run {run_id!r} ended {status}: {error or 'no error recorded'}")
        self.run_id = run_id
        self.status = status
        self.error = error


class DeadlineExceeded(PerdureError):
    """Raised when a run passes its deadline."""


class WaitTimeout(PerdureError):
    """Raised when `result(timeout=...)` gave up before the run finished."""


class SyncInAsyncError(PerdureError):
    """Raised when a blocking sync call is made inside a running event loop."""


class InboxFileChanged(PerdureError):
    """Raised when `open_inbox_file` finds the run's file swapped for a link, replaced or
    edited since its run was started (its sha256 differs): the run never sees that content."""


class RunSuspended(BaseException):
    """Unwinds a workflow that must wait (sleep, event, child, pause, cancel)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class WorkerStopping(BaseException):
    """Unwinds a workflow whose worker stops or lost its lease; nothing more is written."""
