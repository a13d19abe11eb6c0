"""The openai provider: Chat Completions via the official SDK, on OpenAI or any compatible server.

    model = OpenAIModel("gpt-4.1-mini")                                  # OPENAI_API_KEY
    model = OpenAIModel("qwen3", base_url="http://127.0.0.1:8080/v1")   # llama.cpp, vLLM, Ollama

The key and base URL come from the arguments, else from OPENAI_API_KEY and
OPENAI_BASE_URL; a local server without a key gets the placeholder "not-needed".
The SDK never retries (`max_retries=0`): its errors become `ModelRetryable`
(429 with Retry-After, 408, 409, 5xx, connection), `ModelAuthError` (401/403,
naming the key to fix) or `ModelError`, and the durable step decides.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import os
import re
import time
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ...errors import PerdureError
from ...extras import require_extra
from ..messages import Message, ModelRequest, ModelResponse, ToolCall, ToolSpec, Usage
from .base import MissingKey, ModelAuthError, ModelError, ModelRetryable, stream_out

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
CONNECT_TIMEOUT = 5.0  # seconds to open a connection, as the SDKs' own default
PLACEHOLDER_KEY = "not-needed"  # local servers (llama.cpp, vLLM, Ollama) ignore the key


class OpenAIModel:
    """Chat Completions with tools, on OpenAI or any server that speaks its wire format."""

    name = "openai"

    def __init__(
        self,
        model: str = "",
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        stream: bool = False,
        timeout: float = 60.0,
        connect_timeout: float = CONNECT_TIMEOUT,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """Args:
            model: the model asked when a request names none.
            base_url: the server, e.g. `http://127.0.0.1:8080/v1`; else OPENAI_BASE_URL,
                else OpenAI's.
            api_key: else the variable `api_key_env`; unneeded with a base URL.
            api_key_env: the variable holding the key, named when the server refuses it.
            stream: ask for a streamed reply and assemble it (same ModelResponse).
            timeout: seconds the server may stay silent: to answer a call (the whole reply
                when not streamed) or between two streamed chunks.
            connect_timeout: seconds to open the connection (a down host fails fast).
            env: where the settings are read (default: the process environment).

        Raises:
            ConfigError: the openai SDK is missing, or no key is set for OpenAI itself.
        """
        require_extra("models", "the openai model provider", "openai")  # now, not at a call
        env = os.environ if env is None else env
        self.model = model
        self.base_url = (base_url or env.get("OPENAI_BASE_URL") or OPENAI_URL).rstrip("/")
        self._key, self._key_source = resolve_key(
            api_key, api_key_env, env, local=self.base_url != OPENAI_URL, url_env="OPENAI_BASE_URL"
        )
        self.stream = stream
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        # An SDK client holds connections bound to the event loop that opened them.
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, openai.AsyncOpenAI]
        self._clients = weakref.WeakKeyDictionary()

    def __repr__(self) -> str:
        return f"OpenAIModel(model={self.model!r}, base_url={self.base_url!r})"

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """One Chat Completions call (streamed if asked), as a provider-neutral response.

        Raises:
            ModelRetryable: 429 (with `retry_after`), 408, 409, 5xx, connection or timeout.
            ModelAuthError: 401/403; the message names the key and the server.
            ModelError: any other refusal, or a reply that cannot be read.
        """
        import openai

        model = request.model or self.model
        if not model:
            raise ModelError("openai: no model named (pass model= or set it in the request)")
        # OpenAI's newer models refuse max_tokens; compatible servers may not know its successor.
        limit = request.max_tokens if request.max_tokens is not None else openai.omit
        official = self.base_url == OPENAI_URL
        client = self._client()
        try:
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
        except openai.OpenAIError as exc:
            raise self._translate(exc) from exc

    async def aclose(self) -> None:
        """Close the SDK client of the running event loop."""
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.close()

    def _client(self) -> openai.AsyncOpenAI:
        import openai

        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = openai.AsyncOpenAI(
                api_key=self._key,
                base_url=self.base_url,
                timeout=openai.Timeout(self.timeout, connect=self.connect_timeout),
                max_retries=0,
            )
            self._clients[loop] = client
        return client

    def _translate(self, exc: openai.OpenAIError) -> PerdureError:
        """The perdure error for an SDK error: retryable, an auth problem, or final."""
        import openai

        where = f"openai {self.base_url}"
        if isinstance(exc, openai.APITimeoutError):
            return ModelRetryable(f"{where}: {timed_out(exc, self.timeout, self.connect_timeout)}")
        if isinstance(exc, openai.APIConnectionError):
            return ModelRetryable(f"{where}: {one_line(exc.message)}")
        if not isinstance(exc, openai.APIStatusError):
            return ModelError(f"{where}: {one_line(str(exc))}")
        status, said = exc.status_code, server_message(exc.body, exc.message)
        if isinstance(exc, openai.AuthenticationError | openai.PermissionDeniedError):
            verb = "rejected" if status == 401 else "not permitted"
            return ModelAuthError(
                f"{self._key_source} {verb} by {self.base_url}: {status} {said}",
                status=status,
                setting=self._key_source,
                detail=f"{status} from {self.base_url}: {said}",
            )
        if status in (408, 409, 429) or status >= 500:
            after = retry_after_seconds(exc.response.headers)
            return ModelRetryable(f"{where}: {status} {said}", retry_after=after)
        return ModelError(f"{where}: {status} {said}")


def resolve_key(
    api_key: str | None, api_key_env: str, env: Mapping[str, str], *, local: bool, url_env: str
) -> tuple[str, str]:
    """The key to send and the setting it came from (named when the server refuses it).

    Raises:
        ConfigError: no key anywhere, for the provider's own service (a local server
            gets a placeholder instead).
    """
    if api_key:
        return api_key, "the api_key argument"
    if env.get(api_key_env):
        return env[api_key_env], api_key_env
    if local:
        return PLACEHOLDER_KEY, f"{api_key_env} (unset)"
    raise MissingKey(
        f"{api_key_env} is not set: export it, pass api_key=..., "
        f"or set {url_env} to a compatible server",
        setting=api_key_env,
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


def retry_after_seconds(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds the server asked to wait: `retry-after-ms`, or `Retry-After` in seconds or as an
    HTTP date; None when it did not say."""
    millis = headers.get("retry-after-ms")
    if millis:
        try:
            return max(0.0, float(millis) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    # An HTTP date is wall-clock time, so it is compared with the wall clock.
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def server_message(body: object, fallback: str) -> str:
    """The server's own words from an error body (`{"error": {"message": ...}}` and kin)."""
    found: object = None
    if isinstance(body, dict):
        inner = body.get("error", body)
        found = inner.get("message") if isinstance(inner, dict) else inner
    elif isinstance(body, str):
        found = body
    return one_line(str(found) if found else fallback)


def timed_out(exc: BaseException, timeout: float, connect_timeout: float) -> str:
    """What an SDK timeout means, by the HTTP client's timeout under it: connecting, or
    waiting (by name: the SDKs have moved from httpx to httpx2, both call it ConnectTimeout)."""
    cause = type(exc.__cause__).__mro__ if exc.__cause__ is not None else ()
    if any(kind.__name__ == "ConnectTimeout" for kind in cause):
        return f"no connection within {connect_timeout:g}s (connect_timeout)"
    return f"no answer within {timeout:g}s (timeout)"


def one_line(text: str) -> str:
    """Text with its runs of whitespace (newlines too) made single spaces."""
    return re.sub(r"\s+", " ", text).strip()


def _given(value: float | None) -> Any:
    import openai

    return openai.omit if value is None else value
