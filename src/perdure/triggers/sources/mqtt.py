"""MQTT (aiomqtt, extra `mqtt`): a QoS 1 subscription in a persistent MQTT 5 session.

Workers share the subscription (`$share/{group}/{topic}`), so the broker spreads the
messages. Each worker's session is named by its client id (`perdure-{name}-{worker id}`),
so workers need a stable `--id` (a trigger refuses to consume in a worker without one):
a restarted worker resumes its session and gets back what it had not acknowledged, and
the broker (Mosquitto does) keeps handing an offline session its share of the messages,
so a session left behind by a random worker id would hold them for nobody. When a worker
id is retired for good, end its session (connect once with its client id and a clean
start). The PUBACK is sent only once the run
exists: aiomqtt has no public switch for that yet, so the source sets paho's manual
acknowledgement on the client it wraps. The identity of a message is its `message-id`
user property, else a hash of topic and payload. MQTT has no dead-letter queue: a poison
message is published to `dead_topic` if given, and acknowledged. The lag is unknown.
"""

from __future__ import annotations

from typing import Any

from ...extras import require_extra
from ..messages import Message, Pending, SourceRefused, content_identity, usable_identity

REFUSED = (4, 5, 134, 135)  # bad user name or password, not authorised (MQTT 3.1.1 and 5)
SESSION_EXPIRY = 7 * 24 * 3600  # seconds the broker keeps a worker's session while it is away


class MQTT:
    """An MQTT topic filter as a message source.

    Args:
        host: the broker's host name.
        topic: the topic filter (`orders/#`).
        port: the broker's port.
        group: the shared-subscription group (None: every worker gets every message,
            which the run ids make harmless but wasteful).
        client_id: this worker's session name (default `perdure-{name}-{worker id}`).
        username, password: credentials, if the broker wants them.
        id_property: the MQTT 5 user property naming a message's id.
        dead_topic: a topic poison messages are published to.
        name: the trigger's name (default: set by `on_message`).
    """

    kind = "mqtt"

    def __init__(
        self,
        host: str,
        topic: str,
        *,
        port: int = 1883,
        group: str | None = "perdure",
        client_id: str | None = None,
        username: str | None = None,
        password: str | None = None,
        id_property: str = "message-id",
        dead_topic: str | None = None,
        name: str | None = None,
    ) -> None:
        self.host = host
        self.topic = topic
        self.port = port
        self.group = group
        self.client_id = client_id
        self.username = username
        self.password = password
        self.id_property = id_property
        self.dead_topic = dead_topic
        self.name = name
        self._client: Any = None
        self._next: Pending[Any] = Pending()

    @property
    def stable_consumer(self) -> bool:
        """Workers must have stable ids, unless this source names its session itself."""
        return self.client_id is None

    def copy(self) -> MQTT:
        return MQTT(self.host, self.topic, port=self.port, group=self.group,
                    client_id=None, username=self.username, password=self.password,
                    id_property=self.id_property, dead_topic=self.dead_topic,
                    name=self.name)  # fmt: skip

    def where(self) -> str:
        return f"mqtt://{self.host}:{self.port} topic {self.topic!r}"

    async def connect(self, consumer: str, prefetch: int) -> None:
        require_extra("mqtt", "an MQTT message source")
        import aiomqtt
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        probe = not prefetch
        if not probe:
            properties.SessionExpiryInterval = SESSION_EXPIRY
            properties.ReceiveMaximum = prefetch  # unacknowledged messages out to this worker
        identifier = self.client_id or f"perdure-{self.name}-{consumer}"
        client = aiomqtt.Client(
            self.host, self.port, identifier=None if probe else identifier,
            username=self.username, password=self.password,
            protocol=aiomqtt.ProtocolVersion.V5, clean_start=probe,
            properties=properties, timeout=10,
        )  # fmt: skip
        client._client.manual_ack_set(True)  # PUBACK once the run exists (see the docstring)
        try:
            await client.__aenter__()
        except aiomqtt.MqttCodeError as exc:
            code: Any = exc.rc
            if int(getattr(code, "value", code) or 0) in REFUSED:
                raise SourceRefused(f"credentials refused ({exc})") from None
            raise
        self._client = client
        if not probe:
            target = f"$share/{self.group}/{self.topic}" if self.group else self.topic
            await client.subscribe(target, qos=1)

    async def receive(self, limit: int, wait: float) -> list[Message]:
        messages = self._client.messages
        first = await self._next.get(lambda: anext(messages), wait)
        if first is None:
            return []
        found = [first]
        while len(found) < limit and len(messages):
            found.append(await anext(messages))
        return [self._message(m) for m in found]

    def _message(self, m: Any) -> Message:
        payload = bytes(m.payload) if not isinstance(m.payload, str) else m.payload.encode()
        topic = str(m.topic)
        given = None
        for key, value in getattr(m.properties, "UserProperty", None) or []:
            if key == self.id_property:
                given = value
        if given is None:
            identity = content_identity(topic.encode(), payload)
        else:
            identity = usable_identity(given, topic.encode() + b"\0" + payload)
        return Message(identity, payload, m, {"topic": topic})

    async def ack(self, messages: list[Message]) -> None:
        for message in messages:
            if message.handle.qos:
                self._client._client.ack(message.handle.mid, message.handle.qos)

    async def dead(self, message: Message, reason: str) -> None:
        if self.dead_topic:
            from paho.mqtt.packettypes import PacketTypes
            from paho.mqtt.properties import Properties

            properties = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
            properties.UserProperty = [("reason", reason[:500]), ("message-id", message.identity)]
            await self._client.publish(self.dead_topic, message.body, qos=1,
                                       properties=properties)  # fmt: skip
        await self.ack([message])

    async def lag(self) -> int | None:
        return None  # MQTT brokers do not say how many messages wait

    async def close(self) -> None:
        self._next.cancel()
        client, self._client = self._client, None
        if client is not None:
            await client.__aexit__(None, None, None)
