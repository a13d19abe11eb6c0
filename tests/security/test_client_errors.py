"""Issue 12 §7 against a real `perdure serve`: input that is the client's fault (JSON nested
100,000 deep, a cursor nested 3,000 deep, page numbers of 10**23) gets a 4xx with one line,
never a 500, a traceback or a server path, on the API, the webhooks and the dashboard."""

from __future__ import annotations

import hashlib
import hmac

from served import Served, sign_in

from perdure.nesting import nested_message

DEEP = "[" * 100_000 + "]" * 100_000


def one_line_refusal(status: int, text: str) -> None:
    assert 400 <= status < 500, (status, text[:300])
    assert "Traceback" not in text and ".py" not in text and "/perdure/" not in text, text[:300]


def test_what_the_client_got_wrong_is_never_a_500(serve: Served) -> None:
    operate = {"Authorization": f"Bearer {serve.tokens['operate']}"}
    with serve.client() as http:
        for path in ("/api/v1/runs", "/api/v1/runs/nope/events"):
            body = '{"workflow": "waits", "args": ' + DEEP + "}"
            answer = http.post(path, content=body, headers=operate)
            one_line_refusal(answer.status_code, answer.text)
            assert answer.json()["error"] == nested_message("body")
        deep_hook = DEEP.encode()
        signature = "sha256=" + hmac.new(b"s3cret", deep_hook, hashlib.sha256).hexdigest()
        hooked = http.post("/hooks/push-body", content=deep_hook, headers={  # sha256= of the body
            "X-Perdure-Delivery": "deep-1", "X-Perdure-Signature": signature,
            "Content-Type": "application/json",
        })  # fmt: skip
        one_line_refusal(hooked.status_code, hooked.text)
        assert hooked.json()["error"] == nested_message("body")  # signed: parsed, refused
        cursor = "[" * 3000 + "]" * 3000
        for path in ("/api/v1/runs", "/api/v1/audit"):
            listed = http.get(path, params={"cursor": cursor}, headers=operate)
            one_line_refusal(listed.status_code, listed.text)
    browser = sign_in(serve, serve.tokens["admin"])
    try:
        huge = str(10**23)
        for path in (f"/ui/runs?page={huge}", f"/ui/audit?before={huge}", f"/ui/audit?page={huge}"):
            page = browser.get(path)
            assert page.status_code == 200, (path, page.text[:300])
            assert "Traceback" not in page.text
    finally:
        browser.close()
    assert "Traceback" not in serve.output(), serve.output()[-2000:]


def test_a_superscript_digit_is_no_number(serve: Served) -> None:
    """Issue 35 §11: `²` is a digit to `str.isdigit` but not to `int`: in the Host port
    (no credential needed) it was a 500, as in `page=`/`before=` of the dashboard."""
    import socket

    with socket.create_connection(("127.0.0.1", serve.port), timeout=10) as sock:
        sock.sendall("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:8²\r\n\r\n".encode())
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 4"), answer[:200]
    browser = sign_in(serve, serve.tokens["read"])
    try:
        for path in ("/ui/runs?page=²", "/ui/audit?before=²", "/ui/audit?page=¹"):
            page = browser.get(path)
            assert page.status_code == 200, (path, page.text[:300])
    finally:
        browser.close()
    assert "Traceback" not in serve.output(), serve.output()[-2000:]
