"""schemathesis against a live `perdure serve` API: no input the committed OpenAPI document
(docs/openapi.json) allows, or breaks, gets a 5xx answer, and every input it allows is
accepted (positive data acceptance)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from extras_needed import needs
from local_servers import live_server

pytest.importorskip("uvicorn", reason=needs("server"))
pytest.importorskip("schemathesis", reason=needs("dev"))

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import CheckContext, not_a_server_error, positive_data_acceptance

import perdure
from perdure.server import sse
from perdure.server.access import create_token

DOCUMENT = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"
schema = schemathesis.openapi.from_path(DOCUMENT)  # the same as served: see test_openapi.py


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A live server on a fresh SQLite store with one workflow: (its URL, an admin token)."""
    folder: Path = tmp_path_factory.mktemp("api")
    app = perdure.App(f"sqlite:///{folder}/api.db")

    @app.workflow(name="echo")
    def echo(x: Any = None) -> Any:
        return x

    _, token = app.runtime.sync(create_token(app, "fuzzer", ["admin"]), "token")
    app.start(echo, 1, run_id="r-1")
    previous = sse.MAX_AGE
    sse.MAX_AGE = 1.0  # a stream of a run nobody finishes ends soon
    try:
        with live_server(app) as url:
            yield url, token
    finally:
        sse.MAX_AGE = previous
        app.close()


def schema_valid_input_is_accepted(ctx: CheckContext, response: Any, case: Any) -> bool | None:
    """schemathesis' positive_data_acceptance: input the document allows gets no 4xx but 401,
    403, 404 (an unknown run, gate, schedule or workflow: the request was well formed), 409 or
    429. The one refusal the document cannot foresee is let through: arguments that do not fit
    the named workflow's signature (422, field `args`), since the document knows no workflow;
    the generator learns the fixture's `echo` from a 404's message and tries it."""
    if response.status_code == 422 and response.json().get("field") == "args":
        return None
    return positive_data_acceptance(ctx, response, case)


@pytest.mark.slow  # about 40 s on two cores: the coverage phase of every operation
@schema.parametrize()
@settings(max_examples=8, deadline=None, database=None, suppress_health_check=list(HealthCheck))
def test_no_input_gets_a_server_error(case: Any, served: tuple[str, str]) -> None:
    """Every operation answers generated (valid and invalid) input without a 5xx, and accepts
    every input the document allows."""
    url, token = served
    case.call_and_validate(
        base_url=url,
        headers={"Authorization": f"Bearer {token}"},
        checks=[not_a_server_error, schema_valid_input_is_accepted],
        timeout=15,
    )
