"""Message triggers against the machine's real brokers: one run per message identity,
acknowledged once the run exists, poison messages dead with their reason, pauses holding
messages at the broker, and a broker that is down or refuses the credentials."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from message_brokers import (
    MQTT_HOST,
    NATS_URL,
    RABBIT_URL,
    REDIS_URL,
    Proxy,
    body,
    publish,
    rabbit_queue,
    run_ids,
    unique,
    until,
    with_worker,
)

import perdure
from extras_needed import require
from live_workers import worker_task
from perdure.engine.worker import Worker, WorkerOptions
from perdure.errors import ConfigError
from perdure.triggers.dead_sql import DeadMessages
from perdure.triggers.messages import MessageTrigger, content_identity


@dataclass
class Order:
    sku: str
    qty: int


def shop(tmp_path: Path) -> perdure.App:
    app = perdure.App(f"sqlite:///{tmp_path}/messages.db")

    @app.workflow(name="take_order")
    def take_order(order: Order) -> int:
        return order.qty

    return app


# -- RabbitMQ ---------------------------------------------------------------------------


def test_rabbitmq_one_run_per_message_id_and_poison_is_dead(tmp_path: Path) -> None:
    """Redelivered ids start nothing new, an id unfit for a run id is a content hash, and a
    non-JSON, oversized or ill-typed body is dead with its reason and dead-lettered."""
    require("rabbitmq")
    app = shop(tmp_path)
    queue, dlq = unique("rmq"), unique("rmq-dead")
    trigger = app.on_message(perdure.sources.RabbitMQ(RABBIT_URL, queue, declare=False),
                             "take_order", name="orders", max_payload=200)  # fmt: skip

    async def scenario(worker: Worker) -> None:
        try:
            for i in range(10):
                await publish(channel, queue, body({"sku": f"s{i}", "qty": i}), f"m{i}")
            await publish(channel, queue, body({"sku": "s3", "qty": 3}), "m3")  # redelivery
            twin = body({"sku": "t", "qty": 1})
            await publish(channel, queue, twin, "not usable")  # aio-pika sets an id if none
            await publish(channel, queue, twin, "not usable")
            await publish(channel, queue, b"{not json", "bad-json")
            await publish(channel, queue, body({"sku": "x" * 300, "qty": 1}), "too-big")
            await publish(channel, queue, body({"sku": "s", "qty": "many"}), "bad-type")
            expected = {f"msg:orders:m{i}" for i in range(10)}
            expected.add(f"msg:orders:{content_identity(b'not usable', twin)}")

            async def settled() -> bool:
                dead = await DeadMessages(app.runtime.store).dead_messages("orders")
                return await run_ids(app, "take_order") == expected and len(dead) == 3

            await until(settled)
            await until(lambda: _lag_is(trigger, 0))
            dead = {
                d.message_id: d.reason
                for d in await DeadMessages(app.runtime.store).dead_messages()
            }
            assert dead["bad-json"].startswith("payload is not JSON")
            assert dead["too-big"].startswith("payload of 321 bytes is over the limit of 200")
            assert "input check" in dead["bad-type"] and "qty" in dead["bad-type"]
            dead_queue = await channel.declare_queue(dlq, passive=True)
            assert dead_queue.declaration_result.message_count == 3
            assert trigger.status()["state"] == "consuming"
        finally:
            await channel.queue_delete(queue)
            await channel.queue_delete(dlq)
            await conn.close()

    async def main() -> None:
        nonlocal conn, channel
        conn, channel = await rabbit_queue(queue, dead_letter=dlq)
        await with_worker(app, scenario)

    conn = channel = None
    asyncio.run(main())
    assert trigger.started == 11 and trigger.dead == 3
    run = app.get_run("msg:orders:m7")
    assert run.workflow == "take_order" and '"sku":"s7"' in (run.input or "")


async def _lag_is(trigger: MessageTrigger, value: int) -> bool:
    probe = await trigger.source.lag()
    return probe == value


def test_rabbitmq_a_paused_workflow_leaves_messages_at_the_broker(tmp_path: Path) -> None:
    """While the workflow is paused the worker takes no message (they wait, counted as
    lag); resumed, each starts its run."""
    require("rabbitmq")
    app = shop(tmp_path)
    queue = unique("rmq-pause")
    trigger = app.on_message(perdure.sources.RabbitMQ(RABBIT_URL, queue), "take_order")

    async def scenario(worker: Worker) -> None:
        conn, channel = await rabbit_queue(queue)
        try:
            await app.client.set_pause("workflow", "take_order", True)
            await until(lambda: _state_is(trigger, "paused (workflow take_order)"))
            for i in range(5):
                await publish(channel, queue, body({"sku": "p", "qty": i}), f"p{i}")
            await until(lambda: _ready_is(channel, queue, 5))
            assert await run_ids(app, "take_order") == set()
            await app.client.set_pause("workflow", "take_order", False)
            await until(lambda: _count_is(app, 5))
            await until(lambda: _ready_is(channel, queue, 0))
            assert trigger.status()["state"] == "consuming"
        finally:
            await channel.queue_delete(queue)
            await conn.close()

    asyncio.run(with_worker(app, scenario))


async def _ready_is(channel: Any, queue: str, n: int) -> bool:
    declared = await channel.declare_queue(queue, passive=True)
    return bool(declared.declaration_result.message_count == n)


async def _state_is(trigger: MessageTrigger, state: str) -> bool:
    return trigger.status()["state"] == state


async def _count_is(app: perdure.App, n: int) -> bool:
    return len(await run_ids(app, "take_order")) == n


def test_a_broker_that_is_down_or_refuses_is_one_line_naming_the_trigger(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A closed port is `down` (retried, logged with the trigger's name); wrong credentials
    are `refused`; a probe from a process that does not consume says `down` too."""
    require("nats")
    require("rabbitmq")
    app = shop(tmp_path)
    down = app.on_message(perdure.sources.RabbitMQ("amqp://guest:guest@127.0.0.1:1/", "q"),
                          "take_order", name="nowhere")  # fmt: skip
    wrong = app.on_message(
        perdure.sources.RabbitMQ("amqp://guest:nope@127.0.0.1:5672/", "q"), "take_order",
        name="badpass",
    )  # fmt: skip
    missing = app.on_message(
        perdure.sources.RabbitMQ(RABBIT_URL, unique("missing"), declare=False), "take_order",
        name="noqueue",
    )  # fmt: skip
    no_stream = app.on_message(perdure.sources.JetStream(NATS_URL, unique("nostream")),
                               "take_order", name="nostream")  # fmt: skip
    probed = asyncio.run(down.probe(timeout=5))
    assert probed["state"] == "down" and probed["last_error"]
    caplog.set_level(logging.INFO, "perdure.messages")

    async def scenario(worker: Worker) -> None:
        await until(lambda: _state_is(down, "down"))
        await until(lambda: _state_is(wrong, "refused"))
        await until(lambda: _state_is(missing, "refused"))
        await until(lambda: _state_is(no_stream, "refused"))
        assert "does not exist" in (missing.last_error or "")
        assert "does not exist" in (no_stream.last_error or "")

    asyncio.run(with_worker(app, scenario))
    assert "credentials refused" in (wrong.last_error or "")
    assert "password" not in (wrong.last_error or "") or "nope" not in (wrong.last_error or "")
    lines = [r.getMessage() for r in caplog.records]
    assert any("message trigger 'nowhere': cannot consume from amqp://guest@127.0.0.1:1/"
               in line for line in lines), lines  # fmt: skip
    assert any(line.startswith("message trigger 'badpass' (amqp://guest@127.0.0.1:5672/ "
                               "queue 'q'): credentials refused") for line in lines)  # fmt: skip
    assert all("nope" not in line for line in lines)


def test_bad_trigger_options_are_one_line() -> None:
    """A name used twice, a bad name, a zero prefetch, a workflow taking two arguments."""
    app = perdure.App("sqlite:///:memory:")

    @app.workflow(name="two")
    def two(a: int, b: int) -> None: ...

    @app.workflow(name="one")
    def one(a: int) -> None: ...

    source = perdure.sources.RabbitMQ(RABBIT_URL, "q")
    with pytest.raises(ConfigError, match="must take the message's payload as its one"):
        app.on_message(source, "two")
    with pytest.raises(ConfigError, match="prefetch=0 must be at least 1"):
        app.on_message(source, "one", prefetch=0)
    with pytest.raises(ConfigError, match="use 1-100 letters"):
        app.on_message(source, "one", name="a b")
    app.on_message(source, "one", name="x")
    with pytest.raises(ConfigError, match="two message triggers are named 'x'"):
        app.on_message(perdure.sources.RabbitMQ(RABBIT_URL, "q"), "one", name="x")
    assert list(app.runtime.triggers.of(MessageTrigger)) == ["x"]
    assert app.runtime.triggers.of(MessageTrigger)["x"].status() == {
        "kind": "rabbitmq", "name": "x", "workflow": "one", "state": "idle", "since": None,
        "lag": None, "pending": None, "last_error": None, "workers": [],
    }  # fmt: skip


def test_a_bare_import_loads_no_broker_client() -> None:
    """Importing perdure and its CLI imports none of the broker clients (a bare install)."""
    code = (
        "import sys, perdure, perdure.cli.main\n"
        "loaded = {'aio_pika', 'nats', 'redis', 'aiomqtt', 'aiokafka'} & set(sys.modules)\n"
        "print(sorted(loaded))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    assert out.strip() == "[]"


# -- Redis Streams ----------------------------------------------------------------------


def redis_orders(app: perdure.App, **options: Any) -> tuple[MessageTrigger, str, str]:
    """Trigger `orders` of take_order on a fresh stream, poison copied to a fresh dead
    stream: (the trigger, the stream, the dead stream)."""
    stream, dead_stream = unique("stream"), unique("stream-dead")
    source = perdure.sources.RedisStream(REDIS_URL, stream, dead_stream=dead_stream, **options)
    return app.on_message(source, "take_order", name="orders"), stream, dead_stream


def test_redis_streams_one_run_per_entry_and_a_dead_consumers_entries_are_claimed(
    tmp_path: Path,
) -> None:
    """Entries read by a consumer that died unacknowledged are taken over (XAUTOCLAIM) and
    start their runs once; a poison entry is copied to the dead stream; nothing stays
    pending."""
    require("redis")
    import redis.asyncio as aioredis

    app = shop(tmp_path)
    trigger, stream, dead_stream = redis_orders(app, claim_idle=0.5)

    async def scenario(worker: Worker) -> None:
        client = aioredis.Redis.from_url(REDIS_URL)
        try:
            # the worker is ready once it consumes: its group exists (made at the start)
            ids = [await client.xadd(stream, {"data": body({"sku": "r", "qty": i})})
                   for i in range(8)]  # fmt: skip
            await client.xadd(stream, {"data": b"\xff\xfe"})
            # a consumer that reads three entries and dies before acknowledging them
            await client.xreadgroup("perdure", "ghost", {stream: ">"}, count=3)
            expected = {f"msg:orders:{i.decode()}" for i in ids}

            async def done() -> bool:
                info = await client.xpending(stream, "perdure")
                return await run_ids(app, "take_order") == expected and info["pending"] == 0

            await until(done)
            dead = await DeadMessages(app.runtime.store).dead_messages("orders")
            assert [d.reason.split(" (")[0] for d in dead] == ["payload is not JSON"]
            assert await client.xlen(dead_stream) == 1
            assert await trigger.source.lag() == 0
        finally:
            await client.delete(stream, dead_stream)
            await client.aclose()

    asyncio.run(with_worker(app, scenario))
    assert trigger.started == 8


def test_redis_streams_an_entry_without_the_body_field_is_dead_not_a_run(tmp_path: Path) -> None:
    """An entry whose JSON is in another field than the source's (`body`, not `data`) is dead
    with a reason naming both, its fields kept in the dead message; so is one whose `data`
    is not JSON; the entry with `data` starts its run."""
    require("redis")
    import redis.asyncio as aioredis

    app = shop(tmp_path)
    trigger, stream, dead_stream = redis_orders(app)

    async def scenario(worker: Worker) -> None:
        client = aioredis.Redis.from_url(REDIS_URL)
        try:
            wrong = await client.xadd(stream, {"body": "not json", "kind": "order"})
            await client.xadd(stream, {"data": "not json"})
            good = await client.xadd(stream, {"data": body({"sku": "b", "qty": 2})})

            async def done() -> bool:
                info = await client.xpending(stream, "perdure")
                return await client.xlen(dead_stream) == 2 and info["pending"] == 0

            await until(done)
            assert await run_ids(app, "take_order") == {f"msg:orders:{good.decode()}"}
            dead = {d.message_id: d for d in await DeadMessages(app.runtime.store).dead_messages(
                "orders")}  # fmt: skip
            no_field = dead[wrong.decode()]
            assert no_field.reason.startswith("entry has no 'data' field"), no_field.reason
            assert "its fields: body, kind" in no_field.reason
            assert json.loads(no_field.body) == {"body": "not json", "kind": "order"}
            [other] = [d for key, d in dead.items() if key != wrong.decode()]
            assert other.reason.startswith("payload is not JSON")
        finally:
            await client.delete(stream, dead_stream)
            await client.aclose()

    asyncio.run(with_worker(app, scenario))
    assert trigger.started == 1 and trigger.dead == 2


# -- NATS JetStream ---------------------------------------------------------------------


def test_jetstream_one_run_per_stream_sequence_and_unacked_messages_come_back(
    tmp_path: Path,
) -> None:
    """Messages a consumer fetched and never acknowledged come back after ack_wait and start
    their runs once; a poison message is terminated and dead; the consumer has no lag."""
    require("nats")
    import nats

    app = shop(tmp_path)
    stream = unique("js").replace("-", "_")
    trigger = app.on_message(
        perdure.sources.JetStream(NATS_URL, stream, ack_wait=1.0), "take_order", name="orders"
    )

    async def main() -> None:
        nc = await nats.connect(NATS_URL)
        js = nc.jetstream()
        await js.add_stream(name=stream, subjects=[f"{stream}.>"])
        try:
            seqs = [(await js.publish(f"{stream}.o", body({"sku": "j", "qty": i}))).seq
                    for i in range(8)]  # fmt: skip
            await js.publish(f"{stream}.o", b"not json")
            from nats.js.api import ConsumerConfig

            config = ConsumerConfig(durable_name="perdure-orders", ack_wait=1.0)
            ghost = await js.pull_subscribe(f"{stream}.>", durable="perdure-orders",
                                            stream=stream, config=config)  # fmt: skip
            fetched = await ghost.fetch(3, timeout=5)  # a consumer that dies before acking
            assert len(fetched) == 3
            await ghost.unsubscribe()
            expected = {f"msg:orders:{stream}:{seq}" for seq in seqs}

            async def scenario(worker: Worker) -> None:
                async def done() -> bool:
                    lag = await trigger.source.lag()
                    return await run_ids(app, "take_order") == expected and lag == 0

                await until(done)

            await with_worker(app, scenario)
            dead = await DeadMessages(app.runtime.store).dead_messages("orders")
            assert [(d.message_id, d.reason.split(" (")[0]) for d in dead] == [
                (f"{stream}:9", "payload is not JSON")
            ]
        finally:
            await js.delete_stream(stream)
            await nc.close()

    asyncio.run(main())
    assert trigger.started == 8


# -- MQTT -------------------------------------------------------------------------------


def test_mqtt_one_run_per_message_id_property_or_content(tmp_path: Path) -> None:
    """QoS 1 messages start one run per `message-id` user property (a resend starts
    nothing), one per content without it; a poison message goes to the dead topic."""
    require("mqtt")
    import aiomqtt
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    app = shop(tmp_path)
    topic = unique("mqtt")
    trigger = app.on_message(
        perdure.sources.MQTT(MQTT_HOST, f"{topic}/#", dead_topic=f"{topic}-dead"),
        "take_order", name="orders",
    )  # fmt: skip

    def with_id(message_id: str) -> Properties:
        properties = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        properties.UserProperty = [("message-id", message_id)]
        return properties

    worker_ids: list[str] = []

    async def scenario(worker: Worker) -> None:
        worker_ids.append(worker.id)
        async with aiomqtt.Client(MQTT_HOST, protocol=aiomqtt.ProtocolVersion.V5) as client:
            await client.subscribe(f"{topic}-dead", qos=1)
            await until(lambda: _state_is(trigger, "consuming"))  # subscribed (SUBACK)
            for i in range(6):
                await client.publish(f"{topic}/o", body({"sku": "q", "qty": i}), qos=1,
                                     properties=with_id(f"q{i}"))  # fmt: skip
            await client.publish(f"{topic}/o", body({"sku": "q", "qty": 2}), qos=1,
                                 properties=with_id("q2"))  # fmt: skip
            plain = body({"sku": "plain", "qty": 1})
            await client.publish(f"{topic}/o", plain, qos=1)
            await client.publish(f"{topic}/o", plain, qos=1)
            await client.publish(f"{topic}/o", b"\x00binary", qos=1, properties=with_id("bin"))
            expected = {f"msg:orders:q{i}" for i in range(6)}
            expected.add(f"msg:orders:{content_identity(f'{topic}/o'.encode(), plain)}")
            await until(lambda: _ids_are(app, expected))
            dead = await asyncio.wait_for(anext(client.messages), 20)
            assert bytes(dead.payload) == b"\x00binary"
            assert ("message-id", "bin") in dead.properties.UserProperty
            rows = await DeadMessages(app.runtime.store).dead_messages("orders")
            assert [r.message_id for r in rows] == ["bin"]

    asyncio.run(with_worker(app, scenario))
    assert trigger.started == 7
    asyncio.run(_end_session(f"perdure-orders-{worker_ids[0]}"))


async def _end_session(client_id: str) -> None:
    """End a worker's persistent MQTT session (the broker would keep it for days)."""
    import aiomqtt

    async with aiomqtt.Client(MQTT_HOST, identifier=client_id, clean_start=True,
                              protocol=aiomqtt.ProtocolVersion.V5):  # fmt: skip
        pass


async def _ids_are(app: perdure.App, expected: set[str]) -> bool:
    return await run_ids(app, "take_order") == expected


# -- Kafka (no server here) -------------------------------------------------------------


def test_kafka_without_a_server_is_down_with_one_line_and_names_records_by_offset(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """No Kafka server runs here, so this is what the client allows without one: a broker
    that does not answer leaves the trigger `down` with one log line naming it (and /readyz's
    probe says so), and a record's identity is its topic, partition and offset."""
    require("kafka")
    from aiokafka.structs import ConsumerRecord

    app = shop(tmp_path)
    source = perdure.sources.Kafka("127.0.0.1:1", "orders", options={"request_timeout_ms": 2000})
    trigger = app.on_message(source, "take_order", name="kafka-orders")
    probed = asyncio.run(trigger.probe(timeout=10))
    assert probed["state"] == "down" and probed["kind"] == "kafka"
    caplog.set_level(logging.INFO, "perdure.messages")

    async def scenario(worker: Worker) -> None:
        await until(lambda: _state_is(trigger, "down"))

    asyncio.run(with_worker(app, scenario))
    lines = [r.getMessage() for r in caplog.records if r.name == "perdure.messages"]
    assert lines and lines[0].startswith(
        "message trigger 'kafka-orders': cannot consume from kafka://127.0.0.1:1 topic "
        "'orders' group 'perdure-kafka-orders' ("
    )
    record = ConsumerRecord("orders", 3, 1207, 0, 0, None, b'{"sku": "k", "qty": 1}', None,
                            0, 22, [])  # fmt: skip
    message = source.message(record)
    assert (message.identity, message.body) == ("orders-3-1207", b'{"sku": "k", "qty": 1}')
    assert trigger.run_id(message.identity) == "msg:kafka-orders:orders-3-1207"


def test_a_worker_behind_its_pending_runs_stops_taking_messages(tmp_path: Path) -> None:
    """With `max_pending` runs pending (a queue limited to one run at a time, its run held),
    the worker takes no more messages: they wait at the broker; once runs drain, every
    message starts its run."""
    require("rabbitmq")
    import threading

    app = perdure.App(f"sqlite:///{tmp_path}/pressure.db")
    app.queue("one-at-a-time", concurrency=1)
    gate = threading.Event()

    @app.step(name="wait_for_gate", effect="read")
    def wait_for_gate() -> None:
        gate.wait(30)

    @app.workflow(name="slow", queue="one-at-a-time")
    def slow(order: dict[str, Any]) -> None:
        wait_for_gate()

    queue = unique("rmq-pressure")
    trigger = app.on_message(perdure.sources.RabbitMQ(RABBIT_URL, queue), "slow",
                             prefetch=2, max_pending=3)  # fmt: skip

    async def main() -> None:
        conn, channel = await rabbit_queue(queue)
        try:
            for i in range(12):
                await publish(channel, queue, body({"n": i}), f"n{i}")

            async def scenario(worker: Worker) -> None:
                await until(lambda: _state_is(trigger, "backpressure"))
                await until(lambda: _ready_is_over(channel, queue, 0))
                assert len(await run_ids(app, "slow")) < 12
                gate.set()
                await until(lambda: _count_of(app, "slow", 12), timeout=30)
                await until(lambda: _ready_is(channel, queue, 0))

            await with_worker(app, scenario)
        finally:
            gate.set()
            await channel.queue_delete(queue)
            await conn.close()

    asyncio.run(main())


async def _ready_is_over(channel: Any, queue: str, n: int) -> bool:
    declared = await channel.declare_queue(queue, passive=True)
    return bool(declared.declaration_result.message_count > n)


async def _count_of(app: perdure.App, workflow: str, n: int) -> bool:
    return len(await run_ids(app, workflow)) == n


def test_a_message_whose_run_id_names_another_workflows_run_is_dead(tmp_path: Path) -> None:
    """The run id a message names already belongs to a run of another workflow (another app
    on the same store): the message is dead with that reason, not redelivered forever."""
    require("rabbitmq")
    app = shop(tmp_path)

    @app.workflow(name="other")
    def other(x: Any) -> None: ...

    app.start("other", 1, run_id="msg:orders:taken")
    queue = unique("rmq-taken")
    trigger = app.on_message(perdure.sources.RabbitMQ(RABBIT_URL, queue), "take_order",
                             name="orders")  # fmt: skip

    async def main() -> None:
        conn, channel = await rabbit_queue(queue)
        try:
            await publish(channel, queue, body({"sku": "t", "qty": 1}), "taken")

            async def scenario(worker: Worker) -> None:
                await until(lambda: _dead_count(app, 1))
                await until(lambda: _ready_is(channel, queue, 0))

            await with_worker(app, scenario)
        finally:
            await channel.queue_delete(queue)
            await conn.close()

    asyncio.run(main())
    [dead] = app.runtime.sync(DeadMessages(app.runtime.store).dead_messages(), "dead")
    assert dead.message_id == "taken" and dead.reason.startswith("cannot start its run: ")
    assert "already names a run of workflow 'other'" in dead.reason
    assert trigger.started == 0


async def _dead_count(app: perdure.App, n: int) -> bool:
    return len(await DeadMessages(app.runtime.store).dead_messages()) == n


def test_mqtt_needs_workers_with_a_stable_id(tmp_path: Path) -> None:
    """Without a stable worker id (or client_id=) an MQTT trigger refuses to consume: a
    session left behind by a restart would keep taking its share of the messages."""
    require("mqtt")
    app = shop(tmp_path)
    trigger = app.on_message(perdure.sources.MQTT(MQTT_HOST, f"{unique('mq')}/#"),
                             "take_order")  # fmt: skip

    async def main() -> None:
        async with worker_task(app, WorkerOptions(poll=0.05, gc_every=None, grace=1.0)):
            await until(lambda: _state_is(trigger, "refused"))

    asyncio.run(main())
    assert (trigger.last_error or "").startswith(
        "mqtt keeps a session per worker, named by the worker's id: start workers with a "
        "stable id (perdure worker --id NAME"
    )


class Side:
    """The test's side of one broker: its port, make the queue, publish, count what waits."""

    def __init__(self, kind: str) -> None:
        require(kind)  # each kind's client comes with the extra of the same name
        self.kind, self.name = kind, unique(f"flaky-{kind}").replace("-", "_")
        self.port = {"rabbitmq": 5672, "redis": 6379, "nats": 4222, "mqtt": 1883}[kind]

    def source(self, port: int) -> Any:
        s = perdure.sources
        if self.kind == "rabbitmq":
            return s.RabbitMQ(f"amqp://guest:guest@127.0.0.1:{port}/", self.name)
        if self.kind == "redis":
            return s.RedisStream(f"redis://127.0.0.1:{port}/0", self.name)
        if self.kind == "nats":
            return s.JetStream(f"nats://127.0.0.1:{port}", self.name, ack_wait=1.0)
        return s.MQTT("127.0.0.1", f"{self.name}/#", port=port, client_id=self.name)

    async def open(self) -> None:
        if self.kind == "rabbitmq":
            self.conn, self.channel = await rabbit_queue(self.name)
        elif self.kind == "redis":
            import redis.asyncio as aioredis

            self.client = aioredis.Redis.from_url(REDIS_URL)
        elif self.kind == "nats":
            import nats

            self.nc = await nats.connect(NATS_URL)
            self.js = self.nc.jetstream()
            await self.js.add_stream(name=self.name, subjects=[f"{self.name}.>"])
        else:
            import aiomqtt
            from paho.mqtt.packettypes import PacketTypes
            from paho.mqtt.properties import Properties

            session = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            session.SessionExpiryInterval = 600
            async with aiomqtt.Client(MQTT_HOST, identifier=self.name, clean_start=False,
                                      protocol=aiomqtt.ProtocolVersion.V5,
                                      properties=session) as worker_session:  # fmt: skip
                await worker_session.subscribe(f"$share/perdure/{self.name}/#", qos=1)
            self.mqtt = aiomqtt.Client(MQTT_HOST, protocol=aiomqtt.ProtocolVersion.V5)
            await self.mqtt.__aenter__()

    async def publish(self, i: int) -> None:
        data = body({"sku": "d", "qty": i})
        if self.kind == "rabbitmq":
            await publish(self.channel, self.name, data, f"d{i}")
        elif self.kind == "redis":
            await self.client.xadd(self.name, {"data": data})
        elif self.kind == "nats":
            await self.js.publish(f"{self.name}.d", data)
        else:
            await self.mqtt.publish(f"{self.name}/d", data, qos=1)

    async def close(self) -> None:
        if self.kind == "rabbitmq":
            await self.channel.queue_delete(self.name)
            await self.conn.close()
        elif self.kind == "redis":
            await self.client.delete(self.name)
            await self.client.aclose()
        elif self.kind == "nats":
            await self.js.delete_stream(self.name)
            await self.nc.close()
        else:
            await self.mqtt.__aexit__(None, None, None)
            await _end_session(self.name)


@pytest.mark.parametrize(
    "kind", ["rabbitmq", "redis", pytest.param("nats", marks=pytest.mark.slow), "mqtt"]
)  # nats: its client sees a cut connection only when a flush times out (5 s)
def test_a_broker_down_at_start_and_lost_midway_is_reconnected_losing_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    """The broker not answering when the worker starts: the trigger is `down` (one line
    naming it) and retries with backoff; once it answers, the trigger connects; its
    connections cut mid-stream, it reconnects: every message starts exactly one run."""
    app = shop(tmp_path)
    side = Side(kind)
    proxy = Proxy("127.0.0.1", side.port)
    trigger = app.on_message(side.source(proxy.port), "take_order", name="flaky")
    caplog.set_level(logging.INFO, "perdure.messages")

    async def main() -> None:
        await side.open()
        try:
            for i in range(20):
                await side.publish(i)

            async def scenario(worker: Worker) -> None:
                await until(lambda: _state_is(trigger, "down"))
                await proxy.open()
                await until(lambda: _count_is(app, 20))
                proxy.cut()  # the broker "restarts"
                for i in range(20, 40):
                    await side.publish(i)
                await until(lambda: _count_is(app, 40), timeout=30)

            await with_worker(app, scenario)
        finally:
            await proxy.close()
            await side.close()

    asyncio.run(main())
    assert trigger.started == 40
    lines = [r.getMessage() for r in caplog.records if r.name == "perdure.messages"]
    assert lines[0].startswith("message trigger 'flaky': cannot consume from "), lines[0]
    assert f":{proxy.port}" in lines[0]
    assert any(line.startswith("message trigger 'flaky': connected to") for line in lines)


def test_an_item_taken_as_a_wait_times_out_comes_with_the_next_wait() -> None:
    """`Pending` keeps the one wait it started: an item the waiting task took after the
    wait timed out is returned by the next wait, not dropped with a cancelled task."""
    from perdure.triggers.messages import Pending

    async def main() -> None:
        queue: asyncio.Queue[str] = asyncio.Queue()
        pending: Pending[str] = Pending()
        assert await pending.get(queue.get, 0.01) is None
        queue.put_nowait("m1")
        await asyncio.sleep(0)  # the kept task takes m1 off the queue now
        assert queue.empty()
        assert await pending.get(queue.get, 1.0) == "m1"
        assert await pending.get(queue.get, 0.01) is None
        pending.cancel()

    asyncio.run(main())
