"""The openai provider: Chat Completions via the official SDK, on OpenAI or any compatible server.

    model = OpenAIModel("gpt-4.1-mini")                                  # OPENAI_API_KEY
    model = OpenAIModel("qwen3", base_url="http://127.0.0.1:8080/v1")   # llama.cpp, vLLM, Ollama

The key and base URL come from the arguments, else from OPENAI_API_KEY and
OPENAI_BASE_URL; a local server without a key gets the placeholder "not-needed".
The client, the key and the translation of the SDK's errors are `base.SdkProvider`'s;
this module holds the Chat Completions wire format.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, ClassVar

from ..messages import Message, ModelRequest, ModelResponse, ToolCall, ToolSpec, Usage
from .base import ModelError, SdkProvider, one_line, stream_out

if TYPE_CHECKING:
    import openai
    from openai.types.chat import (
        ChatCompletion,
        ChatCompletionChunk,
        ChatCompletionFunctionToolParam,
        ChatCompletionMessageFunctionToolCallParam,
        ChatCompletionMessageParam,
    )

OPENAI_URL = "https://api.openai.com/v1"


class OpenAIModel(SdkProvider["openai.AsyncOpenAI"]):
    """Chat Completions with tools, on OpenAI or any server that speaks its wire format."""

    name = "openai"
    api_key_env: ClassVar[str | None] = "OPENAI_API_KEY"  # (LlamaCppModel's is None)
    # a hosted model sends a whole (non-streamed) reply of the usual size well within a minute
    default_timeout = 60.0
    sdk = "openai"
    sdk_error = "OpenAIError"
    service_url = OPENAI_URL
    base_url_env = "OPENAI_BASE_URL"
    model_env = "OPENAI_MODEL"
    default_model = "gpt-4o-mini"
    choices: ClassVar[tuple[str, ...]] = ("openai",)

    async def _ask(
        self, client: openai.AsyncOpenAI, model: str, request: ModelRequest
    ) -> ModelResponse:
        import openai

        # OpenAI's newer models refuse max_tokens; compatible servers may not know its successor.
        limit = request.max_tokens if request.max_tokens is not None else openai.omit
        official = self.base_url == OPENAI_URL
        if not self.stream:
            completion = await client.chat.completions.create(
                model=model,
                messages=[to_openai_message(m) for m in request.messages],
                tools=[to_openai_tool(t) for t in request.tools] or openai.omit,
                max_tokens=openai.omit if official else limit,
                max_completion_tokens=limit if official else openai.omit,
                temperature=_given(request.temperature),
                stop=request.stop or openai.omit,
            )
            return from_openai(completion)
        chunks = await client.chat.completions.create(
            model=model,
            messages=[to_openai_message(m) for m in request.messages],
            tools=[to_openai_tool(t) for t in request.tools] or openai.omit,
            max_tokens=openai.omit if official else limit,
            max_completion_tokens=limit if official else openai.omit,
            temperature=_given(request.temperature),
            stop=request.stop or openai.omit,
            stream=True,
            stream_options={"include_usage": True},
        )
        assembler = StreamAssembler()
        async with chunks:
            async for chunk in chunks:
                assembler.add(chunk)
        return assembler.response()

    def _open(self) -> openai.AsyncOpenAI:
        import openai

        return openai.AsyncOpenAI(
            api_key=self._key,
            base_url=self.base_url,
            timeout=openai.Timeout(self.timeout, connect=self.connect_timeout),
            max_retries=0,
        )


def to_openai_message(message: Message) -> ChatCompletionMessageParam:
    """A provider-neutral message in Chat Completions form."""
    if message.role == "system":
        return {"role": "system", "content": message.content}
    if message.role == "user":
        return {"role": "user", "content": message.content}
    if message.role == "tool":
        if not message.tool_call_id:
            raise ModelError("openai: a tool message must name the tool_call_id it answers")
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
    calls: list[ChatCompletionMessageFunctionToolCallParam] = [
        {
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
        }
        for call in message.tool_calls
    ]
    if calls:
        return {"role": "assistant", "content": message.content or None, "tool_calls": calls}
    return {"role": "assistant", "content": message.content}


def to_openai_tool(tool: ToolSpec) -> ChatCompletionFunctionToolParam:
    """A ToolSpec as a Chat Completions function tool."""
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
        },
    }


def from_openai(completion: ChatCompletion) -> ModelResponse:
    """A (non-streamed) Chat Completion as a provider-neutral response."""
    if not completion.choices:
        raise ModelError(f"openai: the reply to model {completion.model!r} has no choices")
    choice = completion.choices[0]
    calls = [
        parse_call(call.id, call.function.name, call.function.arguments)
        for call in choice.message.tool_calls or []
        if call.type == "function"
    ]
    usage = completion.usage
    return ModelResponse(
        message=Message(role="assistant", content=choice.message.content or "", tool_calls=calls),
        usage=Usage(
            input_tokens=usage.prompt_tokens if usage else 0,
            output_tokens=usage.completion_tokens if usage else 0,
        ),
        model=completion.model,
        stop_reason=choice.finish_reason or "",
    )


class StreamAssembler:
    """Folds streamed chunks (text pieces, tool-call fragments by index, usage) into one reply."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.calls: dict[int, dict[str, str]] = {}
        self.model = ""
        self.stop_reason = ""
        self.usage = Usage()

    def add(self, chunk: ChatCompletionChunk) -> None:
        self.model = chunk.model or self.model
        if chunk.usage is not None:
            self.usage = Usage(chunk.usage.prompt_tokens, chunk.usage.completion_tokens)
        for choice in chunk.choices:
            if choice.index != 0:
                continue
            if choice.finish_reason:
                self.stop_reason = choice.finish_reason
            if choice.delta.content:
                self.text.append(choice.delta.content)
                stream_out(choice.delta.content)  # the run's watchers see it as it comes
            for piece in choice.delta.tool_calls or []:
                call = self.calls.setdefault(piece.index, {"id": "", "name": "", "arguments": ""})
                call["id"] = piece.id or call["id"]
                if piece.function is not None:
                    # The name comes whole in the first fragment; some servers repeat it.
                    if not call["name"] and piece.function.name:
                        stream_out(tool=piece.function.name)
                    call["name"] = call["name"] or piece.function.name or ""
                    call["arguments"] += piece.function.arguments or ""

    def response(self) -> ModelResponse:
        calls = [
            parse_call(c["id"], c["name"], c["arguments"]) for _, c in sorted(self.calls.items())
        ]
        return ModelResponse(
            message=Message(role="assistant", content="".join(self.text), tool_calls=calls),
            usage=self.usage,
            model=self.model,
            stop_reason=self.stop_reason,
        )


def parse_call(call_id: str, name: str, arguments: str) -> ToolCall:
    """A tool call whose arguments arrived as JSON text (empty text means no arguments)."""
    try:
        parsed = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict):
        raise ModelError(
            f"openai: tool call {name!r} ({call_id}) has arguments that are not a JSON object: "
            f"{one_line(arguments)[:200]}"
        )
    return ToolCall(id=call_id, name=name, arguments=parsed)


def _given(value: float | None) -> Any:
    import openai

    return openai.omit if value is None else value
