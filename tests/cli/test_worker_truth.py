"""One truth about workers and runs, shown by real `perdure worker` processes: an idle live
worker, a run handed back by SIGTERM, and a worker killed with -9 read the same in
`perdure workers`, `perdure ls`, `top --once`, the API and the dashboard."""

from __future__ import annotations

import re
import signal
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from module_files import load_file
from perdure.cli.main import cli
from perdure.server.access import create_token

pytest.importorskip("starlette")
pytest.importorskip("rich")


@pytest.fixture
def shop(tmp_path: Path) -> Iterator[Any]:
    """The stop_app shop (tests/chaos) on a fresh SQLite store; its workers killed after."""
    path = Path(__file__).resolve().parents[1] / "chaos" / "shop.py"
    made = load_file("perdure_test_shop", path).Shop(f"sqlite:///{tmp_path}/shop.db", tmp_path)
    try:
        yield made
    finally:
        made.reap()


def views(shop: Any, client: Any) -> dict[str, str]:
    """What each view says now: `workers`, `ls`, `top --once`, the dashboard's Workers page."""
    said = {}
    for name, args in (("workers", ["workers"]), ("ls", ["ls"]), ("top", ["top", "--once"])):
        result = CliRunner().invoke(cli, ["--db", shop.url, *args])
        assert result.exit_code == 0, result.output
        said[name] = result.output
    said["page"] = re.sub(r"<[^>]+>", " ", client.get("/ui/workers").text)
    return said


def test_idle_handed_back_and_killed_read_the_same_everywhere(shop: Any) -> None:
    """An idle worker is `alive (idle)` in every view; a run its SIGTERM handed back is
    `claimable` in ls (and `ls --status claimable`, not `--status running`), the API and the
    dashboard; the stopped worker is
    stopped; a worker killed with -9 is dead with the proof in every view."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*httpx2", category=UserWarning)
        from starlette.testclient import TestClient
    from perdure.server import create_app

    app = shop.app
    _, token = app.runtime.sync(create_token(app, "ana", ["read"]), "token")
    with TestClient(create_app(app)) as client:
        csrf = re.search(r'name="csrf" value="([^"]+)"', client.get("/ui/login").text)
        assert csrf is not None
        signed = client.post("/ui/login", data={"token": token, "csrf": csrf[1], "next": "/ui"},
                             follow_redirects=False)  # fmt: skip
        assert signed.status_code == 303
        api = {"Authorization": f"Bearer {token}"}

        first = shop.spawn(grace=10, worker_id="first")
        first.wait_ready()
        said = views(shop, client)
        assert re.search(r"^first .* alive \(idle\)$", said["workers"], re.M), said["workers"]
        assert re.search(r"first\s+alive \(idle\)", said["top"]), said["top"]
        assert "first" in said["page"] and "alive (idle)" in said["page"]
        [listed] = client.get("/api/v1/workers", headers=api).json()["workers"]
        assert (listed["id"], listed["state"], listed["busy"]) == ("first", "alive", False)

        run_id = app.start("risky", 1.0, 0.0).id  # prepare takes 1 s, then charge
        shop.wait_started("prepare")
        first.signal(signal.SIGTERM)
        code, _ = first.wait()
        assert code == 0
        run = app.get_run(run_id)
        assert run.status == "running" and not run.lease_until  # handed back, not finished
        said = views(shop, client)
        assert re.search(rf"^{run_id}\s+risky\s+claimable ", said["ls"], re.M), said["ls"]
        assert re.search(r"^first .* stopped \d{4}-", said["workers"], re.M)
        only = CliRunner().invoke(cli, ["--db", shop.url, "ls", "--status", "claimable"])
        assert run_id in only.output
        running = CliRunner().invoke(cli, ["--db", shop.url, "ls", "--status", "running"])
        assert running.output.strip() == "no runs"
        assert "Claimable" in said["page"] and run_id in said["page"]
        assert client.get(f"/api/v1/runs/{run_id}", headers=api).json()["claimable"] is True
        page = client.get(f"/ui/runs/{run_id}").text
        assert re.search(r'id="run-status">claimable<', page)

        second = shop.spawn(grace=10, worker_id="second")
        second.wait_ready()
        assert app.handle(run_id).result(timeout=20) == "receipt"  # the next worker took it
        second.signal(signal.SIGKILL)
        second.wait()
        proof = f"dead: process {second.pid} is gone on this host"
        said = views(shop, client)
        assert re.search(rf"^second .* {proof}", said["workers"], re.M), said["workers"]
        assert proof in said["top"] and proof in said["page"]
        states = {w["id"]: w for w in client.get("/api/v1/workers", headers=api).json()["workers"]}
        assert states["second"]["state"] == "dead" and states["first"]["state"] == "stopped"
        assert states["second"]["label"].startswith(proof)
