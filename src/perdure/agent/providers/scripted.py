"""The scripted model: the deterministic test and demo provider, which replays replies in order.

    model = ScriptedModel([
        {"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.md"}}]},
        "The notes say: ship on Friday.",
    ])
    model = ScriptedModel("tests/script.jsonl")               # one reply per line
    model = ScriptedModel(responder=lambda req: req.messages[-1].content.splitlines()[0])

It never touches the network. It counts the calls it answered and the tokens it
"spent" (the script's usage, or an estimate of len(text) // 4), so a test can
assert that replaying a journaled run asks the model nothing and spends nothing.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from ...errors import ConfigError
from ..extractive import extract, extract_pieces
from ..facts import PROMPT as FACTS_PROMPT
from ..messages import Message, ModelRequest, ModelResponse, ToolCall, Usage
from .base import ModelError, Provider

if TYPE_CHECKING:
    from typing import Self

    from ..spec import AgentSpec, ModelSpec

#: One scripted reply: a ModelResponse, its `to_dict()` form, a message-shaped dict
#: (`{"content": ..., "tool_calls": [...], "usage": {...}}`) or a plain string of text.
Reply: TypeAlias = ModelResponse | dict[str, Any] | str

#: Computes a reply from the request (`"summarise: echo the first line"`).
Responder: TypeAlias = Callable[[ModelRequest], Reply]


class ScriptedModel(Provider):
    """The deterministic test/demo model: answers each call with the next scripted reply.

    Replies are served in order; when the script runs out, `responder` (if given)
    answers from the request; otherwise the call raises `ModelError`. Like httpx's
    `MockTransport`, it takes a list, a handler, or both.

    Attributes:
        calls: calls answered so far.
        tokens: tokens those calls "spent" (input + output).
        requests: every request answered, in order, for tests to inspect.
    """

    name = "scripted"
    choices = ("scripted",)

    def __init__(
        self,
        responses: Iterable[Reply] | str | os.PathLike[str] | None = None,
        *,
        responder: Responder | None = None,
        follow_transcript: bool = False,
        latency: float = 0.0,
    ) -> None:
        """Args:
            responses: the replies in order, or the path of a JSON file (a list of
                replies, or `{"responses": [...]}`) or a JSONL file (one reply a line).
            responder: answers every call after the scripted replies are used up.
            follow_transcript: pick reply N for a transcript holding N assistant turns,
                not the Nth call: a run resumed in a new process (whose earlier calls are
                replayed from its journal, not made again) gets the reply it would have.
            latency: seconds each answer takes, as a real model's would (a demo uses it
                so that a kill lands in the middle of a call).

        Raises:
            ConfigError: the file is missing or is not a script.
        """
        if isinstance(responses, str | os.PathLike):
            self.script = load_script(responses)
        else:
            self.script = [_to_response(r, f"reply {i + 1}") for i, r in enumerate(responses or [])]
        self.responder = responder
        self.follow_transcript = follow_transcript
        self.latency = latency
        self.calls = 0
        self.tokens = 0
        self.requests: list[ModelRequest] = []

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> ScriptedModel:
        """A scripted model replaying the replies in a JSON or JSONL file."""
        return cls(path)

    @classmethod
    def from_tier(cls, spec: AgentSpec, tier: str) -> Self:
        """The tier's script (a file next to the spec, replayed by transcript length so a
        resumed run gets the reply it would have had), or `builtin:extractive`.

        Raises:
            ConfigError: the tier names no script.
        """
        model = spec.tier(tier)
        if model.script == "builtin:extractive":
            return cls(responder=extractive_summary, latency=model.latency)
        if model.script is None:
            raise ConfigError(f'model tier {tier!r}: a scripted model needs script = "file"')
        return cls(str(spec.path(model.script)), follow_transcript=True, latency=model.latency)

    @classmethod
    def for_choice(cls, choice: str, current: ModelSpec) -> ModelSpec:
        """`--model scripted`: the extractive summariser, in the tier's context size."""
        from ..spec import ModelSpec

        return ModelSpec(provider=cls.name, script="builtin:extractive",
                         context_tokens=current.context_tokens)  # fmt: skip

    @property
    def remaining(self) -> int:
        """Scripted replies not served yet."""
        return len(self.script) - min(self.calls, len(self.script))

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """The next scripted reply (or the responder's), with its usage counted.

        Raises:
            ModelError: the script is used up and there is no responder.
        """
        if self.latency:
            await asyncio.sleep(self.latency)
        index = self.calls
        if self.follow_transcript:
            index = sum(1 for m in request.messages if m.role == "assistant")
        if index < len(self.script):
            # A copy, so a caller that edits its response cannot change the script.
            response = copy.deepcopy(self.script[index])
        elif self.responder is not None:
            response = _to_response(self.responder(request), "responder reply")
        else:
            raise ModelError(f"scripted model: no response left after {self.calls} calls")
        if not response.model:
            response.model = request.model
        if response.usage.total == 0:
            response.usage = _estimate(request, response.message)
        self.calls += 1
        self.tokens += response.usage.total
        self.requests.append(request)
        return response


def load_script(path: str | os.PathLike[str]) -> list[ModelResponse]:
    """The replies in a JSON (a list, or `{"responses": [...]}`) or JSONL file.

    Raises:
        ConfigError: the file is missing, is not JSON, or holds something else.
    """
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"scripted model: cannot read script {file}: {exc.strerror}") from exc
    if file.suffix == ".jsonl":
        items: list[tuple[str, Any]] = []
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                items.append((f"{file}:{number}", _parse(line, f"{file}:{number}")))
    else:
        data = _parse(text, str(file))
        if isinstance(data, dict) and "responses" in data:
            data = data["responses"]
        if not isinstance(data, list):
            raise ConfigError(
                f"scripted model: {file} must hold a list of replies or {{'responses': [...]}}"
            )
        items = [(f"{file} reply {i + 1}", item) for i, item in enumerate(data)]
    return [_to_response(item, where) for where, item in items]


def _parse(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"scripted model: {where} is not JSON: {exc.msg}") from exc


def _to_response(reply: Any, where: str) -> ModelResponse:
    """A reply in any accepted shape as a ModelResponse (tool calls get ids if they lack one)."""
    if isinstance(reply, ModelResponse):
        return copy.deepcopy(reply)
    if isinstance(reply, str):
        return ModelResponse(message=Message(role="assistant", content=reply), stop_reason="stop")
    if not isinstance(reply, dict):
        raise ConfigError(
            f"scripted model: {where} is a {type(reply).__name__}; "
            "expected a ModelResponse, a dict or a string"
        )
    try:
        if "message" in reply:
            response = ModelResponse.from_dict(reply)
        else:
            calls = [
                ToolCall(
                    id=str(call.get("id") or f"call_{i + 1}"),
                    name=call["name"],
                    arguments=dict(call.get("arguments") or {}),
                )
                for i, call in enumerate(reply.get("tool_calls") or [])
            ]
            response = ModelResponse(
                message=Message(
                    role="assistant", content=reply.get("content") or "", tool_calls=calls
                ),
                usage=Usage(**(reply.get("usage") or {})),
                model=reply.get("model", ""),
                stop_reason=reply.get("stop_reason", ""),
            )
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"scripted model: {where} is not a reply: {exc!r}") from exc
    if not response.stop_reason:
        response.stop_reason = "tool_calls" if response.message.tool_calls else "stop"
    return response


def _estimate(request: ModelRequest, reply: Message) -> Usage:
    """Rough tokens for a reply the script gave no usage for: about four characters a token."""
    sent = sum(len(m.content) for m in request.messages)
    said = len(reply.content) + sum(
        len(c.name) + len(json.dumps(c.arguments)) for c in reply.tool_calls
    )
    return Usage(input_tokens=sent // 4, output_tokens=said // 4)


def extractive_summary(request: ModelRequest) -> ModelResponse:
    """The deterministic scripted summariser (`script = "builtin:extractive"`): the
    sentences of the task's file that carry its facts (perdure.agent.extractive), so demos
    and tests run without any model."""
    users = [m.content for m in request.messages if m.role == "user"]
    text = next((u for u in users if u.count("---") >= 2), users[0] if users else "")
    body = text
    if "\n---\n" in text:  # the file between its fences (the request may follow them)
        body = text.split("\n---\n", 1)[1]
        body = body.rsplit("\n---", 1)[0] if "\n---" in body else body
    if FACTS_PROMPT[:30] in text:  # facts first: the fact sentences, one a line
        pieces, _ = extract_pieces(body)
        facts = "\n".join(f"- {piece}" for piece in pieces) or "- (empty file)"
        return ModelResponse(message=Message("assistant", facts))
    summary = extract(body) or "(empty file)"
    return ModelResponse(message=Message("assistant", f"Summary: {summary}"))
