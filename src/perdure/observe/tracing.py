"""OpenTelemetry spans per run execution and per step attempt, off unless OTEL_* asks for them.

A run's trace id is the first 16 bytes of sha256(run id): every worker that
executes the run, before and after a crash, puts its spans in the same trace.
Each execution (one lease epoch) is a root span `run WORKFLOW`; each step
attempt is its child `step NAME`, made current while the step body runs so
spans of instrumented libraries called by the step nest under it. Retries,
recoveries and lost leases are events on the run span.

Spans are exported when `OTEL_EXPORTER_OTLP_ENDPOINT` (or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, or `OTEL_TRACES_EXPORTER=otlp|console`) is
set; the OTLP exporter reads the other standard variables (headers, timeout)
itself, and `OTEL_SERVICE_NAME` names the service (default `perdure`).
"""

from __future__ import annotations

import contextvars
import hashlib
import os
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..engine import observers
from ..engine.observers import RunEvent, StepEvent
from ..errors import ConfigError, MissingExtra

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span

_trace_for: contextvars.ContextVar[int] = contextvars.ContextVar("perdure_trace_for", default=0)


def trace_id_of(run_id: str) -> int:
    """The run's trace id: the same on every worker and across every recovery."""
    value = int.from_bytes(hashlib.sha256(run_id.encode()).digest()[:16], "big")
    return value or 1  # 0 is the invalid trace id


def trace_id_hex(run_id: str) -> str:
    """`trace_id_of` as the 32 hex digits logs and trace viewers show."""
    return f"{trace_id_of(run_id):032x}"


def wanted(env: Mapping[str, str] | None = None) -> bool:
    """Whether the standard OTEL_* variables ask for traces to be exported."""
    env = os.environ if env is None else env
    exporters = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters == "none":
        return False
    return bool(
        exporters
        or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def _provider(exporter: SpanExporter | None, env: Mapping[str, str]) -> TracerProvider:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SimpleSpanProcessor,
    )
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class RunIdGenerator(RandomIdGenerator):
        """Random ids, except a run span's trace id, which comes from its run id."""

        def generate_trace_id(self) -> int:
            return _trace_for.get() or super().generate_trace_id()

    attributes = {} if env.get("OTEL_SERVICE_NAME") else {"service.name": "perdure"}
    provider = TracerProvider(resource=Resource.create(attributes), id_generator=RunIdGenerator())
    if exporter is not None:  # given (tests): export each span as it ends
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        return provider
    names = env.get("OTEL_TRACES_EXPORTER", "").strip().lower() or "otlp"
    for name in (n.strip() for n in names.split(",") if n.strip()):
        if name == "otlp":
            protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get(
                "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
            )
            if protocol != "http/protobuf":
                raise ConfigError(
                    f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: perdure exports traces over "
                    "http/protobuf; unset it or set it to http/protobuf"
                )
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        elif name == "console":
            provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
        else:
            raise ConfigError(
                f"OTEL_TRACES_EXPORTER={names!r}: perdure knows otlp, console and none"
            )
    return provider


def configure_tracing(
    exporter: SpanExporter | None = None, *, env: Mapping[str, str] | None = None
) -> Tracing | None:
    """Export spans of runs and steps if OTEL_* asks for it (or to `exporter`, for tests).

    Returns the installed observer (uninstall it with `perdure.engine.observers.uninstall`),
    or None when tracing is off.

    Raises:
        ConfigError: tracing is asked for but the `observe` extra is missing, or the
            OTEL_* variables name an exporter perdure does not have.
    """
    env = os.environ if env is None else env
    if exporter is None and not wanted(env):
        return None
    try:
        provider = _provider(exporter, env)
    except ImportError as exc:
        raise MissingExtra("tracing (asked for by OTEL_*)", "observe", exc.name) from None
    if exporter is None:
        from opentelemetry import trace

        trace.set_tracer_provider(provider)  # other instrumented libraries export here too
    tracing = Tracing(provider)
    observers.install(tracing)
    return tracing


class Tracing(observers.Observer):
    """Turns engine hooks into spans; one open span per run execution and per step attempt."""

    def __init__(self, provider: TracerProvider) -> None:
        from opentelemetry import context as otel_context
        from opentelemetry import trace

        self.provider = provider
        self.tracer = provider.get_tracer("perdure")
        self._trace = trace
        self._context = otel_context
        self._lock = threading.Lock()
        self._runs: dict[tuple[str, str, int], Span] = {}
        self._steps: dict[tuple[str, str, int, int, int], tuple[Span, object | None]] = {}

    def shutdown(self) -> None:
        """Export what is pending and stop (also done at interpreter exit)."""
        observers.uninstall(self)
        self.provider.shutdown()

    @staticmethod
    def _run_key(event: RunEvent | StepEvent) -> tuple[str, str, int]:
        return (event.run_id, event.worker, event.epoch)

    def _run_span(self, event: RunEvent | StepEvent) -> Span | None:
        with self._lock:
            return self._runs.get(self._run_key(event))

    def run_started(self, event: RunEvent) -> None:
        attributes: dict[str, Any] = {
            "perdure.run_id": event.run_id,
            "perdure.workflow": event.workflow,
            "perdure.worker": event.worker,
            "perdure.epoch": event.epoch,
            "perdure.queue": event.queue,
        }
        if event.recovered_from:
            attributes["perdure.recovered_from"] = event.recovered_from
        token = _trace_for.set(trace_id_of(event.run_id))
        try:  # an empty context: a run span is a root whatever is current here
            span = self.tracer.start_span(
                f"run {event.workflow}", context=self._context.Context(), attributes=attributes
            )
        finally:
            _trace_for.reset(token)
        with self._lock:
            self._runs[self._run_key(event)] = span

    def run_finished(self, event: RunEvent) -> None:
        key = self._run_key(event)
        with self._lock:
            span = self._runs.pop(key, None)
            cut = [k for k in self._steps if k[:3] == key]  # attempts a crash left open
            open_steps = [self._steps.pop(k)[0] for k in cut]
        for step in open_steps:
            step.set_attribute("perdure.outcome", "interrupted")
            step.end()
        if span is None:
            return
        span.set_attribute("perdure.outcome", event.outcome)
        if event.outcome == "failed":
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, "run failed"))
        span.end()

    def step_started(self, event: StepEvent) -> None:
        parent = self._run_span(event)
        if parent is not None:
            context = self._trace.set_span_in_context(parent, self._context.Context())
        else:
            context = self._context.Context()
        token = _trace_for.set(trace_id_of(event.run_id))
        try:
            span = self.tracer.start_span(
                f"step {event.name}",
                context=context,
                attributes={
                    "perdure.run_id": event.run_id,
                    "perdure.step": event.name,
                    "perdure.position": event.position,
                    "perdure.attempt": event.attempt,
                    "perdure.effect": event.effect,
                },
            )
        finally:
            _trace_for.reset(token)
        attached = None
        if event.effect != "transactional":  # its body runs on the store's thread
            attached = self._context.attach(self._trace.set_span_in_context(span))
        with self._lock:
            key = (*self._run_key(event), event.position, event.attempt)
            self._steps[key] = (span, attached)

    def step_finished(self, event: StepEvent) -> None:
        with self._lock:
            key = (*self._run_key(event), event.position, event.attempt)
            found = self._steps.pop(key, None)
        if found is None:
            return
        span, attached = found
        if attached is not None:
            self._context.detach(attached)  # type: ignore[arg-type]
        span.set_attribute("perdure.outcome", event.outcome)
        if event.error is not None:
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, event.error))
        span.end()

    def _event(self, event: RunEvent | StepEvent, name: str, attributes: dict[str, Any]) -> None:
        span = self._run_span(event)
        if span is not None:
            span.add_event(name, attributes)

    def step_retry(self, event: StepEvent) -> None:
        self._event(event, "retry scheduled", {
            "perdure.step": event.name, "perdure.attempt": event.attempt,
            "perdure.delay": event.delay, "perdure.error": event.error or "",
        })  # fmt: skip

    def step_recovered(self, event: StepEvent) -> None:
        self._event(event, "step recovered", {
            "perdure.step": event.name, "perdure.position": event.position,
            "perdure.action": event.action,
        })  # fmt: skip

    def lease_lost(self, run_id: str, worker: str, how: str) -> None:
        with self._lock:
            spans = [s for k, s in self._runs.items() if k[0] == run_id and k[1] == worker]
        for span in spans:
            span.add_event("lease lost", {"perdure.how": how})
