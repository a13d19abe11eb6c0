"""The HTTP API of `perdure serve`: every endpoint, its scope, bad input, paging, SSE, readiness."""

from __future__ import annotations

import base64
import json
import logging
import re
import threading
import warnings
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from extras_needed import needs
from local_servers import live_server
from waits import wait_for

pytest.importorskip("starlette", reason=needs("server"))

import perdure
from perdure.agent.budget_sql import Budgets, UsageRow
from perdure.nesting import nested_message
from perdure.server import create_app, sse
from perdure.server.access import Principal, create_token
from perdure.server.api import ENDPOINTS
from perdure.server.throttle import Throttle
from perdure.testing import SimulatedCrash, TestClock, TestWorker

with warnings.catch_warnings():  # starlette 1.x prefers httpx2 for its TestClient; httpx works
    warnings.filterwarnings("ignore", message=".*httpx2", category=UserWarning)
    from starlette.testclient import TestClient

SCOPES = ("read", "operate", "approve", "admin")


def register(app: perdure.App) -> None:
    """The workflows these tests drive: an echo, a gate, a question, a sleeper, one that
    takes steering, a `once` step."""

    @app.workflow(name="echo")
    def echo(x: int) -> int:
        return x

    @app.workflow(name="gated")
    async def gated() -> Any:
        return await perdure.wait_event("approve:c1")

    @app.workflow(name="asks")
    async def asks() -> Any:
        return await perdure.wait_event("human:q1")

    @app.workflow(name="nap")
    async def nap() -> str:
        await perdure.sleep(86400)
        return "rested"

    @app.workflow(name="steered")
    async def steered() -> Any:
        await perdure.steering()  # it takes steering from here on
        return (await perdure.wait_event("steer"))["text"]

    @app.step(name="pay")
    def pay() -> str:
        return "paid"

    @app.workflow(name="payer")
    def payer() -> str:
        return pay()


@pytest.fixture
def tokens(app: perdure.App) -> dict[str, str]:
    """One token per scope, held by someone named after it (`read` is held by `read-er`)."""
    register(app)
    made = {}
    for scope in SCOPES:
        _, made[scope] = app.runtime.sync(create_token(app, f"{scope}-er", [scope]), "token")
    return made


@pytest.fixture
def client(app: perdure.App, tokens: dict[str, str]) -> Iterator[TestClient]:
    """The API of `app` (workflows registered), in process."""
    with TestClient(create_app(app)) as test_client:
        yield test_client


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def fill(path: str) -> str:
    return re.sub(r"{\w+}", "x", path)


def start(client: TestClient, token: str, workflow: str, *args: Any, **extra: Any) -> Any:
    answer = client.post(
        "/api/v1/runs",
        json={"workflow": workflow, "args": list(args), **extra},
        headers=auth(token),
    )
    assert answer.status_code in (200, 201), answer.text
    return answer.json()["run"]


def audit_actions(
    client: TestClient, token: str, target: str, outcome: str | None = "ok"
) -> list[tuple[str, str, Any]]:
    """(actor, action, detail) of `target`'s audit entries with `outcome` (None: all)."""
    entries = client.get(f"/api/v1/audit?target={target}", headers=auth(token)).json()["entries"]
    return [(e["actor"], e["action"], e["detail"]) for e in entries
            if outcome is None or e["outcome"] == outcome]  # fmt: skip


# -- health, readiness, tokens and scopes -------------------------------------------------


def test_health_and_readiness_answer_without_a_token(client: TestClient) -> None:
    """/healthz and /readyz need no token; readiness is 200 while the store answers."""
    assert client.get("/healthz").json() == {"ok": True}
    ready = client.get("/readyz")
    assert (ready.status_code, ready.json()) == (200, {"ready": True})


def test_readiness_is_503_when_the_store_cannot_be_reached(tmp_path: Path) -> None:
    """A store that cannot open (a SQLite path that is a directory) makes /readyz 503 and every
    authenticated endpoint 503, never 500."""
    (tmp_path / "dir.db").mkdir()
    app = perdure.App(f"sqlite:///{tmp_path}/dir.db")
    try:
        with TestClient(create_app(app)) as broken:
            ready = broken.get("/readyz")
            assert ready.status_code == 503 and ready.json()["ready"] is False
            assert broken.get("/healthz").status_code == 200  # liveness: the process answers
            runs = broken.get("/api/v1/runs", headers=auth("pdr_whatever"))
            assert runs.status_code == 503 and "store" in runs.json()["error"]
    finally:
        app.close()


def test_readiness_is_503_naming_a_message_trigger_whose_broker_is_down(tmp_path: Path) -> None:
    """A message trigger whose broker cannot be reached makes /readyz 503, naming it; one
    whose broker answers leaves it ready."""
    app = perdure.App(f"sqlite:///{tmp_path}/ready.db")
    register(app)
    app.on_message(perdure.sources.RedisStream("redis://127.0.0.1:6379/0", "perdure-ready"),
                   "echo", name="live")  # fmt: skip
    try:
        with TestClient(create_app(app)) as server:
            assert server.get("/readyz").status_code == 200
        app.on_message(perdure.sources.RabbitMQ("amqp://guest:secret@127.0.0.1:1/", "q"),
                       "echo", name="gone")  # fmt: skip
        with TestClient(create_app(app)) as server:
            ready = server.get("/readyz")
            assert ready.status_code == 503, ready.text
            error = ready.json()["error"]
            assert error == "message trigger 'gone' is not consuming (down); see perdure triggers"
            assert "secret" not in error and "127.0.0.1" not in error  # /readyz is public
    finally:
        app.close()


def test_every_endpoint_refuses_a_missing_or_bad_token(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    """Each endpoint with a scope answers 401 (with WWW-Authenticate) to no token, a wrong one,
    or another scheme; and no token reaches the log."""
    caplog.set_level(logging.DEBUG)
    client.app.state.throttle = Throttle(most=1000)  # ~100 wrong tokens on purpose, not 429
    for endpoint in ENDPOINTS:
        if endpoint.scope is None:
            continue
        for headers in ({}, auth("pdr_not-a-token"), {"Authorization": "Basic dXNlcjpwdw=="}):
            answer = client.request(endpoint.method, fill(endpoint.path), headers=headers, json={})
            assert answer.status_code == 401, (endpoint.path, answer.text)
            assert answer.headers["www-authenticate"] == "Bearer"
    assert "pdr_" not in caplog.text


def test_each_endpoint_checks_its_scope(client: TestClient, tokens: dict[str, str]) -> None:
    """A token whose scopes do not allow an endpoint gets 403 before anything is read or done
    (a read token cannot cancel, an operate token cannot approve); an allowed one gets past."""
    refused = 0
    for endpoint in ENDPOINTS:
        if endpoint.scope is None:
            continue
        for scope, token in tokens.items():
            who = Principal(scope, frozenset({scope}))
            answer = client.request(endpoint.method, fill(endpoint.path), headers=auth(token))
            if who.allows(endpoint.scope):
                assert answer.status_code not in (401, 403), (scope, endpoint.path)
            else:
                refused += 1
                assert answer.status_code == 403, (scope, endpoint.path, answer.text)
                assert f"'{endpoint.scope}' scope" in answer.json()["error"]
    assert refused > 20


# -- runs --------------------------------------------------------------------------------------


def test_start_is_idempotent_by_id_and_checks_its_input(
    client: TestClient, tokens: dict[str, str]
) -> None:
    """Starting an id twice gives 201 then 200 and one run; an id of another workflow is 409;
    an unknown workflow is 404 and ill-typed arguments are 422 (`args`), before anything is
    recorded."""
    op = auth(tokens["operate"])
    first = client.post(
        "/api/v1/runs", json={"workflow": "echo", "args": [1], "id": "e1"}, headers=op
    )
    again = client.post(
        "/api/v1/runs", json={"workflow": "echo", "args": [1], "id": "e1"}, headers=op
    )
    assert (first.status_code, first.json()["created"]) == (201, True)
    assert (again.status_code, again.json()["created"]) == (200, False)
    assert first.json()["run"]["input"] == {"args": [1], "kwargs": {}}
    other = client.post("/api/v1/runs", json={"workflow": "gated", "id": "e1"}, headers=op)
    assert other.status_code == 409 and "e1" in other.json()["error"]
    unknown = client.post("/api/v1/runs", json={"workflow": "nope"}, headers=op)
    assert unknown.status_code == 404 and "nope" in unknown.json()["error"]
    assert unknown.json()["field"] == "workflow"
    typed = client.post("/api/v1/runs", json={"workflow": "echo", "args": ["a"]}, headers=op)
    assert typed.status_code == 422 and "x" in typed.json()["error"]
    assert typed.json()["field"] == "args"
    missing = client.post("/api/v1/runs", json={"workflow": "echo"}, headers=op)
    assert missing.status_code == 422
    runs = client.get("/api/v1/runs", headers=op).json()["runs"]
    assert [r["id"] for r in runs] == ["e1"]


def test_get_journal_and_explain_a_finished_run(
    client: TestClient, tokens: dict[str, str], worker: TestWorker
) -> None:
    """A run's detail has its result; its journal pages by `after`; explain says per step what
    happened; an unknown run is 404 on each."""
    read = auth(tokens["read"])
    run = start(client, tokens["operate"], "payer", id="p1")
    assert run["status"] == "pending"
    worker.run_until_idle()
    detail = client.get("/api/v1/runs/p1", headers=read).json()
    assert (detail["status"], detail["result"], detail["error"]) == ("completed", "paid", None)
    journal = client.get("/api/v1/runs/p1/journal", headers=read).json()
    kinds = [e["kind"] for e in journal["entries"]]
    assert kinds[:2] == ["step.intent", "step.outcome"] and journal["next_after"] is None
    page = client.get("/api/v1/runs/p1/journal?after=0&limit=1", headers=read).json()
    assert [e["seq"] for e in page["entries"]] == [1] and page["next_after"] == 1
    steps = client.get("/api/v1/runs/p1/explain", headers=read).json()["steps"]
    assert (steps[0]["name"], steps[0]["effect"], steps[0]["state"]) == ("pay", "once", "done")
    for path in ("", "/journal", "/explain"):
        missing = client.get(f"/api/v1/runs/nope{path}", headers=read)
        assert missing.status_code == 404 and "nope" in missing.json()["error"]


def test_listing_filters_and_pages_every_run_exactly_once(
    client: TestClient, tokens: dict[str, str], clock: TestClock
) -> None:
    """Paging newest first with a cursor walks each run once, even with runs created at the same
    instant and runs started during the walk; status and workflow filter."""
    op = auth(tokens["operate"])
    made = []
    for i in range(23):
        made.append(start(client, tokens["operate"], "echo", i, id=f"r{i:02d}")["id"])
        if i % 3 == 0:  # some share a created_at, so ties are ordered by id
            clock.advance(1)
    seen: list[str] = []
    cursor = ""
    for turn in range(20):
        page = client.get(f"/api/v1/runs?limit=5&cursor={cursor}", headers=op).json()
        seen += [r["id"] for r in page["runs"]]
        if turn == 1:  # newer than the cursor: not in this walk
            start(client, tokens["operate"], "gated", id="late")
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(made) and len(seen) == len(made)
    created = [
        r["created_at"] for r in client.get("/api/v1/runs?limit=500", headers=op).json()["runs"]
    ]
    assert created == sorted(created, reverse=True)
    only = client.get("/api/v1/runs?workflow=gated&status=pending,waiting", headers=op).json()
    assert [r["id"] for r in only["runs"]] == ["late"]
    assert client.get("/api/v1/runs?status=completed", headers=op).json()["runs"] == []


def test_runs_by_id_are_one_bulk_status_call(
    client: TestClient, tokens: dict[str, str], worker: TestWorker
) -> None:
    """`?id=a&id=b` lists just those runs with their status; `missing` names the ids no run
    has; more than 500 ids is a 400 naming `id`."""
    op = auth(tokens["operate"])
    for i in range(3):
        start(client, tokens["operate"], "echo", i, id=f"e{i}")
    start(client, tokens["operate"], "gated", id="g")
    worker.run_until_idle()
    page = client.get("/api/v1/runs?id=e1&id=g&id=nope&id=e1", headers=op).json()
    assert sorted((r["id"], r["status"]) for r in page["runs"]) == [
        ("e1", "completed"),
        ("g", "waiting"),
    ]
    assert page["missing"] == ["nope"]
    narrowed = client.get("/api/v1/runs?id=e1&id=g&status=waiting", headers=op).json()
    assert [r["id"] for r in narrowed["runs"]] == ["g"]
    assert "missing" not in client.get("/api/v1/runs", headers=op).json()
    many = "&".join(f"id=x{i}" for i in range(501))
    answer = client.get(f"/api/v1/runs?{many}", headers=op)
    assert answer.status_code == 400 and answer.json()["field"] == "id"


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("status=finished", "status"),
        ("limit=0", "limit"),
        ("limit=ten", "limit"),
        ("cursor=%%%", "cursor"),
        ("cursor=bm90IGpzb24", "cursor"),  # base64 of "not json"
        ("cursor=" + base64.urlsafe_b64encode(b'{"a":1}').decode(), "cursor"),
        ("workflow=%00", "workflow"),
    ],
)
def test_bad_list_queries_are_400_naming_the_field(
    client: TestClient, tokens: dict[str, str], query: str, field: str
) -> None:
    """A wrong status, limit, cursor or workflow is a 400 whose `field` names it."""
    answer = client.get(f"/api/v1/runs?{query}", headers=auth(tokens["read"]))
    assert answer.status_code == 400 and answer.json()["field"] == field, answer.text


def test_cancel_pause_and_resume_are_done_and_audited(
    client: TestClient, tokens: dict[str, str], worker: TestWorker
) -> None:
    """Pause, resume and cancel change the run and each lands in the audit log with its actor
    and comment; pausing a finished run is 409; acting on an unknown run is 404."""
    op = auth(tokens["operate"])
    start(client, tokens["operate"], "nap", id="n1")
    worker.run_until_idle()
    assert client.get("/api/v1/runs/n1", headers=op).json()["status"] == "sleeping"
    paused = client.post("/api/v1/runs/n1/pause", json={"comment": "hold on"}, headers=op)
    assert paused.json() == {"run_id": "n1", "status": "paused"}
    assert client.post("/api/v1/runs/n1/resume", headers=op).json()["status"] == "pending"
    cancelled = client.post("/api/v1/runs/n1/cancel", json={"comment": "no need"}, headers=op)
    assert cancelled.json()["status"] == "cancelled"
    again = client.post("/api/v1/runs/n1/pause", headers=op)
    assert again.status_code == 409 and "cancelled" in again.json()["error"]
    assert client.post("/api/v1/runs/nope/cancel", headers=op).status_code == 404
    assert audit_actions(client, tokens["read"], "run:n1") == [
        ("operate-er", "run.cancel", {"comment": "no need"}),
        ("operate-er", "run.resume", {}),
        ("operate-er", "run.pause", {"comment": "hold on"}),
        ("operate-er", "run.start", {"workflow": "nap", "via": "api", "created": True}),
    ]
    [refused] = audit_actions(client, tokens["read"], "run:n1", "refused")
    assert refused[:2] == ("operate-er", "run.pause")


def test_resolve_settles_a_needs_attention_step(
    app: perdure.App, client: TestClient, tokens: dict[str, str], clock: TestClock
) -> None:
    """A once step interrupted mid-effect is marked done with a value through the API; the run
    completes with it. Exactly one of value, retry or fail is accepted; a settled run is 409."""
    op = auth(tokens["operate"])
    start(client, tokens["operate"], "payer", id="p1")
    dead = TestWorker(app)
    dead.crash_after_intent("pay")
    with pytest.raises(SimulatedCrash):
        dead.run_until_idle()
    clock.advance(dead.lease + 1)
    fresh = TestWorker(app)
    fresh.run_until_idle()
    assert client.get("/api/v1/runs/p1", headers=op).json()["status"] == "needs_attention"
    for body in ({"step": 0}, {"step": 0, "value": 1, "retry": True}):
        answer = client.post("/api/v1/runs/p1/resolve", json=body, headers=op)
        assert answer.status_code == 422 and answer.json()["field"] == "value"
    done = client.post(
        "/api/v1/runs/p1/resolve", json={"step": "pay", "value": "by hand", "comment": "checked"},
        headers=op,
    )  # fmt: skip
    assert done.json() == {"run_id": "p1", "status": "pending"}
    fresh.run_until_idle()
    assert client.get("/api/v1/runs/p1", headers=op).json()["result"] == "by hand"
    late = client.post("/api/v1/runs/p1/resolve", json={"step": 0, "fail": True}, headers=op)
    assert late.status_code == 409
    [(actor, action, detail)] = audit_actions(client, tokens["read"], "run:p1")[:1]
    assert (actor, action, detail["how"], detail["value"], detail["comment"]) == (
        "operate-er", "run.resolve", "value", "by hand", "checked",
    )  # fmt: skip
    [(_, _, late_detail)] = audit_actions(client, tokens["read"], "run:p1", "refused")[:1]
    assert late_detail["how"] == "fail"


def test_fork_retries_from_a_step(
    client: TestClient, tokens: dict[str, str], worker: TestWorker
) -> None:
    """Fork starts a new run of the same input from step N (201); a taken id is 409; a negative
    step is 422 naming from_step."""
    op = auth(tokens["operate"])
    start(client, tokens["operate"], "echo", 7, id="e1")
    worker.run_until_idle()
    forked = client.post("/api/v1/runs/e1/fork", json={"from_step": 0, "id": "e1-b"}, headers=op)
    assert forked.status_code == 201
    assert (forked.json()["run"]["id"], forked.json()["forked_from"]) == ("e1-b", "e1")
    worker.run_until_idle()
    assert client.get("/api/v1/runs/e1-b", headers=op).json()["result"] == 7
    taken = client.post("/api/v1/runs/e1/fork", json={"from_step": 0, "id": "e1-b"}, headers=op)
    assert taken.status_code == 409
    negative = client.post("/api/v1/runs/e1/fork", json={"from_step": -1}, headers=op)
    assert negative.status_code == 422 and negative.json()["field"] == "from_step"


def test_events_reach_a_waiting_run(
    client: TestClient, tokens: dict[str, str], worker: TestWorker
) -> None:
    """An event sent through the API wakes the run waiting for it (202); a repeated key is kept
    once; an unknown run is 404 and an event without a name 422."""
    op = auth(tokens["operate"])
    start(client, tokens["operate"], "asks", id="a1")
    worker.run_until_idle()
    body = {"name": "human:q1", "payload": "yes", "key": "k1"}
    sent = client.post("/api/v1/runs/a1/events", json=body, headers=op)
    repeat = client.post("/api/v1/runs/a1/events", json=body, headers=op)
    assert sent.status_code == 202 and repeat.json()["event_id"] == sent.json()["event_id"]
    worker.run_until_idle()
    assert client.get("/api/v1/runs/a1", headers=op).json()["result"] == "yes"
    assert client.post("/api/v1/runs/nope/events", json=body, headers=op).status_code == 404
    nameless = client.post("/api/v1/runs/a1/events", json={"payload": 1}, headers=op)
    assert nameless.status_code == 422 and nameless.json()["field"] == "name"


def test_steer_reaches_a_run_that_takes_it_and_is_refused_elsewhere(
    client: TestClient, tokens: dict[str, str], worker: TestWorker
) -> None:
    """A steer (202, audited with its actor) reaches a run whose workflow takes steering;
    a plain workflow's run and a finished run are 409 with one line, an unknown run 404,
    an empty text 422."""
    op = auth(tokens["operate"])
    for workflow, run_id in (("steered", "st1"), ("gated", "g9"), ("echo", "e9")):
        start(client, tokens["operate"], workflow, *([1] if workflow == "echo" else []),
              id=run_id)  # fmt: skip
    worker.run_until_idle()
    sent = client.post("/api/v1/runs/st1/steer", json={"text": "go left"}, headers=op)
    assert sent.status_code == 202, sent.text
    assert sent.json()["run_id"] == "st1" and sent.json()["event_id"] > 0
    worker.run_until_idle()
    assert client.get("/api/v1/runs/st1", headers=op).json()["result"] == "go left"
    for run_id, why in (("g9", "does not take steering"), ("e9", "finished run")):
        refused = client.post(f"/api/v1/runs/{run_id}/steer", json={"text": "x"}, headers=op)
        assert refused.status_code == 409 and why in refused.json()["error"], refused.text
        assert "\n" not in refused.json()["error"]
    unknown = client.post("/api/v1/runs/nope/steer", json={"text": "x"}, headers=op)
    assert unknown.status_code == 404
    empty = client.post("/api/v1/runs/st1/steer", json={"text": ""}, headers=op)
    assert empty.status_code == 422 and empty.json()["field"] == "text"
    done = audit_actions(client, tokens["read"], "run:st1")
    assert [(who, what) for who, what, _ in done if what == "run.steer"] == [
        ("operate-er", "run.steer")
    ]
    assert audit_actions(client, tokens["read"], "run:g9", "refused")[0][1] == "run.steer"


# -- gates ---------------------------------------------------------------------------------


def test_a_token_without_approve_cannot_approve_and_the_audit_log_records_an_approval(
    app: perdure.App, client: TestClient, tokens: dict[str, str], worker: TestWorker
) -> None:
    """The gate is listed; read and operate tokens get 403 and change nothing; an approve token
    approves, the audit log says who, what, on which run, when and with which comment, and the
    run continues with the decision. Approving again is 409."""
    start(client, tokens["operate"], "gated", id="g1")
    worker.run_until_idle()
    [gate] = client.get("/api/v1/gates", headers=auth(tokens["read"])).json()["gates"]
    assert (gate["run_id"], gate["kind"], gate["call_id"]) == ("g1", "approval", "c1")
    for scope in ("read", "operate"):
        refused = client.post(
            "/api/v1/gates/g1/c1/approve", json={"comment": "sneaky"}, headers=auth(tokens[scope])
        )
        assert refused.status_code == 403 and "'approve' scope" in refused.json()["error"]
    assert client.get("/api/v1/runs/g1", headers=auth(tokens["read"])).json()["status"] == "waiting"
    approved = client.post(
        "/api/v1/gates/g1/c1/approve", json={"comment": "looks right"},
        headers=auth(tokens["approve"]),
    )  # fmt: skip
    assert approved.json() == {"run_id": "g1", "call_id": "c1", "decision": "approve"}
    log = client.get("/api/v1/audit?target=run:g1", headers=auth(tokens["read"])).json()["entries"]
    assert [(e["actor"], e["action"], e["outcome"]) for e in log] == [
        ("approve-er", "gate.approve", "ok"), ("operate-er", "gate.approve", "refused"),
        ("read-er", "gate.approve", "refused"), ("operate-er", "run.start", "ok"),
    ]  # fmt: skip
    assert "'approve' scope" in log[1]["reason"]
    assert log[0]["detail"] == {"call": "c1", "comment": "looks right"}
    assert log[0]["at"] == app.clock.now()
    worker.run_until_idle()
    run = client.get("/api/v1/runs/g1", headers=auth(tokens["read"])).json()
    assert run["result"] == {"approve": True, "comment": "looks right"}
    again = client.post("/api/v1/gates/g1/c1/approve", headers=auth(tokens["approve"]))
    assert again.status_code == 409
    assert client.get("/api/v1/gates", headers=auth(tokens["read"])).json()["gates"] == []


def test_deny_and_answer_gates(
    client: TestClient, tokens: dict[str, str], worker: TestWorker
) -> None:
    """Deny sends a negative decision with its comment; answer answers a question gate; both
    are audited; an unknown run is 404."""
    ok = auth(tokens["approve"])
    start(client, tokens["operate"], "gated", id="g2")
    start(client, tokens["operate"], "asks", id="q2")
    worker.run_until_idle()
    kinds = {
        g["run_id"]: g["kind"] for g in client.get("/api/v1/gates", headers=ok).json()["gates"]
    }
    assert kinds == {"g2": "approval", "q2": "question"}
    denied = client.post("/api/v1/gates/g2/c1/deny", json={"comment": "too risky"}, headers=ok)
    assert denied.json()["decision"] == "deny"
    answered = client.post("/api/v1/gates/q2/q1/answer", json={"text": "blue"}, headers=ok)
    assert answered.json()["decision"] == "answer"
    assert client.post("/api/v1/gates/q2/q1/answer", json={}, headers=ok).status_code == 422
    assert client.post("/api/v1/gates/nope/c1/deny", headers=ok).status_code == 404
    worker.run_until_idle()
    read = auth(tokens["read"])
    assert client.get("/api/v1/runs/g2", headers=read).json()["result"]["approve"] is False
    assert client.get("/api/v1/runs/q2", headers=read).json()["result"] == "blue"
    actions = {a for _, a, _ in audit_actions(client, tokens["read"], "run:g2")}
    assert "gate.deny" in actions
    assert audit_actions(client, tokens["read"], "run:q2")[0][1:] == (
        "gate.answer", {"call": "q1", "answer": "blue"},
    )  # fmt: skip


# -- schedules, pauses, usage, budgets, audit ------------------------------------------------


def test_triggers_lists_every_trigger_for_a_read_token(
    app: perdure.App, client: TestClient, tokens: dict[str, str], tmp_path: Path
) -> None:
    """GET /triggers (read scope) lists each trigger with state, lag and last error; a table
    change on a table that does not exist says so."""
    app.inbox(tmp_path / "in", "echo", name="drop")
    app.on_table_change("orders", "echo")
    assert client.get("/api/v1/triggers").status_code == 401
    listed = client.get("/api/v1/triggers", headers=auth(tokens["read"]))
    assert listed.status_code == 200
    by_name = {t["name"]: t for t in listed.json()["triggers"]}
    assert by_name["drop"]["kind"] == "inbox" and by_name["drop"]["state"] == "watching"
    orders = by_name["orders"]
    assert orders["kind"] == "table_change" and orders["state"] == "error"
    assert "no table 'orders'" in orders["last_error"]
    assert set(orders) == {"kind", "name", "workflow", "state", "lag", "last_error", "detail",
                           "pending", "since"}  # fmt: skip


def test_schedules_are_stored_paused_resumed_and_deleted_by_admin(
    client: TestClient, tokens: dict[str, str]
) -> None:
    """An admin stores a schedule (an operate token cannot), reads its next fire times, pauses,
    resumes and deletes it; a bad cron or policy is 422, an unknown name 404."""
    admin = auth(tokens["admin"])
    body = {"workflow": "echo", "every": 60, "args": [3]}
    assert (
        client.put("/api/v1/schedules/s1", json=body, headers=auth(tokens["operate"])).status_code
        == 403
    )
    stored = client.put("/api/v1/schedules/s1", json=body, headers=admin)
    assert stored.status_code == 200 and stored.json()["input"] == {"args": [3], "kwargs": {}}
    listed = client.get("/api/v1/schedules", headers=auth(tokens["read"])).json()["schedules"]
    assert [s["name"] for s in listed] == ["s1"]
    detail = client.get("/api/v1/schedules/s1?next=3", headers=admin).json()
    assert len(detail["upcoming"]) == 3 and detail["upcoming"][1] - detail["upcoming"][0] == 60
    assert client.post("/api/v1/schedules/s1/pause", headers=admin).json()["paused"] is True
    assert client.post("/api/v1/schedules/s1/resume", headers=admin).json()["paused"] is False
    assert client.delete("/api/v1/schedules/s1", headers=admin).json() == {"deleted": "s1"}
    assert client.get("/api/v1/schedules/s1", headers=admin).status_code == 404
    assert client.post("/api/v1/schedules/s1/pause", headers=admin).status_code == 404
    cron = client.put(
        "/api/v1/schedules/s2", json={"workflow": "echo", "cron": "nope"}, headers=admin
    )
    assert cron.status_code == 422 and cron.json()["field"] == "cron"
    policy = client.put(
        "/api/v1/schedules/s2", json={**body, "overlap": "sometimes"}, headers=admin
    )
    assert policy.status_code == 422 and policy.json()["field"] == "overlap"
    bad_name = client.put("/api/v1/schedules/a:b", json=body, headers=admin)
    assert bad_name.status_code == 400
    actions = [a for _, a, _ in audit_actions(client, tokens["read"], "schedule:s1")]
    assert actions == ["schedule.delete", "schedule.resume", "schedule.pause", "schedule.add"]
    refused = [(who, a) for who, a, _ in audit_actions(client, tokens["read"], "schedule:s1",
                                                      "refused")]  # fmt: skip
    assert refused == [("admin-er", "schedule.pause"), ("operate-er", "schedule.add")]


def test_workflow_pauses(client: TestClient, tokens: dict[str, str]) -> None:
    """An operate token pauses and resumes a whole workflow; the pauses are listed and audited."""
    op = auth(tokens["operate"])
    body = {"scope": "workflow", "name": "nap", "comment": "maintenance"}
    assert client.post("/api/v1/pauses", json=body, headers=op).json()["changed"] is True
    pauses = client.get("/api/v1/pauses", headers=op).json()["pauses"]
    assert [(p["scope"], p["name"]) for p in pauses] == [("workflow", "nap")]
    resumed = client.post("/api/v1/pauses", json={**body, "paused": False}, headers=op).json()
    assert resumed == {"scope": "workflow", "name": "nap", "paused": False, "changed": True}
    assert client.get("/api/v1/pauses", headers=op).json()["pauses"] == []
    bad = client.post("/api/v1/pauses", json={**body, "scope": "host"}, headers=op)
    assert bad.status_code == 422 and bad.json()["field"] == "scope"
    actions = [a for _, a, _ in audit_actions(client, tokens["read"], "workflow:nap")]
    assert actions == ["workflow.resume", "workflow.pause"]


def test_usage_and_budgets(client: TestClient, tokens: dict[str, str], app: perdure.App) -> None:
    """Usage is grouped by agent, run or day; an admin sets a budget (audited), which shows with
    what was spent this hour and day; an operate token cannot; a bad grouping is 400."""
    now = app.clock.now()
    for i, (run, tokens_in) in enumerate((("t-1", 100), ("t-1", 50), ("t-2", 10))):
        app.runtime.sync(
            Budgets(app.runtime.store).record_usage(
                UsageRow(run, i, "triage", "m", tokens_in, 5, 0.5, now)
            ),
            "u",
        )
    read = auth(tokens["read"])
    by_agent = client.get("/api/v1/usage", headers=read).json()["groups"]
    assert by_agent == [
        {"agent": "triage", "calls": 3, "input_tokens": 160, "output_tokens": 15, "cost": 1.5}
    ]
    by_run = client.get("/api/v1/usage?by=run&agent=triage", headers=read).json()["groups"]
    assert [(g["run_id"], g["calls"]) for g in by_run] == [("t-1", 2), ("t-2", 1)]
    assert client.get(f"/api/v1/usage?since={now + 1}", headers=read).json()["groups"] == []
    assert client.get("/api/v1/usage?by=week", headers=read).json()["field"] == "by"
    app.runtime.sync(
        Budgets(app.runtime.store).declare_agent("triage", "{}", now), "declare"
    )  # a worker serves it
    limits = {"tokens_per_day": 1000, "cost_per_hour": 2.5}
    refused = client.put("/api/v1/budgets/triage", json=limits, headers=auth(tokens["operate"]))
    assert refused.status_code == 403
    set_ = client.put("/api/v1/budgets/triage", json=limits, headers=auth(tokens["admin"])).json()
    assert set_["woken"] == 0 and set_["budget"]["tokens_per_day"] == 1000
    got = client.get("/api/v1/budgets/triage", headers=read).json()
    assert got["budget"]["cost_per_hour"] == 2.5 and got["spent"]["day"] == {
        "tokens": 175,
        "cost": 1.5,
    }
    assert client.get("/api/v1/budgets/other", headers=read).status_code == 404  # unknown
    admin = auth(tokens["admin"])
    more = client.put("/api/v1/budgets/triage", json={"cost_per_day": 1.0}, headers=admin).json()
    assert more["budget"]["tokens_per_day"] == 1000  # only the limit given changed
    assert more["in_force"]["cost_per_day"] == {"limit": 1.0, "from": "stored"}
    back = client.put("/api/v1/budgets/triage", json={"reset": True}, headers=admin).json()
    assert back["budget"] is None and back["in_force"]["tokens_per_day"]["from"] == "none"
    typo = client.put("/api/v1/budgets/triaje", json={"tokens_per_day": 5}, headers=admin)
    assert typo.status_code == 404 and "no agent named 'triaje'" in typo.json()["error"]
    wrong = client.put(
        "/api/v1/budgets/triage", json={"tokens_per_day": -1}, headers=auth(tokens["admin"])
    )
    assert wrong.status_code == 422 and wrong.json()["field"] == "tokens_per_day"
    assert audit_actions(client, tokens["read"], "agent:triage")[-1][:2] == (
        "admin-er",
        "budget.set",
    )


def test_shared_budgets(client: TestClient, tokens: dict[str, str], app: perdure.App) -> None:
    """A budget agents share is read and changed like an agent's: only the limits given
    change (admin, audited), it shows its agents and what they spent; a shared budget no
    agent names is 404, a negative limit 422."""
    now = app.clock.now()
    app.runtime.sync(
        Budgets(app.runtime.store).declare_agent("triage", '{"shared": "team-a"}', now), "declare"
    )
    row = UsageRow("t-1", 0, "triage", "m", 100, 5, 0.5, now, pool="team-a")
    app.runtime.sync(Budgets(app.runtime.store).record_usage(row), "usage")
    read, admin = auth(tokens["read"]), auth(tokens["admin"])
    got = client.get("/api/v1/budgets/shared/team-a", headers=read).json()
    assert got["agents"] == ["triage"] and got["spent"]["day"] == {"tokens": 105, "cost": 0.5}
    assert got["limits"]["tokens_per_day"] is None
    refused = client.put("/api/v1/budgets/shared/team-a", json={"tokens_per_day": 9},
                         headers=auth(tokens["operate"]))  # fmt: skip
    assert refused.status_code == 403
    set_ = client.put("/api/v1/budgets/shared/team-a", json={"tokens_per_day": 1000},
                      headers=admin).json()  # fmt: skip
    assert set_["woken"] == 0 and set_["limits"]["tokens_per_day"] == 1000
    more = client.put("/api/v1/budgets/shared/team-a", json={"cost_per_day": 2.0},
                      headers=admin).json()  # fmt: skip
    assert more["limits"]["tokens_per_day"] == 1000 and more["limits"]["cost_per_day"] == 2.0
    typo = client.put("/api/v1/budgets/shared/team-b", json={"tokens_per_day": 5}, headers=admin)
    assert typo.status_code == 404 and "no shared budget named 'team-b'" in typo.json()["error"]
    assert client.get("/api/v1/budgets/shared/team-b", headers=read).status_code == 404
    wrong = client.put("/api/v1/budgets/shared/team-a", json={"tokens_per_day": -1},
                       headers=admin)  # fmt: skip
    assert wrong.status_code == 422 and wrong.json()["field"] == "tokens_per_day"
    assert audit_actions(client, tokens["read"], "shared:team-a")[-1][:2] == (
        "admin-er",
        "budget.set",
    )


def test_the_audit_log_pages_with_a_cursor(client: TestClient, tokens: dict[str, str]) -> None:
    """The audit log walks newest first, each record once; a bad cursor is 400."""
    for i in range(7):
        start(client, tokens["operate"], "echo", i)
    read = auth(tokens["read"])
    everything = client.get("/api/v1/audit?limit=500", headers=read).json()["entries"]
    seen: list[int] = []
    cursor = ""
    while cursor is not None:
        page = client.get(f"/api/v1/audit?limit=3&cursor={cursor}", headers=read).json()
        seen += [e["id"] for e in page["entries"]]
        cursor = page["next_cursor"]
    assert seen == [e["id"] for e in everything] and seen == sorted(seen, reverse=True)
    assert len(seen) == 7  # the starts (the fixture's tokens are made below the audited path)
    assert client.get("/api/v1/audit?cursor=eyJ4IjoxfQ", headers=read).status_code == 400


# -- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        (b"{", 400, "body"),
        (b'{"workflow": "echo", "deadline": NaN}', 400, "body"),
        (b"\xff\xfe", 400, "body"),
        (b"[1, 2]", 422, "body"),
        (b'{"workflow": 3}', 422, "workflow"),
        (b'{"workflow": "echo", "args": {"x": 1}}', 422, "args"),
        (b'{"workflow": "echo", "priority": "5"}', 422, "priority"),
        (b'{"workflow": "echo", "priority": 99999999999999}', 422, "priority"),
        (b'{"workflow": "echo", "colour": "red"}', 422, "colour"),
        (b'{"workflow": "ec\\u0000ho"}', 422, "workflow"),
        (b'{"workflow": "echo", "id": "\\ud800"}', 422, "id"),
        (b'{"workflow": ""}', 422, "workflow"),
    ],
)
def test_bad_bodies_are_4xx_naming_the_field(
    client: TestClient, tokens: dict[str, str], body: bytes, status: int, field: str
) -> None:
    """Malformed JSON, wrong types, unknown fields and unstorable text are 400/422 naming the
    field, and start nothing."""
    answer = client.post(
        "/api/v1/runs",
        content=body,
        headers={**auth(tokens["operate"]), "Content-Type": "application/json"},
    )
    assert (answer.status_code, answer.json()["field"]) == (status, field), answer.text
    assert field in answer.json()["error"]
    assert client.get("/api/v1/runs", headers=auth(tokens["read"])).json()["runs"] == []


def test_an_oversized_body_is_413(client: TestClient, tokens: dict[str, str]) -> None:
    """A body over 1 MiB is refused with 413, whether its length is declared or not."""
    big = json.dumps({"workflow": "echo", "args": ["x" * 1_100_000]}).encode()
    answer = client.post("/api/v1/runs", content=big, headers=auth(tokens["operate"]))
    assert answer.status_code == 413 and answer.json()["field"] == "body"

    def chunks() -> Iterator[bytes]:
        for _ in range(20):
            yield b"x" * 100_000

    streamed = client.post("/api/v1/runs", content=chunks(), headers=auth(tokens["operate"]))
    assert streamed.status_code == 413


def test_unknown_paths_and_methods_are_json_404_and_405(
    client: TestClient, tokens: dict[str, str]
) -> None:
    """Paths and methods the API does not have answer as JSON errors."""
    assert client.get("/api/v1/nothing", headers=auth(tokens["read"])).status_code == 404
    wrong = client.delete("/api/v1/runs", headers=auth(tokens["admin"]))
    assert wrong.status_code == 405 and "error" in wrong.json()


# -- Server-Sent Events ------------------------------------------------------------------------


def read_events(response: httpx.Response, into: list[tuple[str, Any]]) -> None:
    """Parse an SSE body into (event, data) pairs (comments as ("comment", text))."""
    event = ""
    for line in response.iter_lines():
        if line.startswith(":"):
            into.append(("comment", line[1:].strip()))
        elif line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            into.append((event, json.loads(line[6:])))


def test_the_stream_shows_status_changes_and_journal_entries_until_the_run_ends(
    app: perdure.App, tokens: dict[str, str], worker: TestWorker
) -> None:
    """A client watching a run sees its status go pending, waiting, completed, the journal
    entries in between, then `end`, and the stream closes."""
    app.start("gated", run_id="g1")
    events: list[tuple[str, Any]] = []
    with live_server(app) as url, httpx.Client(base_url=url, timeout=10) as http:

        def watch() -> None:
            with http.stream(
                "GET", "/api/v1/events/stream?run=g1", headers=auth(tokens["read"])
            ) as r:
                assert r.headers["content-type"].startswith("text/event-stream")
                read_events(r, events)

        reader = threading.Thread(target=watch)
        reader.start()
        wait_for("the status pending", lambda: ("status", "pending") in statuses(events))
        worker.run_until_idle()
        wait_for("the status waiting", lambda: ("status", "waiting") in statuses(events))
        approve = auth(tokens["approve"])
        assert http.post("/api/v1/gates/g1/c1/approve", headers=approve).status_code == 200
        worker.run_until_idle()
        reader.join(10)
        assert not reader.is_alive()
    shown = [s for _, s in statuses(events)]
    assert shown[:2] == ["pending", "waiting"] and shown[-1] == "completed"
    assert set(shown[2:-1]) <= {"pending", "running"}  # as far as polling caught them
    journal = [(d["seq"], d["kind"]) for e, d in events if e == "journal"]
    assert journal == [(0, "event.wait"), (1, "event.received"), (2, "run.completed")]
    assert events[-1] == ("end", {"run_id": "g1", "status": "completed"})


def statuses(events: list[tuple[str, Any]]) -> list[tuple[str, str]]:
    return [(e, d["status"]) for e, d in events if e == "status"]


def test_the_stream_sends_heartbeats_and_stops_when_the_client_leaves(
    app: perdure.App, tokens: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A quiet stream sends heartbeat comments; when the client disconnects the server stops
    polling and forgets the connection."""
    monkeypatch.setattr(sse, "HEARTBEAT", 0.2)
    monkeypatch.setattr(sse, "POLL", 0.05)
    app.start("gated", run_id="g1")
    listeners = len(app.runtime.on_notify)
    with live_server(app) as url, httpx.Client(base_url=url, timeout=10) as http:
        with http.stream("GET", "/api/v1/events/stream?run=g1", headers=auth(tokens["read"])) as r:
            lines = r.iter_lines()
            while next(lines) != ": heartbeat":
                pass
            assert len(app.runtime.on_notify) == listeners + 1
        wait_for("the listener gone", lambda: len(app.runtime.on_notify) == listeners, timeout=10)


def test_the_stream_needs_a_known_run(client: TestClient, tokens: dict[str, str]) -> None:
    """Without `run` the stream is 400 naming it; an unknown run is 404; a bad `after` is 400."""
    read = auth(tokens["read"])
    missing = client.get("/api/v1/events/stream", headers=read)
    assert missing.status_code == 400 and missing.json()["field"] == "run"
    assert client.get("/api/v1/events/stream?run=nope", headers=read).status_code == 404
    start(client, tokens["operate"], "echo", 1, id="e1")
    bad = client.get("/api/v1/events/stream?run=e1&after=x", headers=read)
    assert bad.status_code == 400 and bad.json()["field"] == "after"


def test_a_reconnecting_client_resumes_after_its_last_event_id(
    client: TestClient, tokens: dict[str, str], worker: TestWorker
) -> None:
    """With Last-Event-ID the stream sends only later journal entries; a finished run's stream
    ends by itself after its status."""
    start(client, tokens["operate"], "payer", id="p1")
    worker.run_until_idle()
    events: list[tuple[str, Any]] = []
    headers = {**auth(tokens["read"]), "Last-Event-ID": "0"}
    with client.stream("GET", "/api/v1/events/stream?run=p1", headers=headers) as answer:
        read_events(answer, events)
    seqs = [d["seq"] for e, d in events if e == "journal"]
    assert seqs and seqs[0] == 1 and seqs == sorted(seqs)
    assert [e for e, _ in events][-2:] == ["status", "end"]
    assert events[-2][1]["status"] == "completed"


# -- the audit log of every action, refused ones too ----------------------------------------


def _entries(client: TestClient, token: str, query: str = "") -> list[dict[str, Any]]:
    answer = client.get(f"/api/v1/audit?limit=500{query}", headers=auth(token))
    assert answer.status_code == 200, answer.text
    return list(answer.json()["entries"])


def test_run_actions_through_the_api_are_audited_with_actor_target_and_outcome(
    client: TestClient, tokens: dict[str, str], worker: TestWorker
) -> None:
    """start, send event, fork and a worker pause each leave an `ok` record naming the token,
    the action and its target (a fork's new run in its detail)."""
    op = auth(tokens["operate"])
    start(client, tokens["operate"], "asks", id="a1")
    worker.run_until_idle()
    sent = client.post("/api/v1/runs/a1/events", json={"name": "human:q1", "payload": 1},
                       headers=op)  # fmt: skip
    assert sent.status_code == 202
    worker.run_until_idle()
    assert client.post("/api/v1/runs/a1/fork", json={"from_step": 0, "id": "a2"},
                       headers=op).status_code == 201  # fmt: skip
    body = {"scope": "worker", "name": "host9", "paused": True}
    assert client.post("/api/v1/pauses", json=body, headers=op).status_code == 200
    rows = [(e["actor"], e["action"], e["target"], e["outcome"])
            for e in reversed(_entries(client, tokens["read"]))]  # fmt: skip
    assert rows == [
        ("operate-er", "run.start", "run:a1", "ok"), ("operate-er", "run.event", "run:a1", "ok"),
        ("operate-er", "run.fork", "run:a1", "ok"),
        ("operate-er", "worker.pause", "worker:host9", "ok"),
    ]  # fmt: skip
    fork = _entries(client, tokens["read"], "&target=run:a1")[0]
    assert fork["detail"] == {"from_step": 0, "new_id": "a2"}


def test_every_action_endpoint_audits_a_request_refused_for_its_scope(
    client: TestClient, tokens: dict[str, str]
) -> None:
    """Each endpoint that changes something names the action it performs, and a read token's
    request to it is 403 and recorded as that action, refused, with the reason."""
    actions = [e for e in ENDPOINTS if e.scope is not None and e.method != "GET"]
    assert len(actions) >= 15
    for endpoint in actions:
        assert getattr(endpoint.handler, "audits", None), f"{endpoint.path} names no action"
        answer = client.request(endpoint.method, fill(endpoint.path), headers=auth(tokens["read"]))
        assert answer.status_code == 403, (endpoint.path, answer.text)
        [entry] = _entries(client, tokens["read"], "&limit=1")
        kind = "schedule" if "/schedules/" in endpoint.path else "shared" if "/shared/" in (
            endpoint.path) else "agent" if "budgets" in endpoint.path else "run"  # fmt: skip
        target = f"{kind}:x" if "{" in endpoint.path else f"api:{endpoint.method} {endpoint.path}"
        assert (entry["actor"], entry["action"], entry["target"], entry["outcome"]) == (
            "read-er", endpoint.handler.audits, target, "refused",  # type: ignore[attr-defined]
        ), endpoint.path  # fmt: skip
        assert f"'{endpoint.scope}' scope" in entry["reason"]
    assert len(_entries(client, tokens["read"])) == len(actions)


def test_an_action_on_an_unknown_run_or_in_the_wrong_state_is_audited_as_refused(
    client: TestClient, tokens: dict[str, str], worker: TestWorker
) -> None:
    """Cancelling an unknown run (404), sending to one (404) and pausing a finished run (409)
    are recorded as refused with their one-line reason; nothing else is recorded for them."""
    op = auth(tokens["operate"])
    assert client.post("/api/v1/runs/nope/cancel", headers=op).status_code == 404
    assert client.post("/api/v1/runs/nope/events", json={"name": "e"},
                       headers=op).status_code == 404  # fmt: skip
    start(client, tokens["operate"], "echo", 1, id="e1")
    worker.run_until_idle()
    assert client.post("/api/v1/runs/e1/pause", headers=op).status_code == 409
    refused = [(e["action"], e["target"], e["reason"]) for e in _entries(client, tokens["read"])
               if e["outcome"] == "refused"]  # fmt: skip
    assert refused == [
        ("run.pause", "run:e1", "run 'e1' is completed; it cannot be paused"),
        ("run.event", "run:nope", "no run with id 'nope' (list runs with `perdure ls`)"),
        ("run.cancel", "run:nope", "no run with id 'nope' (list runs with `perdure ls`)"),
    ]


def test_the_audit_endpoint_filters_by_run_actor_and_since(
    app: perdure.App, client: TestClient, tokens: dict[str, str], clock: TestClock
) -> None:
    """`run`, `target`, `actor` and `since` (a duration, an ISO time or Unix seconds) narrow
    the log together (`run` with another `target` matches nothing); a bad `since` is 400."""
    from perdure.server.access import record

    def note(actor: str, action: str, target: str) -> int:
        return int(app.runtime.sync(record(app, actor, action, target, {}), "record"))

    note("ana", "run.pause", "run:x")
    clock.advance(7200)
    note("bob", "run.pause", "run:x")
    note("ana", "run.pause", "run:y")
    recent = note("ana", "run.resume", "run:x")
    read = tokens["read"]

    def ids(query: str) -> list[int]:
        return [e["id"] for e in _entries(client, read, query)]

    assert ids("&run=x&actor=ana&since=1h") == [recent]
    assert ids(f"&target=run:x&actor=ana&since={clock.now() - 60}") == [recent]
    assert len(ids("&run=x&actor=ana")) == 2 and len(ids("&actor=bob")) == 1
    iso = datetime.fromtimestamp(clock.now() - 60, UTC).isoformat()
    assert ids(f"&run=x&since={iso.replace('+', '%2B')}") == [recent, recent - 2]
    assert ids("&run=x&target=run:y") == []
    assert client.get("/api/v1/audit?since=yesterday", headers=auth(read)).status_code == 400


def test_bodies_nested_thousands_deep_are_400_not_500(
    client: TestClient, tokens: dict[str, str]
) -> None:
    """A JSON body nested 100,000 deep, to starting a run or to a run's events: 400, one line."""
    op = {**auth(tokens["operate"]), "content-type": "application/json"}
    deep = '{"workflow": "echo", "args": ' + "[" * 100_000 + "]" * 100_000 + "}"
    for path in ("/api/v1/runs", "/api/v1/runs/nope/events"):
        answer = client.post(path, content=deep, headers=op)
        assert answer.status_code == 400, (path, answer.text)
        assert answer.json() == {"error": nested_message("body"), "field": "body"}
