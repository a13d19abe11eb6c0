"""The scripted model of the refund agent: what it answers at each turn, as a pydantic-ai
FunctionModel and as an OpenAI-compatible HTTP server on 127.0.0.1 that counts every call.

Deterministic: turn 0 looks the order up, turn 1 refunds the amount the lookup gave, turn 2
e-mails the customer, turn 3 answers. The turn is the number of model answers already in the
transcript, so whichever process asks for a turn gets the same action. Every answer carries
a marker `rqN` (N: the server's request serial) in its tool call id or text, so a journal
shows which request's response it recorded.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from refund_outside import QuietServer

ORDER = re.compile(r"\bo\d{4}\b")
MARKER = re.compile(r"rq(\d+)")
TURNS = 4  # model calls one conversation needs at least
PID_HEADER = "x-refund-worker"  # the pid of the process that sent a request


@dataclass(frozen=True)
class Action:
    """What the model says at one turn: one tool call (name, arguments) or a final text."""

    tool: str | None = None
    args: dict[str, Any] = field(default_factory=dict)
    text: str = ""


def next_action(order: str, turn: int, tool_results: Sequence[str]) -> Action:
    """The scripted answer for `order` at `turn`, given the tool results so far."""
    if turn == 0:
        return Action("lookup_order", {"order": order})
    found = _json(tool_results[0]) if tool_results else {}
    if turn == 1:
        return Action("issue_refund", {"order": order, "amount": found.get("amount", 0.0)})
    if turn == 2:
        body = f"Your refund for order {order} ({found.get('amount', 0.0):.2f} EUR) is on its way."
        return Action("send_email", {"to": found.get("email", ""), "order": order, "body": body})
    return Action(text=f"Refunded order {order} and told the customer.")


def _json(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


# -- pydantic-ai's FunctionModel ---------------------------------------------------------


def function_model() -> Any:
    """The script as a pydantic-ai `FunctionModel` (no server, no network)."""
    from pydantic_ai.messages import (
        ModelMessage,
        ModelRequest,
        ModelResponse,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        prompts = [
            str(p.content)
            for m in messages
            if isinstance(m, ModelRequest)
            for p in m.parts
            if isinstance(p, UserPromptPart)
        ]
        results = [
            p.model_response_str()
            for m in messages
            if isinstance(m, ModelRequest)
            for p in m.parts
            if isinstance(p, ToolReturnPart)
        ]
        match = ORDER.search(prompts[0]) if prompts else None
        turn = sum(isinstance(m, ModelResponse) for m in messages)
        action = next_action(match.group() if match else "o0000", turn, results)
        if action.tool is None:
            return ModelResponse(parts=[TextPart(action.text)])
        return ModelResponse(parts=[ToolCallPart(action.tool, action.args, f"call_{turn}")])

    return FunctionModel(answer, model_name="scripted-function")


# -- the OpenAI-compatible server ----------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """One chat completion request the server answered."""

    serial: int
    order: str
    turn: int
    pid: int
    at: float


class ScriptedModelServer:
    """`POST /v1/chat/completions` on 127.0.0.1 answering `next_action`; counts every call
    (a call is billed once the request arrived, whether or not its sender lived to read it)."""

    model = "scripted"

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.lock = threading.Lock()
        self._httpd = QuietServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def start(self) -> ScriptedModelServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def snapshot(self) -> list[Call]:
        with self.lock:
            return list(self.calls)

    def answer(self, body: dict[str, Any], pid: int) -> dict[str, Any]:
        messages = body.get("messages") or []
        users = [str(m.get("content") or "") for m in messages if m.get("role") == "user"]
        match = ORDER.search(users[0]) if users else None
        order = match.group() if match else "o0000"
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        results = [str(m.get("content") or "") for m in messages if m.get("role") == "tool"]
        with self.lock:
            serial = len(self.calls) + 1
            self.calls.append(Call(serial, order, turn, pid, time.monotonic()))
        action = next_action(order, turn, results)
        message: dict[str, Any] = {"role": "assistant", "content": None}
        if action.tool is None:
            message["content"] = f"{action.text} (rq{serial})"
        else:
            message["tool_calls"] = [
                {
                    "id": f"call_rq{serial}",
                    "type": "function",
                    "function": {"name": action.tool, "arguments": json.dumps(action.args)},
                }
            ]
        return {
            "id": f"chatcmpl-rq{serial}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", self.model),
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "stop" if action.tool is None else "tool_calls",
                    "logprobs": None,
                }
            ],
            "usage": {"prompt_tokens": 120 + 40 * turn, "completion_tokens": 20,
                      "total_tokens": 140 + 40 * turn},
        }  # fmt: skip

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                if len(raw) < length:  # the client was killed before it sent the request
                    self.close_connection = True
                    return
                if self.path.rstrip("/") != "/v1/chat/completions":
                    status, data = 404, {"error": {"message": f"no route {self.path}"}}
                else:
                    pid = int(self.headers.get(PID_HEADER) or 0)
                    status, data = 200, server.answer(json.loads(raw or b"{}"), pid)
                payload = json.dumps(data).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        return Handler
