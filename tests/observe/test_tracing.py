"""OpenTelemetry spans: one trace per run, the same across a crash and a takeover by another
worker; step spans are children of their execution's run span; off unless configured."""

from __future__ import annotations

import pytest

from extras_needed import needs

pytest.importorskip("opentelemetry.sdk.trace", reason=needs("observe"))

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import perdure
from perdure.engine import observers
from perdure.errors import ConfigError
from perdure.observe.tracing import configure_tracing, trace_id_hex, trace_id_of, wanted
from perdure.testing import SimulatedCrash, TestClock, TestWorker

LEASE = 30.0


def attr(span: ReadableSpan, name: str) -> object:
    assert span.attributes is not None
    return span.attributes.get(name)


def test_a_recovered_run_keeps_its_trace_id_across_workers(
    app: perdure.App, clock: TestClock
) -> None:
    """Worker A dies mid-step, worker B takes the run over: both executions' spans are in the
    trace derived from the run id, each step span under its own execution's run span."""
    exporter = InMemorySpanExporter()
    tracing = configure_tracing(exporter)
    assert tracing is not None
    seen_inside: list[int] = []

    @app.step(name="fetch", effect="read")
    def fetch() -> int:
        return 1

    @app.step(name="charge", effect="keyed")
    def charge(n: int) -> str:
        seen_inside.append(trace.get_current_span().get_span_context().trace_id)
        return f"charged {n}"

    @app.workflow(name="pay")
    def pay() -> str:
        return charge(fetch())

    handle = app.start(pay, run_id="pay-42")
    a = TestWorker(app, lease=LEASE)
    a.crash_after_intent("charge")
    with pytest.raises(SimulatedCrash):
        a.run_until_idle()
    clock.advance(LEASE + 1)
    b = TestWorker(app, lease=LEASE)
    b.run_until_idle()
    assert handle.result(timeout=5) == "charged 1"
    assert a.worker is not None and b.worker is not None

    spans = exporter.get_finished_spans()
    runs = [s for s in spans if s.name == "run pay"]
    steps = [s for s in spans if s.name.startswith("step ")]
    assert [attr(s, "perdure.worker") for s in runs] == [a.worker.id, b.worker.id]
    assert attr(runs[1], "perdure.recovered_from") == a.worker.id
    assert [attr(s, "perdure.outcome") for s in runs] == ["stopped", "completed"]
    assert [(s.name, attr(s, "perdure.attempt")) for s in steps] == [
        ("step fetch", 1),  # run by A; B replays it without executing
        ("step charge", 1),  # same attempt again: the keyed step is re-run by B
    ]
    expected = trace_id_of("pay-42")
    assert {s.context.trace_id for s in spans if s.context is not None} == {expected}
    assert f"{expected:032x}" == trace_id_hex("pay-42")  # the trace id logs carry
    assert all(s.parent is None for s in runs)  # each execution is a root of the trace
    for step, run in zip(steps, runs, strict=True):
        assert step.parent is not None and run.context is not None
        assert step.parent.span_id == run.context.span_id
    assert seen_inside == [expected]  # the step body ran inside its span
    recovered = [e for e in runs[1].events if e.name == "step recovered"]
    assert len(recovered) == 1 and recovered[0].attributes is not None
    assert recovered[0].attributes["perdure.action"] == "rerun"
    assert trace.get_current_span().get_span_context().trace_id == 0  # nothing left attached


def test_a_failed_attempt_and_a_retry_are_visible(app: perdure.App, worker: TestWorker) -> None:
    """A failing attempt's span is an error, the retry an event on the run span."""
    exporter = InMemorySpanExporter()
    configure_tracing(exporter)
    calls: list[int] = []

    @app.step(name="flaky", effect="idempotent", retry=perdure.Retry(initial=0, jitter=0))
    def flaky() -> int:
        calls.append(1)
        if len(calls) == 1:
            raise TimeoutError("slow")
        return len(calls)

    @app.workflow(name="wf")
    def wf() -> int:
        return flaky()

    app.start(wf)
    worker.run_until_idle()
    spans = exporter.get_finished_spans()
    attempts = [s for s in spans if s.name == "step flaky"]
    assert [s.status.status_code for s in attempts] == [
        trace.StatusCode.ERROR,
        trace.StatusCode.UNSET,
    ]
    assert attempts[0].status.description == "TimeoutError"
    [run] = [s for s in spans if s.name == "run wf"]
    assert [e.name for e in run.events] == ["retry scheduled"]


def test_tracing_is_off_unless_the_environment_asks() -> None:
    """No OTEL_* variable: no tracer is installed; the standard variables turn it on, `none`
    off; an exporter perdure lacks is a clear error."""
    assert not wanted({})
    assert wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert wanted({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"})
    assert wanted({"OTEL_TRACES_EXPORTER": "console"})
    assert not wanted({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "x"})
    before = observers.installed()
    assert configure_tracing(env={}) is None
    assert observers.installed() == before
    with pytest.raises(ConfigError, match="OTEL_TRACES_EXPORTER='zipkin'"):
        configure_tracing(env={"OTEL_TRACES_EXPORTER": "zipkin"})
    with pytest.raises(ConfigError, match="http/protobuf"):
        configure_tracing(
            env={"OTEL_EXPORTER_OTLP_ENDPOINT": "x", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
        )
    assert observers.installed() == before
    assert trace_id_of("a") != trace_id_of("b")
    assert trace_id_hex("a") == "ca978112ca1bbdcafac231b39a23dc4d"  # sha256("a")[:16]
