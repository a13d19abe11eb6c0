"""Prometheus metrics: runs by state (read from the store when scraped) and what workers do.

    perdure_runs{status}                         runs in each state, from the store
    perdure_runs_waiting_for_person{cause}       runs a person must move: a once step in doubt
                                                 (interrupted, stopped, probe), dead, parked
    perdure_runs_executing                       runs this process executes now
    perdure_run_executions_total{outcome}        executions ended: completed, failed, suspended...
    perdure_step_seconds{step,effect,outcome}    step attempts (histogram; replays not counted)
    perdure_step_retries_total{step}             failed attempts that will be retried
    perdure_recoveries_total{effect,action}      steps found cut between intent and outcome
    perdure_lease_takeovers_total                runs claimed from a worker whose lease expired
    perdure_leases_lost_total                    leases this process learnt it had lost
    perdure_schedule_ticks_total{status}         ticks fired, missed, skipped or queued
    perdure_model_tokens_total{agent,direction}  model tokens spent, input and output
    perdure_model_cost_total{agent}              model cost (in the spec's price unit)

Labels stay few: step names come from code, never from run ids. A `perdure
serve` process reports `perdure_runs` (every worker's runs); a worker's own
counters are scraped from its `--metrics-port`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
from collections.abc import Callable, Iterator
from http import HTTPStatus
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from ..engine import observers
from ..engine.observers import RunEvent, StepEvent
from ..engine.reasons import PERSON, cause_of
from ..errors import ConfigError, PerdureError
from ..extras import require_extra
from ..store.base import ALL_STATUSES

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import Metric
    from starlette.responses import Response

    from ..engine.runtime import Runtime

log = logging.getLogger("perdure.metrics")

CAUSES = ("interrupted", "stopped", "probe", "version", "dead", "parked")  # reasons.cause_of
# seconds: from a cached read to a slow model call or a long tool run
STEP_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 1800.0)


class RunsCollector:
    """`perdure_runs{status}`, counted by the store at each scrape (from a thread of its own)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def describe(self) -> list[Metric]:
        return []  # no read of the store when registered

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        try:
            counts = self.runtime.sync(self.runtime.store.count_runs(), "perdure_runs")
        except PerdureError as exc:  # the store is away: say so, without runs figures
            log.warning("metrics: cannot count runs (%s)", exc)
            up = 0.0
        else:
            up = 1.0
            runs = GaugeMetricFamily("perdure_runs", "Runs in each state.", labels=["status"])
            for status in (*ALL_STATUSES, *sorted(set(counts) - set(ALL_STATUSES))):
                runs.add_metric([status], float(counts.get(status, 0)))
            yield runs
            if any(counts.get(status) for status in PERSON):
                yield self._waiting()
            else:
                yield _waiting_family({})
        yield GaugeMetricFamily("perdure_store_up", "1 if the store answered.", value=up)

    def _waiting(self) -> Metric:
        """The runs that wait for a person, by cause (read only when there are some)."""
        try:
            rows = self.runtime.sync(
                self.runtime.store.list_runs(statuses=PERSON, limit=100_000),
                "perdure_runs_waiting_for_person",
            )
        except PerdureError as exc:
            log.warning("metrics: cannot list runs waiting for a person (%s)", exc)
            rows = []
        causes: dict[str, int] = {}
        for row in rows:
            cause = cause_of(row)
            if cause is not None:
                causes[cause] = causes.get(cause, 0) + 1
        return _waiting_family(causes)


def _waiting_family(causes: dict[str, int]) -> Metric:
    from prometheus_client.core import GaugeMetricFamily

    family = GaugeMetricFamily(
        "perdure_runs_waiting_for_person",
        "Runs only a person can move, by cause: interrupted, stopped or probe (a once step "
        "in doubt), version (waiting for a worker of their code version), dead, parked (by a "
        "step).",
        labels=["cause"],
    )
    for cause in CAUSES:
        family.add_metric([cause], float(causes.get(cause, 0)))
    return family


class Metrics(observers.Observer):
    """The metric families on one registry, fed by the engine's hooks once installed."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.executing = Gauge("perdure_runs_executing", "Runs this process executes.", registry=r)
        self.executions = Counter(
            "perdure_run_executions", "Run executions ended, by outcome.", ["outcome"],
            registry=r,
        )  # fmt: skip
        self.step_seconds = Histogram(
            "perdure_step_seconds", "Step attempts and their duration.",
            ["step", "effect", "outcome"], buckets=STEP_BUCKETS, registry=r,
        )  # fmt: skip
        self.retries = Counter(
            "perdure_step_retries", "Failed step attempts that will be retried.", ["step"],
            registry=r,
        )  # fmt: skip
        self.recoveries = Counter(
            "perdure_recoveries", "Steps found cut between intent and outcome, and what "
            "recovery did (rerun or needs_attention).", ["effect", "action"], registry=r,
        )  # fmt: skip
        self.takeovers = Counter(
            "perdure_lease_takeovers", "Runs claimed from a worker whose lease expired.",
            registry=r,
        )  # fmt: skip
        self.leases_lost = Counter(
            "perdure_leases_lost", "Leases this process learnt were taken over.", registry=r
        )
        self.ticks = Counter(
            "perdure_schedule_ticks", "Schedule ticks by what became of them.", ["status"],
            registry=r,
        )  # fmt: skip
        self.tokens = Counter(
            "perdure_model_tokens", "Model tokens spent.", ["agent", "direction"], registry=r
        )
        self.cost = Counter("perdure_model_cost", "Model cost spent.", ["agent"], registry=r)
        self._watched: set[int] = set()
        self._lock = threading.Lock()

    def watch(self, runtime: Runtime) -> None:
        """Report `perdure_runs` of `app`'s store (once per app)."""
        with self._lock:
            if id(runtime) in self._watched:
                return
            self._watched.add(id(runtime))
        self.registry.register(RunsCollector(runtime))

    def exposition(self) -> bytes:
        """The text format Prometheus scrapes (reads the store: call it off the event loop)."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry)

    # -- hooks ---------------------------------------------------------------------------

    def run_started(self, event: RunEvent) -> None:
        self.executing.inc()

    def run_finished(self, event: RunEvent) -> None:
        self.executing.dec()
        self.executions.labels(event.outcome).inc()

    def run_recovered(self, run_id: str, worker: str, previous: str) -> None:
        self.takeovers.inc()

    def step_finished(self, event: StepEvent) -> None:
        self.step_seconds.labels(event.name, event.effect, event.outcome).observe(event.seconds)

    def step_retry(self, event: StepEvent) -> None:
        self.retries.labels(event.name).inc()

    def step_recovered(self, event: StepEvent) -> None:
        self.recoveries.labels(event.effect, event.action).inc()

    def lease_lost(self, run_id: str, worker: str, how: str) -> None:
        self.leases_lost.inc()

    def schedule_tick(self, schedule: str, status: str) -> None:
        self.ticks.labels(status).inc()

    def model_usage(
        self, agent: str, model: str, input_tokens: int, output_tokens: int, cost: float
    ) -> None:
        self.tokens.labels(agent, "input").inc(input_tokens)
        self.tokens.labels(agent, "output").inc(output_tokens)
        self.cost.labels(agent).inc(cost)


# (authorization header, client address) -> None, or (status, one-line error, headers)
Guard = Callable[[str | None, str], "tuple[int, str, dict[str, str]] | None"]
_default: Metrics | None = None
_default_lock = threading.Lock()


def install_metrics(runtime: Runtime | None = None) -> Metrics:
    """The process's metrics, created and hooked into the engine on first use.

    Raises:
        ConfigError: prometheus-client (the `observe` extra) is not installed.
    """
    global _default
    with _default_lock:
        if _default is None:
            require_extra("observe", "/metrics", "prometheus_client")
            _default = Metrics()
            observers.install(_default)
    if runtime is not None:
        _default.watch(runtime)
    return _default


def serve_metrics(
    runtime: Runtime, port: int, host: str | None = None, guard: Guard | None = None
) -> Any:
    """Serve this process's metrics at http://host:port/metrics from a thread of its own;
    returns the server (`.shutdown()` stops it).

    `host` defaults to `PERDURE_METRICS_HOST`, else 127.0.0.1 (0.0.0.0: every interface).
    `guard(authorization header, client address)` may refuse a request: (status, one-line
    error, headers), answered as JSON; None lets it through.
    """
    metrics = install_metrics(runtime)
    from prometheus_client import make_wsgi_app

    served = _guarded(make_wsgi_app(metrics.registry), guard)
    host = host or os.environ.get("PERDURE_METRICS_HOST", "127.0.0.1")
    try:
        server = make_server(host, port, served, _ThreadingServer, handler_class=_QuietHandler)
    except OSError as exc:
        raise ConfigError(f"metrics on {host}:{port}: cannot listen ({exc.strerror})") from None
    threading.Thread(target=server.serve_forever, name="perdure-metrics", daemon=True).start()
    return server


SCRAPE_TIMEOUT = 10.0  # seconds a metrics connection may take to send its request
MAX_SCRAPES = 32  # metrics connections served at once; more are closed at once


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    """A thread per connection, at most MAX_SCRAPES at once: half-open connections cannot
    pile up threads (each also times out after SCRAPE_TIMEOUT seconds of silence)."""

    daemon_threads = True  # a slow scraper never holds the process up at exit

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.slots = threading.BoundedSemaphore(MAX_SCRAPES)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A scraper that timed out or went away: nothing worth a traceback in the log."""

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


class _QuietHandler(WSGIRequestHandler):
    timeout = SCRAPE_TIMEOUT  # socket timeout: a client that sends nothing is dropped

    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not logged: one line per scrape would drown the worker's own."""


def _guarded(served: Any, guard: Guard | None) -> Any:
    """`served` (a WSGI app) at /metrics only (404 elsewhere), behind `guard` if given."""

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("PATH_INFO") != "/metrics":
            refused: tuple[int, str, dict[str, str]] | None = (404, "only /metrics is here", {})
        elif guard is not None:
            refused = guard(environ.get("HTTP_AUTHORIZATION"), environ.get("REMOTE_ADDR", "-"))
        else:
            refused = None
        if refused is None:
            return served(environ, start_response)
        status, message, headers = refused
        body = (json.dumps({"error": message}) + "\n").encode()
        start_response(
            f"{status} {HTTPStatus(status).phrase}",
            [("Content-Type", "application/json"), ("Content-Length", str(len(body))),
             *headers.items()],
        )  # fmt: skip
        return [body]

    return app


async def metrics_endpoint(runtime: Runtime) -> Response:
    """GET /metrics of `runtime`'s store: the Prometheus text format (503 with a hint
    without the extra)."""
    from starlette.responses import PlainTextResponse, Response

    try:
        metrics = install_metrics(runtime)
    except ConfigError as exc:
        return PlainTextResponse(str(exc) + "\n", status_code=503)
    from prometheus_client import CONTENT_TYPE_LATEST

    body = await asyncio.to_thread(metrics.exposition)  # the runs collector reads the store
    return Response(body, media_type=CONTENT_TYPE_LATEST)
