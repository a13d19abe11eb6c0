"""The anthropic provider: the Messages API through the official SDK, with tools and streaming.

    model = AnthropicModel("claude-sonnet-4-5")                      # ANTHROPIC_API_KEY
    model = AnthropicModel("claude-sonnet-4-5", stream=True, max_tokens=4096)

System messages go to `system=`; tool results go back as `tool_result` blocks in
a user turn, consecutive ones merged into one turn, as the API wants. The SDK
never retries (`max_retries=0`): 429 (with Retry-After), 408, 409, 5xx, 529
overloaded and connection errors become `ModelRetryable`, 401/403
`ModelAuthError` naming ANTHROPIC_API_KEY, anything else `ModelError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from ..messages import Message, ModelRequest, ModelResponse, ToolCall, ToolSpec, Usage
from .base import CONNECT_TIMEOUT, ModelError, SdkProvider, stream_out

if TYPE_CHECKING:
    import anthropic
    from anthropic.types import ContentBlockParam, MessageParam, ToolParam
    from anthropic.types import Message as AnthropicMessage

ANTHROPIC_URL = "https://api.anthropic.com"
# Error types a stream may report after its 200 status; they are worth another attempt.
RETRYABLE_TYPES = {"overloaded_error", "api_error", "rate_limit_error", "timeout_error"}


class AnthropicModel(SdkProvider["anthropic.AsyncAnthropic"]):
    """Claude models through the Messages API, with tool use."""

    name = "anthropic"
    api_key_env = "ANTHROPIC_API_KEY"
    default_timeout = 120.0  # Anthropic's larger replies come within two minutes
    sdk = "anthropic"
    sdk_error = "AnthropicError"
    service_url = ANTHROPIC_URL
    base_url_env = "ANTHROPIC_BASE_URL"
    model_env = "ANTHROPIC_MODEL"
    default_model = "claude-3-5-haiku-latest"
    choices = ("anthropic",)

    def __init__(
        self,
        model: str = "",
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        api_key_env: str | None = None,
        stream: bool = False,
        max_tokens: int = 1024,
        timeout: float | None = None,
        connect_timeout: float = CONNECT_TIMEOUT,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """Args:
            max_tokens: the reply limit when a request sets none (the API requires one).

        The other arguments are `SdkProvider`'s: the base URL else ANTHROPIC_BASE_URL, the
        key else ANTHROPIC_API_KEY.
        """
        super().__init__(
            model, base_url=base_url, api_key=api_key, api_key_env=api_key_env, stream=stream,
            timeout=timeout, connect_timeout=connect_timeout, env=env,
        )  # fmt: skip
        self.max_tokens = max_tokens

    async def _ask(
        self, client: anthropic.AsyncAnthropic, model: str, request: ModelRequest
    ) -> ModelResponse:
        import anthropic

        system = "\n\n".join(m.content for m in request.messages if m.role == "system")
        messages = to_anthropic_messages(request.messages)
        tools = [to_anthropic_tool(t) for t in request.tools]
        max_tokens = request.max_tokens or self.max_tokens
        # The SDK no longer offers `temperature`; servers that still take it find it in the body.
        extra = None if request.temperature is None else {"temperature": request.temperature}
        if not self.stream:
            reply = await client.messages.create(
                model=model,
                max_tokens=max_tokens,
                messages=messages,
                system=system or anthropic.omit,
                tools=tools or anthropic.omit,
                stop_sequences=request.stop or anthropic.omit,
                extra_body=extra,
            )
            return from_anthropic(reply)
        # The SDK's stream folds text and tool-input JSON deltas into the final message.
        async with client.messages.stream(
            model=model,
            max_tokens=max_tokens,
            messages=messages,
            system=system or anthropic.omit,
            tools=tools or anthropic.omit,
            stop_sequences=request.stop or anthropic.omit,
            extra_body=extra,
        ) as stream:
            async for event in stream:  # deltas to the run's stream as they come
                if event.type == "text":
                    stream_out(event.text)
                elif event.type == "content_block_start" and event.content_block.type == (
                    "tool_use"
                ):
                    stream_out(tool=event.content_block.name)
            return from_anthropic(await stream.get_final_message())

    def _open(self) -> anthropic.AsyncAnthropic:
        import anthropic

        return anthropic.AsyncAnthropic(
            api_key=self._key,
            base_url=self.base_url,
            timeout=anthropic.Timeout(self.timeout, connect=self.connect_timeout),
            max_retries=0,
        )

    def _retryable(self, body: object) -> bool:
        """529 overloaded and kin, reported in the body."""
        return error_type(body) in RETRYABLE_TYPES


def error_type(body: object) -> str | None:
    """The `error.type` of an Anthropic error body (`{"type": "error", "error": {...}}`)."""
    inner = body.get("error") if isinstance(body, dict) else None
    kind = inner.get("type") if isinstance(inner, dict) else None
    return kind if isinstance(kind, str) else None


def to_anthropic_messages(messages: list[Message]) -> list[MessageParam]:
    """The transcript as alternating user/assistant turns (system messages go elsewhere).

    A tool message becomes a `tool_result` block in a user turn; a turn of the same
    role as the one before it joins that turn, so parallel tool results travel together.
    """
    turns: list[tuple[Literal["user", "assistant"], list[ContentBlockParam]]] = []
    for message in messages:
        blocks: list[ContentBlockParam] = []
        role: Literal["user", "assistant"] = "user"
        if message.role == "system":
            continue
        if message.role == "tool":
            if not message.tool_call_id:
                raise ModelError("anthropic: a tool message must name the tool_call_id it answers")
            blocks.append(
                {
                    "type": "tool_result",
                    "tool_use_id": message.tool_call_id,
                    "content": message.content,
                }
            )
        else:
            # The API refuses empty text blocks.
            if message.content:
                blocks.append({"type": "text", "text": message.content})
            if message.role == "assistant":
                role = "assistant"
                for call in message.tool_calls:
                    blocks.append(
                        {
                            "type": "tool_use",
                            "id": call.id,
                            "name": call.name,
                            "input": call.arguments,
                        }
                    )
        if not blocks:
            continue
        if turns and turns[-1][0] == role:
            turns[-1][1].extend(blocks)
        else:
            turns.append((role, blocks))
    out: list[MessageParam] = []
    for role, blocks in turns:
        only = blocks[0]
        content: str | list[ContentBlockParam] = blocks
        if len(blocks) == 1 and only["type"] == "text":
            content = only["text"]
        if role == "user":
            out.append({"role": "user", "content": content})
        else:
            out.append({"role": "assistant", "content": content})
    return out


def to_anthropic_tool(tool: ToolSpec) -> ToolParam:
    """A ToolSpec as a Messages API tool."""
    return {"name": tool.name, "description": tool.description, "input_schema": tool.parameters}


def from_anthropic(reply: AnthropicMessage) -> ModelResponse:
    """A Messages API reply as a provider-neutral response (cache reads count as input)."""
    text: list[str] = []
    calls: list[ToolCall] = []
    for block in reply.content:
        if block.type == "text":
            text.append(block.text)
        elif block.type == "tool_use":
            arguments: Any = block.input
            calls.append(
                ToolCall(
                    id=block.id,
                    name=block.name,
                    arguments=dict(arguments) if isinstance(arguments, dict) else {},
                )
            )
    usage = reply.usage
    input_tokens = (
        usage.input_tokens
        + (usage.cache_creation_input_tokens or 0)
        + (usage.cache_read_input_tokens or 0)
    )
    return ModelResponse(
        message=Message(role="assistant", content="".join(text), tool_calls=calls),
        usage=Usage(input_tokens=input_tokens, output_tokens=usage.output_tokens),
        model=reply.model,
        stop_reason=reply.stop_reason or "",
    )
