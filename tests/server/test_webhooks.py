"""Webhooks on `perdure serve`: both signature schemes, the timestamp tolerance, delivery ids,
body limits and the real server."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from extras_needed import needs

pytest.importorskip("starlette", reason=needs("server"))

import httpx
from click.testing import CliRunner

import perdure
from local_servers import free_port
from perdure.cli.main import cli
from perdure.server import create_app
from perdure.testing import TestClock, TestWorker
from perdure.triggers.webhooks import Webhook, sign, sign_standard, standard_headers

with warnings.catch_warnings():  # starlette 1.x prefers httpx2 for its TestClient; httpx works
    warnings.filterwarnings("ignore", message=".*httpx2", category=UserWarning)
    from starlette.testclient import TestClient

HERE = Path(__file__).resolve().parent
SECRET = "s3cret"


def register(app: perdure.App, **options: Any) -> Webhook:
    """Register workflow `on_push` and webhook `push` (secret SECRET unless told otherwise)."""

    @app.workflow(name="on_push")
    def on_push(payload: dict[str, Any]) -> str:
        return f"{payload['repo']}@{payload['ref']}"

    options.setdefault("secret", SECRET)
    hook: Webhook = app.webhook("push", on_push, **options)
    return hook


def now_of(client: TestClient | httpx.Client) -> int:
    """The server's time: its app's (driven) clock in process, the wall clock otherwise."""
    if isinstance(client, TestClient):
        app: perdure.App = client.app.state.perdure  # type: ignore[attr-defined]
        return int(app.clock.now())
    return int(time.time())


def post(
    client: TestClient | httpx.Client,
    body: bytes,
    *,
    delivery: str | None = "d-1",
    secret: str | list[str] = SECRET,
    signature: str | None = None,
    timestamp: int | None = None,
    path: str = "/hooks/push",
) -> httpx.Response:
    """POST `body` as Standard Webhooks delivery `delivery`, signed with `secret` (or
    carrying the literal `signature`) at `timestamp` (default: the server's now)."""
    when = now_of(client) if timestamp is None else timestamp
    headers = {"Content-Type": "application/json"}
    headers.update(standard_headers(secret, body, delivery_id=delivery or "", timestamp=when))
    if signature is not None:
        headers["webhook-signature"] = signature
    if delivery is None:
        del headers["webhook-id"]
    return client.post(path, content=body, headers=headers)


def post_body_signed(
    client: TestClient | httpx.Client,
    body: bytes,
    *,
    delivery: str | None = "d-1",
    secret: str = SECRET,
    path: str = "/hooks/push",
) -> httpx.Response:
    """POST `body` GitHub-style: `X-Perdure-Signature: sha256=<hex>`, `X-Perdure-Delivery`."""
    headers = {"Content-Type": "application/json", "X-Perdure-Signature": sign(secret, body)}
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
    assert "no webhook-signature entry matches" in response.json()["error"]
    assert app.list_runs() == []


def test_missing_or_malformed_signature_is_refused(app: perdure.App, client: TestClient) -> None:
    """No signature, one of another version or not base64, or a body-only `sha256=` one: 401."""
    good = sign_standard(SECRET, "d-1", now_of(client), PUSH)
    for signature in ("", "v2," + good[3:], "v1,not*base64", good[3:], sign(SECRET, PUSH)):
        assert post(client, PUSH, signature=signature).status_code == 401, signature
    assert app.list_runs() == []


def test_signature_of_another_body_is_refused(app: perdure.App, client: TestClient) -> None:
    """A valid signature for a different body (a tampered payload) answers 401."""
    tampered = json.dumps({"repo": "perdure", "ref": "evil"}).encode()
    response = post(client, tampered, signature=sign_standard(SECRET, "d-1", now_of(client), PUSH))
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
            headers=standard_headers(SECRET, big, delivery_id="d-2", timestamp=now_of(client)),
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
    """No delivery id, or one with spaces, control characters, a '.' (which could shift the
    signed `id.timestamp`) or over 200 characters, even signed: 400."""
    for delivery in (None, "has space", "x" * 201, "tab\there", "a.b"):
        response = post(client, PUSH, delivery=delivery)
        assert response.status_code == 400, delivery
        assert "webhook-id" in response.json()["error"]
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
    assert list(app.runtime.triggers.of(Webhook)) == ["fine"]


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


# -- the standard scheme: id and timestamp signed, a tolerance, key rotation, whsec_ secrets --

# The published Standard Webhooks test vector: matching it is what lets any of the spec's
# sender libraries deliver to perdure unchanged.
VECTOR_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
VECTOR = ("msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, b'{"test": 2432232314}')
VECTOR_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_signing_matches_the_standard_webhooks_test_vector() -> None:
    """`sign_standard` with a `whsec_` secret gives the spec's published signature."""
    assert sign_standard(VECTOR_SECRET, *VECTOR) == VECTOR_SIGNATURE


def test_the_test_vector_is_accepted_at_its_time(clock: TestClock, app: perdure.App) -> None:
    """The spec's vector delivery (whsec_ secret, its headers, its body) starts a run when the
    server's clock is at its timestamp."""

    @app.workflow(name="vector")
    def vector(payload: dict[str, int]) -> int:
        return payload["test"]

    app.webhook("vector", vector, secret=VECTOR_SECRET)
    delivery_id, stamp, body = VECTOR
    clock.set(datetime.fromtimestamp(stamp + 10, UTC))  # the vector was signed in 2021
    headers = {"webhook-id": delivery_id, "webhook-timestamp": str(stamp)}
    with TestClient(create_app(app)) as client:
        response = client.post(
            "/hooks/vector",
            content=body,
            headers={**headers, "webhook-signature": VECTOR_SIGNATURE},
        )
    assert response.status_code == 202, response.text
    assert response.json()["run_id"] == f"hook:vector:{delivery_id}"


def test_a_captured_delivery_under_a_new_id_is_refused(
    app: perdure.App, client: TestClient
) -> None:
    """The id is signed: the same body and signature with another `webhook-id` answer 401
    and start nothing; the original id still answers 202."""
    headers = standard_headers(SECRET, PUSH, delivery_id="d-1", timestamp=now_of(client))
    replayed = client.post("/hooks/push", content=PUSH, headers={**headers, "webhook-id": "d-2"})
    assert replayed.status_code == 401
    assert "no webhook-signature entry matches" in replayed.json()["error"]
    assert app.list_runs() == []
    assert client.post("/hooks/push", content=PUSH, headers=headers).status_code == 202
    assert [run.id for run in app.list_runs()] == ["hook:push:d-1"]


def test_the_same_delivery_id_is_one_run_across_retries(
    clock: TestClock, app: perdure.App, client: TestClient
) -> None:
    """A sender retrying one event re-signs it with a new timestamp: same id, same run,
    `duplicate`; and a captured copy resent as is inside the window is a duplicate too."""
    first = post(client, PUSH, delivery="evt-1")
    clock.advance(120)
    retried = post(client, PUSH, delivery="evt-1")
    assert first.json() == {"run_id": "hook:push:evt-1", "duplicate": False}
    assert retried.status_code == 202
    assert retried.json() == {"run_id": "hook:push:evt-1", "duplicate": True}
    assert [run.id for run in app.list_runs()] == ["hook:push:evt-1"]


def test_a_stale_or_future_timestamp_is_refused(
    clock: TestClock, app: perdure.App, client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    """Against the server's clock, a correctly signed timestamp more than 300 s old or ahead
    answers 401 naming the check; 299 s either way is accepted."""
    now = now_of(client)
    with caplog.at_level(logging.WARNING, logger="perdure.server"):
        old = post(client, PUSH, delivery="old", timestamp=now - 301)
        ahead = post(client, PUSH, delivery="ahead", timestamp=now + 301)
    assert old.status_code == ahead.status_code == 401
    assert "webhook-timestamp is 301 s old" in old.json()["error"]
    assert "301 s in the future" in ahead.json()["error"]
    assert "300 s tolerance" in old.json()["error"]
    assert "refused: webhook-timestamp" in caplog.text  # the operator sees replays too
    assert app.list_runs() == []
    assert post(client, PUSH, delivery="late", timestamp=now - 299).status_code == 202
    assert post(client, PUSH, delivery="early", timestamp=now + 299).status_code == 202


def test_a_captured_delivery_is_refused_once_the_window_passed(
    clock: TestClock, app: perdure.App, client: TestClient
) -> None:
    """The same request bytes that started a run answer 401 once the server's clock moved
    past the tolerance (by then the id cannot be changed, and the time cannot be either)."""
    headers = standard_headers(SECRET, PUSH, delivery_id="d-1", timestamp=now_of(client))
    assert client.post("/hooks/push", content=PUSH, headers=headers).status_code == 202
    clock.advance(301)
    late = client.post("/hooks/push", content=PUSH, headers=headers)
    assert late.status_code == 401 and "old" in late.json()["error"]


def test_the_tolerance_is_per_hook(clock: TestClock, app: perdure.App) -> None:
    """tolerance=30: 31 s old is refused, 30 s accepted."""
    register(app, tolerance=30)
    with TestClient(create_app(app)) as client:
        now = now_of(client)
        refused = post(client, PUSH, delivery="a", timestamp=now - 31)
        accepted = post(client, PUSH, delivery="b", timestamp=now - 30)
    assert refused.status_code == 401 and "30 s tolerance" in refused.json()["error"]
    assert accepted.status_code == 202


def test_a_malformed_or_missing_timestamp_is_400(app: perdure.App, client: TestClient) -> None:
    """A `webhook-timestamp` that is not unix seconds (even signed as sent) answers 400."""
    for stamp in ("", "soon", "1767225600.5", "-5", "9" * 16):
        headers = standard_headers(SECRET, PUSH, delivery_id="d-1", timestamp=0)
        headers["webhook-timestamp"] = stamp
        response = client.post("/hooks/push", content=PUSH, headers=headers)
        assert response.status_code == 400, stamp
        assert "webhook-timestamp" in response.json()["error"]
    assert app.list_runs() == []


def test_any_one_of_several_signatures_may_match(app: perdure.App, client: TestClient) -> None:
    """Key rotation: a sender signing with its old and new key (either order), or sending an
    entry of an unknown version first, is accepted; only wrong entries are refused."""
    assert post(client, PUSH, delivery="r-1", secret=["old-secret", SECRET]).status_code == 202
    assert post(client, PUSH, delivery="r-2", secret=[SECRET, "old-secret"]).status_code == 202
    now = now_of(client)
    good = sign_standard(SECRET, "r-3", now, PUSH)
    mixed = f"v1a,c29tZQ== v1,bm90LWl0 {good}"
    assert post(client, PUSH, delivery="r-3", signature=mixed).status_code == 202
    wrong = post(client, PUSH, delivery="r-4", secret=["old-secret", "older-secret"])
    assert wrong.status_code == 401
    assert sorted(run.id for run in app.list_runs()) == [
        "hook:push:r-1", "hook:push:r-2", "hook:push:r-3"
    ]  # fmt: skip


def test_a_whsec_secret_is_base64_decoded(app: perdure.App) -> None:
    """secret='whsec_<base64>': senders sign with the decoded bytes (as the spec's libraries
    do); an HMAC keyed with the literal text is refused."""
    raw = b"\x00\x01binary-key-bytes\xff"
    register(app, secret="whsec_" + base64.b64encode(raw).decode())
    with TestClient(create_app(app)) as client:
        with_bytes = client.post(
            "/hooks/push",
            content=PUSH,
            headers=standard_headers(raw, PUSH, delivery_id="w-1", timestamp=now_of(client)),
        )
        literal = "whsec_" + base64.b64encode(raw).decode()
        with_text = post(client, PUSH, delivery="w-2", secret=literal)
        signed_text = sign_standard(literal.encode(), "w-3", now_of(client), PUSH)  # as bytes
        with_literal = post(client, PUSH, delivery="w-3", signature=signed_text)
    assert with_bytes.status_code == 202, with_bytes.text
    assert with_text.status_code == 202  # standard_headers decodes whsec_ the same way
    assert with_literal.status_code == 401
    with pytest.raises(perdure.ConfigError, match="whsec_ secret must be base64"):
        app.webhook("bad", "on_push", secret="whsec_not*base64")


def test_a_malformed_whsec_secret_in_the_environment_is_500(
    app: perdure.App, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A `whsec_` value in secret_env that does not decode is the server's fault: 500, the
    variable named in the log, nothing started."""
    register(app, secret=None, secret_env="PUSH_HOOK_SECRET")
    monkeypatch.setenv("PUSH_HOOK_SECRET", "whsec_***")
    with (
        TestClient(create_app(app)) as client,
        caplog.at_level(logging.ERROR, logger="perdure.server"),
    ):
        response = post(client, PUSH)
    assert response.status_code == 500
    assert "PUSH_HOOK_SECRET: a whsec_ secret must be base64" in caplog.text
    assert app.list_runs() == []


def test_a_body_only_sender_at_a_standard_hook_is_told_the_fix(
    app: perdure.App, client: TestClient
) -> None:
    """An old-style `X-Perdure-Signature: sha256=` delivery at a standard hook answers 401 in
    one line naming `scheme='body'`."""
    response = post_body_signed(client, PUSH)
    assert response.status_code == 401
    error = response.json()["error"]
    assert "missing webhook-signature" in error and "scheme='body'" in error
    assert "\n" not in error
    assert app.list_runs() == []


# -- the body scheme: GitHub-style, the delivery id unsigned ---------------------------------


def test_the_body_scheme_checks_the_body_hmac_only(app: perdure.App) -> None:
    """scheme='body' with GitHub's headers: a valid `sha256=` delivery starts a run, the same
    id is a duplicate, a wrong signature is 401, and (as documented) the same body and
    signature under a new id verify and start a second run; no timestamp is read."""
    register(app, scheme="body", signature_header="X-Hub-Signature-256",
             delivery_header="X-GitHub-Delivery")  # fmt: skip
    signature = sign(SECRET, PUSH)

    def deliver(delivery: str, signed: str = signature) -> httpx.Response:
        headers = {"X-Hub-Signature-256": signed, "X-GitHub-Delivery": delivery}
        return client.post("/hooks/push", content=PUSH, headers=headers)

    with TestClient(create_app(app)) as client:
        first = deliver("gh-1")
        again = deliver("gh-1")
        other_id = deliver("gh-2")  # the replay the standard scheme refuses
        wrong = deliver("gh-3", sign("other", PUSH))
        no_id = client.post("/hooks/push", content=PUSH, headers={"X-Hub-Signature-256": signature})
    assert first.json() == {"run_id": "hook:push:gh-1", "duplicate": False}
    assert again.json() == {"run_id": "hook:push:gh-1", "duplicate": True}
    assert other_id.json() == {"run_id": "hook:push:gh-2", "duplicate": False}
    assert wrong.status_code == 401 and "X-Hub-Signature-256" in wrong.json()["error"]
    assert no_id.status_code == 400 and "X-GitHub-Delivery" in no_id.json()["error"]
    assert sorted(run.id for run in app.list_runs()) == ["hook:push:gh-1", "hook:push:gh-2"]


def test_the_body_scheme_defaults_to_the_perdure_headers(app: perdure.App) -> None:
    """scheme='body' alone reads `X-Perdure-Signature` and `X-Perdure-Delivery`, as hooks did
    before the standard scheme (existing senders keep working with that one option)."""
    register(app, scheme="body")
    with TestClient(create_app(app)) as client:
        response = post_body_signed(client, PUSH, delivery="old-1")
    assert response.json() == {"run_id": "hook:push:old-1", "duplicate": False}


def test_registration_refuses_options_of_the_other_scheme(app: perdure.App) -> None:
    """Header names without scheme='body', a tolerance with it, a bad tolerance or an unknown
    scheme: one-line ConfigError naming the fix; nothing registered."""

    @app.workflow(name="one")
    def one(payload: Any) -> None:
        return None

    with pytest.raises(perdure.ConfigError, match="pass scheme='body' to keep them"):
        app.webhook("gh", one, secret="a", signature_header="X-Hub-Signature-256")
    with pytest.raises(perdure.ConfigError, match="tolerance needs a signed timestamp"):
        app.webhook("gh", one, secret="a", scheme="body", tolerance=60)
    for tolerance in (0, -1, float("inf"), float("nan")):
        with pytest.raises(perdure.ConfigError, match="positive number of seconds"):
            app.webhook("gh", one, secret="a", tolerance=tolerance)
    with pytest.raises(perdure.ConfigError, match="use 'standard'"):
        app.webhook("gh", one, secret="a", scheme="hmac")  # type: ignore[arg-type]
    assert list(app.runtime.triggers.of(Webhook)) == []
