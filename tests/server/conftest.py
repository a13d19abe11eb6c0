"""Fixtures of the server tests: the API of an app with an `echo` workflow, for an admin."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

import perdure
from perdure.server.access import create_token

if TYPE_CHECKING:
    from starlette.testclient import TestClient


@pytest.fixture
def served(app: perdure.App) -> Iterator[tuple[TestClient, dict[str, str]]]:
    """The API of an app with an `echo` workflow, and an admin's headers."""
    from perdure.server import create_app

    with warnings.catch_warnings():  # starlette 1.x prefers httpx2 for its TestClient; httpx works
        warnings.filterwarnings("ignore", message=".*httpx2", category=UserWarning)
        from starlette.testclient import TestClient

    @app.workflow(name="echo")
    def echo(x: Any = None) -> Any:
        return x

    _, token = app.runtime.sync(create_token(app, "ana", ["admin"]), "token")
    with TestClient(create_app(app)) as client:
        yield client, {"Authorization": f"Bearer {token}"}
