"""Message triggers tell the truth (issue 34 item 4), against the machine's real brokers: a
trigger a worker cannot consume is in error in `perdure triggers`, `perdure stuck`, `/readyz`
and the dashboard, as that worker recorded it in the store; the ready line names it; message
runs say `trigger == "message"` with the broker's redelivered flag; a restarted Redis Streams
consumer takes its own pending entries back at once."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from message_brokers import RABBIT_URL, REDIS_URL, body, publish, rabbit_queue, unique, until

import perdure
from extras_needed import require
from fresh_stores import fresh_store_url
from live_workers import worker_task
from module_files import load_file
from perdure.engine.worker import WorkerOptions
from perdure.server import operations
from perdure.server.access import local_operator
from process_stops import stop_processes
from waits import wait_for

HERE = Path(__file__).parent


def perdure_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`perdure ARGS` in a process of its own (it consumes nothing: it reads the store)."""
    return subprocess.run([sys.executable, "-m", "perdure", *args], cwd=HERE, env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip


async def _declare(queue: str, dead_letter: str | None = None) -> None:
    conn, _ = await rabbit_queue(queue, dead_letter=dead_letter)
    await conn.close()


async def _publish(queue: str, data: bytes, message_id: str) -> None:
    import aio_pika

    async with await aio_pika.connect(RABBIT_URL) as conn:  # the queue as it is
        await publish(await conn.channel(), queue, data, message_id)


async def _delete(*queues: str) -> None:
    import aio_pika

    async with await aio_pika.connect(RABBIT_URL) as conn:
        channel = await conn.channel()
        for queue in queues:
            await channel.queue_delete(queue)


def start_truth_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, missing: str, live: str, dlq: str,
    worker_id: str,
) -> tuple[dict[str, str], subprocess.Popen[bytes], Path]:  # fmt: skip
    """A `perdure worker` process of truth_app.py (`orders` on the `missing` queue, `live` on
    `live`, declared here with the dead-letter exchange `dlq`), its store in `tmp_path`; the
    store and queues also set in this process's environment, for an app loaded here. Returns
    the worker's environment (for `perdure_cli`), its process and its log file."""
    asyncio.run(_declare(live, dead_letter=dlq))
    env = {**os.environ, "PERDURE_DB": f"sqlite:///{tmp_path}/truth.db",
           "PERDURE_APP": "truth_app:app", "TRUTH_MISSING": missing, "TRUTH_LIVE": live,
           "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}  # fmt: skip
    for key in ("PERDURE_DB", "TRUTH_MISSING", "TRUTH_LIVE"):  # for the served app
        monkeypatch.setenv(key, env[key])
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "perdure", "worker", "--id", worker_id],
                                cwd=HERE, env=env, stdout=out, stderr=out)  # fmt: skip
    return env, proc, log


def test_a_trigger_a_worker_cannot_consume_is_in_error_in_every_view(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker whose queue is missing records `refused` with the broker's words: its ready
    line names it, `perdure triggers` (another process, whose own probe reaches the broker)
    shows `error` and exits 1, `stuck` lists it, `/readyz` is 503 naming the trigger and
    its state only, the dashboard shows it; a dead-lettered queue with the default
    `declare=True` is consumed as it is. Once the worker stops, its record is history."""
    require("rabbitmq")
    pytest.importorskip("starlette")
    missing, live, dlq = unique("truth-missing"), unique("truth-live"), unique("truth-dlq")
    env, proc, log = start_truth_worker(tmp_path, monkeypatch, missing, live, dlq, "truth-1")
    try:
        ready = wait_for("the ready line", lambda: re.search(r"ready worker=.*\n",
                         log.read_text(errors="replace")), log, timeout=60)  # fmt: skip
        assert ready.group(0).rstrip().endswith(" not_consuming=orders:refused"), ready.group(0)
        asyncio.run(_publish(live, body({"n": 1}), "l1"))
        asyncio.run(_publish(live, b"not json", "l2"))  # dead-lettered: the queue's DLX
        listed = perdure_cli(env, "triggers", "--json")
        assert listed.returncode == 1, listed.stdout + listed.stderr
        rows = {t["name"]: t for t in json.loads(listed.stdout)["triggers"]}
        assert rows["live"]["state"] == "consuming" and rows["live"]["last_error"] is None
        orders = rows["orders"]
        assert orders["state"] == "error"
        assert orders["last_error"] == f"refused: queue {missing!r} does not exist"
        assert isinstance(orders["since"], float)
        text = perdure_cli(env, "triggers")
        assert re.search(r"orders +take +error .*refused: queue", text.stdout), text.stdout
        stuck = perdure_cli(env, "stuck", "--json")
        assert stuck.returncode == 1
        [failing] = json.loads(stuck.stdout)["triggers"]
        assert (failing["trigger"], failing["kind"], failing["worker"], failing["state"]) == (
            "orders", "rabbitmq", "truth-1", "refused",
        )  # fmt: skip
        assert failing["error"] == f"queue {missing!r} does not exist"
        assert failing["since"] == orders["since"]
        assert "TRIGGER NOT CONSUMING" in perdure_cli(env, "stuck").stdout
        _served_views()
        wait_for("the run of the live queue's message",
                 lambda: "completed" in perdure_cli(env, "ls").stdout, log, every=0.5)  # fmt: skip
        dead = perdure_cli(env, "dead", "ls", "--json")
        assert [d["message_id"] for d in json.loads(dead.stdout)["dead_messages"]] == ["l2"]
    finally:
        stop_processes([proc], grace=30)
        asyncio.run(_delete(live, dlq))
    after = perdure_cli(env, "stuck", "--json")
    assert json.loads(after.stdout)["triggers"] == [], after.stdout
    rows = {t["name"]: t for t in json.loads(perdure_cli(env, "triggers", "--json").stdout)
            ["triggers"]}  # fmt: skip
    assert rows["orders"]["state"] == "reachable"  # no live worker's word: the broker's


def _served_views() -> None:
    """`/readyz` and the dashboard of a server process that consumes nothing."""
    from starlette.testclient import TestClient

    from perdure.server import create_app

    app = load_file("truth_app_served", HERE / "truth_app.py").app  # env: the worker's
    try:
        with TestClient(create_app(app)) as client:
            answer = client.get("/readyz")
            assert answer.status_code == 503
            assert answer.json() == {
                "ready": False,
                "error": "message trigger 'orders' is not consuming (refused); see perdure "
                "triggers",
            }
            made = operations.create_token(app, local_operator(), "ops", ["read"])
            _, token = app.runtime.sync(made, "token")
            login = client.get("/ui/login").text
            csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', login)
            assert csrf
            signed = client.post("/ui/login", data={"token": token, "csrf": csrf.group(1)})
            assert signed.url.path == "/ui/runs"
            page = client.get("/ui/triggers").text
            row = re.search(r"<td>orders</td>.*?</tr>", page, re.S)
            assert row and ">error<" in row.group(0) and "does not exist" in row.group(0)
            assert "(since " in row.group(0)
            notice = re.search(r'id="not-consuming".*?</div>', client.get("/ui/runs").text, re.S)
            assert notice and "1 message trigger not consuming" in notice.group(0)
            assert "<td>orders</td>" in notice.group(0) and "does not exist" in notice.group(0)
    finally:
        app.close()


def test_a_message_run_says_message_with_the_brokers_redelivered_flag(tmp_path: Path) -> None:
    """A RabbitMQ message a consumer took and gave back unacknowledged starts its run with
    `trigger == "message"` and an origin naming the trigger, source, queue, message id and
    `redelivered: true`; `show --json` (the API's run object) carries the same origin."""
    require("rabbitmq")
    app = perdure.App(f"sqlite:///{tmp_path}/m.db")

    @app.workflow(name="take")
    def take(item: Any) -> dict[str, Any]:
        run = perdure.current_run()
        return {"trigger": run.trigger, "origin": run.origin}

    queue = unique("redelivered")
    app.on_message(perdure.sources.RabbitMQ(RABBIT_URL, queue), take, name="orders")

    async def scenario() -> None:
        import aio_pika

        await _declare(queue)
        await _publish(queue, body({"n": 1}), "m1")
        async with await aio_pika.connect(RABBIT_URL) as conn:  # takes it, never acks
            channel = await conn.channel()
            q = await channel.declare_queue(queue, passive=True)
            taken = await q.get(no_ack=False, fail=False, timeout=10)
            assert taken is not None and not taken.redelivered
        await _publish(queue, body({"n": 2}), "m2")
        options = WorkerOptions(id=unique("w"), poll=0.05, gc_every=None, grace=2.0)
        try:
            async with worker_task(app, options, stop_within=30) as worker:
                await asyncio.wait_for(worker.ready.wait(), 20)
                await until(lambda: _all_done(app, {"msg:orders:m1", "msg:orders:m2"}))
        finally:
            await _delete(queue)

    asyncio.run(scenario())
    first, second = app.get_run("msg:orders:m1"), app.get_run("msg:orders:m2")
    origin = {"message": "orders", "source": "rabbitmq", "id": "m1", "queue": queue,
              "redelivered": True}  # fmt: skip
    assert json.loads(first.result or "") == {"trigger": "message", "origin": origin}
    assert json.loads(second.result or "")["origin"]["redelivered"] is False
    app.close()
    env = {**os.environ, "PERDURE_DB": f"sqlite:///{tmp_path}/m.db"}
    shown = json.loads(perdure_cli(env, "show", "msg:orders:m1", "--json").stdout)
    assert [e["data"] for e in shown["entries"] if e["kind"] == "run.origin"] == [origin]


def test_a_restarted_redis_consumer_takes_its_own_pending_entries_back_at_once(
    tmp_path: Path,
) -> None:
    """Entries read under a worker's id and never acknowledged (that worker was killed) are
    taken back by the next worker with the same id as it connects, long before
    `claim_idle`, marked redelivered; later entries are not."""
    require("redis")
    import redis.asyncio as aioredis

    app = perdure.App(f"sqlite:///{tmp_path}/r.db")

    @app.workflow(name="take")
    def take(item: Any) -> dict[str, Any]:
        return {"redelivered": perdure.current_run().origin.get("redelivered")}

    stream, worker_id = unique("own-pel"), unique("w")
    app.on_message(perdure.sources.RedisStream(REDIS_URL, stream, claim_idle=600), take,
                   name="orders")  # fmt: skip

    async def scenario() -> None:
        client = aioredis.Redis.from_url(REDIS_URL)
        try:
            await client.xgroup_create(stream, "perdure", id="0", mkstream=True)
            ids = [(await client.xadd(stream, {"data": body({"n": i})})).decode()
                   for i in range(3)]  # fmt: skip
            # the earlier life of this worker: read them, killed before acknowledging
            await client.xreadgroup("perdure", worker_id, {stream: ">"}, count=3)
            options = WorkerOptions(id=worker_id, poll=0.05, gc_every=None, grace=2.0)
            async with worker_task(app, options, stop_within=30) as worker:
                await asyncio.wait_for(worker.ready.wait(), 20)
                later = (await client.xadd(stream, {"data": body({"n": 9})})).decode()
                expected = {f"msg:orders:{i}" for i in [*ids, later]}
                await until(lambda: _all_done(app, expected), timeout=20)
                info = await client.xpending(stream, "perdure")
                assert info["pending"] == 0
            results = {i: await _result(app, f"msg:orders:{i}") for i in [*ids, later]}
            assert results == {**{i: {"redelivered": True} for i in ids},
                               later: {"redelivered": False}}  # fmt: skip
        finally:
            await client.delete(stream)
            await client.aclose()

    asyncio.run(scenario())
    app.close()


async def _result(app: perdure.App, run_id: str) -> Any:
    run = await app.client.get(run_id)
    return json.loads(run.result or "")


async def _all_done(app: perdure.App, expected: set[str]) -> bool:
    rows = await app.client.list_runs(workflow="take", limit=100)
    return {r.id for r in rows if r.status == "completed"} == expected


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_only_a_live_workers_record_of_a_trigger_counts(kind: str, tmp_path: Path) -> None:
    """Each worker's row is its own (a later state replaces it); a stopped worker's and a
    dead one's (its process gone) are history, the stopped one's dropped at the next write."""
    from perdure.engine.peers import this_process
    from perdure.store.workers_sql import WorkerRow
    from perdure.triggers.health_sql import HealthRow, TriggerHealth
    from perdure.triggers.messages import consumer_health

    with fresh_store_url(kind, tmp_path) as url:
        app = perdure.App(url)
        runtime = app.runtime

        async def scenario() -> list[HealthRow]:
            await runtime.open_store()
            now, store, pid = runtime.clock.now(), runtime.store, os.getpid()
            gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                                  capture_output=True, text=True, check=True)  # fmt: skip
            workers = [
                WorkerRow("alive", "h", pid, now, now, 4, 0, proc=this_process()),
                WorkerRow("stopped", "h", pid, now, now, 4, 0, stopped_at=now),
                WorkerRow("dead", socket.gethostname(), int(gone.stdout), now, now, 4, 0),
            ]
            health = TriggerHealth(store)
            for w in workers:
                await store.worker_beat(dataclasses.replace(w, stopped_at=None))  # registers
                await store.worker_beat(w)
                await health.record_health(HealthRow("orders", w.id, "rabbitmq", "refused",
                                                     now - 5, "no", now))  # fmt: skip
            await health.record_health(HealthRow("orders", "alive", "rabbitmq", "consuming",
                                                 now, None, now))  # fmt: skip
            kept = {r.worker for r in await health.trigger_health("orders")}
            assert kept == {"alive", "dead"}  # the stopped worker's row went at the next write
            return await consumer_health(runtime, "orders")

        try:
            [row] = app.runtime.sync(scenario(), "health")
        finally:
            app.close()
    assert (row.worker, row.state, row.error, row.failing) == ("alive", "consuming", None, False)


def test_a_queue_the_broker_refuses_is_recorded_in_the_brokers_words(tmp_path: Path) -> None:
    """A queue another connection holds exclusively is refused (RESOURCE_LOCKED): the
    worker records `refused` with the broker's sentence, and the ready event waits for
    that answer (the trigger is no longer `starting`)."""
    require("rabbitmq")
    import aio_pika

    from perdure.triggers.messages import consumer_health

    app = perdure.App(f"sqlite:///{tmp_path}/x.db")

    @app.workflow(name="take")
    def take(item: Any) -> None:
        return None

    queue = unique("exclusive")
    trigger = app.on_message(perdure.sources.RabbitMQ(RABBIT_URL, queue), take, name="locked")

    async def scenario() -> None:
        async with await aio_pika.connect(RABBIT_URL) as holder:
            await (await holder.channel()).declare_queue(queue, exclusive=True)
            options = WorkerOptions(id=unique("w"), poll=0.05, gc_every=None, grace=2.0)
            async with worker_task(app, options, stop_within=30) as worker:
                await asyncio.wait_for(worker.ready.wait(), 20)
                assert trigger.readiness() == "refused"
                [row] = await consumer_health(app.runtime, "locked")
                assert (row.worker, row.state) == (worker.id, "refused")
                assert row.error is not None and row.error.startswith(
                    f"queue {queue!r} refused: RESOURCE_LOCKED - cannot obtain exclusive access"
                ), row.error

    asyncio.run(scenario())
    app.close()
