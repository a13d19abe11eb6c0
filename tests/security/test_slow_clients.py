"""Slow clients against a real `perdure serve` / `perdure mcp --http`: headers sent a byte at a
time, a body that stalls, a connection that says nothing, one connection too many. The
server must close them itself (the tests' own socket timeouts are only a backstop, far
beyond the server's deadlines, so a pass never depends on how fast the machine is)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from contextlib import AbstractContextManager

import pytest
from served import Served

ServeWith = Callable[..., AbstractContextManager[Served]]
TIMEOUT = "1.5"  # the server's header and body deadlines in these tests, seconds
BACKSTOP = 30.0  # how long a test waits for the server to act before it fails


async def trickle(port: int, request: bytes, every: float = 0.5, first: bytes = b"") -> bytes:
    """Send `first`, then `request` a byte every `every` seconds until the server closes the
    connection; what it answered ("" if nothing)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    answered = asyncio.ensure_future(reader.read())  # b"" or the answer, once closed
    try:
        writer.write(first)
        for byte in request:
            if answered.done():
                break
            try:
                writer.write(bytes([byte]))
                await writer.drain()
            except ConnectionError:
                break
            await asyncio.wait([answered], timeout=every)
        return await asyncio.wait_for(answered, BACKSTOP)
    finally:
        writer.close()


def headers(port: int, path: str = "/healthz") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Pad: {'a' * 200}\r\n\r\n".encode()


def status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


@pytest.mark.slow
def test_headers_sent_a_byte_at_a_time_are_cut_off_while_others_are_served(
    serve_with: ServeWith,
) -> None:
    """50 connections trickling their headers all get 408 and are closed by the server; a
    normal request made while they hang is answered."""
    with serve_with("--header-timeout", TIMEOUT) as served:

        async def scene() -> tuple[list[bytes], int]:
            slow = [asyncio.ensure_future(trickle(served.port, headers(served.port)))
                    for _ in range(50)]  # fmt: skip
            await asyncio.sleep(0.5)
            with served.client() as http:  # while they hang
                normal = (await asyncio.to_thread(http.get, "/healthz")).status_code
            return list(await asyncio.gather(*slow)), normal

        answers, normal = asyncio.run(scene())
    assert normal == 200
    assert [status(a) for a in answers] == [408] * 50
    assert b'{"error": "request headers not complete within 1.5 s"}' in answers[0]


@pytest.mark.slow
def test_a_connection_that_sends_nothing_is_closed(serve_with: ServeWith) -> None:
    with (
        serve_with("--header-timeout", TIMEOUT) as served,
        socket.create_connection(("127.0.0.1", served.port), timeout=BACKSTOP) as sock,
    ):
        assert sock.recv(1024) == b""  # closed by the server, without an answer


@pytest.mark.slow
def test_a_stalled_body_gets_408(serve_with: ServeWith) -> None:
    """A webhook whose body stops half-way: 408 and closed (the handler was reading it)."""
    with serve_with("--body-timeout", TIMEOUT) as served:
        head = (f"POST /hooks/push HTTP/1.1\r\nHost: 127.0.0.1:{served.port}\r\n"
                "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n")  # fmt: skip
        with socket.create_connection(("127.0.0.1", served.port), timeout=BACKSTOP) as sock:
            sock.sendall(head.encode() + b'{"half": ')
            answer = b"".join(iter(lambda: sock.recv(4096), b""))
        with served.client() as http:
            assert http.get("/healthz").status_code == 200  # the server carries on
        log = served.output()
    assert status(answer) == 408
    assert answer.endswith(b'{"error": "request body stalled for 1.5 s"}\n')
    assert "Traceback" not in log


@pytest.mark.slow
def test_a_body_still_trickling_after_the_answer_is_cut_off(serve_with: ServeWith) -> None:
    """Refused at once (401: no token), the client keeps its body coming a byte at a time,
    each well within the body deadline: the server still closes the connection rather than
    read a body nobody needs for ever."""
    with serve_with("--body-timeout", TIMEOUT) as served:
        head = (f"POST /api/v1/runs HTTP/1.1\r\nHost: 127.0.0.1:{served.port}\r\n"
                "Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n")  # fmt: skip
        answer = asyncio.run(trickle(served.port, b" " * 1000, first=head.encode()))
    assert status(answer) == 401


@pytest.mark.slow
def test_one_connection_too_many_gets_503(serve_with: ServeWith) -> None:
    with serve_with("--max-connections", "3") as served:
        held = [socket.create_connection(("127.0.0.1", served.port), timeout=BACKSTOP)
                for _ in range(3)]  # fmt: skip
        try:
            for sock in held:  # each accepted and counted: half a request is in
                sock.sendall(b"GET /healthz HTTP/1.1\r\n")
            with socket.create_connection(("127.0.0.1", served.port), timeout=BACKSTOP) as extra:
                answer = b"".join(iter(lambda: extra.recv(4096), b""))
        finally:
            for sock in held:
                sock.close()
        with served.client() as http:
            assert http.get("/healthz").status_code == 200  # room again
    assert status(answer) == 503


@pytest.mark.slow
def test_mcp_http_cuts_off_trickled_headers_too(
    mcp_http_with: Callable[..., AbstractContextManager[Served]],
) -> None:
    with mcp_http_with("--header-timeout", TIMEOUT) as served:
        answer = asyncio.run(trickle(served.port, headers(served.port, "/mcp")))
    assert status(answer) == 408


@pytest.mark.slow
def test_a_body_trickled_steadily_is_cut_off_at_its_deadline(serve_with: ServeWith) -> None:
    """Issue 35 §3: a sign-in body sent a byte every 0.3 s never pauses as long as the body
    deadline (1.5 s) but is not complete 2 s after its headers: 408 and closed, long before
    its 200 bytes would have come."""
    with serve_with("--body-timeout", TIMEOUT, "--body-deadline", "2") as served:
        head = (f"POST /ui/login HTTP/1.1\r\nHost: 127.0.0.1:{served.port}\r\n"
                "Content-Type: application/x-www-form-urlencoded\r\n"
                "Content-Length: 200\r\n\r\n")  # fmt: skip
        answer = asyncio.run(trickle(served.port, b"t" * 200, every=0.3, first=head.encode()))
    assert status(answer) == 408
    assert answer.endswith(b'{"error": "request body not complete within 2 s"}\n')


def hold(port: int, count: int, source: str = "127.0.0.1") -> list[socket.socket]:
    """`count` connections from `source`, each with half a request in (so each is counted)."""
    held = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=BACKSTOP,
                                        source_address=(source, 0))  # fmt: skip
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")
        held.append(sock)
    return held


def answer_of(port: int, request: bytes, source: str = "127.0.0.1") -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=BACKSTOP,
                                  source_address=(source, 0)) as sock:  # fmt: skip
        sock.sendall(request)
        return sock.recv(4096)


@pytest.mark.slow
def test_one_address_may_hold_only_its_share_of_connections(serve_with: ServeWith) -> None:
    """Issue 35 §3: `--max-per-address 3`: a 4th connection from 127.0.0.1 gets 503 at once,
    while another address (127.0.0.2) is still served."""
    with serve_with("--max-per-address", "3") as served:
        held = hold(served.port, 3)
        try:
            request = f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{served.port}\r\n\r\n".encode()
            refused = answer_of(served.port, request)
            other = answer_of(served.port, request, source="127.0.0.2")
        finally:
            for sock in held:
                sock.close()
    assert status(refused) == 503 and b"too many connections from this address" in refused
    assert status(other) == 200


@pytest.mark.slow
def test_bodies_without_credentials_get_a_quarter_of_the_connections(
    serve_with: ServeWith,
) -> None:
    """Issue 35 §3: `--max-connections 8`: two sign-in bodies trickling (from two addresses)
    take the share of bodies without credentials; a third is answered 503 at its headers,
    while a request with a token and a body is still served."""
    with serve_with("--max-connections", "8") as served:
        port = served.port
        head = (f"POST /ui/login HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                "Content-Type: application/x-www-form-urlencoded\r\n"
                "Content-Length: 200\r\n\r\nt").encode()  # fmt: skip
        held = []
        for source in ("127.0.0.3", "127.0.0.4"):
            sock = socket.create_connection(("127.0.0.1", port), timeout=BACKSTOP,
                                            source_address=(source, 0))  # fmt: skip
            sock.sendall(head)
            held.append(sock)
        try:
            with served.client() as http:  # the two are in before the third comes
                assert http.get("/healthz").status_code == 200
            third = answer_of(port, head, source="127.0.0.5")
            with served.client("operate") as api:
                started = api.post("/api/v1/runs", json={"workflow": "waits", "id": "r1"})
        finally:
            for sock in held:
                sock.close()
    assert status(third) == 503 and b"too many requests sending a body" in third
    assert started.status_code in (200, 201), started.text
