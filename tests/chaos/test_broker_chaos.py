"""kill -9 chaos per broker: 1,000 messages published while two real worker processes consume
and one of them is killed every couple of seconds and restarted. Afterwards: exactly one
run per message (none lost, none twice), no `once` charge executed twice (an interrupted
one is settled by its probe, which asks the ledger: none waits for a person), and the
broker drained: every message
acknowledged."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from extras_needed import require
from fresh_stores import fresh_store_url
from module_files import load_file
from perdure.store.base import COMPLETED, NEEDS_ATTENTION
from perdure.triggers.dead_sql import DeadMessages
from process_stops import stop_processes

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "broker_app.py"
RABBIT_URL = os.environ.get("PERDURE_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672/")
REDIS_URL = os.environ.get("PERDURE_TEST_REDIS", "redis://127.0.0.1:6379/0")
NATS_URL = os.environ.get("PERDURE_TEST_NATS", "nats://127.0.0.1:4222")
MQTT_HOST = os.environ.get("PERDURE_TEST_MQTT", "127.0.0.1")
MESSAGES = 1000
WORKERS = 2
PUBLISH_SECONDS = 12.0  # messages come in while the kills happen
BURST = 100
KILL_EVERY = (1.0, 2.5)  # seconds between kills
MIN_KILLS = 5
KILL_BEFORE_ACK = 0.03  # chance per batch that a worker kill -9s itself before its ack
SETTLE_SECONDS = 90.0


def load_app_module() -> ModuleType:
    return load_file("perdure_broker_app", SCRIPT)


class Broker:
    """One broker's side of the test: make the queue, publish, say whether it is drained."""

    kind = ""

    def __init__(self, name: str) -> None:
        self.name = name

    async def setup(self) -> None: ...
    async def publish(self, order: int) -> str:
        """Publish order `order`; returns the message identity its run id carries."""
        raise NotImplementedError

    async def drained(self) -> bool:
        raise NotImplementedError

    async def teardown(self) -> None: ...


class Rabbit(Broker):
    kind = "rabbitmq"

    async def setup(self) -> None:
        import aio_pika

        self.conn = await aio_pika.connect(RABBIT_URL)
        self.channel = await self.conn.channel(publisher_confirms=True)
        await self.channel.declare_queue(self.name, durable=True)

    async def publish(self, order: int) -> str:
        import aio_pika

        message_id = f"order-{order}"
        message = aio_pika.Message(b'{"order": %d}' % order, message_id=message_id,
                                   delivery_mode=2)  # fmt: skip
        await self.channel.default_exchange.publish(message, routing_key=self.name)
        return message_id

    async def drained(self) -> bool:
        queue = await self.channel.declare_queue(self.name, passive=True)
        return bool(queue.declaration_result.message_count == 0)

    async def teardown(self) -> None:
        await self.channel.queue_delete(self.name)
        await self.conn.close()


class Redis(Broker):
    kind = "redis"

    async def setup(self) -> None:
        import redis.asyncio as aioredis

        self.client = aioredis.Redis.from_url(REDIS_URL)
        await self.client.xgroup_create(self.name, "perdure", id="0", mkstream=True)

    async def publish(self, order: int) -> str:
        entry = await self.client.xadd(self.name, {"data": b'{"order": %d}' % order})
        return str(entry.decode())

    async def drained(self) -> bool:
        groups = await self.client.xinfo_groups(self.name)
        group = next(g for g in groups if g["name"] in (b"perdure", "perdure"))
        return bool(group["pending"] == 0 and group["lag"] == 0)

    async def teardown(self) -> None:
        await self.client.delete(self.name)
        await self.client.aclose()


class Nats(Broker):
    kind = "nats"

    async def setup(self) -> None:
        import nats

        self.nc = await nats.connect(NATS_URL)
        self.js = self.nc.jetstream()
        await self.js.add_stream(name=self.name, subjects=[f"{self.name}.>"])

    async def publish(self, order: int) -> str:
        ack = await self.js.publish(f"{self.name}.order", b'{"order": %d}' % order)
        return f"{self.name}:{ack.seq}"

    async def drained(self) -> bool:
        info = await self.js.consumer_info(self.name, "perdure-chaos")
        return bool(info.num_pending == 0 and info.num_ack_pending == 0)

    async def teardown(self) -> None:
        await self.js.delete_stream(self.name)
        await self.nc.close()


class Mqtt(Broker):
    """MQTT cannot say what waits at the broker: after the workers stop, each worker's
    session is resumed and must hold nothing unacknowledged (a marker published to it
    arrives after anything the broker still had to redeliver)."""

    kind = "mqtt"

    async def setup(self) -> None:
        """The workers' sessions first: MQTT keeps a message only for a subscription that
        exists, so one published before the first worker subscribed would go nowhere."""
        import aiomqtt
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        for slot in range(WORKERS):
            properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            properties.SessionExpiryInterval = 3600
            async with aiomqtt.Client(MQTT_HOST, identifier=f"{self.name}-{slot}",
                                      protocol=aiomqtt.ProtocolVersion.V5, clean_start=False,
                                      properties=properties) as session:  # fmt: skip
                await session.subscribe(f"$share/{self.name}/{self.name}/#", qos=1)
        self.client = aiomqtt.Client(MQTT_HOST, protocol=aiomqtt.ProtocolVersion.V5)
        await self.client.__aenter__()

    async def publish(self, order: int) -> str:
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        properties = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        properties.UserProperty = [("message-id", f"order-{order}")]
        await self.client.publish(f"{self.name}/order", b'{"order": %d}' % order, qos=1,
                                  properties=properties)  # fmt: skip
        return f"order-{order}"

    async def drained(self) -> bool:
        return True  # checked by `left_in_sessions` once the workers stopped

    async def left_in_sessions(self) -> list[str]:
        """What each stopped worker's session still had to deliver (should be nothing)."""
        import aiomqtt

        left: list[str] = []
        for slot in range(WORKERS):
            session = aiomqtt.Client(MQTT_HOST, identifier=f"{self.name}-{slot}",
                                     protocol=aiomqtt.ProtocolVersion.V5,
                                     clean_start=False)  # fmt: skip
            async with session:
                marker = f"{self.name}-marker/{slot}"
                await session.subscribe(marker, qos=1)
                await session.publish(marker, b"marker", qos=1)
                async for message in session.messages:
                    if str(message.topic) == marker:
                        break
                    left.append(bytes(message.payload).decode())
                await session.unsubscribe(marker)
        return left

    async def teardown(self) -> None:
        import aiomqtt

        await self.client.__aexit__(None, None, None)
        for slot in range(WORKERS):  # end the workers' sessions
            async with aiomqtt.Client(
                MQTT_HOST,
                identifier=f"{self.name}-{slot}",
                protocol=aiomqtt.ProtocolVersion.V5,
                clean_start=True,
            ):
                pass


BROKERS: dict[str, type[Broker]] = {
    "rabbitmq": Rabbit, "redis": Redis, "nats": Nats, "mqtt": Mqtt,
}  # fmt: skip


class Workers:
    """Worker processes on one workdir; every one is killed at the end."""

    def __init__(self, workdir: Path, kind: str, name: str, env: dict[str, str]) -> None:
        self.workdir, self.kind, self.name = workdir, kind, name
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **env}
        self.env.pop("PERDURE_DB", None)
        self.slots: list[subprocess.Popen[bytes] | None] = [None] * WORKERS
        self.count = 0
        (workdir / "logs").mkdir(parents=True, exist_ok=True)

    def spawn(self, slot: int) -> None:
        """A worker in `slot` (the slot names its MQTT session, kept across restarts)."""
        log = self.workdir / "logs" / f"worker-{self.count}-slot{slot}.log"
        self.count += 1
        env = {**self.env, "MQTT_ID": f"{self.name}-{slot}"}
        if self.kind != "mqtt":  # MQTT cannot say when a resumed session is drained
            env["KILL_BEFORE_ACK"] = str(KILL_BEFORE_ACK)
        with open(log, "wb") as out:
            self.slots[slot] = subprocess.Popen(
                [sys.executable, str(SCRIPT), str(self.workdir), self.kind, self.name],
                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            )  # fmt: skip

    def kill(self, slot: int) -> None:
        proc = self.slots[slot]
        assert proc is not None
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait()

    def revive(self) -> int:
        """Restart the workers that killed themselves before an ack; how many."""
        revived = 0
        for slot, proc in enumerate(self.slots):
            if proc is not None and proc.poll() is not None:
                assert proc.returncode == -signal.SIGKILL, (
                    f"a worker exited by itself with {proc.returncode}:\n" + self.logs()
                )
                self.spawn(slot)
                revived += 1
        return revived

    def stop_all(self) -> None:
        stop_processes([p for p in self.slots if p is not None and p.poll() is None], grace=20)

    def logs_count(self, text: str) -> int:
        return sum(p.read_text(errors="replace").count(text)
                   for p in (self.workdir / "logs").iterdir())  # fmt: skip

    def logs(self) -> str:
        return "\n".join(
            p.read_text(errors="replace")[-3000:] for p in sorted((self.workdir / "logs").iterdir())
        )


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, str]]:
    """The environment naming the store: SQLite in the workdir, or a fresh PostgreSQL schema."""
    if request.param == "sqlite":
        yield {}
        return
    with fresh_store_url("postgres", tmp_path) as url:
        yield {"BROKER_STORE_URL": url}


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", sorted(BROKERS))
def test_every_message_starts_one_run_through_worker_kills(
    tmp_path: Path, kind: str, store_env: dict[str, str]
) -> None:
    """1,000 messages, a worker kill -9'd every 1-2.5 s: 1,000 runs, none lost or doubled,
    no charge executed twice, none parked (the charge's probe settles what a kill cut off),
    every message acknowledged."""
    require(kind)  # the broker's client: the extra of the same name
    os.environ.update(store_env)  # the test's own App reads the same store
    try:
        asyncio.run(chaos(tmp_path / "brokers", kind, store_env))
    finally:
        for key in store_env:
            os.environ.pop(key, None)


async def chaos(workdir: Path, kind: str, store_env: dict[str, str]) -> None:
    mod = load_app_module()
    workdir.mkdir()
    name = f"perdure-chaos-{kind}-{uuid.uuid4().hex[:10]}"
    broker = BROKERS[kind](name)
    await broker.setup()
    app = mod.build_app(workdir, kind, name)
    await app.client.list_runs(limit=1)  # migrates the store before the workers race to
    workers = Workers(workdir, kind, name, store_env)
    rng = random.Random()
    identities: list[str] = []
    try:
        for slot in range(WORKERS):
            workers.spawn(slot)

        async def publish_all() -> None:
            """In bursts, so a kill finds messages prefetched and not yet acknowledged."""
            for order in range(MESSAGES):
                identities.append(await broker.publish(order))
                if order % BURST == BURST - 1:
                    await asyncio.sleep(PUBLISH_SECONDS * BURST / MESSAGES)

        publisher = asyncio.create_task(publish_all())
        kills = self_kills = 0
        next_kill = time.monotonic() + rng.uniform(*KILL_EVERY)
        while not publisher.done() or kills < MIN_KILLS:
            await asyncio.sleep(0.05)  # chaos pacing, not synchronisation
            self_kills += workers.revive()
            if time.monotonic() >= next_kill:
                slot = rng.randrange(WORKERS)
                workers.kill(slot)
                workers.spawn(slot)
                kills += 1
                next_kill = time.monotonic() + rng.uniform(*KILL_EVERY)
        await publisher
        (workdir / "calm").touch()  # no more kills before an ack
        self_kills += workers.revive()
        killed_at = time.monotonic()

        async def settled() -> list[Any] | None:
            runs = await app.client.list_runs(limit=10_000)
            done = [r for r in runs if r.status in (COMPLETED, NEEDS_ATTENTION)]
            if len(done) == len(runs) >= MESSAGES and await broker.drained():
                return runs
            return None

        runs = None
        while runs is None:
            self_kills += workers.revive()  # one may have been past its check of `calm`
            if time.monotonic() - killed_at > SETTLE_SECONDS:
                seen = Counter(r.status for r in await app.client.list_runs(limit=10_000))
                pytest.fail(f"not settled {SETTLE_SECONDS}s after the last kill: runs "
                            f"{dict(seen)}, drained {await broker.drained()}\n"
                            + workers.logs())  # fmt: skip
            await asyncio.sleep(0.1)
            runs = await settled()
        drained_after = time.monotonic() - killed_at
        workers.stop_all()
        assert await broker.drained()  # a graceful stop returns nothing unacknowledged
        if isinstance(broker, Mqtt):
            assert await broker.left_in_sessions() == []

        expected = {f"msg:{mod.TRIGGER}:{identity}" for identity in identities}
        assert len(expected) == MESSAGES
        assert {r.id for r in runs} == expected, "a message lost, or a run not of a message"
        ledger = mod.read_ledger(workdir)
        per_order = Counter(line["order"] for line in ledger)
        assert not per_order or max(per_order.values()) == 1, per_order.most_common(3)
        status = {r.id: r.status for r in runs}
        charged = {line["run"] for line in ledger}
        for run_id, state in status.items():
            if state == COMPLETED:
                assert run_id in charged, f"{run_id} completed without its charge"
        parked = [run_id for run_id, state in status.items() if state == NEEDS_ATTENTION]
        assert parked == [], "the charge's probe asks the ledger: no run waits for a person"
        assert set(status.values()) == {COMPLETED}
        probed = [
            e for r in runs for e in await app.client.journal(r.id) if e.kind == "step.probed"
        ]
        assert await DeadMessages(app.runtime.store).dead_messages() == []
        redelivered = workers.logs_count("redelivered message(s) found their runs")
        if self_kills:  # a batch committed and never acknowledged came back: no new runs
            assert redelivered > 0
        print(f"{kind}: {MESSAGES} messages, {kills} kills + {self_kills} between commit and "
              f"ack, {len(parked)} parked, {len(probed)} charges settled by the probe, "
              f"{redelivered} batches with redeliveries, drained "
              f"{drained_after:.1f}s after the last kill")  # fmt: skip
    finally:
        workers.stop_all()
        await broker.teardown()
