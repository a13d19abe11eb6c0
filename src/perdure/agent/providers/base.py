"""The model provider interface and the errors that decide whether a call is retried."""

from __future__ import annotations

from typing import Protocol

from ...errors import PerdureError
from ..messages import ModelRequest, ModelResponse


class ModelError(PerdureError):
    """A model call failed in a way retrying will not fix (bad request, unknown model)."""


class ModelAuthError(ModelError):
    """The provider refused the credentials; the message names the setting to fix."""


class ModelRetryable(PerdureError):
    """A call that may succeed later (429, 5xx, connection reset); `retry_after` in seconds
    when the provider said how long to wait (the step's retry honours it)."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ModelProvider(Protocol):
    """One way to reach models: `scripted`, `openai` (any compatible server), `anthropic`."""

    name: str

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """One call. Raises ModelRetryable, ModelAuthError or ModelError; never retries itself
        (the durable step around it does, so each attempt is journaled)."""
        ...
