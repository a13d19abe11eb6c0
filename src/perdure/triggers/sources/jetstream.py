"""NATS JetStream (nats-py, extra `nats`): a durable pull consumer on one stream.

Every worker fetches from the same durable consumer, so JetStream spreads the messages.
The identity of a message is `{stream}:{stream sequence}`. A message not acknowledged
within `ack_wait` seconds (its worker was killed) is delivered again, to any worker; a
poison message is terminated (`term`: never redelivered).
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from ...extras import require_extra
from ..messages import Message, SourceRefused
from .urls import public

CONNECT_TIMEOUT = 5.0  # seconds a connection attempt may take
FLUSH_TIMEOUT = 5  # seconds for the server to confirm it has the acks


class JetStream:
    """A JetStream stream read through a durable pull consumer.

    Args:
        url: `nats://[user:password@]host:4222`.
        stream: the stream (it must exist; perdure creates only the consumer).
        subject: the subjects of the stream to consume (default all: `>`).
        durable: the consumer's name, shared by every worker (default `perdure-{name}`).
        ack_wait: seconds before an unacknowledged message is delivered again.
        max_ack_pending: messages out unacknowledged over all workers at once.
        name: the trigger's name (default: set by `on_message`).
    """

    kind = "nats"

    def __init__(
        self,
        url: str,
        stream: str,
        *,
        subject: str | None = None,
        durable: str | None = None,
        ack_wait: float = 30.0,
        max_ack_pending: int = 1000,
        name: str | None = None,
    ) -> None:
        self.url = url
        self.stream = stream
        self.subject = subject
        self.durable = durable
        self.ack_wait = ack_wait
        self.max_ack_pending = max_ack_pending
        self.name = name
        self._nc: Any = None
        self._js: Any = None
        self._sub: Any = None

    def copy(self) -> JetStream:
        return JetStream(self.url, self.stream, subject=self.subject, durable=self.durable,
                         ack_wait=self.ack_wait, max_ack_pending=self.max_ack_pending,
                         name=self.name)  # fmt: skip

    def where(self) -> str:
        return f"{public(self.url)} stream {self.stream!r} consumer {self._durable()!r}"

    def _durable(self) -> str:
        return self.durable or re.sub(r"[^A-Za-z0-9_-]", "_", f"perdure-{self.name}")

    async def connect(self, consumer: str, prefetch: int) -> None:
        require_extra("nats", "a NATS JetStream message source")
        import nats
        import nats.errors as errors
        import nats.js.errors as js_errors
        from nats.js.api import AckPolicy, ConsumerConfig

        seen: list[Exception] = []

        async def failed(exc: Exception) -> None:  # nats-py retries an initial connect itself
            seen.append(exc)

        try:
            self._nc = await asyncio.wait_for(
                nats.connect(self.url, connect_timeout=CONNECT_TIMEOUT, allow_reconnect=False,
                             max_reconnect_attempts=0, error_cb=failed),
                CONNECT_TIMEOUT,
            )  # fmt: skip
        except (errors.AuthorizationError, errors.InvalidUserCredentialsError) as exc:
            raise SourceRefused(f"credentials refused ({exc})") from None
        except (errors.NoServersError, TimeoutError):
            last = f" ({seen[-1]})" if seen else ""
            if seen and isinstance(seen[-1], errors.AuthorizationError):
                raise SourceRefused(f"credentials refused{last}") from None
            raise ConnectionError(f"no NATS server answers{last}") from None
        self._js = self._nc.jetstream()
        try:
            await self._js.stream_info(self.stream)
        except js_errors.NotFoundError:
            raise SourceRefused(f"stream {self.stream!r} does not exist") from None
        if not prefetch:  # a probe: `lag` reads the consumer's numbers
            return
        config = ConsumerConfig(
            durable_name=self._durable(), ack_policy=AckPolicy.EXPLICIT,
            ack_wait=self.ack_wait, max_ack_pending=self.max_ack_pending,
            filter_subject=self.subject,
        )  # fmt: skip
        self._sub = await self._js.pull_subscribe(
            self.subject or ">", durable=self._durable(), stream=self.stream, config=config
        )

    async def receive(self, limit: int, wait: float) -> list[Message]:
        import nats.errors as errors

        if not self._nc.is_connected:
            raise ConnectionError("the connection to NATS was lost")
        try:
            found = await self._sub.fetch(batch=limit, timeout=wait)
        except (TimeoutError, errors.TimeoutError):
            return []
        return [
            Message(
                f"{self.stream}:{m.metadata.sequence.stream}",
                m.data,
                m,
                {
                    "stream": self.stream,
                    "subject": m.subject,
                    "redelivered": (m.metadata.num_delivered or 1) > 1,
                },
            )
            for m in found
        ]

    async def ack(self, messages: list[Message]) -> None:
        for message in messages:
            await message.handle.ack()
        if messages:
            await self._nc.flush(timeout=FLUSH_TIMEOUT)

    async def dead(self, message: Message, reason: str) -> None:
        await message.handle.term()
        await self._nc.flush(timeout=FLUSH_TIMEOUT)

    async def lag(self) -> int | None:
        """Messages not yet delivered to the consumer plus those out unacknowledged."""
        import nats.js.errors as js_errors

        if self._js is None:
            return None
        try:
            info = await self._js.consumer_info(self.stream, self._durable())
        except js_errors.NotFoundError:
            return None
        return int(info.num_pending or 0) + int(info.num_ack_pending or 0)

    async def close(self) -> None:
        nc, self._nc, self._js, self._sub = self._nc, None, None, None
        if nc is not None:
            await nc.close()
