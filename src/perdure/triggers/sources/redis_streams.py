"""Redis Streams (redis-py, extra `redis`): a consumer group over one stream.

Each worker is a consumer of the group, named by its worker id. The identity of a message
is its entry id. A consumer, once connected, first takes back at once its own pending
entries (read by an earlier process under the same name, never acknowledged); entries
another consumer read and never acknowledged (it was killed) are taken over with
XAUTOCLAIM once idle for `claim_idle` seconds; consumers long gone with nothing pending are
removed from the group. Entries taken back either way are marked `redelivered` in the
run's origin. A poison entry is copied to `dead_stream` (if given) and acknowledged.
"""

from __future__ import annotations

import json
import time
from typing import Any

from ...extras import require_extra
from ..messages import Message, SourceRefused
from .urls import public

FORGET_CONSUMER_AFTER = 300.0  # seconds idle, with nothing pending, before a consumer is gone


class RedisStream:
    """A Redis stream read through a consumer group.

    Args:
        url: `redis://[:password@]host:6379/0`.
        stream: the stream key (created with the group if missing).
        group: the consumer group (default `perdure`), created at the stream's start.
        field: the entry field holding the JSON body (`XADD stream * data '{"sku": ...}'`).
            An entry without it is dead (its fields kept as a JSON object in the dead
            message, the reason naming them); its other fields are ignored.
        claim_idle: seconds an entry stays pending with a consumer before another takes it
            (a slow live consumer losing one is harmless: its run id is the same).
        dead_stream: a stream key poison entries are copied to, with the reason.
        name: the trigger's name (default: set by `on_message`).
    """

    kind = "redis"

    def __init__(
        self,
        url: str,
        stream: str,
        *,
        group: str = "perdure",
        field: str = "data",
        claim_idle: float = 10.0,
        dead_stream: str | None = None,
        name: str | None = None,
    ) -> None:
        self.url = url
        self.stream = stream
        self.group = group
        self.field = field
        self.claim_idle = claim_idle
        self.dead_stream = dead_stream
        self.name = name
        self._redis: Any = None
        self._consumer = ""
        self._claimed_at = 0.0
        self._swept_at = 0.0
        self._own_from: str | None = None

    def copy(self) -> RedisStream:
        return RedisStream(self.url, self.stream, group=self.group, field=self.field,
                           claim_idle=self.claim_idle, dead_stream=self.dead_stream,
                           name=self.name)  # fmt: skip

    def where(self) -> str:
        return f"{public(self.url)} stream {self.stream!r} group {self.group!r}"

    async def connect(self, consumer: str, prefetch: int) -> None:
        require_extra("redis", "a Redis Streams message source")
        import redis.asyncio as aioredis
        from redis.exceptions import AuthenticationError, ResponseError

        self._consumer = consumer
        self._redis = aioredis.Redis.from_url(self.url, socket_connect_timeout=10)
        try:
            await self._redis.ping()
        except AuthenticationError as exc:
            raise SourceRefused(f"credentials refused ({exc})") from None
        if not prefetch:  # a probe creates nothing
            return
        try:
            await self._redis.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._claimed_at = 0.0
        self._own_from = "0-0"  # its own pending entries: taken back first

    async def receive(self, limit: int, wait: float) -> list[Message]:
        found = await self._own_pending(limit) or await self._claim(limit)
        again = bool(found)
        if not found:
            answer = await self._redis.xreadgroup(
                self.group, self._consumer, {self.stream: ">"}, count=limit,
                block=max(1, int(wait * 1000)),
            )  # fmt: skip
            for _, entries in answer or []:
                found.extend(entries)
        messages = [self._message(entry_id, fields) for entry_id, fields in found if fields]
        for message in messages:
            message.extra["redelivered"] = again
        return messages

    async def _own_pending(self, limit: int) -> list[Any]:
        """The entries this consumer's name holds pending (an earlier process under the same
        worker id read them and never acknowledged them), read from its own pending list
        with XREADGROUP from id 0 until it is empty; an entry deleted from the stream since
        comes without fields and is acknowledged."""
        if self._own_from is None:
            return []
        answer = await self._redis.xreadgroup(
            self.group, self._consumer, {self.stream: self._own_from}, count=limit
        )
        entries = [e for _, got in answer or [] for e in got]
        if not entries:
            self._own_from = None
            return []
        self._own_from = _text(entries[-1][0])
        gone = [entry_id for entry_id, fields in entries if not fields]
        if gone:
            await self._redis.xack(self.stream, self.group, *gone)
        return [e for e in entries if e[1]] or await self._own_pending(limit)

    async def _claim(self, limit: int) -> list[Any]:
        """Entries idle with another consumer past `claim_idle` (checked every few seconds)."""
        now = time.monotonic()
        if now - self._claimed_at < min(5.0, self.claim_idle / 2):
            return []
        self._claimed_at = now
        answer = await self._redis.xautoclaim(
            self.stream, self.group, self._consumer, int(self.claim_idle * 1000),
            start_id="0-0", count=limit,
        )  # fmt: skip
        if now - self._swept_at > 60.0:
            self._swept_at = now
            await self._forget_gone_consumers()
        return list(answer[1])

    async def _forget_gone_consumers(self) -> None:
        for row in await self._redis.xinfo_consumers(self.stream, self.group):
            name = _text(row.get("name"))
            if (name != self._consumer and int(row.get("pending", 0)) == 0
                    and int(row.get("idle", 0)) > FORGET_CONSUMER_AFTER * 1000):  # fmt: skip
                await self._redis.xgroup_delconsumer(self.stream, self.group, name)

    def _message(self, entry_id: Any, fields: dict[Any, Any]) -> Message:
        identity, extra = _text(entry_id), {"stream": self.stream}
        key = self.field.encode()
        if key in fields:
            return Message(identity, bytes(fields[key]), identity, extra)
        names = {_text(k): _text(v) for k, v in fields.items()}
        unreadable = (f"entry has no {self.field!r} field, the one this source reads the JSON "
                      f"body from (its fields: {', '.join(sorted(names))}; "
                      f"RedisStream(..., field=NAME) reads another)")  # fmt: skip
        return Message(identity, json.dumps(names).encode(), identity, extra, unreadable)

    async def ack(self, messages: list[Message]) -> None:
        if messages:
            await self._redis.xack(self.stream, self.group, *[m.handle for m in messages])

    async def dead(self, message: Message, reason: str) -> None:
        if self.dead_stream:
            fields = {"id": message.identity, "reason": reason, self.field: message.body}
            await self._redis.xadd(self.dead_stream, fields)
        await self._redis.xack(self.stream, self.group, message.handle)

    async def lag(self) -> int | None:
        """Entries not yet delivered to the group plus those delivered and unacknowledged."""
        from redis.exceptions import ResponseError

        try:
            groups = await self._redis.xinfo_groups(self.stream)
        except ResponseError:  # no such stream yet
            return None
        for row in groups:
            if _text(row.get("name")) == self.group:
                lag = row.get("lag")
                pending = int(row.get("pending", 0))
                return None if lag is None else int(lag) + pending
        return None

    async def close(self) -> None:
        client, self._redis = self._redis, None
        if client is not None:
            await client.aclose()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
