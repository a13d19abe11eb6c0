"""The outside world the refund agent acts on: a payments stub and a mail stub, each a small
HTTP server on 127.0.0.1 that keeps what it was asked to do, so anyone can count it.

Payments (`PaymentsStub`): `GET /orders/ID` (amount and e-mail), `POST /refunds` (applies a
refund; a request whose `Idempotency-Key` was seen before gets the first refund back and
applies nothing, as payment providers do), `GET /refunds?order=ID` (what an operator checks).
Mail (`MailStub`): `POST /send` (counts every message), `GET /sent?order=ID`. Both take
`POST /probe` from tool bodies (start and end of a call, with the caller's pid), so a bench
can tell whether a kill landed inside a tool.
"""

from __future__ import annotations

import json
import sys
import threading
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


@dataclass(frozen=True)
class Probe:
    """A tool body said it started or ended."""

    tool: str
    order: str
    stage: str  # "begin" or "end"
    pid: int


class QuietServer(ThreadingHTTPServer):
    """A threaded HTTP server that does not print the resets of clients killed mid-request,
    with a listen backlog for many clients connecting at once (the default 5 overflows on a
    loaded machine, and a connection dropped there reads as a server that hung up)."""

    daemon_threads = True
    request_queue_size = 1024

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a reset is no news
            super().handle_error(request, client_address)


class Stub:
    """A threaded JSON-over-HTTP server on a free port of 127.0.0.1."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.probes: list[Probe] = []
        self._httpd = QuietServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> Any:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def begun(self, tool: str) -> Counter[str]:
        """How many times a body of `tool` started, per order."""
        with self.lock:
            return Counter(p.order for p in self.probes if p.tool == tool and p.stage == "begin")

    def open_calls(self, pid: int) -> list[Probe]:
        """Tool calls of process `pid` that began and did not end (where a kill lands)."""
        with self.lock:
            count: Counter[tuple[str, str]] = Counter()
            for p in self.probes:
                if p.pid == pid:
                    count[(p.tool, p.order)] += 1 if p.stage == "begin" else -1
            return [Probe(tool, order, "begin", pid) for (tool, order), n in count.items() if n]

    def route(self, method: str, path: str, query: dict[str, str], body: Any) -> Any:
        """The JSON answer to one request (subclasses add routes); None: 404."""
        if method == "POST" and path == "/probe":
            with self.lock:
                self.probes.append(Probe(body["tool"], body["order"], body["stage"], body["pid"]))
            return {"ok": True}
        return None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _answer(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                if len(raw) < length:  # the client was killed mid-request: nothing was asked
                    self.close_connection = True
                    return
                parts = urlsplit(self.path)
                query = {k: v[0] for k, v in parse_qs(parts.query).items()}
                body = json.loads(raw) if raw else {}
                if self.headers.get("Idempotency-Key"):
                    body["idempotency_key"] = self.headers["Idempotency-Key"]
                data = stub.route(method, parts.path, query, body)
                status = 200 if data is not None else 404
                payload = json.dumps(data if data is not None else {"error": "no route"}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_GET(self) -> None:
                self._answer("GET")

            def do_POST(self) -> None:
                self._answer("POST")

        return Handler


def order_amount(order: str) -> float:
    """The order's price: the same for every process that asks."""
    return 10.0 + int(order.lstrip("o") or 0) % 90 + 0.5


class PaymentsStub(Stub):
    """Orders and refunds; refunds deduplicated by idempotency key."""

    def __init__(self) -> None:
        super().__init__()
        self.refunds: list[dict[str, Any]] = []  # applied, in order
        self.by_key: dict[str, dict[str, Any]] = {}
        self.deduplicated = 0  # requests answered from by_key, nothing applied

    def applied(self) -> Counter[str]:
        """Refunds applied, per order."""
        with self.lock:
            return Counter(r["order"] for r in self.refunds)

    def route(self, method: str, path: str, query: dict[str, str], body: Any) -> Any:
        if method == "GET" and path.startswith("/orders/"):
            order = path.removeprefix("/orders/")
            return {"order": order, "amount": order_amount(order), "email": f"{order}@example.org"}
        if method == "GET" and path == "/refunds":
            with self.lock:
                return [r for r in self.refunds if r["order"] == query.get("order")]
        if method == "POST" and path == "/refunds":
            key = body.get("idempotency_key")
            with self.lock:
                if key and key in self.by_key:
                    self.deduplicated += 1
                    return {**self.by_key[key], "deduplicated": True}
                refund = {
                    "refund_id": f"re_{len(self.refunds) + 1}",
                    "order": body["order"],
                    "amount": body["amount"],
                    "key": key,
                }
                self.refunds.append(refund)
                if key:
                    self.by_key[key] = refund
                return refund
        return super().route(method, path, query, body)


class MailStub(Stub):
    """Sends nothing; counts every message it was asked to send."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[dict[str, Any]] = []

    def per_order(self) -> Counter[str]:
        """Messages sent, per order."""
        with self.lock:
            return Counter(m["order"] for m in self.sent)

    def route(self, method: str, path: str, query: dict[str, str], body: Any) -> Any:
        if method == "POST" and path == "/send":
            with self.lock:
                message = {"message_id": f"m_{len(self.sent) + 1}", **body}
                self.sent.append(message)
                return {"message_id": message["message_id"]}
        if method == "GET" and path == "/sent":
            with self.lock:
                return [m for m in self.sent if m["order"] == query.get("order")]
        return super().route(method, path, query, body)
