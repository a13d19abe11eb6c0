"""Helpers for the message-trigger tests: the machine's brokers, unique names, and an
in-process worker run while a coroutine publishes and waits."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import perdure
from live_workers import worker_task
from perdure.engine.worker import Worker, WorkerOptions
from waits import wait_for_async

RABBIT_URL = os.environ.get("PERDURE_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672/")
REDIS_URL = os.environ.get("PERDURE_TEST_REDIS", "redis://127.0.0.1:6379/0")
NATS_URL = os.environ.get("PERDURE_TEST_NATS", "nats://127.0.0.1:4222")
MQTT_HOST = os.environ.get("PERDURE_TEST_MQTT", "127.0.0.1")

T = TypeVar("T")


def unique(prefix: str) -> str:
    return f"perdure-test-{prefix}-{uuid.uuid4().hex[:10]}"


def body(value: Any) -> bytes:
    return json.dumps(value).encode()


async def until(check: Callable[[], Awaitable[bool]], timeout: float = 20.0) -> None:
    """Wait until `check()` holds (a broker's answer may take seconds), or fail naming it."""
    await wait_for_async(getattr(check, "__name__", "the condition"), check, timeout, every=0.05)


async def rabbit_queue(name: str, *, dead_letter: str | None = None) -> Any:
    """A connection and channel to RabbitMQ, with durable queue `name` declared (its
    dead-letter exchange routing to queue `dead_letter`, declared too, if given)."""
    import aio_pika

    conn = await aio_pika.connect(RABBIT_URL)
    channel = await conn.channel()
    arguments: dict[str, Any] = {}
    if dead_letter:
        await channel.declare_queue(dead_letter, durable=True)
        arguments = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead_letter}
    await channel.declare_queue(name, durable=True, arguments=arguments)
    return conn, channel


async def publish(channel: Any, queue: str, data: bytes, message_id: str | None) -> None:
    """Publish `data` persistently to `queue` through the default exchange."""
    import aio_pika

    await channel.default_exchange.publish(
        aio_pika.Message(data, message_id=message_id, delivery_mode=2), routing_key=queue
    )


async def with_worker(app: perdure.App, body_of_test: Callable[[Worker], Awaitable[T]]) -> T:
    """Run a real worker of `app` (its message triggers consuming) while the test runs."""
    options = WorkerOptions(id=unique("worker"), concurrency=8, poll=0.05, gc_every=None,
                            grace=2.0)  # fmt: skip
    async with worker_task(app, options, stop_within=30) as worker:
        await asyncio.wait_for(worker.ready.wait(), 20)
        return await body_of_test(worker)


async def run_ids(app: perdure.App, workflow: str) -> set[str]:
    rows = await app.client.list_runs(workflow=workflow, limit=100_000)
    return {r.id for r in rows}


class Proxy:
    """A TCP proxy to a broker that can be down: not listening until `open()`, and `cut()`
    drops every connection at once (a broker restart, as the trigger sees it)."""

    def __init__(self, host: str, port: int) -> None:
        import socket

        self.target = (host, port)
        with socket.socket() as probe:  # a free port, not listening until open()
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.server: asyncio.Server | None = None
        self.writers: list[asyncio.StreamWriter] = []

    async def open(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self.writers += [writer, up_writer]

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))

    def cut(self) -> None:
        for writer in self.writers:
            writer.transport.abort()
        self.writers.clear()

    async def close(self) -> None:
        self.cut()
        if self.server is not None:
            self.server.close()
