"""Issue 35 §5 against a real `perdure serve`: a refused action's audit row keeps a digest and
the size of its payload, not the payload. 20 refused `resolve` calls carrying 1 MiB each used
to add 20 MB to the store and to every `GET /api/v1/audit`; a refused value nested near the
limit no longer breaks the audit page either."""

from __future__ import annotations

import hashlib
import json
import os

from served import Served, sign_in

from perdure.nesting import MAX_DEPTH


def test_refused_payloads_are_kept_as_a_digest_and_a_size(serve: Served) -> None:
    operate = {"Authorization": f"Bearer {serve.tokens['operate']}"}
    big = "x" * (1024 * 1024 - 100)
    deep: object = "bottom"
    for _ in range(MAX_DEPTH - 3):  # body object, "value": under the limit, so read
        deep = [deep]
    with serve.client() as http:
        assert http.post("/api/v1/runs", json={"workflow": "waits", "id": "calm"},
                         headers=operate).is_success  # fmt: skip
        before = os.path.getsize(serve.db.removeprefix("sqlite:///"))
        for i in range(20):
            body = {"step": "nothing", "value": big, "comment": f"try {i}"}
            refused = http.post("/api/v1/runs/calm/resolve", headers=operate, json=body)
            assert refused.status_code == 409, refused.text[:300]
        deep_refused = http.post("/api/v1/runs/calm/resolve", headers=operate,
                                 json={"step": "nothing", "value": deep})  # fmt: skip
        assert deep_refused.status_code == 409, deep_refused.text[:300]
        audit = http.get("/api/v1/audit", params={"limit": 100},
                         headers={"Authorization": f"Bearer {serve.tokens['read']}"})  # fmt: skip
    assert audit.status_code == 200
    assert len(audit.content) < 100_000, len(audit.content)  # was over 20 MB
    grown = os.path.getsize(serve.db.removeprefix("sqlite:///")) - before
    assert grown < 2_000_000, grown
    rows = [r for r in audit.json()["entries"] if r["action"] == "run.resolve"]
    assert len(rows) == 21 and {r["outcome"] for r in rows} == {"refused"}
    detail = next(r["detail"] for r in rows if r["detail"].get("comment") == "try 3")
    kept = json.dumps(big)
    assert detail["value"] == {"sha256": hashlib.sha256(kept.encode()).hexdigest(),
                               "bytes": len(kept)}  # fmt: skip
    assert detail["step"] == "nothing"  # small fields stay as they were
    browser = sign_in(serve, serve.tokens["admin"])
    try:
        for path in ("/ui/audit", "/ui/runs/calm"):
            page = browser.get(path)
            assert page.status_code == 200 and "run.resolve" in page.text, path
    finally:
        browser.close()
