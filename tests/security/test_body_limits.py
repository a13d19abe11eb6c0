"""Issue 12 §2 and §8 against a real `perdure serve`. Request bodies are bounded while they
stream, before any handler or sign-in reads them:
a chunked body far over the limit is answered 413 after about the limit, not after all of it
(a 400 MB sign-in body once took the server from 58 MB to 820 MB)."""

from __future__ import annotations

import select
import socket
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

import pytest

from extras_needed import needs

pytest.importorskip("starlette", reason=needs("server"))

from served import Served, sign_in

from perdure.server.limits import MAX_FORM, MAX_OTHER, body_limit
from perdure.server.validation import MAX_BODY

TOKEN: dict[str, str] = {}
CHUNK = 64 * 1024
MOST = 256 * 1024 * 1024  # what a client would send if the server kept reading


@pytest.fixture
def served(serve: Served) -> Iterator[int]:
    """The real `perdure serve`'s port, with a run to follow and a dashboard session (the
    API and the dashboard then read the body rather than refusing the request)."""
    TOKEN.update(serve.tokens)
    with serve.client("operate") as api:
        assert api.post("/api/v1/runs", json={"workflow": "waits", "id": "streamed"}).is_success
    browser = sign_in(serve, serve.tokens["operate"])
    TOKEN["session"] = browser.cookies["perdure_session"]
    TOKEN["tab"] = browser.headers["X-Perdure-Tab"]
    browser.close()
    yield serve.port


def stream_until_answered(
    port: int, path: str, content_type: str, extra: str = ""
) -> tuple[bytes, int]:
    """POST a chunked body of up to MOST bytes, stopping at the first byte of an answer;
    returns (the answer's first bytes, body bytes sent by then)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, CHUNK)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: {content_type}\r\n"
        f"{extra}Transfer-Encoding: chunked\r\n\r\n"
    )
    sock.sendall(head.encode())
    chunk = f"{CHUNK:x}\r\n".encode() + b"a" * CHUNK + b"\r\n"
    sent = 0
    try:
        while sent < MOST:
            readable, _, _ = select.select([sock], [], [], 0)
            if readable:
                break
            try:
                sock.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += CHUNK
        sock.settimeout(10)
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            part = sock.recv(4096)
            if not part:
                break
            answer += part
        return answer, sent
    finally:
        sock.close()


SIGNED = "X-Perdure-Delivery: d1\r\nX-Perdure-Signature: sha256=00\r\n"


@pytest.mark.parametrize(
    ("path", "content_type", "limit", "extra"),
    [
        ("/ui/login", "application/x-www-form-urlencoded", MAX_FORM, ""),
        ("/api/v1/runs", "application/json", MAX_BODY, "Authorization: Bearer {operate}\r\n"),
        ("/hooks/small", "application/json", 1000, SIGNED),
    ],
)
def test_a_streamed_body_over_the_limit_is_cut_off_near_the_limit(
    served: int, path: str, content_type: str, limit: int, extra: str
) -> None:
    answer, sent = stream_until_answered(served, path, content_type, extra.format(**TOKEN))
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"request body is over" in answer or b"over this hook" in answer
    # the server stopped reading about the limit in (plus what sockets buffer), never all
    assert sent < limit + 32 * 1024 * 1024, sent


def test_a_declared_length_over_the_limit_is_refused_before_reading(served: int) -> None:
    sock = socket.create_connection(("127.0.0.1", served), timeout=10)
    with sock:
        sock.sendall(
            b"POST /ui/login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-"
            b"urlencoded\r\nContent-Length: 400000000\r\n\r\n"
        )
        assert sock.recv(4096).startswith(b"HTTP/1.1 413")


def test_one_table_gives_every_path_its_limit() -> None:
    from perdure.triggers.webhooks import Webhook

    hooks = {"github": Webhook(name="github", workflow="wf", secret="s", max_body=5_000_000)}
    assert body_limit("/api/v1/runs", hooks) == MAX_BODY
    assert body_limit("/ui/login", hooks) == MAX_FORM
    assert body_limit("/hooks/github", hooks) == 5_000_000
    assert body_limit("/hooks/unknown", hooks) == MAX_OTHER  # small enough to answer 404
    assert body_limit("/metrics", hooks) == MAX_OTHER


def test_the_stream_cap_holds_when_many_open_at_once(served: int) -> None:
    """150 event streams opened at the same moment, to the API's run stream (three tokens)
    and to the dashboard's (a session of a fourth): exactly MAX_STREAMS are served, a quarter
    per token, and the rest get 503 (the count was taken only once a stream started, so all
    200 of a burst used to get in)."""
    from perdure.server.sse import MAX_STREAMS

    requests = []
    for i in range(150):
        if i % 4:
            token = TOKEN[("read", "approve", "admin")[i % 4 - 1]]
            path, auth = "/api/v1/events/stream?run=streamed", f"Authorization: Bearer {token}\r\n"
        else:
            path = f"/ui/stream?tab={TOKEN['tab']}"
            auth = f"Cookie: perdure_session={TOKEN['session']}\r\n"
        requests.append(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}\r\n".encode())
    socks = [  # from three addresses: each within its share of connections (100)
        socket.create_connection(("127.0.0.1", served), timeout=30,
                                 source_address=(f"127.0.0.{2 + i % 3}", 0))
        for i in range(len(requests))
    ]  # fmt: skip
    try:
        for sock, request in zip(socks, requests, strict=True):
            sock.sendall(request)
        codes = [sock.recv(64).split(b" ")[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()
    assert codes.count(b"200") == MAX_STREAMS, codes
    assert codes.count(b"503") == 150 - MAX_STREAMS


def test_the_stream_cap_is_an_option(
    serve_with: Callable[..., AbstractContextManager[Served]],
) -> None:
    """`perdure serve --max-streams 2`: two streams are served (of two tokens: one token
    may hold a quarter, at least one), a third gets 503 naming the cap; its default is the
    library's MAX_STREAMS."""
    from perdure.cli.serve import serve as command
    from perdure.server.sse import MAX_STREAMS

    default = next(p.default for p in command.params if p.name == "max_streams")
    assert default == MAX_STREAMS
    with serve_with("--max-streams", "2") as served:
        with served.client("operate") as api:
            assert api.post("/api/v1/runs", json={"workflow": "waits", "id": "w1"}).is_success
        socks = [socket.create_connection(("127.0.0.1", served.port), timeout=30) for _ in range(3)]
        try:
            heads = []
            for sock, scope in zip(socks, ("read", "approve", "admin"), strict=True):
                auth = f"Authorization: Bearer {served.tokens[scope]}\r\n"
                request = f"GET /api/v1/runs/w1/stream HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}\r\n"
                sock.sendall(request.encode())
                head = sock.recv(4096)
                while head.startswith(b"HTTP/1.1 503") and not head.rstrip().endswith(b"}"):
                    head += sock.recv(4096)  # the JSON body may come in a packet of its own
                heads.append(head)
        finally:
            for sock in socks:
                sock.close()
    assert [h.split(b" ")[1] for h in heads] == [b"200", b"200", b"503"], heads
    assert b"2 streams are open" in heads[2]


def test_one_token_holds_a_quarter_of_the_streams(
    serve_with: Callable[..., AbstractContextManager[Served]],
) -> None:
    """Issue 35 §7: `--max-streams 8`: a read token's third stream gets 503 naming its
    share (2), while another token still gets one (a revoked or runaway token's streams
    used to take every slot)."""
    with serve_with("--max-streams", "8") as served:
        with served.client("operate") as api:
            assert api.post("/api/v1/runs", json={"workflow": "waits", "id": "w1"}).is_success
        socks = [socket.create_connection(("127.0.0.1", served.port), timeout=30) for _ in range(4)]
        try:
            heads = []
            for sock, scope in zip(socks, ("read", "read", "read", "admin"), strict=True):
                auth = f"Authorization: Bearer {served.tokens[scope]}\r\n"
                request = f"GET /api/v1/runs/w1/stream HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}\r\n"
                sock.sendall(request.encode())
                head = sock.recv(4096)
                while head.startswith(b"HTTP/1.1 503") and not head.rstrip().endswith(b"}"):
                    head += sock.recv(4096)
                heads.append(head)
        finally:
            for sock in socks:
                sock.close()
    assert [h.split(b" ")[1] for h in heads] == [b"200", b"200", b"503", b"200"], heads
    assert b"this token has 2 streams open" in heads[2]
