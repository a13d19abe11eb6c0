"""Structured logs: structlog over stdlib logging, JSON lines or console, run context, redaction.

Every line logged while a run executes, by perdure, by a library or by the
workflow's own code (`logging` or structlog), carries the run it belongs to:
`run_id`, `workflow`, `worker`, `epoch`, `trace_id`, and inside a step `step`,
`position`, `attempt`. Secrets are masked in every line before it is written:
perdure tokens (`pdr_...`), `sk-...` keys, bearer credentials, the values of
environment variables named `*_KEY`, `*_TOKEN`, `*_SECRET` or `*_PASSWORD`, and
what `PERDURE_REDACT` (a regular expression) matches.

`PERDURE_LOG_FORMAT=json|console` chooses the format (default: console on a
terminal, JSON lines otherwise); `PERDURE_LOG_LEVEL` the level (default INFO).
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Iterable, Mapping, MutableMapping
from typing import IO, Any

from ..engine import observers
from ..engine.observers import RunEvent, StepEvent
from ..errors import ConfigError, MissingExtra
from ..nesting import MAX_DEPTH
from .tracing import trace_id_hex

MASK = "***"
TOO_DEEP = "[nested too deeply to show]"  # in place of lists/objects past nesting.MAX_DEPTH
SECRET_NAME = re.compile(r"_(KEY|TOKEN|SECRET|PASSWORD)$", re.IGNORECASE)
MIN_SECRET = 8  # shorter values ("1", "true") would mask ordinary words
TOKEN_SHAPED = [  # perdure's API tokens and `sk-` provider keys, wherever they appear
    (re.compile(r"\bpdr_[A-Za-z0-9_\-]{6,}"), "pdr_" + MASK),
    (re.compile(r"\bsk-[A-Za-z0-9_\-]{6,}"), "sk-" + MASK),
]
# a credential in a URL's query (`?token=...`, as a request line in an access log shows it)
SECRET_QUERY = re.compile(
    r"(?i)([?&](?:token|access_token|api_key|apikey|key|secret|password|client_secret)=)"
    r"[^&#\s\"']+"
)
_BUILTIN = [
    (re.compile(r"(?i)\b(bearer\s+)[^\s\"',;]+"), r"\1" + MASK),
    (SECRET_QUERY, r"\1" + MASK),
    *TOKEN_SHAPED,
]


class Redactor:
    """A log processor masking secrets in every string of a line (tracebacks included).

    Args:
        patterns: regular expressions to mask besides the built-in ones.
        env: where secret-named variables are read (default `os.environ`), read once here.
    """

    def __init__(self, patterns: Iterable[str] = (), env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        found = {v for k, v in env.items() if SECRET_NAME.search(k) and len(v) >= MIN_SECRET}
        self.values = sorted(found, key=len, reverse=True)  # a longer secret is masked whole
        extra = list(patterns) + list(filter(None, [env.get("PERDURE_REDACT")]))
        self.patterns = [re.compile(p) for p in extra]

    def text(self, text: str) -> str:
        for value in self.values:
            if value in text:
                text = text.replace(value, MASK)
        for pattern, replacement in _BUILTIN:
            text = pattern.sub(replacement, text)
        for pattern in self.patterns:
            text = pattern.sub(MASK, text)
        return text

    def value(self, value: Any, depth: int = 0) -> Any:
        """`value` with its strings masked; lists and objects nested past `MAX_DEPTH` are
        shown as `TOO_DEEP` (a value stored before the limit must not break a view)."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict | list | tuple) and depth >= MAX_DEPTH:
            return TOO_DEEP
        if isinstance(value, dict):
            return {k: self.value(v, depth + 1) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.value(v, depth + 1) for v in value]
        return value

    def __call__(self, logger: Any, method: str, event: MutableMapping[str, Any]) -> Any:
        for key, value in event.items():
            if not key.startswith("_"):  # structlog's own (the stdlib record) stay as they are
                event[key] = self.value(value)
        return event


class PlainFormatter(logging.Formatter):
    """The format without structlog: `time logger message`, secrets masked all the same."""

    def __init__(self, redactor: Redactor) -> None:
        super().__init__("%(asctime)s %(name)s %(message)s")
        self.redactor = redactor

    def format(self, record: logging.LogRecord) -> str:
        return self.redactor.text(super().format(record))


def add_run_context(logger: Any, method: str, event: MutableMapping[str, Any]) -> Any:
    """Add the executing run's (and step's) fields and the run's trace id to a line."""
    for key, value in observers.log_fields().items():
        event.setdefault(key, value)
    run_id = event.get("run_id")
    if isinstance(run_id, str) and "trace_id" not in event:
        event["trace_id"] = trace_id_hex(run_id)
    return event


_HANDLER_MARK = "_perdure_handler"


def configure_logging(
    json: bool | None = None,
    *,
    level: str | int | None = None,
    stream: IO[str] | None = None,
    redact: Iterable[str] = (),
) -> None:
    """Send this process's logs (perdure's, libraries', the workflows') through structlog.

    Args:
        json: JSON lines (True) or the console format (False); default
            `PERDURE_LOG_FORMAT`, else console on a terminal and JSON otherwise.
        level: default `PERDURE_LOG_LEVEL`, else INFO.
        stream: where lines go (default stderr).
        redact: regular expressions to mask besides the built-in ones.

    Without the `observe` extra, logs stay plain text (JSON asked for is a ConfigError).
    Calling it again replaces what the previous call installed.
    """
    stream = stream or sys.stderr
    asked = json
    if asked is None:
        wanted = os.environ.get("PERDURE_LOG_FORMAT", "").strip().lower()
        if wanted not in ("", "json", "console"):
            raise ConfigError(f"PERDURE_LOG_FORMAT={wanted!r}: use json or console")
        asked = {"json": True, "console": False}.get(wanted)
    json = not _isatty(stream) if asked is None else asked
    level = level or os.environ.get("PERDURE_LOG_LEVEL", "INFO").upper()
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]:
        root.removeHandler(old)
    handler = logging.StreamHandler(stream)
    setattr(handler, _HANDLER_MARK, True)
    try:
        import structlog
    except ImportError:
        if asked:
            raise MissingExtra("PERDURE_LOG_FORMAT=json", "observe", "structlog") from None
        handler.setFormatter(PlainFormatter(Redactor(redact)))
        root.addHandler(handler)
        root.setLevel(level)
        LOG_OBSERVER.structured = False
        observers.install(LOG_OBSERVER)
        return
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        add_run_context,
        structlog.stdlib.add_logger_name,
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
        structlog.processors.format_exc_info,  # as text, so that redaction reaches tracebacks
        Redactor(redact),
    ]
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if json
        else structlog.dev.ConsoleRenderer(
            colors=_isatty(stream), exception_formatter=structlog.dev.plain_traceback
        )
    )
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    root.addHandler(handler)
    root.setLevel(level)
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *shared,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
    LOG_OBSERVER.structured = True
    observers.install(LOG_OBSERVER)


def _isatty(stream: IO[str]) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class LogObserver(observers.Observer):
    """One line per run execution start and end, per retry, recovery and lost lease; step
    attempts at DEBUG (a failed one at INFO)."""

    def __init__(self) -> None:
        self.log = logging.getLogger("perdure.run")
        self.structured = True  # False: no structlog (the observe extra), fields as key=value

    def _line(self, level: int, message: str, **fields: Any) -> None:
        if not self.log.isEnabledFor(level):
            return
        if not self.structured:
            self.log.log(level, "%s %s", message, " ".join(f"{k}={v}" for k, v in fields.items()))
            return
        import structlog

        structlog.get_logger("perdure.run").log(level, message, **fields)

    @staticmethod
    def _run(event: RunEvent | StepEvent) -> dict[str, Any]:
        return {
            "run_id": event.run_id,
            "workflow": event.workflow,
            "worker": event.worker,
            "epoch": event.epoch,
        }

    @staticmethod
    def _step(event: StepEvent) -> dict[str, Any]:
        return {
            **LogObserver._run(event),
            "step": event.name,
            "position": event.position,
            "attempt": event.attempt,
            "effect": event.effect,
        }

    def run_started(self, event: RunEvent) -> None:
        if event.recovered_from:
            self._line(
                logging.INFO, "run recovered", recovered_from=event.recovered_from,
                **self._run(event),
            )  # fmt: skip
        else:
            self._line(logging.INFO, "run started", **self._run(event))

    def run_finished(self, event: RunEvent) -> None:
        level = logging.WARNING if event.outcome in ("failed", "lost") else logging.INFO
        more = {} if event.error is None else {"error": event.error}
        self._line(
            level, "run " + event.outcome, seconds=round(event.seconds, 6), **more,
            **self._run(event),
        )  # fmt: skip

    def step_started(self, event: StepEvent) -> None:
        self._line(logging.DEBUG, "step started", **self._step(event))

    def step_finished(self, event: StepEvent) -> None:
        level = logging.DEBUG if event.error is None else logging.INFO
        self._line(
            level, "step finished", outcome=event.outcome, seconds=round(event.seconds, 6),
            error=event.error, **self._step(event),
        )  # fmt: skip

    def step_retry(self, event: StepEvent) -> None:
        self._line(
            logging.WARNING, "step retry scheduled", delay=round(event.delay, 3),
            error=event.error, **self._step(event),
        )  # fmt: skip

    def step_recovered(self, event: StepEvent) -> None:
        self._line(
            logging.WARNING, "step interrupted mid-effect", action=event.action,
            **self._step(event),
        )  # fmt: skip

    def lease_lost(self, run_id: str, worker: str, how: str) -> None:
        self._line(logging.WARNING, "lease lost", run_id=run_id, worker=worker, how=how)


LOG_OBSERVER = LogObserver()
