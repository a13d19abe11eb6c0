"""Webhooks on `perdure serve`: signatures, delivery ids, body limits and the real server."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

import perdure
from perdure.cli.main import cli
from perdure.server import create_app
from perdure.testing import TestClock, TestWorker
from perdure.triggers.webhooks import Webhook, sign

with warnings.catch_warnings():  # starlette 1.x prefers httpx2 for its TestClient; httpx works
    warnings.filterwarnings("ignore", message=".*httpx2", category=UserWarning)
    from starlette.testclient import TestClient

HERE = Path(__file__).resolve().parent
SECRET = "s3cret"
PG_URL = os.environ.get("PERDURE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


def register(app: perdure.App, **options: Any) -> Webhook:
    """Register workflow `on_push` and webhook `push` (secret SECRET unless told otherwise)."""

    @app.workflow(name="on_push")
    def on_push(payload: dict[str, Any]) -> str:
        return f"{payload['repo']}@{payload['ref']}"

    options.setdefault("secret", SECRET)
    hook: Webhook = app.webhook("push", on_push, **options)
    return hook


def post(
    client: TestClient | httpx.Client,
    body: bytes,
    *,
    delivery: str | None = "d-1",
    secret: str = SECRET,
    signature: str | None = None,
    path: str = "/hooks/push",
) -> httpx.Response:
    """POST `body` signed with `secret` (or with the literal `signature`) as delivery `delivery`."""
    headers = {"Content-Type": "application/json"}
    headers["X-Perdure-Signature"] = signature if signature is not None else sign(secret, body)
    if delivery is not None:
        headers["X-Perdure-Delivery"] = delivery
    return client.post(path, content=body, headers=headers)


PUSH = json.dumps({"repo": "perdure", "ref": "main"}).encode()


@pytest.fixture
def client(app: perdure.App) -> Iterator[TestClient]:
    """The server for `app` (webhook `push` registered), in process."""
    register(app)
    with TestClient(create_app(app)) as test_client:
        yield test_client


def test_valid_delivery_starts_the_run_with_the_payload(
    app: perdure.App, client: TestClient
) -> None:
    """A signed delivery answers 202 with the run id; a worker runs the workflow on the body."""
    response = post(client, PUSH, delivery="d-1")
    assert response.status_code == 202, response.text
    assert response.json() == {"run_id": "hook:push:d-1", "duplicate": False}
    assert app.get_run("hook:push:d-1").workflow == "on_push"
    TestWorker(app).run_until_idle()
    assert app.handle("hook:push:d-1").result(timeout=5) == "perdure@main"


def test_bad_signature_is_refused_and_starts_nothing(app: perdure.App, client: TestClient) -> None:
    """A body signed with another secret answers 401 and no run exists."""
    response = post(client, PUSH, secret="not-the-secret")
    assert response.status_code == 401
    assert "X-Perdure-Signature" in response.json()["error"]
    assert app.list_runs() == []


def test_missing_or_malformed_signature_is_refused(app: perdure.App, client: TestClient) -> None:
    """No signature header, or one not in `sha256=<hex>` form, answers 401."""
    for signature in ("", "sha1=abc", sign(SECRET, PUSH).removeprefix("sha256=")):
        assert post(client, PUSH, signature=signature).status_code == 401, signature
    assert app.list_runs() == []


def test_signature_of_another_body_is_refused(app: perdure.App, client: TestClient) -> None:
    """A valid signature for a different body (a tampered payload) answers 401."""
    tampered = json.dumps({"repo": "perdure", "ref": "evil"}).encode()
    response = post(client, tampered, signature=sign(SECRET, PUSH))
    assert response.status_code == 401
    assert app.list_runs() == []


def test_replayed_delivery_id_starts_nothing_new(app: perdure.App, client: TestClient) -> None:
    """The same delivery id again answers 202 with the same run id, `duplicate`, one run."""
    first = post(client, PUSH, delivery="d-7")
    other_body = json.dumps({"repo": "perdure", "ref": "other"}).encode()
    again = post(client, other_body, delivery="d-7")
    assert first.status_code == again.status_code == 202
    assert first.json() == {"run_id": "hook:push:d-7", "duplicate": False}
    assert again.json() == {"run_id": "hook:push:d-7", "duplicate": True}
    assert [run.id for run in app.list_runs()] == ["hook:push:d-7"]
    TestWorker(app).run_until_idle()
    assert app.handle("hook:push:d-7").result(timeout=5) == "perdure@main"  # the first body


def test_oversized_body_is_refused(app: perdure.App) -> None:
    """A body over max_body answers 413, whether Content-Length says so or not, and starts
    nothing."""
    register(app, max_body=32)
    big = json.dumps({"repo": "perdure", "ref": "x" * 40}).encode()
    with TestClient(create_app(app)) as client:
        declared = post(client, big)
        streamed = client.post(  # chunked: no Content-Length, counted while read
            "/hooks/push",
            content=iter([big[:20], big[20:]]),
            headers={"X-Perdure-Signature": sign(SECRET, big), "X-Perdure-Delivery": "d-2"},
        )
        small = post(client, b"{}", delivery="d-3")
    assert declared.status_code == 413 and "32" in declared.json()["error"]
    assert streamed.status_code == 413
    assert small.status_code == 202  # the limit is on size, not on the hook
    assert [run.id for run in app.list_runs()] == ["hook:push:d-3"]


def test_oversized_body_is_not_read_to_the_end(app: perdure.App) -> None:
    """Without a Content-Length, reading stops at the first chunk past max_body."""
    register(app, max_body=250)
    server = create_app(app)
    chunks = [b"x" * 100] * 10
    received: list[int] = []
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        received.append(1)
        index = len(received) - 1
        return {"type": "http.request", "body": chunks[index], "more_body": index < 9}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/hooks/push",
        "raw_path": b"/hooks/push",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"x-perdure-delivery", b"d-9"), (b"x-perdure-signature", b"sha256=00")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    asyncio.run(server(scope, receive, send))  # type: ignore[arg-type]
    assert sent[0]["status"] == 413
    assert len(received) == 3
    assert app.list_runs() == []


def test_malformed_body_is_refused(app: perdure.App, client: TestClient) -> None:
    """A signed body that is not JSON (or not UTF-8) answers 400 with a one-line reason."""
    for body in (b"{not json", b"\xff\xfe"):
        response = post(client, body)
        assert response.status_code == 400, body
        assert "not JSON" in response.json()["error"] and "\n" not in response.json()["error"]
    assert app.list_runs() == []


def test_payload_not_fitting_the_workflow_is_refused(app: perdure.App) -> None:
    """A JSON body the workflow's argument type rejects answers 400 and starts nothing."""

    @app.workflow(name="count")
    def count(n: int) -> int:
        return n

    app.webhook("count", count, secret=SECRET)
    with TestClient(create_app(app)) as client:
        refused = post(client, b'{"n": "many"}', path="/hooks/count")
        accepted = post(client, b"3", path="/hooks/count", delivery="d-2")
    assert refused.status_code == 400 and "count" in refused.json()["error"]
    assert accepted.status_code == 202
    assert [run.id for run in app.list_runs()] == ["hook:count:d-2"]


def test_delivery_id_is_required_and_checked(app: perdure.App, client: TestClient) -> None:
    """No delivery id, or one with spaces, control characters or over 200 characters: 400."""
    for delivery in (None, "has space", "x" * 201, "tab\there"):
        response = post(client, PUSH, delivery=delivery)
        assert response.status_code == 400, delivery
        assert "X-Perdure-Delivery" in response.json()["error"]
    assert app.list_runs() == []
    assert post(client, PUSH, delivery="x" * 200).status_code == 202


def test_unknown_hook_wrong_method_and_healthz(app: perdure.App, client: TestClient) -> None:
    """An unknown hook is 404, GET on a hook 405 (JSON, with Allow), /healthz answers ok."""
    unknown = post(client, PUSH, path="/hooks/nope")
    assert unknown.status_code == 404 and "nope" in unknown.json()["error"]
    wrong = client.get("/hooks/push")
    assert wrong.status_code == 405 and "error" in wrong.json()
    assert wrong.headers["allow"] == "POST"
    assert client.get("/healthz").json() == {"ok": True}
    assert client.get("/elsewhere").status_code == 404
    assert app.list_runs() == []


def test_secret_from_the_environment(
    app: perdure.App, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """secret_env is read per request: set, deliveries verify; unset, 500 naming nothing
    to the sender and the variable in the server log."""
    register(app, secret=None, secret_env="PUSH_HOOK_SECRET")
    monkeypatch.delenv("PUSH_HOOK_SECRET", raising=False)
    with TestClient(create_app(app)) as client:
        with caplog.at_level(logging.ERROR, logger="perdure.server"):
            unset = post(client, PUSH, secret="")
        monkeypatch.setenv("PUSH_HOOK_SECRET", "from-env")
        wrong = post(client, PUSH, secret=SECRET, delivery="d-2")
        right = post(client, PUSH, secret="from-env", delivery="d-3")
    assert unset.status_code == 500 and "PUSH_HOOK_SECRET" not in unset.text
    assert "PUSH_HOOK_SECRET" in caplog.text
    assert wrong.status_code == 401
    assert right.status_code == 202
    assert [run.id for run in app.list_runs()] == ["hook:push:d-3"]


def test_registration_refuses_hooks_that_cannot_work(app: perdure.App) -> None:
    """No secret, two secrets, a bad name or a workflow not taking one argument: ConfigError."""

    @app.workflow(name="two")
    def two(a: int, b: int) -> int:
        return a + b

    @app.workflow(name="one")
    def one(payload: Any) -> None:
        return None

    with pytest.raises(perdure.ConfigError, match="unsigned webhooks are refused"):
        app.webhook("open", one)
    with pytest.raises(perdure.ConfigError, match="exactly one"):
        app.webhook("both", one, secret="a", secret_env="B")
    with pytest.raises(perdure.ConfigError, match="URL path segment"):
        app.webhook("a/b", one, secret="a")
    with pytest.raises(perdure.ConfigError, match="one argument"):
        app.webhook("sum", two, secret="a")
    app.webhook("fine", one, secret="a")
    with pytest.raises(perdure.ConfigError, match="two webhooks"):
        app.webhook("fine", one, secret="b")
    assert list(app.webhooks) == ["fine"]


def test_serve_refuses_a_hook_whose_secret_is_unset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`perdure serve` checks every hook before it listens: an unset secret is one line, exit 2."""
    monkeypatch.syspath_prepend(str(HERE))
    monkeypatch.delenv("HOOK_SECRET", raising=False)
    monkeypatch.setenv("PERDURE_DB", f"sqlite:///{tmp_path}/serve.db")
    sys.modules.pop("hooks_app", None)
    try:
        result = CliRunner().invoke(cli, ["--app", "hooks_app:app", "serve"])
    finally:
        module = sys.modules.pop("hooks_app", None)
        if module is not None:
            module.app.close()
    assert result.exit_code == 2
    assert "HOOK_SECRET is not set" in result.output


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_perdure_serve_answers_and_stops_on_sigterm(tmp_path: Path) -> None:
    """The real `perdure serve` (uvicorn) starts a run for a signed POST and exits 0 on SIGTERM."""
    port = free_port()
    db = f"sqlite:///{tmp_path}/serve.db"
    env = {**os.environ, "PERDURE_DB": db, "HOOK_SECRET": SECRET, "PYTHONUNBUFFERED": "1"}
    log = (tmp_path / "serve.log").open("wb")
    args = ["--app", "hooks_app:app", "serve", "--port", str(port)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "perdure", *args], cwd=HERE, env=env, stdout=log, stderr=log
    )
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
            deadline = time.monotonic() + 20
            while True:
                try:
                    if http.get("/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert proc.poll() is None, (tmp_path / "serve.log").read_text()
                assert time.monotonic() < deadline, "perdure serve did not come up"
                time.sleep(0.05)
            response = post(http, b'{"ref": "main"}', delivery="gh-1")
            assert response.status_code == 202, response.text
            assert response.json() == {"run_id": "hook:push:gh-1", "duplicate": False}
            assert post(http, b'{"ref": "main"}', secret="bad").status_code == 401
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0, (tmp_path / "serve.log").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    reader = perdure.App(db)
    try:
        runs = reader.list_runs()
        assert [(run.id, run.workflow, run.status) for run in runs] == [
            ("hook:push:gh-1", "on_push", "pending")
        ]
    finally:
        reader.close()


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh schema on the machine's PostgreSQL, dropped afterwards."""
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:12]}"
    yield f"{PG_URL}?schema={schema}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.mark.postgres
def test_valid_and_replayed_delivery_on_postgres(pg_url: str) -> None:
    """On PostgreSQL too: a delivery starts one run, its replay is a duplicate, a worker runs it."""
    app = perdure.App(pg_url, clock=TestClock())
    try:
        register(app)
        with TestClient(create_app(app)) as client:
            first = post(client, PUSH, delivery="pg-1")
            again = post(client, PUSH, delivery="pg-1")
            refused = post(client, PUSH, delivery="pg-2", secret="bad")
        assert first.status_code == again.status_code == 202
        assert first.json() == {"run_id": "hook:push:pg-1", "duplicate": False}
        assert again.json() == {"run_id": "hook:push:pg-1", "duplicate": True}
        assert refused.status_code == 401
        assert [run.id for run in app.list_runs()] == ["hook:push:pg-1"]
        TestWorker(app).run_until_idle()
        assert app.handle("hook:push:pg-1").result(timeout=5) == "perdure@main"
    finally:
        app.close()


def test_a_body_nested_thousands_deep_is_400_not_500(app: perdure.App, client: TestClient) -> None:
    """JSON nested 100,000 deep (signed, so it is parsed) is the sender's fault: one line."""
    deep = b"[" * 100_000 + b"]" * 100_000
    response = post(client, deep, delivery="d-deep")
    assert response.status_code == 400 and "nested too deeply" in response.json()["error"]
    assert app.list_runs() == []
