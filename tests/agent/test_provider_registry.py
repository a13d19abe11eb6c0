"""The provider registry: each provider's class carries its facts, every module reads them from
there, and a provider added with one class and one registry line is seen by all of them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from wire_servers import OpenAIServer

import perdure
from perdure.agent.loop import Agent
from perdure.agent.models import provider_for, require_extras
from perdure.agent.providers.base import (
    CONNECT_TIMEOUT,
    MissingKey,
    Provider,
    SdkProvider,
)
from perdure.agent.providers.openai import OpenAIModel
from perdure.agent.providers.registry import (
    PROVIDERS,
    make_provider,
    provider_class,
    register,
    unregister,
)
from perdure.agent.serve import MODEL_CHOICES, model_choices, with_model
from perdure.agent.spec import AgentSpec, ModelSpec, load_spec
from perdure.errors import ConfigError
from perdure.extras import EXTRAS
from perdure.store.base import PAUSED
from perdure.testing import TestWorker

SPEC = """
name = "added"
goal = "Say hello"

[models.default]
provider = "{provider}"
model = "{model}"
{more}

[routing]
default = "default"

[memory]
enabled = false
"""


class EchoModel(OpenAIModel):
    """A provider a test adds: an OpenAI-compatible server under facts of its own."""

    name = "echo"
    api_key_env = "ECHO_TEST_KEY"
    default_timeout = 42.0
    service_url = "https://echo.invalid/v1"
    base_url_env = "ECHO_TEST_BASE_URL"
    model_env = "ECHO_TEST_MODEL"
    default_model = "echo-1"
    choices = ("echo",)


@pytest.fixture
def echo(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[EchoModel]]:
    """EchoModel registered as `echo` (one line), unregistered after the test."""
    for name in ("ECHO_TEST_KEY", "ECHO_TEST_BASE_URL", "ECHO_TEST_MODEL"):
        monkeypatch.delenv(name, raising=False)
    register("echo", EchoModel)
    try:
        yield EchoModel
    finally:
        unregister("echo")


@pytest.fixture
def openai_server() -> Iterator[OpenAIServer]:
    server = OpenAIServer().start()
    yield server
    server.stop()


def write_spec(tmp_path: Path, provider: str, more: str = "", model: str = "gpt-x") -> Path:
    path = tmp_path / "spec.toml"
    path.write_text(SPEC.format(provider=provider, model=model, more=more))
    return path


def sdk_timeout(model: Any) -> tuple[float, float]:
    """(read, connect) seconds of the SDK client the provider really uses."""

    async def go() -> tuple[float, float]:
        try:
            timeout = model._client().timeout
            return float(timeout.read), float(timeout.connect)
        finally:
            await model.aclose()

    return asyncio.run(go())


def test_each_registered_class_carries_the_name_it_is_registered_under() -> None:
    """Every registry line resolves to a Provider subclass whose `name` is its key, and the
    four built-in providers (local too) are in the one family."""
    assert list(PROVIDERS) == ["scripted", "local", "openai", "anthropic"]
    for name in PROVIDERS:
        cls = provider_class(name)
        assert issubclass(cls, Provider) and cls.name == name
    assert issubclass(provider_class("local"), SdkProvider)
    with pytest.raises(ConfigError, match="unknown model provider 'gemini': use one of scripted"):
        provider_class("gemini")


def test_spec_validation_accepts_exactly_the_registered_names() -> None:
    """A tier's `provider` is checked against the registry (no separate list): each name
    validates, anything else is refused in pydantic's words for a Literal, naming them all."""
    for name in PROVIDERS:
        assert ModelSpec(provider=name).provider == name
    for wrong in ("magic", 3, None):
        with pytest.raises(ValueError) as caught:
            ModelSpec(provider=wrong)
        assert "Input should be 'scripted', 'local', 'openai' or 'anthropic'" in str(caught.value)


def test_each_extra_a_provider_names_installs_its_sdk() -> None:
    """A provider's extra is one of perdure's extras (EXTRAS mirrors pyproject) and brings
    the SDK module the provider imports; scripted needs none."""
    assert provider_class("scripted").extra is None
    for name in PROVIDERS:
        cls = provider_class(name)
        if cls.extra is not None:
            assert cls.sdk is not None and cls.sdk in EXTRAS[cls.extra], name


def test_the_model_choices_are_the_providers_choices() -> None:
    """`--model` offers `spec` and each provider's choices, and each choice puts a tier of
    that provider in place of the default one."""
    assert MODEL_CHOICES == (
        "spec",
        "scripted",
        "local",
        "local-large",
        "local-small",
        "openai",
        "anthropic",
    )
    spec = AgentSpec.model_validate(
        {"name": "t", "goal": "g", "models": {"fast": {"provider": "scripted", "script": "x"}}}
    )
    for choice in MODEL_CHOICES[1:]:
        tier = with_model(spec, choice).models["fast"]
        assert choice in provider_class(tier.provider).choices
    with pytest.raises(ConfigError, match="--model 'echo': use one of spec, scripted"):
        with_model(spec, "echo")


def test_default_timeouts_and_keys_are_the_providers_facts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, openai_server: OpenAIServer
) -> None:
    """A tier without a timeout gets its provider's `default_timeout`; a tier on the
    provider's own service without its `api_key_env` set is refused naming that variable."""
    base = f'base_url = "{openai_server.origin}/v1"'
    for name in ("openai", "anthropic"):
        cls = provider_class(name)
        assert isinstance(cls.default_timeout, float) and cls.api_key_env
        monkeypatch.setenv(cls.api_key_env, "k")
        spec = load_spec(write_spec(tmp_path, name, base))
        assert sdk_timeout(provider_for(spec, "default")) == (cls.default_timeout, CONNECT_TIMEOUT)
        monkeypatch.delenv(cls.api_key_env)
        with pytest.raises(MissingKey, match=f"^{cls.api_key_env} is not set"):
            provider_for(load_spec(write_spec(tmp_path, name)), "default")
    assert provider_class("local").default_timeout == 300.0
    assert provider_class("local").api_key_env is None


def test_a_provider_added_with_one_class_and_one_line_is_seen_everywhere(
    tmp_path: Path, echo: type[EchoModel], openai_server: OpenAIServer
) -> None:
    """Registered, `echo` passes spec validation (its model must be named), builds with its
    own default timeout, looks for its key in its own variable (the provider and the loop's
    parked-run reason), is a `--model` choice; unregistered, a spec naming it is refused."""
    with pytest.raises(ConfigError, match=r"models\.default\.model: name the model"):
        load_spec(write_spec(tmp_path, "echo", model=""))
    path = write_spec(tmp_path, "echo", f'base_url = "{openai_server.origin}/v1"')
    spec = load_spec(path)
    require_extras(spec)
    assert sdk_timeout(provider_for(spec, "default")) == (42.0, CONNECT_TIMEOUT)
    with pytest.raises(MissingKey, match=r"^ECHO_TEST_KEY is not set: .* set ECHO_TEST_BASE_URL"):
        provider_for(load_spec(write_spec(tmp_path, "echo")), "default")
    assert isinstance(make_provider("echo", model="m", base_url="http://127.0.0.1:9/v1"), EchoModel)
    assert "echo" in model_choices()
    tier = with_model(spec, "echo").models["default"]
    assert (tier.provider, tier.model) == ("echo", "echo-1")

    openai_server.key = "rotated"  # the server refuses the placeholder key: the run parks
    app = perdure.App(f"sqlite:///{tmp_path}/added.db")
    try:
        run_id = app.start(Agent(app.runtime, spec).workflow, {"prompt": "hello"}).id
        TestWorker(app).run_until_idle()
        run = app.get_run(run_id)
        assert run.status == PAUSED
        reason = json.loads(run.error or "{}")["message"]
        assert reason.startswith("model tier 'default' (echo:gpt-x): authentication failed")
        assert "set ECHO_TEST_KEY (the spec's api_key_env) where the workers run" in reason
    finally:
        app.close()

    unregister("echo")
    with pytest.raises(ConfigError, match=r"models\.default\.provider: Input should be 'scripted'"):
        load_spec(path)
    with pytest.raises(ConfigError, match="unknown model provider 'echo'"):
        make_provider("echo")
