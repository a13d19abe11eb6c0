"""Model providers: the scripted model, and openai/anthropic through their real SDKs against
local servers on 127.0.0.1 that speak each provider's wire format (no real provider is called)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import pytest
from wire_servers import INPUT_TOKENS, OUTPUT_TOKENS, AnthropicServer, OpenAIServer

from extras_needed import require
from perdure.agent.messages import Message, ModelRequest, ModelResponse, ToolCall, ToolSpec, Usage
from perdure.agent.providers.anthropic import AnthropicModel
from perdure.agent.providers.base import (
    ModelAuthError,
    ModelError,
    ModelProvider,
    ModelRetryable,
    retry_after_seconds,
)
from perdure.agent.providers.openai import OpenAIModel
from perdure.agent.providers.registry import make_provider
from perdure.agent.providers.scripted import ScriptedModel
from perdure.errors import ConfigError

WEATHER = ToolSpec(
    name="get_weather",
    description="The weather in a city.",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
)
ARGS = {"city": "Paris", "units": "metric", "days": [1, 2]}


def ask(text: str = "Hi", tools: list[ToolSpec] | None = None) -> ModelRequest:
    return ModelRequest(
        model="test-model",
        messages=[Message("system", "You are terse."), Message("user", text)],
        tools=tools or [],
    )


def follow_up() -> ModelRequest:
    """A transcript where the model called two tools and both results came back."""
    return ModelRequest(
        model="test-model",
        messages=[
            Message("system", "You are terse."),
            Message("user", "Weather in Paris and Oslo?"),
            Message(
                "assistant",
                "Checking.",
                tool_calls=[
                    ToolCall("call_1", "get_weather", {"city": "Paris"}),
                    ToolCall("call_2", "get_weather", {"city": "Oslo"}),
                ],
            ),
            Message("tool", "18C sunny", tool_call_id="call_1", name="get_weather"),
            Message("tool", "3C snow", tool_call_id="call_2", name="get_weather"),
        ],
        tools=[WEATHER],
    )


def call(model: OpenAIModel | AnthropicModel, request: ModelRequest) -> ModelResponse:
    """One call on a fresh event loop, closing the SDK client after it."""

    async def go() -> ModelResponse:
        try:
            return await model.complete(request)
        finally:
            await model.aclose()

    return asyncio.run(go())


def openai_model(server: OpenAIServer, stream: bool = False) -> OpenAIModel:
    return OpenAIModel(
        "fallback-model", base_url=f"{server.origin}/v1", api_key="sk-test", stream=stream, env={}
    )


def anthropic_model(server: AnthropicServer, stream: bool = False) -> AnthropicModel:
    return AnthropicModel(
        "fallback-model", base_url=server.origin, api_key="sk-ant-test", stream=stream, env={}
    )


# --- scripted -------------------------------------------------------------------------


def test_scripted_replays_in_order_including_tool_calls() -> None:
    """Replies come back in script order, whatever their form (object, dict, string)."""
    scripted = ModelResponse(Message("assistant", "first"), Usage(5, 2), stop_reason="stop")
    model = ScriptedModel(
        [
            scripted,
            {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]},
            "third",
        ]
    )
    replies = [asyncio.run(model.complete(ask(f"q{i}"))) for i in range(3)]
    assert [r.message.content for r in replies] == ["first", "", "third"]
    assert replies[0].usage == Usage(5, 2)
    assert replies[1].message.tool_calls == [ToolCall("call_1", "get_weather", {"city": "Oslo"})]
    assert replies[1].stop_reason == "tool_calls"
    assert replies[2].model == "test-model"
    assert [r.messages[-1].content for r in model.requests] == ["q0", "q1", "q2"]


def test_scripted_raises_when_the_script_runs_out() -> None:
    """A call after the last scripted reply is a ModelError saying how many calls were served."""
    model = ScriptedModel(["only"])
    asyncio.run(model.complete(ask()))
    with pytest.raises(ModelError, match="no response left after 1 calls"):
        asyncio.run(model.complete(ask()))
    assert model.calls == 1


def test_scripted_counts_calls_and_tokens() -> None:
    """Tokens come from the script's usage, else about len(text) // 4; untouched means zero."""
    model = ScriptedModel([{"content": "x" * 40, "usage": {"input_tokens": 3, "output_tokens": 4}}])
    model.responder = lambda request: ModelResponse(Message("assistant", "y" * 20))
    assert (model.calls, model.tokens) == (0, 0)
    asyncio.run(model.complete(ask("a" * 8)))
    assert (model.calls, model.tokens) == (1, 7)
    second = asyncio.run(model.complete(ask("a" * 8)))
    # input: "You are terse." (14) + 8 characters -> 5 tokens; output: 20 characters -> 5 tokens
    assert second.usage == Usage(5, 5)
    assert (model.calls, model.tokens) == (2, 17)


def test_scripted_responder_computes_replies_from_the_request() -> None:
    """The responder answers from the request once the script is used up."""
    model = ScriptedModel(
        ["scripted"],
        responder=lambda req: "summary: " + req.messages[-1].content.splitlines()[0],
    )
    first = asyncio.run(model.complete(ask("ignored")))
    second = asyncio.run(model.complete(ask("line one\nline two")))
    assert (first.message.content, second.message.content) == ("scripted", "summary: line one")


def test_scripted_loads_json_and_jsonl_files(tmp_path: Path) -> None:
    """A JSON list, a {"responses": [...]} object and a JSONL file all load, in order."""
    call = {"tool_calls": [{"id": "c9", "name": "get_weather", "arguments": ARGS}]}
    full = ModelResponse(Message("assistant", "done"), Usage(1, 1)).to_dict()
    (tmp_path / "a.json").write_text(json.dumps([call, "done"]))
    (tmp_path / "b.json").write_text(json.dumps({"responses": [call, full]}))
    (tmp_path / "c.jsonl").write_text(f"{json.dumps(call)}\n\n{json.dumps(full)}\n")
    for name in ("a.json", "b.json", "c.jsonl"):
        model = ScriptedModel(tmp_path / name)
        first = asyncio.run(model.complete(ask()))
        second = asyncio.run(model.complete(ask()))
        assert first.message.tool_calls == [ToolCall("c9", "get_weather", ARGS)], name
        assert second.message.content == "done", name
        assert model.remaining == 0


def test_scripted_file_errors_are_config_errors(tmp_path: Path) -> None:
    """A missing file, bad JSON or a non-list names the file (and the line) in a ConfigError."""
    with pytest.raises(ConfigError, match="cannot read script"):
        ScriptedModel(tmp_path / "missing.json")
    (tmp_path / "bad.jsonl").write_text('"ok"\n{nope\n')
    with pytest.raises(ConfigError, match=r"bad\.jsonl:2 is not JSON"):
        ScriptedModel(tmp_path / "bad.jsonl")
    (tmp_path / "obj.json").write_text('{"reply": 1}')
    with pytest.raises(ConfigError, match="must hold a list"):
        ScriptedModel(tmp_path / "obj.json")


def test_scripted_replies_are_copies() -> None:
    """Editing a returned response does not change what the script replays next time."""
    model = ScriptedModel([ModelResponse(Message("assistant", "same"))] * 2)
    first = asyncio.run(model.complete(ask()))
    first.message.content = "edited"
    assert asyncio.run(model.complete(ask())).message.content == "same"


# --- openai ---------------------------------------------------------------------------


def test_openai_text_reply_and_usage(openai_server: OpenAIServer) -> None:
    """A plain reply maps text, usage, stop reason and model; the SDK sent key and messages."""
    openai_server.reply("Bonjour!")
    reply = call(openai_model(openai_server), ask("Say hi in French"))
    assert reply.message == Message("assistant", "Bonjour!")
    assert reply.usage == Usage(INPUT_TOKENS, OUTPUT_TOKENS)
    assert (reply.stop_reason, reply.model) == ("stop", "test-model")
    sent = openai_server.requests[-1]
    assert sent.headers["authorization"] == "Bearer sk-test"
    assert sent.body["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Say hi in French"},
    ]
    assert "tools" not in sent.body and "stream" not in sent.body and "stop" not in sent.body


def test_stop_sequences_reach_both_sdks(
    openai_server: OpenAIServer, anthropic_server: AnthropicServer
) -> None:
    """A tier's `stop` goes out as OpenAI's `stop` and Anthropic's `stop_sequences`."""
    request = ask("Summarise")
    request.stop = ["\n\n"]
    openai_server.reply("One paragraph.")
    call(openai_model(openai_server), request)
    assert openai_server.requests[-1].body["stop"] == ["\n\n"]
    anthropic_server.reply("One paragraph.")
    call(anthropic_model(anthropic_server), request)
    assert anthropic_server.requests[-1].body["stop_sequences"] == ["\n\n"]
    assert "stop" not in ask().to_dict()  # unused: requests fingerprint as before


def test_openai_tool_call_reply(openai_server: OpenAIServer) -> None:
    """A tool call comes back as a ToolCall whose arguments are a dict; tools were offered."""
    openai_server.reply(tool_calls=[("call_9", "get_weather", ARGS)])
    reply = call(openai_model(openai_server), ask("Weather?", [WEATHER]))
    assert reply.message.tool_calls == [ToolCall("call_9", "get_weather", ARGS)]
    assert reply.stop_reason == "tool_calls"
    assert openai_server.requests[-1].body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city.",
                "parameters": WEATHER.parameters,
            },
        }
    ]


def test_openai_sends_tool_results_paired_with_their_calls(openai_server: OpenAIServer) -> None:
    """The assistant's calls carry JSON-text arguments; each result names its call id."""
    call(openai_model(openai_server), follow_up())
    messages = openai_server.requests[-1].body["messages"]
    assert messages[2] == {
        "role": "assistant",
        "content": "Checking.",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            },
            {
                "id": "call_2",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
            },
        ],
    }
    assert messages[3:] == [
        {"role": "tool", "tool_call_id": "call_1", "content": "18C sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": "3C snow"},
    ]


@pytest.mark.parametrize(
    "turn",
    [
        {"text": "A fairly long streamed answer, in pieces."},
        {"text": "Two calls:", "tool_calls": [("c1", "get_weather", ARGS), ("c2", "noop", {})]},
    ],
    ids=["text", "tool-calls"],
)
def test_openai_streaming_gives_the_same_response(
    openai_server: OpenAIServer, turn: dict[str, Any]
) -> None:
    """Streamed text pieces, argument fragments and final usage assemble into the same reply."""
    openai_server.reply(**turn)
    openai_server.reply(**turn)
    plain = call(openai_model(openai_server), ask("Go", [WEATHER]))
    streamed = call(openai_model(openai_server, stream=True), ask("Go", [WEATHER]))
    assert streamed == plain
    assert streamed.usage == Usage(INPUT_TOKENS, OUTPUT_TOKENS)
    sent = openai_server.requests[-1].body
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}


def test_openai_429_is_retryable_with_retry_after(openai_server: OpenAIServer) -> None:
    """429 with Retry-After: 3 is ModelRetryable(retry_after=3.0), and the SDK did not retry."""
    openai_server.fail_next(429, retry_after="3")
    with pytest.raises(ModelRetryable, match="429 Rate limit reached") as caught:
        call(openai_model(openai_server), ask())
    assert caught.value.retry_after == 3.0
    assert len(openai_server.requests) == 1


def test_openai_500_is_retryable(openai_server: OpenAIServer) -> None:
    """A 5xx is ModelRetryable without a wait, asked once."""
    openai_server.fail_next(500)
    with pytest.raises(ModelRetryable, match="500 The server had an error") as caught:
        call(openai_model(openai_server, stream=True), ask())
    assert caught.value.retry_after is None
    assert len(openai_server.requests) == 1


def test_openai_401_names_the_key_in_one_line(openai_server: OpenAIServer) -> None:
    """401 is a ModelAuthError naming OPENAI_API_KEY and the server, on one line."""
    openai_server.fail_next(401)
    model = OpenAIModel(
        "m", base_url=f"{openai_server.origin}/v1", env={"OPENAI_API_KEY": "sk-bad"}
    )
    with pytest.raises(ModelAuthError) as caught:
        call(model, ask())
    message = str(caught.value)
    assert message.startswith(f"OPENAI_API_KEY rejected by {openai_server.origin}/v1: 401 ")
    assert "Incorrect API key provided" in message and "\n" not in message
    assert openai_server.requests[-1].headers["authorization"] == "Bearer sk-bad"


def test_openai_400_is_final_with_the_server_message(openai_server: OpenAIServer) -> None:
    """A 400 is a plain ModelError (not retried) carrying the server's message."""
    openai_server.fail_next(400)
    with pytest.raises(ModelError, match="400 Unknown parameter: 'bogus'") as caught:
        call(openai_model(openai_server), ask())
    assert not isinstance(caught.value, ModelAuthError)


def test_openai_connection_refused_is_retryable() -> None:
    """Nothing listening is a ModelRetryable (the step retries it later)."""
    require("models", "openai")
    server = OpenAIServer().start()
    url = f"{server.origin}/v1"
    server.stop()
    with pytest.raises(ModelRetryable, match="openai"):
        call(OpenAIModel("m", base_url=url, api_key="k", timeout=5, env={}), ask())


def test_openai_settings_come_from_env_with_a_placeholder_key(openai_server: OpenAIServer) -> None:
    """OPENAI_BASE_URL is used; without a key a local server gets "not-needed"."""
    model = OpenAIModel("m", env={"OPENAI_BASE_URL": f"{openai_server.origin}/v1"})
    reply = call(model, ask())
    assert reply.message.content == "hello"
    assert openai_server.requests[-1].headers["authorization"] == "Bearer not-needed"
    with pytest.raises(ConfigError, match="OPENAI_API_KEY is not set"):
        OpenAIModel("m", env={})


def test_a_key_from_another_variable_is_named_when_refused(openai_server: OpenAIServer) -> None:
    """api_key_env picks the variable the key is read from, and the 401 names that variable."""
    openai_server.fail_next(401)
    env = {"TEAM_OPENAI_KEY": "sk-team", "OPENAI_API_KEY": "sk-other"}
    model = OpenAIModel(
        "m", base_url=f"{openai_server.origin}/v1", api_key_env="TEAM_OPENAI_KEY", env=env
    )
    with pytest.raises(ModelAuthError, match=r"^TEAM_OPENAI_KEY rejected by"):
        call(model, ask())
    assert openai_server.requests[-1].headers["authorization"] == "Bearer sk-team"
    with pytest.raises(ConfigError, match="TEAM_KEY is not set"):
        AnthropicModel("m", api_key_env="TEAM_KEY", env={"ANTHROPIC_API_KEY": "sk"})


def test_openai_limits_go_to_the_server(openai_server: OpenAIServer) -> None:
    """max_tokens and temperature reach a compatible server; the request's model wins."""
    request = ask()
    request.max_tokens, request.temperature = 50, 0.2
    call(openai_model(openai_server), request)
    sent = openai_server.requests[-1].body
    assert (sent["model"], sent["max_tokens"], sent["temperature"]) == ("test-model", 50, 0.2)


# --- anthropic ------------------------------------------------------------------------


def sent_key(headers: dict[str, str]) -> str:
    """The key as the SDK sent it (x-api-key in older SDKs, a bearer token in newer ones)."""
    return headers.get("x-api-key") or headers.get("authorization", "").removeprefix("Bearer ")


def test_anthropic_text_reply_and_usage(anthropic_server: AnthropicServer) -> None:
    """A plain reply maps text and usage; system went to `system=`, and the key was sent."""
    anthropic_server.reply("Bonjour!")
    reply = call(anthropic_model(anthropic_server), ask("Say hi in French"))
    assert reply.message == Message("assistant", "Bonjour!")
    assert reply.usage == Usage(INPUT_TOKENS, OUTPUT_TOKENS)
    assert (reply.stop_reason, reply.model) == ("end_turn", "test-model")
    sent = anthropic_server.requests[-1]
    assert sent_key(sent.headers) == "sk-ant-test"
    assert sent.body["system"] == "You are terse."
    assert sent.body["max_tokens"] == 1024
    assert sent.body["messages"] == [{"role": "user", "content": "Say hi in French"}]


def test_anthropic_tool_use_reply(anthropic_server: AnthropicServer) -> None:
    """A tool_use block comes back as a ToolCall with its input dict; tools carry input_schema."""
    anthropic_server.reply("Let me look.", tool_calls=[("toolu_1", "get_weather", ARGS)])
    reply = call(anthropic_model(anthropic_server), ask("Weather?", [WEATHER]))
    assert reply.message.content == "Let me look."
    assert reply.message.tool_calls == [ToolCall("toolu_1", "get_weather", ARGS)]
    assert reply.stop_reason == "tool_use"
    assert anthropic_server.requests[-1].body["tools"] == [
        {
            "name": "get_weather",
            "description": "The weather in a city.",
            "input_schema": WEATHER.parameters,
        }
    ]


def test_anthropic_sends_tool_results_in_one_user_turn(anthropic_server: AnthropicServer) -> None:
    """tool_use blocks follow the text; both tool_results travel in one user turn, by id."""
    request = follow_up()
    request.messages.append(Message("user", "Compare them."))
    call(anthropic_model(anthropic_server), request)
    sent = anthropic_server.requests[-1].body
    assert sent["system"] == "You are terse."
    assert sent["messages"] == [
        {"role": "user", "content": "Weather in Paris and Oslo?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Checking."},
                {
                    "type": "tool_use",
                    "id": "call_1",
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                },
                {
                    "type": "tool_use",
                    "id": "call_2",
                    "name": "get_weather",
                    "input": {"city": "Oslo"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "call_1", "content": "18C sunny"},
                {"type": "tool_result", "tool_use_id": "call_2", "content": "3C snow"},
                {"type": "text", "text": "Compare them."},
            ],
        },
    ]


@pytest.mark.parametrize(
    "turn",
    [
        {"text": "A fairly long streamed answer, in pieces."},
        {"text": "Two calls:", "tool_calls": [("t1", "get_weather", ARGS), ("t2", "noop", {})]},
    ],
    ids=["text", "tool-calls"],
)
def test_anthropic_streaming_gives_the_same_response(
    anthropic_server: AnthropicServer, turn: dict[str, Any]
) -> None:
    """text_delta and input_json_delta events assemble into the same reply as plain JSON."""
    anthropic_server.reply(**turn)
    anthropic_server.reply(**turn)
    plain = call(anthropic_model(anthropic_server), ask("Go", [WEATHER]))
    streamed = call(anthropic_model(anthropic_server, stream=True), ask("Go", [WEATHER]))
    assert streamed == plain
    assert streamed.usage == Usage(INPUT_TOKENS, OUTPUT_TOKENS)
    assert anthropic_server.requests[-1].body["stream"] is True


def test_anthropic_429_is_retryable_with_retry_after(anthropic_server: AnthropicServer) -> None:
    """429 with Retry-After: 3 is ModelRetryable(retry_after=3.0), and the SDK did not retry."""
    anthropic_server.fail_next(429, retry_after="3")
    with pytest.raises(ModelRetryable, match="exceeded your rate limit") as caught:
        call(anthropic_model(anthropic_server), ask())
    assert caught.value.retry_after == 3.0
    assert len(anthropic_server.requests) == 1


@pytest.mark.parametrize("status", [500, 529])
def test_anthropic_5xx_and_overloaded_are_retryable(
    anthropic_server: AnthropicServer, status: int
) -> None:
    """500 and 529 (overloaded) are ModelRetryable, asked once."""
    anthropic_server.fail_next(status)
    with pytest.raises(ModelRetryable, match=f"anthropic .*: {status} "):
        call(anthropic_model(anthropic_server, stream=True), ask())
    assert len(anthropic_server.requests) == 1


def test_anthropic_overloaded_mid_stream_is_retryable(anthropic_server: AnthropicServer) -> None:
    """An overloaded_error event after a 200 stream began is ModelRetryable, not final."""
    anthropic_server.overload_mid_stream = True
    with pytest.raises(ModelRetryable, match="Overloaded"):
        call(anthropic_model(anthropic_server, stream=True), ask())


def test_anthropic_401_names_the_key_in_one_line(anthropic_server: AnthropicServer) -> None:
    """401 is a ModelAuthError naming ANTHROPIC_API_KEY and the server, on one line."""
    anthropic_server.fail_next(401)
    model = AnthropicModel(
        "m", base_url=anthropic_server.origin, env={"ANTHROPIC_API_KEY": "sk-ant-bad"}
    )
    with pytest.raises(ModelAuthError) as caught:
        call(model, ask())
    message = str(caught.value)
    assert message.startswith(f"ANTHROPIC_API_KEY rejected by {anthropic_server.origin}: 401 ")
    assert "invalid x-api-key" in message and "\n" not in message


def test_anthropic_403_and_400(anthropic_server: AnthropicServer) -> None:
    """403 is an auth error naming the api_key argument; 400 is final with the server's words."""
    anthropic_server.fail_next(403)
    with pytest.raises(ModelAuthError, match="the api_key argument not permitted by"):
        call(anthropic_model(anthropic_server), ask())
    anthropic_server.fail_next(400)
    with pytest.raises(ModelError, match="400 messages: at least one message") as caught:
        call(anthropic_model(anthropic_server), ask())
    assert not isinstance(caught.value, ModelAuthError)


# --- shared pieces ----------------------------------------------------------------------


def test_retry_after_reads_seconds_milliseconds_and_dates() -> None:
    """Retry-After in seconds or as an HTTP date, and retry-after-ms, become seconds."""
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    later = format_datetime(datetime(2026, 1, 1, 12, 0, 30, tzinfo=UTC), usegmt=True)
    assert retry_after_seconds({"retry-after": "3"}) == 3.0
    assert retry_after_seconds({"retry-after-ms": "1500"}) == 1.5
    assert retry_after_seconds({"retry-after": later}, now=now.timestamp()) == 30.0
    assert retry_after_seconds({"retry-after": "soon"}) is None
    assert retry_after_seconds({}) is None


def test_registry_builds_each_kind_and_refuses_unknowns(openai_server: OpenAIServer) -> None:
    """make_provider gives each provider by name; unknown kinds and options are ConfigErrors."""
    scripted: ModelProvider = make_provider("scripted", responses=["hi"])
    assert isinstance(scripted, ScriptedModel) and scripted.name == "scripted"
    openai = make_provider("openai", model="m", base_url=f"{openai_server.origin}/v1", env={})
    assert isinstance(openai, OpenAIModel) and openai.name == "openai"
    anthropic = make_provider("anthropic", model="m", api_key="k", max_tokens=10)
    assert isinstance(anthropic, AnthropicModel) and anthropic.max_tokens == 10
    with pytest.raises(ConfigError, match="unknown model provider 'gemini': use one of scripted"):
        make_provider("gemini")
    with pytest.raises(ConfigError, match=r"unknown option.* temperatur .*it takes model"):
        make_provider("openai", model="m", temperatur=0.1)
    with pytest.raises(ConfigError, match="ANTHROPIC_API_KEY is not set"):
        make_provider("anthropic", model="m", env={})


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_streamed_reply_reaches_the_runs_stream_as_it_comes(
    provider: str,
    openai_server: OpenAIServer,
    anthropic_server: AnthropicServer,
    app: Any,
    worker: Any,
) -> None:
    """Inside a run, a streamed model call writes its text deltas (topic `out`) and the tools
    it starts to call (topic `tool`) to the run's stream; the reply is the same."""
    turn: dict[str, Any] = {"text": "A fairly long streamed answer, in pieces.",
                            "tool_calls": [("c1", "get_weather", ARGS)]}  # fmt: skip
    if provider == "openai":
        openai_server.reply(**turn)
        model: ModelProvider = openai_model(openai_server, stream=True)
    else:
        anthropic_server.reply(**turn)
        model = anthropic_model(anthropic_server, stream=True)

    @app.step(effect="idempotent", name="think")
    async def think() -> str:
        return (await model.complete(ask("Go", [WEATHER]))).message.content

    @app.workflow(name="thinks")
    async def thinks() -> str:
        return await think()

    handle = app.start(thinks)
    worker.run_until_idle()
    text = handle.result(timeout=10)
    chunks = [c for c in handle.stream() if c.kind == "chunk"]
    assert "".join(c.data for c in chunks if c.topic == "out") == text == turn["text"]
    assert len([c for c in chunks if c.topic == "out"]) > 1  # in pieces, as they came
    assert [c.data for c in chunks if c.topic == "tool"] == [{"tool_call": "get_weather"}]
