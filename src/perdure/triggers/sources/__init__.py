"""Broker sources for `App.on_message`, one module each; a source imports its client (the
extra of its name) only when a worker connects, so a bare install can import them all."""

from __future__ import annotations

from .jetstream import JetStream
from .kafka import Kafka
from .mqtt import MQTT
from .rabbitmq import RabbitMQ
from .redis_streams import RedisStream

__all__ = ["MQTT", "JetStream", "Kafka", "RabbitMQ", "RedisStream"]
