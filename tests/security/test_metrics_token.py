"""GET /metrics of a real `perdure serve`: a token with the `read` scope, or --metrics-public."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

from served import Served

from perdure import App
from perdure.server.access import digest


def test_metrics_without_a_valid_token_are_refused(serve: Served) -> None:
    with serve.client() as http:
        bare = http.get("/metrics")
        wrong = http.get("/metrics", headers={"Authorization": "Bearer pdr_not-a-token"})
    for response in (bare, wrong):
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == "Bearer"
        assert "\n" not in response.text.strip()
        assert "perdure token create" in response.json()["error"]
        assert "perdure_runs" not in response.text


def test_metrics_need_the_read_scope(serve: Served) -> None:
    """A token whose scopes do not include `read` (none at all here, as a hand-edited or newer
    store could hold) is refused 403, naming the scope."""
    token = "pdr_no-scopes-at-all"
    store = App(serve.db)
    try:
        store.sync(store.open_store(), "")
        store.sync(store.store.add_token("noscope", "sec-none", digest(token), "", 0.0), "")
    finally:
        store.close()
    with serve.client() as http:
        response = http.get("/metrics", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 403
    assert "'read' scope" in response.json()["error"]


def test_metrics_with_a_read_token(serve: Served) -> None:
    with serve.client("read") as http:
        response = http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    assert 'perdure_runs{status="pending"} 0.0' in response.text
    assert "perdure_store_up 1.0" in response.text


def test_metrics_public_needs_no_token(
    serve_with: Callable[..., AbstractContextManager[Served]],
) -> None:
    with serve_with("--metrics-public") as served, served.client() as http:
        response = http.get("/metrics")
        api = http.get("/api/v1/runs")
    assert response.status_code == 200
    assert "perdure_store_up 1.0" in response.text
    assert api.status_code == 401  # only /metrics is public
