"""`perdure versions` (CLI, --json), GET /api/v1/versions, the dashboard's versions page,
replay-check's summary and the waiting metric label: one report, the same words."""

from __future__ import annotations

import json
import re
import sys
import time
import warnings
from collections.abc import Iterator
from html import unescape
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_versions import live_worker, parked_under_v1, ship_v2

import perdure
from perdure.cli.main import cli
from perdure.engine.reasons import cause_of
from perdure.testing import TestClock, TestWorker

APP_CODE = """
import perdure

app = perdure.App()

@app.step(name="pack")
def pack() -> str:
    return "box"

@app.step(name="insure")
def insure(box: str) -> str:
    return box

@app.step(name="send")
def send(box: str) -> str:
    return box

@app.workflow(name="ship", version="v2")
def ship() -> str:
    box = insure(pack())
    perdure.sleep(60)
    return send(box)
"""


@pytest.fixture
def deployed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Two ship runs parked under v1, a live worker of v1 (build-a), and a checkout of v2
    (incompatible) as the CLI's --app; the store's URL. Now is the real time: the CLI's."""
    clock = TestClock(time.time())
    url = f"sqlite:///{tmp_path}/deploy.db"
    parked_under_v1(url, clock, n=2)
    app = perdure.App(url, clock=clock)
    ship_v2(app, [])
    live_worker(app, "old-1", "build-a", {"ship": "v1"})
    app.close()
    (tmp_path / "checkout_v2.py").write_text(APP_CODE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PERDURE_DB", url)
    monkeypatch.setenv("PERDURE_APP", "checkout_v2:app")
    yield url
    module = sys.modules.pop("checkout_v2", None)
    if module is not None:
        module.app.close()


def test_cli_versions_json_and_table(deployed: str) -> None:
    """`perdure versions --json` reports runs by version, the live worker of v1, the build it
    holds runs for, and that this checkout would leave both runs waiting at position 1; the
    table says the same."""
    result = CliRunner().invoke(cli, ["versions", "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    (line,) = data["versions"]
    assert (line["workflow"], line["version"], line["runs"], line["workers"]) == (
        "ship", "v1", 2, ["old-1"],
    )  # fmt: skip
    assert [(b["build"], b["holds"], b["drained"]) for b in data["builds"]] == [
        ("build-a", 2, False)
    ]
    checkout = data["checkout"]
    assert checkout["upgrade"] == 0 and {w["position"] for w in checkout["wait"]} == {1}
    assert checkout["summary"] == (
        "0 run(s) of other versions would upgrade, 2 would wait for a worker of their version"
    )
    table = CliRunner().invoke(cli, ["versions"], catch_exceptions=False).output
    assert "ship" in table and "old-1" in table and "holds 2 run(s)" in table
    assert "code changed at position 1: expected sleep 'sleep', found step 'insure'" in table


def test_replay_check_says_the_same_in_its_summary(deployed: str) -> None:
    """replay-check lists the divergences and ends with the versions summary line."""
    result = CliRunner().invoke(cli, ["replay-check"], catch_exceptions=False)
    assert result.exit_code == 1
    assert result.output.strip().splitlines()[-1] == (
        "versions: 0 run(s) of other versions would upgrade, 2 would wait for a worker of "
        "their version"
    )


def test_cli_worker_refuses_a_bad_build_name(deployed: str) -> None:
    """`perdure worker --build` with a name breaking the id rule: one line, exit 2."""
    result = CliRunner().invoke(cli, ["worker", "--build", "a\tb"])
    assert result.exit_code != 0
    lines = [x for x in result.output.splitlines() if x.strip() and "perdure worker:" not in x]
    assert len(lines) == 1 and "build name 'a\\x09b' has U+0009" in lines[0], result.output


def test_api_and_dashboard_versions(db_url: str, clock: TestClock) -> None:
    """GET /api/v1/versions answers the report; /ui/versions shows it; a parked run's cause
    is `version` (the perdure_runs_waiting_for_person{cause} label)."""
    from perdure.server import create_app
    from perdure.server.access import create_token

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*httpx2", category=UserWarning)
        from starlette.testclient import TestClient

    parked_under_v1(db_url, clock, n=1)
    app = perdure.App(db_url, clock=clock)
    ship_v2(app, [])
    clock.advance(61)
    TestWorker(app).run_until_idle()  # no v1 worker: it waits
    assert cause_of(app.get_run("ship-0")) == "version"
    _, token = app.runtime.sync(create_token(app, "ana", ["read"]), "token")
    with TestClient(create_app(app)) as client:
        got = client.get("/api/v1/versions", headers={"Authorization": f"Bearer {token}"})
        assert got.status_code == 200, got.text
        data = got.json()
        assert data["waiting_for_version"] == 1
        assert data["versions"][0]["statuses"] == {"needs_attention": 1}
        skipped = client.get(
            "/api/v1/versions?check=false", headers={"Authorization": f"Bearer {token}"}
        ).json()
        assert skipped["checkout"] is None
        auth = {"Authorization": f"Bearer {token}"}
        assert client.get("/api/v1/versions?check=maybe", headers=auth).status_code == 400
        login = client.get("/ui/login").text
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', login)
        assert csrf is not None
        client.post("/ui/login", data={"token": token, "csrf": csrf.group(1), "next": "/ui/runs"})
        page = client.get("/ui/versions")
        assert page.status_code == 200
        text = re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", page.text)))
        assert "1 run(s) wait for a worker of their version" in text
        assert "ship v1" in text and "code changed at position 1" in text
    app.close()
