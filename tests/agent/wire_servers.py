"""Small real HTTP servers on 127.0.0.1 that speak the OpenAI and Anthropic wire formats.

Each answers `POST /v1/chat/completions` (OpenAI) or `POST /v1/messages`
(Anthropic) with the next queued turn, as JSON or, when the request asks to
stream, as server-sent events split into several deltas (text in pieces, tool
arguments in JSON fragments). It records every request it got, and can be told
to answer the next one with an error status (429 with Retry-After, 500, 401...),
to hang (read the request, never answer), or to refuse every key but one.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

INPUT_TOKENS = 21
OUTPUT_TOKENS = 7


class _Server(ThreadingHTTPServer):
    """An HTTP server whose listen backlog holds a burst of connections (the default, 5,
    refused some under load: "Server disconnected without sending a response")."""

    request_queue_size = 1024
    daemon_threads = True


@dataclass
class Turn:
    """What the fake model says: text and/or tool calls as (id, name, arguments)."""

    text: str = ""
    tool_calls: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)


@dataclass
class Recorded:
    """One request as the server saw it."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]


def pieces(text: str, size: int) -> list[str]:
    """`text` cut into pieces of `size` characters (at least one piece)."""
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


class WireServer:
    """A threaded HTTP server on a free port; subclasses render turns and errors."""

    path = ""

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self.turns: deque[Turn] = deque()
        self.failures: deque[tuple[int, dict[str, str]]] = deque()
        self.default = Turn(text="hello")
        self.hangs = 0  # requests still to hang: read, never answered (until stop())
        self.hung = 0  # requests hung so far
        self.key: str | None = None  # when set, any other key gets a 401
        self._released = threading.Event()
        self._httpd = _Server(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def origin(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def reply(
        self, text: str = "", tool_calls: list[tuple[str, str, dict[str, Any]]] | None = None
    ) -> None:
        """Queue the next turn (unqueued requests get `default`)."""
        self.turns.append(Turn(text, list(tool_calls or [])))

    def fail_next(self, status: int, retry_after: str | None = None) -> None:
        """Answer the next request with `status` (and a Retry-After header if given)."""
        self.failures.append((status, {"Retry-After": retry_after} if retry_after else {}))

    def hang_next(self, count: int = 1) -> None:
        """Accept the next `count` requests and never answer them (a hung model server)."""
        self.hangs += count

    def sent_key(self, request: Recorded) -> str:
        """The key a request carried (Bearer for OpenAI, x-api-key for Anthropic)."""
        auth = request.headers.get("authorization", "")
        return request.headers.get("x-api-key") or auth.removeprefix("Bearer ")

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._released.set()  # hung handlers return (their connections close unanswered)
        self._httpd.shutdown()
        self._httpd.server_close()

    def _after_reply(self) -> None:
        """Hook: a reply was just written (CountingServer calls its `after_reply`)."""

    # Rendering, per provider.
    def render(self, body: dict[str, Any], turn: Turn) -> dict[str, Any]:
        raise NotImplementedError

    def render_stream(self, body: dict[str, Any], turn: Turn) -> Iterator[str]:
        raise NotImplementedError

    def render_error(self, status: int) -> dict[str, Any]:
        raise NotImplementedError

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep test output clean

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = json.loads(raw or b"{}")
                seen = Recorded(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                server.requests.append(seen)
                if server.hangs > 0:
                    server.hangs -= 1
                    server.hung += 1
                    server._released.wait(300)
                    self.close_connection = True
                    return
                if self.path != server.path:
                    self._json(404, {"error": {"message": f"no route {self.path}"}})
                elif server.key is not None and server.sent_key(seen) != server.key:
                    self._json(401, server.render_error(401))
                elif server.failures:
                    status, headers = server.failures.popleft()
                    self._json(status, server.render_error(status), headers)
                else:
                    turn = server.turns.popleft() if server.turns else server.default
                    if body.get("stream"):
                        self._sse(server.render_stream(body, turn))
                    else:
                        self._json(200, server.render(body, turn))
                        self.wfile.flush()
                        server._after_reply()

            def _json(self, status: int, data: Any, headers: dict[str, str] | None = None) -> None:
                payload = json.dumps(data).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(payload)

            def _sse(self, events: Iterator[str]) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for event in events:  # one HTTP chunk per event, flushed, as a real stream
                    data = event.encode()
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")

        return Handler


class OpenAIServer(WireServer):
    """`POST /v1/chat/completions`: JSON, or `data: {...}` chunks ending with `data: [DONE]`."""

    path = "/v1/chat/completions"

    def render(self, body: dict[str, Any], turn: Turn) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": turn.text or None}
        if turn.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args)},
                }
                for call_id, name, args in turn.tool_calls
            ]
        return {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if turn.tool_calls else "stop",
                    "logprobs": None,
                }
            ],
            "usage": {
                "prompt_tokens": INPUT_TOKENS,
                "completion_tokens": OUTPUT_TOKENS,
                "total_tokens": INPUT_TOKENS + OUTPUT_TOKENS,
            },
        }

    def render_stream(self, body: dict[str, Any], turn: Turn) -> Iterator[str]:
        def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
            data = {
                "id": "chatcmpl-1",
                "object": "chat.completion.chunk",
                "created": 1_700_000_000,
                "model": body["model"],
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                **extra,
            }
            return f"data: {json.dumps(data)}\n\n"

        yield chunk({"role": "assistant", "content": ""})
        if turn.text:
            for piece in pieces(turn.text, 3):
                yield chunk({"content": piece})
        for index, (call_id, name, args) in enumerate(turn.tool_calls):
            head = {"index": index, "id": call_id, "type": "function"}
            yield chunk({"tool_calls": [{**head, "function": {"name": name, "arguments": ""}}]})
            for piece in pieces(json.dumps(args), 5):
                yield chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
        yield chunk({}, "tool_calls" if turn.tool_calls else "stop")
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {
                "prompt_tokens": INPUT_TOKENS,
                "completion_tokens": OUTPUT_TOKENS,
                "total_tokens": INPUT_TOKENS + OUTPUT_TOKENS,
            }
            data = {
                "id": "chatcmpl-1",
                "object": "chat.completion.chunk",
                "created": 1_700_000_000,
                "model": body["model"],
                "choices": [],
                "usage": usage,
            }
            yield f"data: {json.dumps(data)}\n\n"
        yield "data: [DONE]\n\n"

    def render_error(self, status: int) -> dict[str, Any]:
        kinds = {
            401: ("invalid_request_error", "Incorrect API key provided: sk-bad.\nFind your key."),
            403: ("permission_denied", "You are not allowed to use this model."),
            429: ("rate_limit_error", "Rate limit reached for requests"),
            400: ("invalid_request_error", "Unknown parameter: 'bogus'."),
        }
        kind, message = kinds.get(status, ("server_error", "The server had an error"))
        return {"error": {"message": message, "type": kind, "param": None, "code": None}}


class AnthropicServer(WireServer):
    """`POST /v1/messages`: JSON, or message_start / content_block_* / message_delta events."""

    path = "/v1/messages"

    def __init__(self) -> None:
        super().__init__()
        self.overload_mid_stream = False  # a stream then breaks off with an overloaded_error

    def _blocks(self, turn: Turn) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = []
        if turn.text:
            blocks.append({"type": "text", "text": turn.text})
        for call_id, name, args in turn.tool_calls:
            blocks.append({"type": "tool_use", "id": call_id, "name": name, "input": args})
        return blocks

    def render(self, body: dict[str, Any], turn: Turn) -> dict[str, Any]:
        return {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": self._blocks(turn),
            "stop_reason": "tool_use" if turn.tool_calls else "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": INPUT_TOKENS, "output_tokens": OUTPUT_TOKENS},
        }

    def render_stream(self, body: dict[str, Any], turn: Turn) -> Iterator[str]:
        def event(name: str, data: dict[str, Any]) -> str:
            return f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n"

        start = {**self.render(body, turn), "content": [], "stop_reason": None}
        start["usage"] = {"input_tokens": INPUT_TOKENS, "output_tokens": 1}
        yield event("message_start", {"message": start})
        yield event("ping", {})
        if self.overload_mid_stream:
            yield event("error", {"error": {"type": "overloaded_error", "message": "Overloaded"}})
            return
        for index, block in enumerate(self._blocks(turn)):
            if block["type"] == "text":
                yield event(
                    "content_block_start",
                    {"index": index, "content_block": {"type": "text", "text": ""}},
                )
                for piece in pieces(block["text"], 3):
                    delta = {"type": "text_delta", "text": piece}
                    yield event("content_block_delta", {"index": index, "delta": delta})
            else:
                yield event(
                    "content_block_start",
                    {"index": index, "content_block": {**block, "input": {}}},
                )
                for piece in pieces(json.dumps(block["input"]), 5):
                    delta = {"type": "input_json_delta", "partial_json": piece}
                    yield event("content_block_delta", {"index": index, "delta": delta})
            yield event("content_block_stop", {"index": index})
        stop = "tool_use" if turn.tool_calls else "end_turn"
        yield event(
            "message_delta",
            {
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": OUTPUT_TOKENS},
            },
        )
        yield event("message_stop", {})

    def render_error(self, status: int) -> dict[str, Any]:
        kinds = {
            401: ("authentication_error", "invalid x-api-key\n(check the key)"),
            403: ("permission_error", "Your API key does not have permission"),
            429: ("rate_limit_error", "Number of requests has exceeded your rate limit"),
            400: ("invalid_request_error", "messages: at least one message is required"),
            529: ("overloaded_error", "Overloaded"),
        }
        kind, message = kinds.get(status, ("api_error", "Internal server error"))
        return {"type": "error", "error": {"type": kind, "message": message}}


@dataclass
class Served:
    """One request a counting server answered 200: what it would bill."""

    model: str
    prompt_tokens: int
    completion_tokens: int

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens


COUNTING_SPEC = """
name = "{name}"
goal = "Answer the question"
instructions = "Answer in one line."

[models.fast]
provider = "openai"
model = "counting-1"
base_url = "{base}/v1"
api_key_env = "{key_env}"
context_tokens = 8000
max_tokens = 1000
price = {{ input_per_mtok = 1.0, output_per_mtok = 2.0 }}

[tools]
grant = ["finish"]

[limits]
max_iterations = 1

[budget]
{budget}
"""  # an agent spec on a CountingServer: one call of up to 1,000 tokens, priced


class CountingServer(OpenAIServer):
    """An OpenAI-compatible server that bills like a provider: the prompt's tokens (about
    four characters each, as real tokenizers do) and the full `max_tokens` asked as the
    answer (the worst case), after `latency` seconds; `served` lists what it billed."""

    def __init__(self, latency: float = 0.0) -> None:
        super().__init__()
        self.latency = latency
        self.served: list[Served] = []
        self.after_reply: Callable[[], None] | None = None  # called once, right after a reply
        self.no_usage = False  # when set, replies carry no usage (billed all the same)
        self.hurry = threading.Event()  # set: calls waiting out their latency answer now
        self._lock = threading.Lock()
        # a client killed mid-call resets its connection: billed all the same, nothing to log
        self._httpd.handle_error = lambda request, address: None  # type: ignore[method-assign]

    def render(self, body: dict[str, Any], turn: Turn) -> dict[str, Any]:
        if self.latency:
            self.hurry.wait(self.latency)
        messages = body.get("messages") or []
        chars = sum(len(str(m.get("content") or "")) for m in messages)
        chars += len(json.dumps(body.get("tools") or []))
        prompt = chars // 4 + 4 * len(messages)
        completion = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        data = super().render(body, turn)
        data["usage"] = {"prompt_tokens": prompt, "completion_tokens": completion,
                         "total_tokens": prompt + completion}  # fmt: skip
        if self.no_usage:  # some compatible servers say nothing of usage
            del data["usage"]
        with self._lock:
            self.served.append(Served(str(body.get("model")), prompt, completion))
        return data

    def _after_reply(self) -> None:
        hook, self.after_reply = self.after_reply, None
        if hook is not None:
            hook()
