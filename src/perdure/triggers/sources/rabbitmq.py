"""RabbitMQ (aio-pika, extra `rabbitmq`): consume a durable queue with a bounded prefetch.

The identity of a message is its `message_id` property, or a content hash when it has none
(two identical bodies without ids are then one message). A poison message is rejected
without requeue, so the queue's dead-letter exchange (if it has one) receives it.

A queue that exists is used as it is (its dead-letter exchange and other arguments kept:
`declare=True` declares only a missing one); a broker that refuses the queue
(PRECONDITION_FAILED, RESOURCE_LOCKED, ACCESS_REFUSED, NOT_FOUND) is `SourceRefused` in the
broker's own words.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from ...extras import require_extra
from ..messages import Message, Pending, SourceRefused, usable_identity
from .urls import public

if TYPE_CHECKING:
    from aio_pika.abc import AbstractIncomingMessage


class RabbitMQ:
    """A RabbitMQ queue as a message source.

    Args:
        url: `amqp://user:password@host:5672/vhost`.
        queue: the queue to consume.
        declare: declare the queue (durable) if missing; False: it must exist. An existing
            queue is never declared again (its arguments, e.g. a dead-letter exchange, stay).
        name: the trigger's name (default: set by `on_message`).
    """

    kind = "rabbitmq"

    def __init__(
        self, url: str, queue: str, *, declare: bool = True, name: str | None = None
    ) -> None:
        self.url = url
        self.queue = queue
        self.declare = declare
        self.name = name
        self._conn: Any = None
        self._channel: Any = None
        self._inbox: asyncio.Queue[AbstractIncomingMessage] = asyncio.Queue()
        self._next: Pending[AbstractIncomingMessage] = Pending()

    def copy(self) -> RabbitMQ:
        return RabbitMQ(self.url, self.queue, declare=self.declare, name=self.name)

    def where(self) -> str:
        return f"{public(self.url)} queue {self.queue!r}"

    async def connect(self, consumer: str, prefetch: int) -> None:
        require_extra("rabbitmq", "a RabbitMQ message source")
        import aio_pika
        import aio_pika.exceptions as errors

        self._inbox, self._next = asyncio.Queue(), Pending()
        try:
            self._conn = await aio_pika.connect(self.url, timeout=10)
        except errors.ProbableAuthenticationError as exc:
            raise SourceRefused(f"credentials refused ({exc})") from None
        if not prefetch:  # a probe: the connection, and `lag` asks for the queue's depth
            return
        queue = await self._declared(prefetch)
        try:
            await queue.consume(self._inbox.put, no_ack=False)
        except errors.AMQPChannelError as exc:  # e.g. RESOURCE_LOCKED: exclusive elsewhere
            raise SourceRefused(f"queue {self.queue!r} refused: {exc}") from None

    async def _declared(self, prefetch: int) -> Any:
        """The queue on a fresh channel: looked up (passive), declared only if missing and
        `declare`; the broker's refusal in its words."""
        import aio_pika.exceptions as errors

        for passive in (True, False):
            self._channel = await self._conn.channel()  # a refused declare closes its channel
            await self._channel.set_qos(prefetch_count=prefetch)
            try:
                return await self._channel.declare_queue(self.queue, durable=True, passive=passive)
            except errors.ChannelNotFoundEntity:
                if not self.declare:
                    raise SourceRefused(f"queue {self.queue!r} does not exist") from None
            except errors.AMQPChannelError as exc:  # PRECONDITION_FAILED, RESOURCE_LOCKED, ...
                raise SourceRefused(f"queue {self.queue!r} refused: {exc}") from None
        raise SourceRefused(f"queue {self.queue!r} does not exist")  # declared, then gone

    async def receive(self, limit: int, wait: float) -> list[Message]:
        conn, channel = self._conn, self._channel
        if conn is None or not conn.connected.is_set() or channel is None or channel.is_closed:
            raise ConnectionError("the connection to RabbitMQ was lost")
        first = await self._next.get(self._inbox.get, wait)
        if first is None:
            return []
        found = [first]
        while len(found) < limit and not self._inbox.empty():
            found.append(self._inbox.get_nowait())
        return [
            Message(usable_identity(m.message_id, m.body), m.body, m,
                    {"queue": self.queue, "redelivered": bool(m.redelivered)})
            for m in found
        ]  # fmt: skip

    async def ack(self, messages: list[Message]) -> None:
        for message in messages:
            await message.handle.ack()

    async def dead(self, message: Message, reason: str) -> None:
        await message.handle.reject(requeue=False)

    async def lag(self) -> int | None:
        """Messages ready in the queue (not those held unacknowledged); None if it is missing."""
        import aio_pika.exceptions as errors

        if self._conn is None:
            return None
        channel = await self._conn.channel()  # a failed passive declare closes its channel
        try:
            queue = await channel.declare_queue(self.queue, passive=True)
        except errors.ChannelNotFoundEntity:
            return None
        finally:
            if not channel.is_closed:
                await channel.close()
        count = queue.declaration_result.message_count
        return int(count) if count is not None else None

    async def close(self) -> None:
        self._next.cancel()
        conn, self._conn, self._channel = self._conn, None, None
        if conn is not None:
            await conn.close()
