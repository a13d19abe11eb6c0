"""405 answers: at every path of the route table, a method the path does not accept gets a 405
whose `Allow` lists exactly the methods it does accept (HEAD wherever GET is)."""

from __future__ import annotations

import re
import warnings

import pytest

from extras_needed import needs

pytest.importorskip("starlette", reason=needs("server"))

from starlette.routing import Mount, Route

import perdure
from perdure.server import create_app, routes

with warnings.catch_warnings():  # starlette 1.x prefers httpx2 for its TestClient; httpx works
    warnings.filterwarnings("ignore", message=".*httpx2", category=UserWarning)
    from starlette.testclient import TestClient

METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def concrete(path: str) -> str:
    """The path with each parameter filled in (`{run_id}` -> `x`)."""
    return re.sub(r"{[^}]+}", "x", path)


def paths() -> list[str]:
    """Each concrete path of the route table, and one inside each mount."""
    found: dict[str, None] = {}
    for route in routes():
        if isinstance(route, Route):
            found[concrete(route.path)] = None
        elif isinstance(route, Mount):
            found[concrete(route.path) + "/perdure.css"] = None
    return list(found)


@pytest.mark.parametrize("path", paths())
def test_a_405_allows_exactly_what_the_path_accepts(app: perdure.App, path: str) -> None:
    """Each method that is not answered 405 is listed in the `Allow` of every 405 there, and
    nothing else is (DELETE /api/v1/runs allows GET, HEAD and POST)."""
    with TestClient(create_app(app), raise_server_exceptions=False) as client:
        answers = {m: client.request(m, path, follow_redirects=False) for m in METHODS}
    accepted = {m for m, answer in answers.items() if answer.status_code != 405}
    refused = set(METHODS) - accepted
    assert accepted, f"{path}: no method is accepted"
    assert "GET" not in accepted or "HEAD" in accepted, f"{path}: GET without HEAD"
    for method in refused:
        allow = answers[method].headers.get("allow", "")
        assert {m.strip() for m in allow.split(",")} == accepted, f"{method} {path}: {allow}"


def test_delete_on_the_runs_collection_names_post(app: perdure.App) -> None:
    """The case the review found: POST /api/v1/runs exists, so DELETE's 405 says so."""
    with TestClient(create_app(app)) as client:
        answer = client.delete("/api/v1/runs")
    assert answer.status_code == 405
    assert answer.headers["allow"] == "GET, HEAD, POST"
    assert answer.json() == {"error": "Method Not Allowed"}
