"""Issue 35 §7: a run-output stream (`/api/v1/runs/{id}/stream`) of a run that never finishes
and writes nothing ends once it is `sse.MAX_AGE` old, with an `end` event saying so (the
client reconnects with Last-Event-ID and its credential is checked again); it used to last
as long as the client held it."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

import perdure
from perdure.server import sse

if TYPE_CHECKING:
    from starlette.testclient import TestClient


def test_a_run_output_stream_ends_at_its_maximum_age(
    served: tuple[TestClient, dict[str, str]], app: perdure.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, admin = served
    monkeypatch.setattr(sse, "MAX_AGE", 1.0)
    monkeypatch.setattr(sse, "RECHECK", 0.2)  # the wait between checks when nothing comes
    app.start("echo", 1, run_id="idle")  # no worker: it stays pending, writing nothing
    with client.stream("GET", "/api/v1/runs/idle/stream", headers=admin) as answer:
        assert answer.status_code == 200
        text = "".join(answer.iter_text())
    assert text.endswith("\n\n") and "event: end" in text, text
    ended = json.loads(text.split("event: end\ndata: ")[1].split("\n")[0])
    assert ended == {"run_id": "idle", "status": None, "reason": "max age"}
