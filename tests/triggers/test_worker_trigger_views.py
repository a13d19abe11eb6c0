"""The workers views and the run lists agree (issue 34 items 3 and 4), against real RabbitMQ:
a live worker's message-trigger consumers (one refused by the broker, one consuming) are the
same in `perdure workers` (text and --json), the API, the dashboard's Workers page and `top`;
a message run's trigger kind and source are the same in `perdure ls` (text and --json), the
API and the dashboard's runs list, and are what the run itself saw (`current_run()`)."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest
from message_brokers import unique
from test_trigger_truth import _delete, _publish, perdure_cli, start_truth_worker

from extras_needed import require
from module_files import load_file
from perdure.observe.top import snapshot
from perdure.server import operations
from perdure.server.access import local_operator
from process_stops import stop_processes
from waits import wait_for

HERE = Path(__file__).parent
WORKER = "views-1"


def _completed(env: dict[str, str]) -> dict[str, Any] | None:
    """The completed run of `perdure ls --json`, if there is one yet."""
    runs = json.loads(perdure_cli(env, "ls", "--json").stdout)["runs"]
    return next((r for r in runs if r["status"] == "completed"), None)


def test_workers_and_runs_views_agree_on_triggers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker consuming `live` and refused on `orders` (a missing queue) shows both states,
    with the broker's words for the refused one, in every workers view; the run its `live`
    message started says trigger `message`, started by `live`, in every runs view."""
    require("rabbitmq")
    pytest.importorskip("starlette")
    missing, live, dlq = unique("views-missing"), unique("views-live"), unique("views-dlq")
    env, proc, log = start_truth_worker(tmp_path, monkeypatch, missing, live, dlq, WORKER)
    try:
        wait_for("the ready line", lambda: "ready worker=" in log.read_text(errors="replace"),
                 log, timeout=60)  # fmt: skip
        asyncio.run(_publish(live, b'{"n": 1}', "v1"))
        run = wait_for("the live message's run", lambda: _completed(env), log, every=0.5)
        assert (run["trigger"], run["started_by"]) == ("message", "live"), run
        shown = json.loads(perdure_cli(env, "show", run["id"], "--json").stdout)["run"]
        assert shown["result"]["trigger"] == run["trigger"] == shown["trigger"]
        assert shown["result"]["origin"]["message"] == run["started_by"]
        listed = perdure_cli(env, "ls").stdout
        assert re.search(rf"{run['id']} +take +completed +message live ", listed), listed
        cli = json.loads(perdure_cli(env, "workers", "--json").stdout)["workers"]
        [mine] = [w for w in cli if w["id"] == WORKER]
        consumers = {c["trigger"]: c for c in mine["triggers"]}
        assert consumers["live"]["state"] == "consuming" and not consumers["live"]["failing"]
        assert consumers["orders"]["state"] == "refused" and consumers["orders"]["failing"]
        assert consumers["orders"]["error"] == f"queue {missing!r} does not exist"
        text = perdure_cli(env, "workers").stdout
        assert re.search(rf"{WORKER} .* live consuming, orders refused +alive", text), text
        assert f"{WORKER}: trigger orders refused since " in text
        assert "does not exist" in text.splitlines()[-1]
        api_workers, api_runs, workers_page, runs_page, top = _served(run["id"])
        [served] = [w for w in api_workers if w["id"] == WORKER]
        assert served["triggers"] == mine["triggers"]
        assert [(r["trigger"], r["started_by"]) for r in api_runs] == [("message", "live")]
        for trigger in ("live", "orders"):
            state = consumers[trigger]["state"]
            assert f'data-trigger="{trigger}" data-consumer="{state}"' in workers_page
        assert "does not exist" in workers_page
        cell = re.search(r'<td class="trigger" data-trigger="(\w+)">\w+ <bdi>(\w+)</bdi>',
                         runs_page)  # fmt: skip
        assert cell and cell.groups() == ("message", "live"), runs_page
        assert top == ("live consuming, orders refused", True)
    finally:
        stop_processes([proc], grace=30)
        asyncio.run(_delete(live, dlq))
    after = json.loads(perdure_cli(env, "workers", "--json").stdout)["workers"]
    assert [w["triggers"] for w in after if w["id"] == WORKER] == [[]]  # stopped: history


def _served(run_id: str) -> tuple[list[Any], list[Any], str, str, tuple[str, bool]]:
    """The API's workers and runs, the dashboard's Workers and runs pages and `top`'s line
    of the worker, read by a server process that consumes nothing."""
    from starlette.testclient import TestClient

    from perdure.server import create_app

    app = load_file("views_app_served", HERE / "truth_app.py").app  # env: the worker's
    with TestClient(create_app(app)) as client:
        made = operations.create_token(app, local_operator(), "ops", ["read"])
        _, token = app.runtime.sync(made, "token")
        bearer = {"Authorization": f"Bearer {token}"}
        workers = client.get("/api/v1/workers", headers=bearer).json()["workers"]
        runs = client.get("/api/v1/runs", headers=bearer).json()["runs"]
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', client.get("/ui/login").text)
        assert csrf, "no login form"
        client.post("/ui/login", data={"token": token, "csrf": csrf.group(1)})
        pages = client.get("/ui/workers").text, client.get(f"/ui/runs?q={run_id}").text
        frame = app.runtime.sync(snapshot(app.runtime), "top")
    [line] = [w for w in frame.workers if w.id == WORKER]
    return workers, runs, *pages, (line.triggers, line.triggers_failing)
