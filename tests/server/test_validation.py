"""The OpenAPI document says exactly what the server accepts: patterns, bounds, integer types
and exclusive fields come from the validators, and the two agree on every example."""

from __future__ import annotations

import warnings
from typing import Any
from urllib.parse import quote

import pytest

from extras_needed import needs

pytest.importorskip("starlette", reason=needs("server"))
pytest.importorskip("jsonschema", reason=needs("dev"))

import jsonschema
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import perdure
from perdure.server.api import ENDPOINTS
from perdure.server.openapi import document
from perdure.server.validation import ID_CURSOR, PATH_PARAMS, RUN_CURSOR

with warnings.catch_warnings():  # starlette 1.x prefers httpx2 for its TestClient; httpx works
    warnings.filterwarnings("ignore", message=".*httpx2", category=UserWarning)
    from starlette.testclient import TestClient

CHECK = settings(
    max_examples=25, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)


def body_schema(name: str) -> jsonschema.Draft202012Validator:
    """A validator for the document's schema `name`, its references resolved in the document."""
    doc = document()
    schema = {"$ref": f"#/components/schemas/{name}", "components": doc["components"]}
    return jsonschema.Draft202012Validator(schema)


def test_parameters_are_documented_as_they_are_checked() -> None:
    """Each path parameter has its validator's pattern, each query parameter its reader's
    schema, and a body with required fields is a required body."""
    doc = document()
    for endpoint in ENDPOINTS:
        operation = doc["paths"][endpoint.path][endpoint.method.lower()]
        params = {p["name"]: p for p in operation.get("parameters", [])}
        for name, param in params.items():
            if param["in"] == "path":
                assert param["schema"]["pattern"] == PATH_PARAMS[name]
        for query in endpoint.params:
            assert params[query.name]["schema"] == query.schema()
            assert params[query.name]["required"] == query.required
        if endpoint.body is not None:
            needed = any(f.is_required() for f in endpoint.body.model_fields.values())
            assert operation["requestBody"]["required"] == needed


@pytest.mark.parametrize(
    ("schema", "body"),
    [
        ("Resolve", {"step": 1, "retry": True}),
        ("Resolve", {"step": 1, "value": None}),
        ("Resolve", {"step": "charge", "fail": True, "retry": False}),
        ("Resolve", {"step": 1, "retry": True, "fail": True}),
        ("Resolve", {"step": 1, "retry": False}),
        ("Resolve", {"step": 1, "value": 3, "fail": True}),
        ("Resolve", {"step": 1.0, "retry": True}),
        ("Resolve", {"step": -1, "retry": True}),
        ("PutSchedule", {"workflow": "echo", "every": 60}),
        ("PutSchedule", {"workflow": "echo", "cron": "0 9 * * MON-FRI", "every": None}),
        ("PutSchedule", {"workflow": "echo", "cron": "@daily", "tz": "Europe/Paris"}),
        ("PutSchedule", {"workflow": "echo", "cron": "*/15 1-5 * * *", "every": 60}),
        ("PutSchedule", {"workflow": "echo"}),
        ("PutSchedule", {"workflow": "echo", "cron": None, "every": None}),
        ("PutSchedule", {"workflow": "echo", "cron": "61 * * * *"}),
        ("PutSchedule", {"workflow": "echo", "every": 60, "tz": "Mars/Olympus"}),
        ("PutSchedule", {"workflow": "echo", "every": 60, "catchup_limit": 5.0}),
        ("StartRun", {"workflow": "echo", "priority": 5.0}),
        ("StartRun", {"workflow": "echo", "priority": 5.5}),
        ("StartRun", {"workflow": "echo", "priority": True}),
        ("StartRun", {"workflow": "echo", "priority": 2**31}),
        ("StartRun", {"workflow": "echo", "id": "a\u200bb c\u00a0d"}),
        ("StartRun", {"workflow": "echo", "id": "line\nbreak"}),
        ("StartRun", {"workflow": "echo", "id": "bidi\u202eoverride"}),
        ("StartRun", {"workflow": "echo", "args": [{"k\x00": 1}]}),
        ("StartRun", {"workflow": "echo", "args": [["nul\x00"]]}),
        ("StartRun", {"workflow": "echo", "kwargs": {"x\x00": 1}}),
        ("StartRun", {"workflow": "echo", "args": [{"deep": ["ok", 1.5, None]}]}),
        ("SetPause", {"scope": "workflow", "name": "echo", "comment": "a\x00b"}),
    ],
)
def test_the_document_and_the_server_agree_on_bodies(
    served: tuple[TestClient, dict[str, str]], schema: str, body: dict[str, Any]
) -> None:
    """A body the document's schema allows is accepted, and one it refuses is a 4xx naming a
    field: exactly-one-of fields, integral numbers, id characters, NUL in nested text."""
    client, admin = served
    allowed = body_schema(schema).is_valid(body)
    if schema == "Resolve":
        answer = client.post("/api/v1/runs/nobody/resolve", json=body, headers=admin)
        accepted = answer.status_code == 404  # well formed: the run is unknown
    elif schema == "PutSchedule":
        answer = client.put("/api/v1/schedules/s1", json=body, headers=admin)
        accepted = answer.status_code == 200
    elif schema == "SetPause":
        answer = client.post("/api/v1/pauses", json=body, headers=admin)
        accepted = answer.status_code == 200
    else:
        answer = client.post("/api/v1/runs", json=body, headers=admin)
        accepted = answer.status_code == 201
    assert accepted == allowed, answer.text
    if not accepted:
        assert answer.status_code in (400, 422) and answer.json()["field"], answer.text


@CHECK
@given(cursor=st.from_regex(RUN_CURSOR, fullmatch=True).filter(lambda c: len(c) <= 1000))
def test_any_runs_cursor_the_document_allows_is_a_page(
    served: tuple[TestClient, dict[str, str]], cursor: str
) -> None:
    """A cursor is a position: any the pattern allows answers a page, none a 400."""
    client, admin = served
    answer = client.get(f"/api/v1/runs?cursor={quote(cursor, safe='')}", headers=admin)
    assert answer.status_code == 200, answer.text


@CHECK
@given(cursor=st.from_regex(ID_CURSOR, fullmatch=True))
def test_any_audit_cursor_the_document_allows_is_a_page(
    served: tuple[TestClient, dict[str, str]], cursor: str
) -> None:
    """An audit cursor is an entry's id: any the pattern allows answers a page."""
    client, admin = served
    assert client.get(f"/api/v1/audit?cursor={cursor}", headers=admin).status_code == 200


def test_cursors_the_server_gives_out_page_through_every_run(
    served: tuple[TestClient, dict[str, str]], app: perdure.App
) -> None:
    """Runs with ids of any characters a path cannot carry page through their cursors."""
    client, admin = served
    for n in range(5):
        app.start("echo", n, run_id=f"odd:{n} /?#%é")
    seen: list[str] = []
    cursor = ""
    while cursor is not None:
        page = client.get(f"/api/v1/runs?limit=2&cursor={quote(cursor)}", headers=admin).json()
        seen += [r["id"] for r in page["runs"]]
        cursor = page["next_cursor"]
    assert sorted(seen) == sorted(f"odd:{n} /?#%é" for n in range(5))


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/api/v1/runs/a%C3%A9%40b", 404),  # letters of any script and '@' are in ids
        ("/api/v1/runs/a%E2%80%8Bb", 400),  # a zero-width space is not (invisible)
        ("/api/v1/runs/a%1Bb", 400),  # an escape is not
        ("/api/v1/runs/a%E2%80%AEb", 400),  # nor a bidirectional override
        ("/api/v1/schedules/a%20b", 400),  # a schedule's name has no spaces
        ("/api/v1/usage?since=1e12", 400),
        ("/api/v1/usage?since=-1e11", 200),
        ("/api/v1/runs?limit=5.0", 200),
        ("/api/v1/runs?status=running,,pending", 200),
        ("/api/v1/events/stream?run=", 400),
    ],
)
def test_parameters_are_refused_where_the_document_refuses_them(
    served: tuple[TestClient, dict[str, str]], path: str, status: int
) -> None:
    """Path and query values at the edges of their patterns and bounds answer as documented."""
    client, admin = served
    assert client.get(path, headers=admin).status_code == status


def test_a_schedule_that_never_fires_is_refused_not_a_crash(
    served: tuple[TestClient, dict[str, str]],
) -> None:
    """A cron expression with no date (30 February) is a 422 naming `cron`, not a 500."""
    client, admin = served
    body = {"workflow": "echo", "cron": "0 0 30 2 *"}
    answer = client.put("/api/v1/schedules/feb", json=body, headers=admin)
    assert (answer.status_code, answer.json()["field"]) == (422, "cron"), answer.text
