"""Kafka (aiokafka, extra `kafka`): a consumer group over one topic, offsets committed by hand.

Every worker joins the group `group`; Kafka assigns it partitions. The identity of a
message is `{topic}-{partition}-{offset}`. Offsets are committed only after the runs of
every message up to them exist, so a killed worker's partitions, reassigned, start from
its last commit and their redelivered messages find their runs. A poison message is
produced to `dead_topic` if given; its offset is committed like the others.

No Kafka server runs where perdure is tested: this source is tested for what the client
does without one (a refused connection, the identity of a record), not end to end.
"""

from __future__ import annotations

from typing import Any

from ...extras import require_extra
from ..messages import Message, SourceRefused


class Kafka:
    """A Kafka topic read by a consumer group.

    Args:
        servers: the bootstrap servers, `host:9092` or several separated by commas.
        topic: the topic to consume.
        group: the consumer group (default `perdure-{name}`).
        dead_topic: a topic poison messages are produced to.
        options: passed to `AIOKafkaConsumer` (security_protocol, sasl_*, ssl_context...).
        name: the trigger's name (default: set by `on_message`).
    """

    kind = "kafka"

    def __init__(
        self,
        servers: str,
        topic: str,
        *,
        group: str | None = None,
        dead_topic: str | None = None,
        options: dict[str, Any] | None = None,
        name: str | None = None,
    ) -> None:
        self.servers = servers
        self.topic = topic
        self.group = group
        self.dead_topic = dead_topic
        self.options = dict(options or {})
        self.name = name
        self._consumer: Any = None
        self._producer: Any = None
        self._dead_offsets: dict[Any, int] = {}

    def copy(self) -> Kafka:
        return Kafka(self.servers, self.topic, group=self.group, dead_topic=self.dead_topic,
                     options=self.options, name=self.name)  # fmt: skip

    def where(self) -> str:
        return f"kafka://{self.servers} topic {self.topic!r} group {self._group()!r}"

    def _group(self) -> str:
        return self.group or f"perdure-{self.name}"

    async def connect(self, consumer: str, prefetch: int) -> None:
        require_extra("kafka", "a Kafka message source")
        from aiokafka import AIOKafkaConsumer
        from aiokafka.errors import (
            AuthenticationFailedError,
            SaslAuthenticationFailed,
        )

        self._dead_offsets = {}
        topics = (self.topic,) if prefetch else ()
        client = AIOKafkaConsumer(
            *topics, bootstrap_servers=self.servers, group_id=self._group(),
            client_id=consumer, enable_auto_commit=False, auto_offset_reset="earliest",
            max_poll_records=max(1, prefetch), **self.options,
        )  # fmt: skip
        try:
            await client.start()
        except (AuthenticationFailedError, SaslAuthenticationFailed) as exc:
            await client.stop()
            raise SourceRefused(f"credentials refused ({exc})") from None
        except Exception:
            await client.stop()
            raise
        self._consumer = client

    def message(self, record: Any) -> Message:
        """The message of one consumer record: its place in the log is its identity."""
        identity = f"{record.topic}-{record.partition}-{record.offset}"
        body = record.value if isinstance(record.value, bytes) else bytes(record.value or b"")
        where = {"topic": record.topic, "partition": record.partition, "offset": record.offset}
        return Message(identity, body, record, where)

    async def receive(self, limit: int, wait: float) -> list[Message]:
        batches = await self._consumer.getmany(timeout_ms=int(wait * 1000), max_records=limit)
        return [self.message(r) for records in batches.values() for r in records]

    async def ack(self, messages: list[Message]) -> None:
        from aiokafka.structs import OffsetAndMetadata, TopicPartition

        upto: dict[Any, int] = dict(self._dead_offsets)
        self._dead_offsets = {}
        for message in messages:
            tp = TopicPartition(message.handle.topic, message.handle.partition)
            upto[tp] = max(upto.get(tp, -1), message.handle.offset)
        if upto:
            await self._consumer.commit(
                {tp: OffsetAndMetadata(offset + 1, "") for tp, offset in upto.items()}
            )

    async def dead(self, message: Message, reason: str) -> None:
        from aiokafka.structs import TopicPartition

        if self.dead_topic:
            if self._producer is None:
                from aiokafka import AIOKafkaProducer

                self._producer = AIOKafkaProducer(bootstrap_servers=self.servers,
                                                  **self.options)  # fmt: skip
                await self._producer.start()
            headers = [("reason", reason[:500].encode()), ("message-id", message.identity.encode())]
            await self._producer.send_and_wait(self.dead_topic, message.body, headers=headers)
        tp = TopicPartition(message.handle.topic, message.handle.partition)
        self._dead_offsets[tp] = max(self._dead_offsets.get(tp, -1), message.handle.offset)

    async def lag(self) -> int | None:
        """Messages past this worker's position in its partitions (None before a fetch)."""
        if self._consumer is None:
            return None
        total = 0
        for tp in self._consumer.assignment():
            high = self._consumer.highwater(tp)
            if high is None:
                return None
            total += max(0, high - await self._consumer.position(tp))
        return total

    async def close(self) -> None:
        consumer, self._consumer = self._consumer, None
        producer, self._producer = self._producer, None
        if consumer is not None:
            await consumer.stop()
        if producer is not None:
            await producer.stop()
