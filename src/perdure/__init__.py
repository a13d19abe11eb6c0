"""perdure: durable workflows and persistent agents that survive crashes, restarts and days.

The public API, and nothing else.
"""

from __future__ import annotations

from .app import App
from .engine.aborts import abortable
from .engine.client import Client
from .engine.clock import Clock, SystemClock
from .engine.context import StepInfo
from .engine.durable import (
    RunInfo,
    continue_as_new,
    current_run,
    now,
    patched,
    random,
    sleep,
    steering,
    uuid,
    wait_event,
)
from .engine.effects import EFFECTS, Effect
from .engine.handles import ChildHandle, RunHandle, Workflow
from .engine.probes import ProbeAnswer
from .engine.retention import GcReport, Retention
from .engine.retry import Retry
from .engine.steering import Steer
from .engine.steps import Step, current_step
from .engine.streams import StreamChunk, stream
from .engine.worker import Worker, WorkerOptions
from .errors import (
    ConfigError,
    DeadlineExceeded,
    InboxFileChanged,
    LeaseLost,
    NonDeterminismError,
    PayloadError,
    PerdureError,
    RunFailed,
    RunNotFound,
    SchemaVersionError,
    StepError,
    StepTimeout,
    StoreError,
    StoreUnavailable,
    SyncInAsyncError,
    WaitTimeout,
)
from .store.base import Entry, QueueSpec, RunRow, RunStatus
from .triggers import sources
from .triggers.inbox_files import open_inbox_file
from .triggers.messages import MessageTrigger
from .triggers.schedule_sql import ScheduleRow, TickRow

__version__ = "0.1.0"

__all__ = [
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
    "stream",
    "StreamChunk",
    "StepInfo",
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
