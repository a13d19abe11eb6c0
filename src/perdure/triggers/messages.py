"""Message triggers: each message of a broker queue or stream starts exactly one run.

    @app.workflow()
    def on_order(order: dict[str, Any]) -> None: ...

    app.on_message(perdure.sources.RabbitMQ("amqp://localhost", "orders"), on_order)

The run id is `msg:{name}:{identity}`, the identity being the message's own at its source
(RabbitMQ message id or a content hash, JetStream stream sequence, Redis Streams entry id,
MQTT `message-id` user property or a content hash, Kafka topic/partition/offset). A message
is acknowledged only after its run is committed, so delivery at least once plus an
idempotent start is exactly one run: a redelivery (after a crash, a timeout, a rebalance)
finds its run and starts nothing.

Every worker consumes (a message trigger is a service); the broker spreads messages over
them. At most `prefetch` messages are held unacknowledged per worker, and a worker stops
taking messages while the workflow is paused or the store holds `max_pending` pending runs
(the broker keeps the rest). A message that can start no run (not JSON, over `max_payload`
bytes, refused by the workflow's input check, or without a body its source can read: a Redis
Streams entry without the body field) is kept in the `dead_messages` table with the
reason, handed to the source's dead-letter mechanism where it has one, and acknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from ..engine.client import Client
from ..engine.peers import SILENT_AFTER, worker_state
from ..engine.triggers import TriggerStatus
from ..errors import ConfigError, PayloadError, PerdureError, StoreError
from ..store.base import PENDING
from .dead_sql import DeadMessage, DeadMessages
from .health_sql import FAILING, HealthRow, TriggerHealth
from .ids import id_problem

if TYPE_CHECKING:
    from ..engine.handles import Workflow
    from ..engine.runtime import Runtime
    from ..engine.worker import Worker

__all__ = [
    "Message",
    "MessageSource",
    "MessageTrigger",
    "Pending",
    "SourceRefused",
    "add_message_trigger",
    "consumer_health",
]

log = logging.getLogger("perdure.messages")
T = TypeVar("T")

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
HOLD_CHECK_EVERY = 1.0  # seconds between looks at pauses and pending runs
RECEIVE_WAIT = 1.0  # longest wait for a message, so a stop or a pause is seen soon
MAX_BACKOFF = 30.0
PROBE_CACHE = 5.0  # seconds a probe's answer is reused (readyz may be polled often)
DEAD_BODY_CHARS = 65_536  # of a dead message's body kept in the table


@dataclass(slots=True)
class Message:
    """One delivery from a source: its stable identity, the raw body, and the source's own
    handle for acknowledging it."""

    identity: str
    body: bytes
    handle: Any = None
    extra: dict[str, Any] = field(default_factory=dict)  # origin details (topic, subject)
    unreadable: str | None = None  # why the source could not read a body: the message is dead


class SourceRefused(ConfigError):
    """Raised when a broker refuses the trigger's URL or credentials, or lacks its queue:
    retrying will not help until someone fixes the configuration."""


class MessageSource(Protocol):
    """A broker adapter: connect, hand out messages, acknowledge them. Each source lives in
    its own module of `perdure.triggers.sources` and imports its client only on connect."""

    kind: str
    name: str | None  # the trigger's name (the run-id scope); set by `on_message` if None

    def where(self) -> str:
        """The broker and queue, fit to print (no password)."""
        ...

    async def connect(self, consumer: str, prefetch: int) -> None:
        """Open a connection; `consumer` names this worker (consumer group member).
        `prefetch` 0: a probe, which consumes nothing (only `lag` follows)."""
        ...

    async def receive(self, limit: int, wait: float) -> list[Message]:
        """Up to `limit` messages, waiting at most `wait` seconds for the first."""
        ...

    async def ack(self, messages: list[Message]) -> None:
        """Acknowledge messages whose runs exist (or that were dead-lettered)."""
        ...

    async def dead(self, message: Message, reason: str) -> None:
        """Hand a poison message to the source's dead-letter mechanism (or acknowledge it)."""
        ...

    async def lag(self) -> int | None:
        """Messages waiting at the broker for this trigger, or None if it cannot tell."""
        ...

    async def close(self) -> None: ...


class Pending(Generic[T]):
    """One awaited item kept across waits that time out, so an item that arrives just as a
    wait ends is returned by the next wait, never dropped (`asyncio.wait_for` can drop it
    on Python 3.11: the message would sit unacknowledged in a live connection)."""

    def __init__(self) -> None:
        self._task: asyncio.Future[T] | None = None

    async def get(self, make: Callable[[], Awaitable[T]], wait: float) -> T | None:
        """The next item from `make()` (started once, kept until it ends), or None if it has
        not come within `wait` seconds."""
        if self._task is None:
            self._task = asyncio.ensure_future(make())
        done, _ = await asyncio.wait({self._task}, timeout=wait)
        if not done:
            return None
        task, self._task = self._task, None
        return task.result()

    def cancel(self) -> None:
        """Drop the wait (on close: what it held was never acknowledged, so it comes back)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()


def content_identity(*parts: bytes) -> str:
    """A message identity from its content: the first 32 hex digits of a sha256."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return "sha256-" + digest.hexdigest()[:32]


def usable_identity(value: str | None, body: bytes) -> str:
    """`value` if it can be part of a run id, else a content hash (a missing or odd id)."""
    if value and id_problem(value) is None:
        return value
    return content_identity(value.encode() if value else b"", body)


class MessageTrigger:
    """A source consumed by every worker; each message starts one run of `workflow`.

    Built by `App.on_message`; kept with the runtime's triggers. `status()` says what this
    process knows of it, `probe()` asks the broker too (for `perdure triggers` and `/readyz`).
    """

    def __init__(
        self,
        runtime: Runtime,
        source: MessageSource,
        workflow: str,
        *,
        name: str,
        prefetch: int,
        max_pending: int,
        max_payload: int,
    ) -> None:
        self.runtime = runtime
        self.source = source
        self.workflow = workflow
        self.name = name
        self.prefetch = prefetch
        self.max_pending = max_pending
        self.max_payload = max_payload
        self.state = "idle"  # not consumed by this process
        self.since: float | None = None  # when `state` began (store clock); None while idle
        self.last_error: str | None = None
        self._recorded: dict[str, tuple[str, str | None]] = {}  # worker -> (state, error) kept
        self.last_lag: int | None = None
        self.started = 0  # runs this process created
        self.duplicates = 0  # deliveries whose run existed already
        self.dead = 0
        self._hold: tuple[float, str | None] = (-1e18, None)
        self._probed: tuple[float, dict[str, Any]] = (-1e18, {})
        self._pending = 0  # pending runs in the store at the last look
        self._started_at_check = 0  # `started` then

    def __repr__(self) -> str:
        return f"MessageTrigger({self.name!r}, {self.source.where()}, workflow={self.workflow!r})"

    def run_id(self, identity: str) -> str:
        """The run of one message: the same message always names the same run."""
        return f"msg:{self.name}:{identity}"

    @property
    def kind(self) -> str:
        """The source's kind (`rabbitmq`, `redis`, `nats`, `mqtt`, `kafka`)."""
        return self.source.kind

    async def statuses(self, runtime: Runtime) -> list[TriggerStatus]:
        """One row: `error` (with the broker's words, since when) while a worker cannot
        consume it or the broker refuses this process too; else the state `probe` says."""
        got = await self.probe()
        state, error = got["state"], got["last_error"]
        if state in FAILING:
            state, error = "error", f"{got['state']}: {error}"
        return [TriggerStatus(got["kind"], got["name"], got["workflow"], state, None, error,
                              self.source.where(), got["pending"], got["since"])]  # fmt: skip

    def status(self) -> dict[str, Any]:
        """kind, name, workflow, state (idle | connecting | consuming | paused (...) |
        backpressure | down | refused), since (when that state began), lag (seconds: None,
        a broker does not say), pending (messages not yet taken, None if unknown),
        last_error (the broker's words) and workers (each worker's state, as it recorded
        it: filled by `probe`), as this process knows them."""
        return {
            "kind": self.source.kind,
            "name": self.name,
            "workflow": self.workflow,
            "state": self.state,
            "since": self.since,
            "lag": None,
            "pending": self.last_lag,
            "last_error": self.last_error,
            "workers": [],
        }

    def readiness(self) -> str | None:
        """For the worker's ready line: `starting` until the first connection consumes or
        fails, then None while consuming, else the state that keeps it from consuming."""
        if self.state in ("idle", "connecting"):
            return "starting"
        return None if self.state == "consuming" else self.state

    async def probe(self, timeout: float = 5.0) -> dict[str, Any]:
        """`status()` when this process consumes it; else what the live workers recorded
        (a worker that cannot consume wins: the trigger is `refused` or `down` with its
        broker's words and since when), the broker asked now for the messages waiting,
        and the broker's answer alone when no worker consumes (for `/readyz`, `perdure
        triggers`, the dashboard)."""
        if self.state != "idle":
            return self.status()
        at, answer = self._probed
        if time.monotonic() - at < PROBE_CACHE:
            return answer
        answer = await self._probe(timeout)
        rows = await consumer_health(self.runtime, self.name)
        if rows:
            failing = [r for r in rows if r.failing]
            shown = min(failing, key=lambda r: r.since) if failing else None
            if shown is None:  # consuming, paused, ...: the workers' word, the broker's count
                states = {r.state for r in rows}
                one = "consuming" if "consuming" in states else sorted(states)[0]
                shown = min((r for r in rows if r.state == one), key=lambda r: r.since)
            answer |= {"state": shown.state, "since": shown.since, "last_error": shown.error}
        answer["workers"] = [r.as_dict() for r in rows]
        self._probed = (time.monotonic(), answer)
        return answer

    async def _probe(self, timeout: float) -> dict[str, Any]:
        probe = _fresh_copy(self.source)
        try:
            await asyncio.wait_for(probe.connect("probe", 0), timeout)
            self.last_lag = await asyncio.wait_for(probe.lag(), timeout)
            answer = self.status() | {"state": "reachable"}
        except ConfigError as exc:
            answer = self.status() | {"state": "refused", "last_error": _one_line(exc),
                                      "since": self.runtime.clock.now()}  # fmt: skip
        except Exception as exc:
            answer = self.status() | {"state": "down", "last_error": _one_line(exc),
                                      "since": self.runtime.clock.now()}  # fmt: skip
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(probe.close(), timeout)
        return answer

    # -- the service -------------------------------------------------------------------

    async def run(self, worker: Worker) -> None:
        """Consume until the worker stops; reconnect with backoff when the broker is lost;
        disconnect while held (what this worker held unacknowledged goes back)."""
        backoff = 0.5
        try:
            while not worker.stopping.is_set():
                hold = await self._held(worker)
                if hold is not None:
                    if self.state != hold:
                        log.info("message trigger %r: %s; not taking messages", self.name, hold)
                    await self._become(worker, hold, None)
                    await _wait(worker, HOLD_CHECK_EVERY)
                    continue
                if self.state not in FAILING:  # a retry stays refused or down until it works
                    await self._become(worker, "connecting", None)
                backoff = await self._attempt(worker, backoff)
                if backoff:
                    await _wait(worker, backoff)
                    backoff = min(backoff * 2, MAX_BACKOFF)
                else:
                    backoff = 0.5
        finally:
            self.state, self.since = "idle", None

    async def _attempt(self, worker: Worker, backoff: float) -> float:
        """Connect and consume until held or stopping (0.0), or fail: the seconds to wait
        before the next attempt, the failure recorded with the broker's words."""
        connected = False
        try:
            _check_consumer(self.source, worker)
            await self.source.connect(worker.id, self.prefetch)
            connected = True  # a connection lost later is retried soon again
            if self.last_error is not None:
                log.info("message trigger %r: connected to %s", self.name,
                         self.source.where())  # fmt: skip
            await self._become(worker, "consuming", None)
            await self._consume(worker)
            return 0.0  # held, or stopping
        except asyncio.CancelledError:
            raise
        except ConfigError as exc:  # SourceRefused, or the source's extra is missing
            await self._become(worker, "refused", _one_line(exc))
            log.error("message trigger %r (%s): %s; retrying in %.0fs", self.name,
                      self.source.where(), self.last_error, MAX_BACKOFF)  # fmt: skip
            return MAX_BACKOFF
        except Exception as exc:
            backoff = 0.5 if connected else backoff
            await self._become(worker, "down", _one_line(exc))
            log.warning("message trigger %r: cannot consume from %s (%s); retrying in %.1fs",
                        self.name, self.source.where(), self.last_error, backoff)  # fmt: skip
            return backoff
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.source.close(), 5.0)

    async def _become(self, worker: Worker, state: str, error: str | None) -> None:
        """Take `state` (since now if it changed), recorded in the store first, so that what
        this process shows (the ready line) is never ahead of what every view reads; a
        failed write is tried again at the next change or look."""
        kept = state == self.state and self.since is not None
        since = self.since if kept and self.since is not None else self.runtime.clock.now()
        await self._record(worker, state, error, since)
        self.state, self.last_error, self.since = state, error, since

    async def _record(self, worker: Worker, state: str, error: str | None, since: float) -> None:
        if self._recorded.get(worker.id) == (state, error):
            return
        row = HealthRow(self.name, worker.id, self.source.kind, state, since, error,
                        self.runtime.clock.now())  # fmt: skip
        try:
            await TriggerHealth(self.runtime.store).record_health(row)
        except Exception as exc:  # recording must never stop the consumer: next change
            log.warning("message trigger %r: state not recorded (%s)", self.name, exc)
            return
        self._recorded[worker.id] = (state, error)

    async def _consume(self, worker: Worker) -> None:
        looked = -1e18
        while not worker.stopping.is_set():
            if await self._held(worker) is not None:
                return  # `run` disconnects and waits for the hold to end
            if self.since is not None:  # if the store refused it before
                await self._record(worker, self.state, self.last_error, self.since)
            batch = await self.source.receive(self.prefetch, RECEIVE_WAIT)
            if batch:
                await self.handle(batch)
            now = worker.clock.now()
            if now - looked > 5.0:  # the lag costs the broker a query: not every batch
                looked = now
                with contextlib.suppress(Exception):
                    self.last_lag = await self.source.lag()

    async def _held(self, worker: Worker) -> str | None:
        """Why this worker should take no message now: its workflow or itself paused, or the
        store full of pending runs; None to go on. Looked up at most once a second; in
        between, the runs this worker created count as pending."""
        now = worker.clock.now()
        at, why = self._hold
        if now - at < HOLD_CHECK_EVERY:
            if why is None and self._pending + self.started - self._started_at_check >= (
                self.max_pending
            ):
                return "backpressure"
            return why
        why = None
        pauses = await self.runtime.store.list_pauses()
        host = worker.id.split(":", 1)[0]
        for scope, name, _ in pauses:
            if (scope == "workflow" and name == self.workflow) or (
                scope == "worker" and name in (worker.id, host)
            ):
                why = f"paused ({scope} {name})"
        if why is None:
            self._pending = (await self.runtime.store.count_runs()).get(PENDING, 0)
            self._started_at_check = self.started
            if self._pending >= self.max_pending:
                why = "backpressure"
        self._hold = (now, why)
        return why

    async def handle(self, batch: list[Message]) -> None:
        """Start (or find) the run of every message, then acknowledge them all. A store
        failure acknowledges none: the broker delivers them again."""
        known = self.duplicates
        dead = await asyncio.gather(*(self._one(message) for message in batch))
        await self.source.ack([m for m, gone in zip(batch, dead, strict=True) if not gone])
        if self.duplicates > known:
            log.info("message trigger %r: %d redelivered message(s) found their runs",
                     self.name, self.duplicates - known)  # fmt: skip

    async def _one(self, message: Message) -> bool:
        """Start the message's run; True if it was dead instead (and settled as such)."""
        problem, payload = self._decode(message)
        if problem is None:
            origin = {"message": self.name, "source": self.source.kind,
                      "id": message.identity, **message.extra}  # fmt: skip
            try:
                _, created = await Client(self.runtime).start_run(
                    self.workflow, (payload,), {}, run_id=self.run_id(message.identity),
                    origin=origin,
                )  # fmt: skip
            except PayloadError as exc:
                problem = f"refused by workflow {self.workflow!r}'s input check: {_one_line(exc)}"
            except (ConfigError, StoreError):
                raise  # the trigger's setup or the store: nothing wrong with the message
            except PerdureError as exc:  # e.g. its run id names a run of another workflow
                problem = f"cannot start its run: {_one_line(exc)}"
            else:
                if created:
                    self.started += 1
                else:
                    self.duplicates += 1
                return False
        await self._dead(message, problem)
        return True

    def _decode(self, message: Message) -> tuple[str | None, Any]:
        if message.unreadable is not None:
            return message.unreadable, None
        size = len(message.body)
        if size > self.max_payload:
            return f"payload of {size} bytes is over the limit of {self.max_payload}", None
        try:
            return None, json.loads(message.body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            return f"payload is not JSON ({exc})", None

    async def _dead(self, message: Message, reason: str) -> None:
        body = message.body[: self.max_payload].decode("utf-8", "backslashreplace")
        row = DeadMessage(self.name, message.identity, self.source.kind, reason,
                          body[:DEAD_BODY_CHARS], len(message.body),
                          self.runtime.clock.now())  # fmt: skip
        if await DeadMessages(self.runtime.store).add_dead_message(row):
            self.dead += 1
            log.warning("message trigger %r: message %s is dead: %s", self.name,
                        message.identity, reason)  # fmt: skip
        await self.source.dead(message, reason)


def add_message_trigger(
    runtime: Runtime,
    source: MessageSource,
    workflow: Workflow[..., Any] | str,
    *,
    name: str | None = None,
    prefetch: int = 64,
    max_pending: int = 10_000,
    max_payload: int = 1_048_576,
) -> MessageTrigger:
    """Start one run of `workflow` per message of `source`, consumed by every worker.

    Args:
        app: the app whose workers consume the source.
        source: a broker source from `perdure.sources` (`RabbitMQ`, `RedisStream`,
            `JetStream`, `MQTT`, `Kafka`).
        workflow: the workflow (or its name); it gets the message's JSON body as its one
            argument.
        name: scopes the run ids (`msg:{name}:{identity}`) and names the trigger; default
            the source's name, else the workflow's. Two triggers of one app need two names.
        prefetch: messages a worker holds unacknowledged at once (the broker keeps the rest).
        max_pending: a worker takes no message while the store holds this many pending runs.
        max_payload: a body larger than this many bytes is dead, not started.

    Returns:
        The `MessageTrigger`, kept with the runtime's triggers.

    Raises:
        ConfigError: a bad name or option, a name taken, or a workflow that cannot take the
            payload as its one argument.
    """
    wf_name = workflow if isinstance(workflow, str) else workflow.name
    label = name or getattr(source, "name", None) or wf_name
    if not _NAME.fullmatch(label):
        raise ConfigError(f"message trigger name {label!r}: use 1-100 letters, digits, '_', '.' "
                          "or '-' (it scopes run ids)")  # fmt: skip
    for option, value in (("prefetch", prefetch), ("max_pending", max_pending),
                          ("max_payload", max_payload)):  # fmt: skip
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"message trigger {label!r}: {option}={value!r} must be at least 1")
    if runtime.triggers.find(MessageTrigger, label) is not None:
        raise ConfigError(f"two message triggers are named {label!r}; pass name=... to one")
    definition = runtime.workflows.get(wf_name)
    if definition is not None:
        try:
            definition.signature.bind(None)
        except TypeError:
            raise ConfigError(
                f"message trigger {label!r}: workflow {wf_name!r} must take the message's "
                f"payload as its one argument, but its signature is {definition.signature}"
            ) from None
    source.name = label
    trigger = MessageTrigger(runtime, source, wf_name, name=label, prefetch=prefetch,
                             max_pending=max_pending, max_payload=max_payload)  # fmt: skip
    return runtime.triggers.add(trigger)


def _check_consumer(source: MessageSource, worker: Worker) -> None:
    """A source whose broker keeps a session per consumer (MQTT) needs a consumer name that
    outlives the process: a session left behind by a restart would take its share of
    the messages with nobody to deliver them to."""
    if getattr(source, "stable_consumer", False) and worker.options.id is None:
        raise ConfigError(
            f"{source.kind} keeps a session per worker, named by the worker's id: start "
            "workers with a stable id (perdure worker --id NAME, WorkerOptions(id=...)) or "
            "give the source client_id=..."
        )


async def consumer_health(runtime: Runtime, trigger: str | None = None) -> list[HealthRow]:
    """What the live workers (alive in the registry: not stopped, dead or silent)
    recorded of their consumers of `trigger` (or of every message trigger)."""
    rows = await TriggerHealth(runtime.store).trigger_health(trigger)
    if not rows:
        return []
    now = runtime.clock.now()
    workers = await runtime.store.list_workers(now - 2 * SILENT_AFTER)
    live = {w.id for w in workers if worker_state(w, now).live}
    return [r for r in rows if r.worker in live]


async def _wait(worker: Worker, seconds: float) -> None:
    """Wait `seconds`, or less if the worker stops."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(worker.stopping.wait(), seconds)


def _fresh_copy(source: MessageSource) -> MessageSource:
    """A second source of the same configuration, for a probe beside the consuming one."""
    copy = getattr(source, "copy", None)
    return copy() if callable(copy) else source


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."
