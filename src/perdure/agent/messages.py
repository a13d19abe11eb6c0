"""The agent's conversation, provider-neutral: messages, tool calls, model requests and replies.

Everything here is a plain dataclass that round-trips through JSON, because a
model call is a journaled step: its request fingerprint and its response are
recorded, and on replay the recorded response is returned as it was.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Role = Literal["system", "user", "assistant", "tool"]


@dataclass
class ToolCall:
    """A tool the model asked for: the provider's call id, the tool's name, its arguments."""

    id: str
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass
class Message:
    """One turn. An assistant turn may carry tool calls; a tool turn answers one call by id."""

    role: Role
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str | None = None  # role == "tool": the call this answers
    name: str | None = None  # role == "tool": the tool's name

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Message:
        calls = [ToolCall(**c) for c in data.get("tool_calls") or []]
        return cls(
            role=data["role"],
            content=data.get("content") or "",
            tool_calls=calls,
            tool_call_id=data.get("tool_call_id"),
            name=data.get("name"),
        )


@dataclass
class ToolSpec:
    """What the model is offered: a tool's name, description and JSON-schema parameters."""

    name: str
    description: str
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})


@dataclass
class Usage:
    """Tokens one call consumed, as the provider reported them."""

    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def total(self) -> int:
        return self.input_tokens + self.output_tokens


@dataclass
class ModelRequest:
    """One model call: which model, the transcript, the tools offered, generation limits."""

    model: str
    messages: list[Message]
    tools: list[ToolSpec] = field(default_factory=list)
    max_tokens: int | None = None
    temperature: float | None = None
    stop: list[str] = field(default_factory=list)  # sequences that end the answer

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if not self.stop:  # absent when unused: requests journaled before it fingerprint alike
            del data["stop"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelRequest:
        return cls(
            model=data["model"],
            messages=[Message.from_dict(m) for m in data["messages"]],
            tools=[ToolSpec(**t) for t in data.get("tools") or []],
            max_tokens=data.get("max_tokens"),
            temperature=data.get("temperature"),
            stop=list(data.get("stop") or []),
        )

    def fingerprint(self) -> str:
        """A stable hash of the request (journaled with the response; equal requests, equal
        fingerprints, whatever the provider)."""
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class ModelResponse:
    """The model's reply: an assistant message (text and/or tool calls) and its usage."""

    message: Message
    usage: Usage = field(default_factory=Usage)
    model: str = ""
    stop_reason: str = ""  # "stop", "tool_calls", "length", ... as the provider said

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelResponse:
        return cls(
            message=Message.from_dict(data["message"]),
            usage=Usage(**data.get("usage") or {}),
            model=data.get("model", ""),
            stop_reason=data.get("stop_reason", ""),
        )
