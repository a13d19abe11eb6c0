"""One redaction for every interface: `perdure show`, `perdure explain`, the HTTP API, the
dashboard and MCP mask the same `sk-` keys and `pdr_` tokens of a run the same way."""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from extras_needed import needs

pytest.importorskip("starlette", reason=needs("server"))
pytest.importorskip("mcp", reason=needs("mcp"))

from click.testing import CliRunner

import perdure
from perdure.cli.main import cli
from perdure.server import create_app
from perdure.server.access import create_token
from perdure.server.mcp.tasks import tool_result
from perdure.testing import TestWorker

with warnings.catch_warnings():  # starlette 1.x prefers httpx2 for its TestClient; httpx works
    warnings.filterwarnings("ignore", message=".*httpx2", category=UserWarning)
    from starlette.testclient import TestClient

KEY = "sk-proj-abc123def456ghi789"
TOKEN = "pdr_s3cr3tT0kenValue0123456789"
SECRETS = (KEY, TOKEN, "abc123def456", "s3cr3tT0ken")
MASKED = ("sk-***", "pdr_***")


def assert_masked(text: str, where: str) -> None:
    """`text` shows neither secret (nor a piece of one), and shows both masked forms."""
    for secret in SECRETS:
        assert secret not in text, f"{where} shows {secret!r}:\n{text}"
    for form in MASKED:
        assert form in text, f"{where} does not show {form!r}:\n{text}"


@pytest.fixture
def runs(app: perdure.App, db_url: str) -> Iterator[perdure.App]:
    """`kept` completed with secrets in its input, a step's outcome and its result; `broke`
    failed with them in its error."""

    @app.step(effect="read", name="fetch")
    def fetch(x: str) -> dict[str, Any]:
        return {"used": x, "note": f"with {TOKEN}"}

    @app.workflow(name="keeper")
    async def keeper(x: str) -> dict[str, Any]:
        got = await fetch(x)
        return {"result": f"{KEY} {TOKEN}", "got": got}

    @app.workflow(name="breaker")
    def breaker(x: str) -> str:
        raise RuntimeError(f"refused {KEY} for {TOKEN}")

    app.start(keeper, f"{KEY} {TOKEN}", run_id="kept")
    app.start(breaker, f"{KEY} {TOKEN}", run_id="broke")
    TestWorker(app).run_until_idle()
    assert app.get_run("kept").status == "completed"
    assert app.get_run("broke").status == "failed"
    yield app


def test_show_and_explain_mask_run_data(runs: perdure.App, db_url: str) -> None:
    """`perdure show` and `perdure explain` print the masked forms, never the secrets."""
    runner = CliRunner(env={"PERDURE_DB": db_url, "PERDURE_APP": ""})
    for command in ("show", "explain"):
        for run_id in ("kept", "broke"):
            result = runner.invoke(cli, [command, run_id], catch_exceptions=False)
            assert result.exit_code == 0, result.output
            assert_masked(result.output, f"perdure {command} {run_id}")


def test_the_api_masks_run_data(runs: perdure.App) -> None:
    """The run, its journal, its explanation and the runs list answer with masked data."""
    _, value = runs.runtime.sync(create_token(runs, "ana", ["read"]), "token")
    read = {"Authorization": f"Bearer {value}"}
    with TestClient(create_app(runs)) as client:
        for path in (
            "/api/v1/runs/kept",
            "/api/v1/runs/kept/journal",
            "/api/v1/runs/broke",
            "/api/v1/runs/broke/journal",
        ):
            answer = client.get(path, headers=read)
            assert answer.status_code == 200
            assert_masked(answer.text, path)
        explained = client.get("/api/v1/runs/kept/explain", headers=read)
        for secret in SECRETS:
            assert secret not in explained.text
        listed = client.get("/api/v1/runs", headers=read)
        for secret in SECRETS:
            assert secret not in listed.text
        detail = client.get("/api/v1/runs/kept", headers=read).json()
    assert "sk-*** pdr_***" in json.dumps(detail["input"])
    assert detail["result"]["result"] == "sk-*** pdr_***"


def test_the_dashboard_masks_run_data(runs: perdure.App) -> None:
    """The dashboard's run pages show the same masked forms."""
    _, value = runs.runtime.sync(create_token(runs, "ana", ["read"]), "token")
    with TestClient(create_app(runs)) as client:
        login = client.get("/ui/login").text
        found = re.search(r'name="csrf" value="([0-9a-f]+)"', login)
        form = {"token": value, "csrf": found.group(1) if found else "", "next": "/ui/runs"}
        assert client.post("/ui/login", data=form, follow_redirects=False).status_code == 303
        for run_id in ("kept", "broke"):
            page = client.get(f"/ui/runs/{run_id}")
            assert page.status_code == 200
            assert_masked(page.text, f"/ui/runs/{run_id}")


def test_mcp_task_results_mask_run_data(runs: perdure.App) -> None:
    """An MCP task's result and a failed task's error are masked the same way."""
    for run_id in ("kept", "broke"):
        result = runs.runtime.sync(tool_result(runs, runs.get_run(run_id)), "mcp result")
        assert_masked(result.model_dump_json(), f"MCP result of {run_id}")
