"""The model provider family: the interface, `Provider` (a kind of provider and its facts),
`SdkProvider` (what openai and anthropic share), and the errors that decide a retry.

    Provider            its facts (name, key variable, timeout, extra), read unbuilt
    └── SdkProvider     an official SDK client per event loop, its errors translated
        ├── OpenAIModel (openai.py) ── LlamaCppModel (local.py)
        └── AnthropicModel (anthropic.py)
    ScriptedModel (scripted.py) is a Provider too; registry.py lists them all by name.
"""

from __future__ import annotations

import asyncio
import email.utils
import importlib
import os
import re
import time
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

from ...errors import ConfigError, ParkRun, PerdureError
from ...extras import require_extra
from ..messages import ModelRequest, ModelResponse

if TYPE_CHECKING:
    from typing import Self

    from ..spec import AgentSpec, ModelSpec

CONNECT_TIMEOUT = 5.0  # seconds to open a connection, as the SDKs' own default
PLACEHOLDER_KEY = "not-needed"  # local servers (llama.cpp, vLLM, Ollama) ignore the key


class ModelError(PerdureError):
    """A model call failed in a way retrying will not fix (bad request, unknown model)."""


class ModelAuthError(ModelError, ParkRun):
    """The provider refused the credentials (401) or their permission (403); the message
    names the setting to fix. In a durable step it parks the run (see `ParkRun`): retrying
    cannot help, and failing would leave a scheduled agent failed after the key is fixed.

    Args:
        status: the HTTP status (401, 403), or None when no key was set at all.
        setting: where the key came from, e.g. "OPENAI_API_KEY" or "OPENAI_API_KEY (unset)".
        detail: the refusal without the setting: "401 from URL: the server's words".
    """

    def __init__(
        self, message: str, *, status: int | None = None, setting: str = "", detail: str = ""
    ) -> None:
        super().__init__(message)
        self.status = status
        self.setting = setting
        self.detail = detail or message


class MissingKey(ModelAuthError, ConfigError):
    """No key is set where the tier looks for it (a ConfigError when a provider is made; in
    a run's model step it parks the run like a refused key)."""


class ModelRetryable(PerdureError):
    """A call that may succeed later (429, 5xx, connection reset); `retry_after` in seconds
    when the provider said how long to wait (the step's retry honours it)."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def stream_out(text: str = "", tool: str = "") -> None:
    """A streamed reply's text delta (or the name of a tool it starts to call) to the run's
    stream (`perdure.stream`), when the call runs inside a run; a no-op outside one."""
    from ...engine.context import current
    from ...engine.streams import stream

    if current() is None:
        return
    if text:
        stream.write(text)
    if tool:
        stream.write({"tool_call": tool}, topic="tool")


class ModelProvider(Protocol):
    """What the agent loop calls: any object with a `name` and `complete` (a `Provider`
    subclass, or one a user hands to `Agent(providers=...)`)."""

    name: str

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """One call. Raises ModelRetryable (a timeout too), ModelAuthError or ModelError; never
        retries itself (the durable step around it does, so each attempt is journaled)."""
        ...


class Provider:
    """A kind of model provider: its facts, read from the class without building it (by the
    spec, the CLI, the loop), and how a spec's tier builds one. A new provider is a subclass
    in a file of its own plus one line in `registry.PROVIDERS`.

    Attributes:
        name: what a spec's `provider =` says, and the registry's key.
        api_key_env: the variable its key is read from by default (None: it needs no key).
        default_timeout: seconds its server may stay silent when a tier sets no `timeout`
            (None: it makes no network call, so a tier may not set one).
        extra: perdure's extra that installs what it needs (`pip install 'perdure[EXTRA]'`).
        sdk: the module of that extra it imports.
        needs_model: a spec's tier must name the model.
        choices: the `--model` values (`perdure run/agent/validate`) it serves.

    No price: a provider's varies by model, so a tier's price is the spec's.
    """

    name: str  # (not a ClassVar: ModelProvider's `name` is an instance's)
    api_key_env: ClassVar[str | None] = None
    default_timeout: ClassVar[float | None] = None
    extra: ClassVar[str | None] = None
    sdk: ClassVar[str | None] = None
    needs_model: ClassVar[bool] = False
    choices: ClassVar[tuple[str, ...]] = ()

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """One call (see `ModelProvider.complete`)."""
        raise NotImplementedError

    @classmethod
    def require(cls, what: str, model: str = "") -> None:
        """Fail now, in one line naming the extra, if what it needs is not installed.

        Args:
            what: the feature as the user names it (`model tier 'fast' (openai)`).
            model: the tier's model, for a provider whose needs depend on it.

        Raises:
            MissingExtra: a module of its extra cannot be imported.
        """
        if cls.extra is not None and cls.sdk is not None:
            require_extra(cls.extra, what, cls.sdk)

    @classmethod
    def from_tier(cls, spec: AgentSpec, tier: str) -> Self:
        """The provider serving `tier` of `spec`.

        Raises:
            ConfigError: the tier cannot be served as written (a missing file or key).
        """
        raise ConfigError(f"model tier {tier!r}: provider {cls.name!r} cannot serve a spec")

    @classmethod
    def for_choice(cls, choice: str, current: ModelSpec) -> ModelSpec:
        """The tier `--model CHOICE` (one of `choices`) puts in place of `current`."""
        raise ConfigError(f"--model {choice!r}: provider {cls.name!r} offers no such choice")


class Closing(Protocol):
    """An SDK client: closed when its event loop's provider is closed."""

    async def close(self) -> None: ...


Client = TypeVar("Client", bound=Closing)


class SdkProvider(Provider, Generic[Client]):
    """A provider reached through its official SDK (openai, anthropic): one client per event
    loop, the SDK's retries off (`max_retries=0`, the durable step retries), and the SDK's
    errors turned into ModelRetryable (429 with Retry-After, 408, 409, 5xx, connection,
    timeout), ModelAuthError (401/403, naming the key to fix) or ModelError.

    A subclass says what differs: its facts below, `_open` (a new client) and `_ask` (one
    call on it), and, if its server marks more errors as worth another try, `_retryable`.

    Attributes:
        service_url: the provider's own service; another URL is a compatible server, which
            may do without a key.
        base_url_env: the variable naming another server.
        model_env: the variable naming the model `--model NAME` asks for.
        default_model: the model `--model NAME` asks for when that variable is unset.
        sdk_error: the name of the SDK's root exception.
    """

    default_timeout: ClassVar[float]
    extra: ClassVar[str] = "models"
    sdk: ClassVar[str]
    needs_model = True
    service_url: ClassVar[str]
    base_url_env: ClassVar[str]
    model_env: ClassVar[str]
    default_model: ClassVar[str]
    sdk_error: ClassVar[str]

    def __init__(
        self,
        model: str = "",
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        api_key_env: str | None = None,
        stream: bool = False,
        timeout: float | None = None,
        connect_timeout: float = CONNECT_TIMEOUT,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """Args:
            model: the model asked when a request names none.
            base_url: the server; else the variable `base_url_env`, else `service_url`.
            api_key: else the variable `api_key_env`; unneeded with a base URL.
            api_key_env: the variable holding the key (default: the provider's), named
                when the server refuses it.
            stream: ask for a streamed reply and assemble it (same ModelResponse).
            timeout: seconds the server may stay silent: to answer a call (the whole reply
                when not streamed) or between two streamed chunks (default: the provider's).
            connect_timeout: seconds to open the connection (a down host fails fast).
            env: where the settings are read (default: the process environment).

        Raises:
            ConfigError: the SDK is missing, or no key is set for the provider's own service.
        """
        require_extra(self.extra, f"the {self.name} model provider", self.sdk)  # now, not at a call
        env = os.environ if env is None else env
        self.model = model
        self.base_url = (base_url or env.get(self.base_url_env) or self.service_url).rstrip("/")
        self._key, self._key_source = resolve_key(
            api_key,
            api_key_env or self.api_key_env,
            env,
            local=self.base_url != self.service_url,
            url_env=self.base_url_env,
        )
        self.stream = stream
        self.timeout = self.default_timeout if timeout is None else timeout
        self.connect_timeout = connect_timeout
        # An SDK client holds connections bound to the event loop that opened them.
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Client]
        self._clients = weakref.WeakKeyDictionary()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model={self.model!r}, base_url={self.base_url!r})"

    @classmethod
    def from_tier(cls, spec: AgentSpec, tier: str) -> Self:
        """The provider of a tier: its model, server, key variable, streaming and timeouts.

        Raises:
            MissingKey: the tier names a key variable that is not set.
        """
        model = spec.tier(tier)
        options: dict[str, Any] = {
            "model": model.model,
            "stream": model.stream,
            "timeout": model.timeout or cls.default_timeout,
            "connect_timeout": model.connect_timeout or CONNECT_TIMEOUT,
        }
        if model.base_url:
            options["base_url"] = model.base_url
        if model.api_key_env is not None:
            if not os.environ.get(model.api_key_env):
                raise MissingKey(
                    f"model tier {tier!r}: the environment variable {model.api_key_env} is not set",
                    setting=model.api_key_env,
                )
            options["api_key_env"] = model.api_key_env
        return cls(**options)

    @classmethod
    def for_choice(cls, choice: str, current: ModelSpec) -> ModelSpec:
        """The provider's model from `model_env` (else `default_model`), its server from
        `base_url_env`; the tier's context, reply limit and price are kept."""
        from ..spec import ModelSpec

        return ModelSpec(
            provider=cls.name,
            model=os.environ.get(cls.model_env, cls.default_model),
            base_url=os.environ.get(cls.base_url_env),
            context_tokens=current.context_tokens,
            max_tokens=current.max_tokens,
            price=current.price,
        )

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """One call (streamed if asked), as a provider-neutral response.

        Raises:
            ModelRetryable: 429 (with `retry_after`), 408, 409, 5xx, connection or timeout.
            ModelAuthError: 401/403; the message names the key and the server.
            ModelError: any other refusal, or a reply that cannot be read.
        """
        model = request.model or self.model
        if not model:
            raise ModelError(f"{self.name}: no model named (pass model= or set it in the request)")
        sdk: Any = importlib.import_module(self.sdk)
        client = self._client()
        try:
            return await self._ask(client, model, request)
        except getattr(sdk, self.sdk_error) as exc:  # the SDK's root error, by its name
            raise self._translate(exc, sdk) from exc

    async def aclose(self) -> None:
        """Close the SDK client of the running event loop."""
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.close()

    async def _ask(self, client: Client, model: str, request: ModelRequest) -> ModelResponse:
        """One call on the SDK client; the SDK's errors are translated by the caller."""
        raise NotImplementedError

    def _open(self) -> Client:
        """A new SDK client: `self._key`, `self.base_url`, the timeouts, `max_retries=0`."""
        raise NotImplementedError

    def _retryable(self, body: object) -> bool:
        """Whether an error body the status alone would not retry is worth another try."""
        return False

    def _client(self) -> Client:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = self._clients[loop] = self._open()
        return client

    def _translate(self, exc: Any, sdk: Any) -> PerdureError:
        """The perdure error for an SDK error: retryable, an auth problem, or final."""
        where = f"{self.name} {self.base_url}"
        if isinstance(exc, sdk.APITimeoutError):
            return ModelRetryable(f"{where}: {timed_out(exc, self.timeout, self.connect_timeout)}")
        if isinstance(exc, sdk.APIConnectionError):
            return ModelRetryable(f"{where}: {one_line(exc.message)}")
        if not isinstance(exc, sdk.APIStatusError):
            return ModelError(f"{where}: {one_line(str(exc))}")
        status, said = exc.status_code, server_message(exc.body, exc.message)
        if isinstance(exc, sdk.AuthenticationError | sdk.PermissionDeniedError):
            verb = "rejected" if status == 401 else "not permitted"
            return ModelAuthError(
                f"{self._key_source} {verb} by {self.base_url}: {status} {said}",
                status=status,
                setting=self._key_source,
                detail=f"{status} from {self.base_url}: {said}",
            )
        if status in (408, 409, 429) or status >= 500 or self._retryable(exc.body):
            after = retry_after_seconds(exc.response.headers)
            return ModelRetryable(f"{where}: {status} {said}", retry_after=after)
        return ModelError(f"{where}: {status} {said}")


def resolve_key(
    api_key: str | None,
    api_key_env: str | None,
    env: Mapping[str, str],
    *,
    local: bool,
    url_env: str,
) -> tuple[str, str]:
    """The key to send and the setting it came from (named when the server refuses it).

    Raises:
        ConfigError: no key anywhere, for the provider's own service (a local server
            gets a placeholder instead).
    """
    if api_key:
        return api_key, "the api_key argument"
    if api_key_env is None:  # a provider that needs no key
        return PLACEHOLDER_KEY, "no key"
    if env.get(api_key_env):
        return env[api_key_env], api_key_env
    if local:
        return PLACEHOLDER_KEY, f"{api_key_env} (unset)"
    raise MissingKey(
        f"{api_key_env} is not set: export it, pass api_key=..., "
        f"or set {url_env} to a compatible server",
        setting=api_key_env,
    )


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
