"""The model provider interface and the errors that decide whether a call is retried."""

from __future__ import annotations

from typing import Protocol

from ...errors import ConfigError, ParkRun, PerdureError
from ..messages import ModelRequest, ModelResponse


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
    """One way to reach models: `scripted`, `openai` (any compatible server), `anthropic`."""

    name: str

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """One call. Raises ModelRetryable (a timeout too), ModelAuthError or ModelError; never
        retries itself (the durable step around it does, so each attempt is journaled)."""
        ...
