"""The metrics of a real `perdure serve` (GET /metrics) and of a real `perdure worker
--metrics-port`: a token with the `read` scope, or --metrics-public; the same errors from both."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import pytest
from served import Served, start

from perdure import App
from perdure.server.access import digest
from perdure.server.access_sql import Access

KINDS = ["serve", "worker"]
Scraped = Callable[..., AbstractContextManager[Served]]


@pytest.fixture(params=KINDS)
def scraped_with(request: pytest.FixtureRequest, tmp_path: Path) -> Scraped:
    """`perdure serve` or `perdure worker --metrics-port P`, with extra options, stopped when
    the block ends (a token per scope made first)."""
    kind: str = request.param

    def made(*options: str) -> AbstractContextManager[Served]:
        if kind == "serve":
            return contextmanager(start)(tmp_path, ["serve", *options], "/healthz")
        return contextmanager(start)(
            tmp_path, ["worker", *options], "/metrics", port_option="--metrics-port"
        )

    return made


@pytest.fixture
def scraped(scraped_with: Scraped) -> Iterator[Served]:
    with scraped_with() as served:
        yield served


def test_metrics_without_a_valid_token_are_refused(scraped: Served) -> None:
    with scraped.client() as http:
        bare = http.get("/metrics")
        wrong = http.get("/metrics", headers={"Authorization": "Bearer pdr_not-a-token"})
    for response in (bare, wrong):
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == "Bearer"
        assert "\n" not in response.text.strip()
        assert "perdure token create" in response.json()["error"]
        assert "--metrics-public" in response.json()["error"]
        assert "perdure_runs" not in response.text


def test_metrics_need_the_read_scope(scraped: Served) -> None:
    """A token whose scopes do not include `read` (none at all here, as a hand-edited or newer
    store could hold) is refused 403, naming the scope."""
    token = "pdr_no-scopes-at-all"
    store = App(scraped.db)
    try:
        store.runtime.sync(store.runtime.open_store(), "")
        store.runtime.sync(
            Access(store.runtime.store).add_token("noscope", "sec-none", digest(token), "", 0.0), ""
        )
    finally:
        store.close()
    with scraped.client() as http:
        response = http.get("/metrics", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 403
    assert "'read' scope" in response.json()["error"]


def test_metrics_with_a_read_token(scraped: Served) -> None:
    with scraped.client("read") as http:
        response = http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    assert 'perdure_runs{status="pending"} 0.0' in response.text
    assert "perdure_store_up 1.0" in response.text


def test_wrong_tokens_are_held_back_but_the_real_one_passes(scraped: Served) -> None:
    """After 20 wrong tokens from one address: 429 with Retry-After; the read token that
    worked before still goes through."""
    with scraped.client() as http:
        assert http.get("/metrics", headers={"Authorization": f"Bearer {scraped.tokens['read']}"}
                        ).status_code == 200  # fmt: skip
        codes = [
            http.get("/metrics", headers={"Authorization": f"Bearer pdr_guess-{i}"}).status_code
            for i in range(22)
        ]
        held = http.get("/metrics", headers={"Authorization": "Bearer pdr_guess-last"})
        real = http.get("/metrics", headers={"Authorization": f"Bearer {scraped.tokens['read']}"})
    assert codes[:20] == [401] * 20 and codes[20:] == [429] * 2, codes
    assert held.status_code == 429 and int(held.headers["retry-after"]) >= 1
    assert real.status_code == 200


def test_metrics_public_needs_no_token(scraped_with: Scraped) -> None:
    with scraped_with("--metrics-public") as served, served.client() as http:
        response = http.get("/metrics")
        api = http.get("/api/v1/runs")
    assert response.status_code == 200
    assert "perdure_store_up 1.0" in response.text
    assert api.status_code in (401, 404)  # only /metrics is public (a worker serves no more)


@pytest.mark.slow
def test_half_open_connections_to_a_workers_metrics_are_dropped(tmp_path: Path) -> None:
    """Issue 35 §11: 50 connections to `perdure worker --metrics-port` that send half a
    request line are closed by the worker within its scrape timeout (10 s; they used to hold
    a thread each for ever), and a scrape is answered afterwards."""
    import socket

    from perdure.observe.metrics import SCRAPE_TIMEOUT

    with contextmanager(start)(
        tmp_path, ["worker"], "/metrics", port_option="--metrics-port"
    ) as served:
        held = [socket.create_connection(("127.0.0.1", served.port), timeout=SCRAPE_TIMEOUT * 3)
                for _ in range(50)]  # fmt: skip
        try:
            for sock in held:
                sock.sendall(b"GET /metr")
            closed = [sock.recv(1024) for sock in held]  # b"" once the worker closes it
        finally:
            for sock in held:
                sock.close()
        with served.client("read") as http:
            assert http.get("/metrics").status_code == 200
        assert "Traceback" not in served.output()
    assert all(answer in (b"",) or answer.startswith(b"HTTP/1.") for answer in closed)
