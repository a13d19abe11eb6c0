"""Issue 35 §7 against a real `perdure serve --max-streams 4` (one stream per token): once a
revoked token's run-output stream ends (its credential is asked again every RECHECK seconds,
with no output coming), its slot is free for another token. A revoked token's streams on a
waiting run used to keep their slots until they were closed by the client."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

from served import Served, make_token, perdure
from test_sessions import open_stream, read_to_end

from perdure.server.sse import RECHECK


def stream_status(served: Served, token: str) -> tuple[bytes, socket.socket]:
    """The status code of a run-output stream asked with `token`, and its open socket."""
    sock = socket.create_connection(("127.0.0.1", served.port), timeout=30)
    sock.sendall(f"GET /api/v1/runs/held/stream HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 f"Authorization: Bearer {token}\r\n\r\n".encode())  # fmt: skip
    head = sock.recv(4096)
    while head.startswith(b"HTTP/1.1 503") and not head.rstrip().endswith(b"}"):
        head += sock.recv(4096)  # the JSON body may come in a packet of its own
    return head.split(b" ")[1], sock


def test_a_revoked_tokens_stream_frees_its_slot_for_another_token(
    serve_with: Callable[..., AbstractContextManager[Served]],
) -> None:
    with serve_with("--max-streams", "4") as served:
        with served.client("operate") as api:
            assert api.post("/api/v1/runs", json={"workflow": "waits", "id": "held"}).is_success
        _, extra = make_token(served.env, "extra", "read")
        held = {
            scope: open_stream(served, "/api/v1/runs/held/stream",
                               f"Authorization: Bearer {served.tokens[scope]}")
            for scope in ("read", "operate", "approve", "admin")
        }  # fmt: skip
        try:
            code, refused = stream_status(served, extra)
            refused.close()
            assert code == b"503"  # every slot is taken
            perdure(served.env, "token", "revoke", served.token_ids["read"])
            revoked = time.monotonic()
            ended = read_to_end(held.pop("read"))  # the socket timeout (30 s) fails it
            assert b"revoked or expired" in ended, ended[-300:]
            deadline = revoked + 4 * RECHECK + 10
            while True:
                code, sock = stream_status(served, extra)
                if code == b"200":
                    sock.close()
                    break
                sock.close()
                assert time.monotonic() < deadline, "the revoked token's slot was never freed"
                time.sleep(0.2)
        finally:
            for sock in held.values():
                sock.close()
