"""Issue 12 §4 against a real `perdure serve`: a captured webhook delivery cannot start a second
run. The standard scheme signs the id and the time, so a replay under a new id fails the
signature and an old one fails the tolerance; the body scheme (opt-in, GitHub-style) behaves as
documented: replayable under a new id, deduplicated by the id header only."""

from __future__ import annotations

import json
import time

import httpx
from served import Served

from perdure.triggers.webhooks import sign, standard_headers

SECRET = "s3cret"  # sec_app's
BODY = json.dumps({"ref": "main", "pusher": "ana"}).encode()


def run_ids(served: Served) -> list[str]:
    with served.client("read") as http:
        return sorted(run["id"] for run in http.get("/api/v1/runs").json()["runs"])


def post(served: Served, path: str, headers: dict[str, str], body: bytes = BODY) -> httpx.Response:
    with served.client() as http:
        return http.post(
            path, content=body, headers={"Content-Type": "application/json", **headers}
        )


def test_a_captured_delivery_replayed_under_a_new_id_is_refused(serve: Served) -> None:
    """The exact request that started a run, resent with another `webhook-id`, answers 401 and
    starts nothing; resent with its own id it is the same run, `duplicate`."""
    captured = standard_headers(SECRET, BODY, delivery_id="msg_1", timestamp=int(time.time()))
    first = post(serve, "/hooks/push", captured)
    assert first.json() == {"run_id": "hook:push:msg_1", "duplicate": False}, first.text
    for new_id in ("msg_2", "msg_1x", "MSG_1"):
        replayed = post(serve, "/hooks/push", {**captured, "webhook-id": new_id})
        assert replayed.status_code == 401, new_id
        assert "no webhook-signature entry matches" in replayed.json()["error"]
    again = post(serve, "/hooks/push", captured)
    assert again.json() == {"run_id": "hook:push:msg_1", "duplicate": True}
    assert run_ids(serve) == ["hook:push:msg_1"]


def test_a_captured_delivery_replayed_later_is_refused(serve: Served) -> None:
    """Correctly signed but stamped 10 minutes ago (or ahead), a delivery answers 401 saying
    which check failed; the server log shows it, never a traceback; nothing starts."""
    now = int(time.time())
    old = post(
        serve, "/hooks/push", standard_headers(SECRET, BODY, delivery_id="old", timestamp=now - 600)
    )
    ahead = post(
        serve,
        "/hooks/push",
        standard_headers(SECRET, BODY, delivery_id="ahead", timestamp=now + 600),
    )
    assert old.status_code == ahead.status_code == 401
    assert "s old, outside this hook's 300 s tolerance" in old.json()["error"]
    assert "s in the future" in ahead.json()["error"]
    assert run_ids(serve) == []
    output = serve.output()
    assert "refused: webhook-timestamp" in output and "Traceback" not in output


def test_an_unsigned_timestamp_or_a_body_only_signature_does_not_pass(serve: Served) -> None:
    """Moving a captured delivery's timestamp forward breaks its signature (401), and a
    body-only `sha256=` signature at the standard hook is 401 naming `scheme='body'`."""
    captured = standard_headers(SECRET, BODY, delivery_id="msg_t", timestamp=int(time.time()) - 600)
    refreshed = post(serve, "/hooks/push", {**captured, "webhook-timestamp": str(int(time.time()))})
    assert refreshed.status_code == 401
    assert "no webhook-signature entry matches" in refreshed.json()["error"]
    old_style = post(
        serve,
        "/hooks/push",
        {"X-Perdure-Signature": sign(SECRET, BODY), "X-Perdure-Delivery": "p-1"},
    )
    assert old_style.status_code == 401 and "scheme='body'" in old_style.json()["error"]
    assert run_ids(serve) == []


def test_the_body_scheme_is_replayable_under_a_new_id_as_documented(serve: Served) -> None:
    """`push-body` (scheme='body'): the same id is one run, a wrong signature is 401, and the
    same body and signature under a new id start a second run: the documented cost of a
    sender that can only sign the body."""
    signed = {"X-Perdure-Signature": sign(SECRET, BODY)}
    first = post(serve, "/hooks/push-body", {**signed, "X-Perdure-Delivery": "gh-1"})
    again = post(serve, "/hooks/push-body", {**signed, "X-Perdure-Delivery": "gh-1"})
    replayed = post(serve, "/hooks/push-body", {**signed, "X-Perdure-Delivery": "gh-2"})
    forged = post(
        serve,
        "/hooks/push-body",
        {"X-Perdure-Signature": sign("guess", BODY), "X-Perdure-Delivery": "gh-3"},
    )
    assert first.json() == {"run_id": "hook:push-body:gh-1", "duplicate": False}
    assert again.json() == {"run_id": "hook:push-body:gh-1", "duplicate": True}
    assert replayed.json() == {"run_id": "hook:push-body:gh-2", "duplicate": False}
    assert forged.status_code == 401
    assert run_ids(serve) == ["hook:push-body:gh-1", "hook:push-body:gh-2"]
