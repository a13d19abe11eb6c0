"""Issue 35 §9 against a real `perdure serve`: one nesting limit (`nesting.MAX_DEPTH`, 200)
at every entrance. JSON nested 201-989 deep is refused with one line (400) as run arguments,
an event payload and a webhook body, where it used to be a 500 or, worse, accepted into a run
whose pages then failed for everyone; a value exactly at the limit is taken, and its run
shows in the API, the dashboard and `perdure show`."""

from __future__ import annotations

import hashlib
import hmac
import json

from served import Served, perdure, sign_in

from perdure.nesting import MAX_DEPTH, nested_message


def nested(depth: int) -> str:
    """A JSON list `depth` lists deep with a string at the bottom."""
    return "[" * depth + '"bottom"' + "]" * depth


def test_json_past_the_limit_is_refused_at_every_entrance(serve: Served) -> None:
    operate = {"Authorization": f"Bearer {serve.tokens['operate']}"}
    with serve.client() as http:
        assert http.post("/api/v1/runs", json={"workflow": "waits", "id": "target"},
                         headers=operate).is_success  # fmt: skip
        for depth in (MAX_DEPTH + 1, 500, 989):
            too_deep = nested(depth)
            for path, body in (
                ("/api/v1/runs", f'{{"workflow": "waits", "args": [{too_deep}]}}'),
                ("/api/v1/runs/target/events", f'{{"event": "poke", "payload": {too_deep}}}'),
            ):
                answer = http.post(path, content=body, headers={**operate,
                                   "Content-Type": "application/json"})  # fmt: skip
                assert answer.status_code == 400, (depth, path, answer.text[:300])
                assert answer.json()["error"] == nested_message("body")
            raw = too_deep.encode()
            signature = "sha256=" + hmac.new(b"s3cret", raw, hashlib.sha256).hexdigest()
            hooked = http.post("/hooks/push-body", content=raw, headers={
                "X-Perdure-Delivery": f"deep-{depth}", "X-Perdure-Signature": signature,
                "Content-Type": "application/json",
            })  # fmt: skip
            assert hooked.status_code == 400, (depth, hooked.text[:300])
            assert hooked.json()["error"] == nested_message("body")
        listed = http.get("/api/v1/runs", headers=operate).json()
    assert [r["id"] for r in listed["runs"]] == ["target"]  # nothing else was started
    assert "Traceback" not in serve.output()


def test_a_value_at_the_limit_is_taken_and_its_run_can_be_inspected(serve: Served) -> None:
    operate = {"Authorization": f"Bearer {serve.tokens['operate']}"}
    deepest = nested(MAX_DEPTH - 2)  # in the body object and its args list: MAX_DEPTH
    with serve.client() as http:
        body = f'{{"workflow": "waits", "id": "deep", "args": [{deepest}]}}'
        started = http.post("/api/v1/runs", content=body,
                            headers={**operate, "Content-Type": "application/json"})  # fmt: skip
        assert started.status_code in (200, 201), started.text[:300]
        assert http.get("/api/v1/runs/deep", headers=operate).status_code == 200
    browser = sign_in(serve, serve.tokens["read"])
    try:
        page = browser.get("/ui/runs/deep")
        assert page.status_code == 200 and "deep" in page.text, page.text[:300]
    finally:
        browser.close()
    shown = perdure(serve.env, "show", "deep")
    assert "deep" in shown.stdout
    assert json.loads(body)  # the body itself was valid JSON all along
