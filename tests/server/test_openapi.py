"""The OpenAPI document: committed as the code produces it, served, and covering every route."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from extras_needed import needs

pytest.importorskip("starlette", reason=needs("server"))
pytest.importorskip("schemathesis", reason=needs("dev"))

import schemathesis
from starlette.routing import Route

import perdure
from perdure.server import create_app
from perdure.server.api import api_routes
from perdure.server.openapi import document, render, write

with warnings.catch_warnings():  # starlette 1.x prefers httpx2 for its TestClient; httpx works
    warnings.filterwarnings("ignore", message=".*httpx2", category=UserWarning)
    from starlette.testclient import TestClient

COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"


def test_the_committed_document_is_what_the_code_produces() -> None:
    """docs/openapi.json is up to date (regenerate: python -m perdure.server.openapi)."""
    assert COMMITTED.read_text(encoding="utf-8") == render()


def test_write_puts_the_document_where_asked(tmp_path: Path) -> None:
    """`write` creates the folder and writes the rendered document."""
    path = write(tmp_path / "docs" / "api.json")
    assert json.loads(path.read_text(encoding="utf-8")) == document()


def test_the_served_document_is_the_committed_one(app: perdure.App) -> None:
    """GET /api/v1/openapi.json answers without a token with the committed document."""
    with TestClient(create_app(app)) as client:
        served = client.get("/api/v1/openapi.json")
    assert served.status_code == 200
    assert served.json() == json.loads(COMMITTED.read_text(encoding="utf-8"))


def test_every_route_is_documented_with_its_scope() -> None:
    """Each API route and method is an operation of the document; each needing a token says
    its scope and the bearer scheme, and documents 401 and 403."""
    doc = document()
    for route in api_routes():
        assert isinstance(route, Route)
        for method in (route.methods or set()) - {"HEAD"}:
            operation = doc["paths"][route.path][method.lower()]
            if route.path.startswith("/api/v1/") and route.path != "/api/v1/openapi.json":
                assert operation["x-perdure-scope"] in ("read", "operate", "approve", "admin")
                assert operation["security"] == [{"bearer": []}]
                assert {"401", "403"} <= set(operation["responses"])
    ids = [op["operationId"] for path in doc["paths"].values() for op in path.values()]
    assert len(ids) == len(set(ids))


def test_the_document_loads_as_openapi_3_1() -> None:
    """schemathesis reads every operation of the document without an error."""
    schema = schemathesis.openapi.from_dict(document())
    operations = [result.ok() for result in schema.get_all_operations()]
    assert document()["openapi"] == "3.1.0"
    assert len(operations) == sum(len(p) for p in document()["paths"].values())
