"""Alerts: a person is told once, without polling, when a run starts waiting for them.

`alert_on_park(target)` installs an observer of `run_parked` (engine/observers.py): the
worker that parks a run (a once step in doubt, a dead run, a step that parked it) calls
`target` once with the event, or, for a URL, POSTs it as JSON:

    {"run_id", "workflow", "status", "cause", "reason", "fix", "step", "position"}

`perdure worker --alert-url URL` (or `PERDURE_ALERT_URL`) does this for a worker process.
A POST runs on a thread of its own and gives up after TIMEOUT seconds, retrying a few
times; a failed alert is logged, never fatal, and the run stays listed by `perdure stuck`
and counted by `perdure_runs_waiting_for_person` whatever the alert's fate.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict
from urllib.parse import urlsplit

from ..engine import observers
from ..engine.observers import ParkEvent
from ..errors import ConfigError

log = logging.getLogger("perdure.alerts")
TIMEOUT = 5.0  # seconds per POST
TRIES = 3  # POSTs before an alert is given up (1 s, then 2 s apart)
ENV = "PERDURE_ALERT_URL"


class ParkAlerts(observers.Observer):
    """Calls `target` with each run that starts waiting for a person."""

    def __init__(self, target: str | Callable[[ParkEvent], object]) -> None:
        if isinstance(target, str):
            parts = urlsplit(target)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ConfigError(f"alert URL {target!r}: give an http:// or https:// URL")
        self.target = target

    def run_parked(self, event: ParkEvent) -> None:
        target = self.target
        if isinstance(target, str):
            body = json.dumps(asdict(event)).encode()
            threading.Thread(
                target=_post, args=(target, body, event.run_id), name="perdure-alert", daemon=True
            ).start()
        else:
            target(event)


def _post(url: str, body: bytes, run_id: str) -> None:
    """POST one alert, a few times if the receiver is away; logged, never raised."""
    error: Exception | None = None
    for attempt in range(TRIES):
        if attempt:
            time.sleep(2.0 ** (attempt - 1))
        request = urllib.request.Request(
            url, data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:
                if answer.status < 300:
                    return
                error = RuntimeError(f"answered {answer.status}")
        except Exception as exc:  # the receiver is away, slow or refuses
            error = exc
    log.warning("alert for run %s not delivered to %s: %s", run_id, url, error)


def alert_on_park(target: str | Callable[[ParkEvent], object]) -> ParkAlerts:
    """Tell `target` (a URL to POST JSON to, or a callable taking the `ParkEvent`) once
    about every run that starts waiting for a person in this process; returns the observer
    (`perdure.engine.observers.uninstall` removes it)."""
    alerts = ParkAlerts(target)
    observers.install(alerts)
    return alerts
