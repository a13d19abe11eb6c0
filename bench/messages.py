"""Figure M1: message triggers per broker and store: messages/s from publish to run created,
and publish-to-first-step latency (p50/p99).

    .venv/bin/python -m bench.messages [--messages N] [--rounds N] [--sqlite | --pg]
                                       [--source rabbitmq|redis|nats|mqtt ...]

Each cell runs one in-process worker (concurrency 16) against the machine's broker and a
fresh store (SQLite file, or a PostgreSQL schema dropped after). Throughput: N messages
published before the worker starts (the MQTT session subscribed first), timed from the
worker's start until the N-th run exists, each message acknowledged after its run: the
publisher's own speed is left out. Latency, once those runs are done: 200 messages
published 20 a second, each carrying its publish time, read by the workflow's first
step. Rounds interleave every configuration; medians. A benchmark, not a test: it
asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import perdure
from perdure.engine.worker import Worker, WorkerOptions

RABBIT_URL = os.environ.get("PERDURE_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672/")
REDIS_URL = os.environ.get("PERDURE_TEST_REDIS", "redis://127.0.0.1:6379/0")
NATS_URL = os.environ.get("PERDURE_TEST_NATS", "nats://127.0.0.1:4222")
MQTT_HOST = os.environ.get("PERDURE_TEST_MQTT", "127.0.0.1")
PG_URL = os.environ.get("PERDURE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
KINDS = ("rabbitmq", "redis", "nats", "mqtt")
LATENCY_MESSAGES = 200
LATENCY_RATE = 20.0  # messages a second

Publish = Callable[[bytes, str], Awaitable[None]]


class Broker:
    """Make a queue of `kind`, publish to it, delete it."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.name = f"perdure-bench-{kind}-{uuid.uuid4().hex[:8]}"
        self.handles: list[Any] = []

    def source(self) -> Any:
        sources = perdure.sources
        if self.kind == "rabbitmq":
            return sources.RabbitMQ(RABBIT_URL, self.name)
        if self.kind == "redis":
            return sources.RedisStream(REDIS_URL, self.name)
        if self.kind == "nats":
            return sources.JetStream(NATS_URL, self.name)
        return sources.MQTT(MQTT_HOST, f"{self.name}/#", group=self.name,
                            client_id=f"{self.name}-worker")  # fmt: skip

    async def open(self) -> Publish:
        if self.kind == "rabbitmq":
            import aio_pika

            conn = await aio_pika.connect(RABBIT_URL)
            channel = await conn.channel()
            await channel.declare_queue(self.name, durable=True)
            self.handles = [conn, channel]

            async def rabbit(data: bytes, message_id: str) -> None:
                message = aio_pika.Message(data, message_id=message_id, delivery_mode=2)
                await channel.default_exchange.publish(message, routing_key=self.name)

            return rabbit
        if self.kind == "redis":
            import redis.asyncio as aioredis

            client = aioredis.Redis.from_url(REDIS_URL)
            await client.xgroup_create(self.name, "perdure", id="0", mkstream=True)
            self.handles = [client]

            async def redis(data: bytes, message_id: str) -> None:
                await client.xadd(self.name, {"data": data})

            return redis
        if self.kind == "nats":
            import nats

            nc = await nats.connect(NATS_URL)
            js = nc.jetstream()
            await js.add_stream(name=self.name, subjects=[f"{self.name}.>"])
            self.handles = [nc, js]

            async def jetstream(data: bytes, message_id: str) -> None:
                await js.publish(f"{self.name}.m", data)

            return jetstream
        import aiomqtt
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        session = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        session.SessionExpiryInterval = 600
        async with aiomqtt.Client(MQTT_HOST, identifier=f"{self.name}-worker",
                                  protocol=aiomqtt.ProtocolVersion.V5, clean_start=False,
                                  properties=session) as worker_session:  # fmt: skip
            await worker_session.subscribe(f"$share/{self.name}/{self.name}/#", qos=1)
        client = aiomqtt.Client(MQTT_HOST, protocol=aiomqtt.ProtocolVersion.V5)
        await client.__aenter__()
        self.handles = [client]

        async def mqtt(data: bytes, message_id: str) -> None:
            properties = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
            properties.UserProperty = [("message-id", message_id)]
            await client.publish(f"{self.name}/m", data, qos=1, properties=properties)

        return mqtt

    async def close(self) -> None:
        if self.kind == "rabbitmq":
            conn, channel = self.handles
            await channel.queue_delete(self.name)
            await conn.close()
        elif self.kind == "redis":
            (client,) = self.handles
            await client.delete(self.name)
            await client.aclose()
        elif self.kind == "nats":
            nc, js = self.handles
            await js.delete_stream(self.name)
            await nc.close()
        else:
            import aiomqtt

            (client,) = self.handles
            await client.__aexit__(None, None, None)
            async with aiomqtt.Client(
                MQTT_HOST,
                identifier=f"{self.name}-worker",
                protocol=aiomqtt.ProtocolVersion.V5,
                clean_start=True,
            ):
                pass  # ends the worker's session


def one_cell(kind: str, store: str, messages: int) -> tuple[float, float, float]:
    """(messages/s publish to run created, p50 ms, p99 ms) for one broker and store."""
    folder = tempfile.mkdtemp(prefix="perdure-bench-messages-")
    schema = f"bench_msg_{uuid.uuid4().hex[:10]}"
    url = f"sqlite:///{folder}/bench.db" if store == "sqlite" else f"{PG_URL}?schema={schema}"
    app = perdure.App(url)
    delays: list[float] = []

    @app.step(name="first", effect="read")
    def first(sent: float) -> None:
        delays.append(time.time() - sent)

    @app.workflow(name="handle")
    def handle(message: dict[str, Any]) -> None:
        if "sent" in message:
            first(message["sent"])

    broker = Broker(kind)
    app.on_message(broker.source(), handle, name="bench")
    try:
        rate = asyncio.run(measure(app, broker, messages, delays))
    finally:
        app.close()
        if store == "postgres":
            import psycopg

            with psycopg.connect(PG_URL, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    ordered = sorted(delays)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return rate, statistics.median(ordered) * 1000, p99 * 1000


async def measure(app: perdure.App, broker: Broker, messages: int, delays: list[float]) -> float:
    """Run a worker; publish the burst (returns its rate) and the paced latency messages."""
    publish = await broker.open()
    for i in range(messages):  # the backlog, before the worker: the publisher's own speed
        await publish(b'{"n": %d}' % i, f"t{i}")  # (in this process) is not measured
    worker = Worker(app.runtime, WorkerOptions(concurrency=16, poll=0.05, gc_every=None, grace=2.0))
    began = time.perf_counter()
    task = asyncio.create_task(worker.run())
    try:
        while sum((await app.runtime.store.count_runs()).values()) < messages:  # runs created
            await asyncio.sleep(0.01)
        rate = messages / (time.perf_counter() - began)
        while (await app.runtime.store.count_runs()).get("completed", 0) < messages:  # no backlog
            await asyncio.sleep(0.05)
        for i in range(LATENCY_MESSAGES):
            await publish(b'{"sent": %r}' % time.time(), f"l{i}")
            await asyncio.sleep(1 / LATENCY_RATE)
        while len(delays) < LATENCY_MESSAGES:
            await asyncio.sleep(0.01)
        return rate
    finally:
        worker.stop()
        await asyncio.wait_for(task, 30)
        await broker.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--source", action="append", choices=KINDS, help="Only these.")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--sqlite", action="store_true")
    which.add_argument("--pg", action="store_true")
    args = parser.parse_args()
    stores = ["sqlite"] if args.sqlite else ["postgres"] if args.pg else ["sqlite", "postgres"]
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs; "
          f"{args.messages} messages per throughput cell, {args.rounds} round(s)")  # fmt: skip
    cells: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    for _ in range(args.rounds):
        for store in stores:
            for kind in args.source or KINDS:
                cells.setdefault((kind, store), []).append(one_cell(kind, store, args.messages))
    print(f"{'source':<10} {'store':<9} {'msgs/s':>8} {'p50 ms':>8} {'p99 ms':>8}")
    for (kind, store), results in cells.items():
        rate = statistics.median(r[0] for r in results)
        p50 = statistics.median(r[1] for r in results)
        p99 = statistics.median(r[2] for r in results)
        print(f"{kind:<10} {store:<9} {rate:>8.0f} {p50:>8.1f} {p99:>8.1f}")


if __name__ == "__main__":
    main()
