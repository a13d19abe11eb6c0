"""The API and the id rule: every id the rule accepts is started, read and cancelled by its
path (%2F and %25 included); what it refuses is one line naming the character, 422 in a body
and 400 in a path or query; the token name rule holds too."""

from __future__ import annotations

import warnings
from urllib.parse import quote

import pytest

from extras_needed import needs

pytest.importorskip("starlette", reason=needs("server"))

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import perdure
from perdure.server.access import create_token
from perdure.server.access_sql import Access
from perdure.store.names import MAX_RUN_ID, REFUSED, BadName, problem

with warnings.catch_warnings():  # starlette 1.x prefers httpx2 for its TestClient; httpx works
    warnings.filterwarnings("ignore", message=".*httpx2", category=UserWarning)
    from starlette.testclient import TestClient


def path(run_id: str) -> str:
    return "/api/v1/runs/" + quote(run_id, safe="")


ids = st.text(min_size=1, max_size=40).filter(lambda v: problem(v, "run id", MAX_RUN_ID) is None)
# Starlette's TestClient decodes a path twice, so '%' is left to tests/security/test_ids.py,
# which meets a real server.
ids_here = ids.filter(lambda v: "%" not in v)


@settings(max_examples=60, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(run_id=ids_here)
def test_every_id_the_rule_accepts_is_created_and_reached_by_its_path(
    served: tuple[TestClient, dict[str, str]], run_id: str
) -> None:
    """POST with the id creates it (or finds it); GET, journal and cancel by its path reach it."""
    client, admin = served
    made = client.post("/api/v1/runs", json={"workflow": "echo", "id": run_id}, headers=admin)
    assert made.status_code in (200, 201), made.text
    assert made.json()["run"]["id"] == run_id
    got = client.get(path(run_id), headers=admin)
    assert got.status_code == 200 and got.json()["id"] == run_id, got.text
    assert client.get(path(run_id) + "/journal", headers=admin).status_code == 200
    cancelled = client.post(path(run_id) + "/cancel", json={}, headers=admin)
    assert cancelled.status_code in (200, 409), cancelled.text


@pytest.mark.parametrize("run_id", ["hook:push:a/b", "%", "x/journal", "日本/語@ü"])
def test_slashes_and_percent_signs_in_ids_stay_in_one_segment(
    served: tuple[TestClient, dict[str, str]], run_id: str
) -> None:
    """An id with '/' (even one ending like a sub-resource) or '%' text names exactly its run."""
    client, admin = served
    client.post("/api/v1/runs", json={"workflow": "echo", "id": "x"}, headers=admin)
    made = client.post("/api/v1/runs", json={"workflow": "echo", "id": run_id}, headers=admin)
    assert made.status_code == 201, made.text
    got = client.get(path(run_id), headers=admin)
    assert got.status_code == 200 and got.json()["id"] == run_id, got.text


def refused(text: str) -> bool:
    return any(a <= ord(c) <= b for c in text for a, b in REFUSED)


@pytest.mark.parametrize("bad", ["a\x1b[2J", "b\x07", "c\r", "d\n", "e\t", "x\u202eevil", " f"])
def test_a_refused_id_is_one_escaped_line_in_the_body_and_the_path(
    served: tuple[TestClient, dict[str, str]], bad: str
) -> None:
    """A bad id in a body is a 422 naming `id`, in a path a 400 naming `run_id`: each the
    rule's one line, the id escaped; nothing is started."""
    client, admin = served
    body = client.post("/api/v1/runs", json={"workflow": "echo", "id": bad}, headers=admin)
    assert (body.status_code, body.json()["field"]) == (422, "id"), body.text
    got = client.get(path(bad), headers=admin)
    cancelled = client.post(path(bad) + "/cancel", json={}, headers=admin)
    for answer, field in ((body, "id"), (got, "run_id"), (cancelled, "run_id")):
        message = answer.json()["error"]
        assert message.startswith(f"{field}: run id '"), message
        assert not refused(message) and "\n" not in message
    assert client.get(path(bad), headers=admin).status_code == 400
    assert client.get("/api/v1/runs", headers=admin).json()["runs"] == []


def test_other_names_in_bodies_and_paths_meet_the_rule(
    served: tuple[TestClient, dict[str, str]],
) -> None:
    """Queue, event and pause names in bodies, schedule and agent names in paths."""
    client, admin = served
    answers = [
        client.post("/api/v1/runs", json={"workflow": "echo", "queue": "q\x1b"}, headers=admin),
        client.post("/api/v1/pauses", json={"scope": "workflow", "name": "e\u202e"}, headers=admin),
        client.put(
            "/api/v1/schedules/s%E2%80%AE", json={"workflow": "echo", "every": 60}, headers=admin
        ),
        client.put("/api/v1/budgets/bot%1B", json={"tokens_per_day": 1}, headers=admin),
    ]
    assert [a.status_code for a in answers] == [422, 422, 400, 400]
    assert all("U+" in a.json()["error"] and not refused(a.json()["error"]) for a in answers)


def test_a_token_name_meets_the_rule(app: perdure.App) -> None:
    """create_token refuses a name with a control character, and one over 100 characters."""
    with pytest.raises(BadName, match=r"^token name 'ana\\x1b\[31m' has U\+001B"):
        app.runtime.sync(create_token(app, "ana\x1b[31m", ["read"]), "token")
    with pytest.raises(BadName, match=r"at most 100"):
        app.runtime.sync(create_token(app, "n" * 101, ["read"]), "token")
    assert app.runtime.sync(Access(app.runtime.store).list_tokens(), "tokens") == []
