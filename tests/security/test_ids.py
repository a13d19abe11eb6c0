"""Issue 12 §5 against a real `perdure serve`: run ids with control, bidi or invisible
characters are refused with one line that never echoes them; unusual but visible ids are
created and reached by GET and cancel; a webhook delivery id with '/' makes a reachable run."""

from __future__ import annotations

import json
import time
from urllib.parse import quote

import httpx
import pytest
from served import Served

from perdure.store.names import REFUSED
from perdure.triggers.webhooks import standard_headers

BAD = {
    "ESC": ("a\x1b[2Jb", "U+001B"),
    "BEL": ("title\x07", "U+0007"),
    "CR": ("over\rwrite", "U+000D"),
    "LF": ("two\nlines", "U+000A"),
    "TAB": ("tab\tbed", "U+0009"),
    "RLO": ("x\u202eevil", "U+202E"),
    "ZWSP": ("zero\u200bwidth", "U+200B"),
    "NEL": ("c1\x85", "U+0085"),
    "LSEP": ("ls\u2028", "U+2028"),
    "TAG": ("tag\U000e0041", "U+E0041"),
}
GOOD = ["ok:1/2@é", "hook:push:a/b", "a%2Fb", "100%", "日本語-Ελλάδα", "x/cancel", "a b?#&="]


def refused(text: str) -> list[str]:
    return [f"U+{ord(c):04X}" for c in text if any(a <= ord(c) <= b for a, b in REFUSED)]


def one_line(answer: httpx.Response) -> str:
    """The error of a JSON answer, checked to be one line with no refused character."""
    assert answer.headers["content-type"].startswith("application/json"), answer.text
    message = answer.json()["error"]
    assert "\n" not in message and refused(message) == [], repr(message)
    assert "Traceback" not in answer.text
    return str(message)


def path(run_id: str) -> str:
    return "/api/v1/runs/" + quote(run_id, safe="")


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_ids_are_refused_with_one_line_everywhere(serve: Served, name: str) -> None:
    """POST with the bad id is a 422 (`id`), GET and cancel by it a 400 (`run_id`): each one
    line naming the character as U+XXXX, the id escaped; nothing is created."""
    bad, code = BAD[name]
    with serve.client("operate") as client:
        made = client.post("/api/v1/runs", json={"workflow": "waits", "id": bad})
        assert (made.status_code, made.json()["field"]) == (422, "id"), made.text
        assert code in one_line(made) and one_line(made).startswith("id: run id '")
        for answer in (client.get(path(bad)), client.post(path(bad) + "/cancel", json={})):
            assert (answer.status_code, answer.json()["field"]) == (400, "run_id"), answer.text
            assert code in one_line(answer)
        assert client.get("/api/v1/runs").json()["runs"] == []


def test_unusual_visible_ids_are_created_read_and_cancelled(serve: Served) -> None:
    """Ids with ':', '/', '@', '%', spaces and letters of any script answer 201, then GET by
    the id's path returns that very run and cancel cancels it."""
    with serve.client("operate") as client:
        for run_id in GOOD:
            made = client.post("/api/v1/runs", json={"workflow": "waits", "id": run_id})
            assert made.status_code == 201, made.text
            got = client.get(path(run_id))
            assert got.status_code == 200 and got.json()["id"] == run_id, (run_id, got.text)
            done = client.post(path(run_id) + "/cancel", json={})
            assert done.status_code == 200 and done.json()["run_id"] == run_id, done.text
            assert client.get(path(run_id)).json()["status"] == "cancelled"
        listed = {r["id"] for r in client.get("/api/v1/runs").json()["runs"]}
    assert listed == set(GOOD)


def test_a_webhook_delivery_with_a_slash_makes_a_reachable_run(serve: Served) -> None:
    """A signed delivery whose id holds '/' starts hook:push:<id>, which GET reaches."""
    body = json.dumps({"ref": "main"}).encode()
    delivery = "gh/123-abc"
    headers = standard_headers("s3cret", body, delivery_id=delivery, timestamp=int(time.time()))
    hooked = httpx.post(serve.url + "/hooks/push", content=body, timeout=10,
                        headers={**headers, "Content-Type": "application/json"})  # fmt: skip
    assert hooked.status_code in (200, 201, 202), hooked.text
    assert hooked.json()["run_id"] == f"hook:push:{delivery}"
    with serve.client("read") as client:
        got = client.get(path(f"hook:push:{delivery}"))
    assert got.status_code == 200 and got.json()["id"] == f"hook:push:{delivery}", got.text
