"""The app the broker chaos tests kill: a message trigger feeding a `once` charge.

    python tests/chaos/broker_app.py WORKDIR KIND NAME

Each message of the broker queue/stream/subject/topic NAME (KIND: rabbitmq, redis, nats,
mqtt) starts one `pay` run; its `charge` step (effect `once`, as a payment API without an
idempotency key) appends one line per execution to `WORKDIR/ledger.jsonl` (one `write()`
on an O_APPEND file survives kill -9 whole). Its probe asks that ledger, as one would ask
the payment provider, whether the run's charge went through. The store is the SQLite file
`WORKDIR/perdure.db` unless `BROKER_STORE_URL` names another.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

import perdure
from perdure.triggers.messages import MessageSource

LEDGER = "ledger.jsonl"
STORE_URL_ENV = "BROKER_STORE_URL"
TRIGGER = "chaos"
RABBIT_URL = os.environ.get("PERDURE_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672/")
REDIS_URL = os.environ.get("PERDURE_TEST_REDIS", "redis://127.0.0.1:6379/0")
NATS_URL = os.environ.get("PERDURE_TEST_NATS", "nats://127.0.0.1:4222")
MQTT_HOST = os.environ.get("PERDURE_TEST_MQTT", "127.0.0.1")


def store_url(workdir: Path) -> str:
    return os.environ.get(STORE_URL_ENV) or f"sqlite:///{Path(workdir) / 'perdure.db'}"


def source(kind: str, name: str) -> MessageSource:
    """The source of `kind` on the machine's broker, consuming `name`."""
    sources = perdure.sources
    if kind == "rabbitmq":
        return sources.RabbitMQ(RABBIT_URL, name, declare=False)
    if kind == "redis":
        return sources.RedisStream(REDIS_URL, name, claim_idle=1.0)
    if kind == "nats":
        return sources.JetStream(NATS_URL, name, ack_wait=2.0)
    if kind == "mqtt":
        return sources.MQTT(MQTT_HOST, f"{name}/#", group=name, client_id=os.environ.get("MQTT_ID"))
    raise ValueError(kind)


class KilledBeforeAck:
    """A source that, with chance `KILL_BEFORE_ACK` per batch and until the file
    `WORKDIR/calm` exists, kill -9s its own worker after the batch's runs are committed and
    before they are acknowledged: the worst moment, which random kills rarely hit."""

    def __init__(self, inner: Any, chance: float, calm: Path) -> None:
        self.inner, self.chance, self.calm = inner, chance, calm
        self.kind = inner.kind

    @property
    def name(self) -> str | None:
        return self.inner.name  # type: ignore[no-any-return]

    @name.setter
    def name(self, value: str | None) -> None:
        self.inner.name = value

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)

    async def ack(self, messages: list[Any]) -> None:
        if messages and random.random() < self.chance and not self.calm.exists():
            os.kill(os.getpid(), signal.SIGKILL)
        await self.inner.ack(messages)


def build_app(workdir: Path, kind: str, name: str) -> perdure.App:
    workdir = Path(workdir)
    app = perdure.App(store_url(workdir))

    def charged(order: int) -> perdure.ProbeAnswer:
        """The payment system's answer: is there a charge of this run?"""
        run = perdure.current_step().run_id
        if any(line["run"] == run for line in read_ledger(workdir)):
            return perdure.ProbeAnswer.done(order, "the ledger has the charge")
        return perdure.ProbeAnswer.not_done("the ledger has no charge of this run")

    @app.step(name="charge", effect="once", probe=charged)
    def charge(order: int) -> int:
        time.sleep(random.uniform(0.0, 0.02))  # a kill may land before or after the effect
        line = {"order": order, "run": perdure.current_step().run_id, "pid": os.getpid()}
        fd = os.open(workdir / LEDGER, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(line) + "\n").encode())
        finally:
            os.close(fd)
        time.sleep(random.uniform(0.0, 0.02))
        return order

    @app.workflow(name="pay")
    def pay(message: dict[str, Any]) -> int:
        return charge(int(message["order"]))

    chance = float(os.environ.get("KILL_BEFORE_ACK", "0"))
    messages: Any = source(kind, name)
    if chance:
        messages = KilledBeforeAck(messages, chance, workdir / "calm")
    app.on_message(messages, pay, name=TRIGGER, prefetch=32)
    return app


def read_ledger(workdir: Path) -> list[dict[str, Any]]:
    path = Path(workdir) / LEDGER
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def main() -> None:
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s pid=%(process)d %(name)s %(levelname)s %(message)s",
    )
    workdir, kind, name = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    app = build_app(workdir, kind, name)
    app.run_worker(concurrency=16, lease=1.0, poll=0.05, grace=2.0)


if __name__ == "__main__":
    main()
