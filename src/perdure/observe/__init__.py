"""Observability: structured logs, Prometheus metrics, OpenTelemetry traces, `perdure top`.

The engine reports what it does through `perdure.engine.observers`; the modules here
turn that into logs (`logs`), metrics (`metrics`) and spans (`tracing`). Each
needs the `observe` extra (`pip install 'perdure[observe]'`) only when used.
`perdure worker` and `perdure serve` call `instrument`; an embedded worker
(`app.run_worker()`) can call it too.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..errors import ConfigError
from .alerts import alert_on_park
from .logs import configure_logging
from .tracing import configure_tracing, trace_id_hex

if TYPE_CHECKING:
    from ..engine.runtime import Runtime

__all__ = ["alert_on_park", "configure_logging", "configure_tracing", "instrument", "trace_id_hex"]

log = logging.getLogger("perdure.observe")
_traced = False


def instrument(runtime: Runtime | None = None, *, json: bool | None = None) -> None:
    """Logs (`configure_logging`), metrics if prometheus-client is installed, and traces if
    the OTEL_* variables ask for them (a tracing setup that fails is logged, not fatal:
    durable work goes on without spans)."""
    global _traced
    configure_logging(json)
    try:
        from .metrics import install_metrics

        install_metrics(runtime)
    except ConfigError:
        pass  # metrics were not asked for; `--metrics-port` and /metrics say what is missing
    if not _traced:  # one tracer per process, however many times this is called
        _traced = True
        try:
            configure_tracing()
        except ConfigError as exc:
            log.error("tracing is off: %s", exc)
