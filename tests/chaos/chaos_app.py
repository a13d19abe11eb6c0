"""The app the chaos tests kill: workflows mixing every effect, with side effects seen from outside.

Imported by the tests (to start, inspect and resolve runs) and run as a worker process:

    python tests/chaos/chaos_app.py WORKDIR [--concurrency N] [--lease S] [--poll S]

Everything a step does outside the engine is recorded where a killed worker cannot
take it back: one line per execution in `WORKDIR/ledger.jsonl` (a single `write()`
on an O_APPEND file), keyed effects in a separate "external service" database that
deduplicates by key, idempotent effects as files, and transactional effects as rows
of a user table in the store's own database. The zombie steps behave by role
(`CHAOS_ROLE=A` blocks until told to go on), so one process can be frozen mid-step.

The store is the SQLite file `WORKDIR/perdure.db` unless `CHAOS_STORE_URL` names
another (a `postgresql://...?schema=NAME` URL puts the store and the user table in
that schema); the ledger and the service database stay in WORKDIR either way.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import sqlite3
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import perdure
import perdure.errors

LEDGER = "ledger.jsonl"
SERVICE_DB = "service.db"
STORE_DB = "perdure.db"
TX_TABLE = "chaos_tx"
STORE_URL_ENV = "CHAOS_STORE_URL"

STEP_EFFECTS = {
    "read_step": "read",
    "flaky_step": "read",
    "idem_step": "idempotent",
    "keyed_step": "keyed",
    "tx_step": "transactional",
    "once_step": "once",
    "quick_once": "once",
    "slow_keyed": "keyed",
    "pay": "once",
    "zombie_prep": "transactional",
    "zombie_block": "idempotent",
    "zombie_hold": "read",
    "zombie_finish": "transactional",
}


def store_url(workdir: Path) -> str:
    """`CHAOS_STORE_URL` if set, else the SQLite file in `workdir`."""
    return os.environ.get(STORE_URL_ENV) or f"sqlite:///{Path(workdir) / STORE_DB}"


def is_postgres(url: str) -> bool:
    return url.startswith(("postgresql:", "postgres:"))


def _pg_connect(url: str) -> Any:
    """A psycopg connection whose search path is the store's schema (`?schema=`)."""
    import psycopg

    parts = urlsplit(url)
    query = parse_qsl(parts.query)
    schema = next((v for k, v in query if k == "schema"), "perdure")
    rest = urlencode([(k, v) for k, v in query if k not in ("schema", "pooler")])
    conninfo = urlunsplit(("postgresql", parts.netloc, parts.path, rest, ""))
    conn = psycopg.connect(conninfo, autocommit=True, connect_timeout=10)
    conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
    conn.execute(f'SET search_path TO "{schema}"')
    return conn


def prepare(workdir: Path) -> None:
    """Create the service database and the user table transactional steps write to."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "idem").mkdir(exist_ok=True)
    with sqlite3.connect(workdir / SERVICE_DB) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS effects (id INTEGER PRIMARY KEY AUTOINCREMENT, "
            "key TEXT NOT NULL, run_id TEXT NOT NULL, pos INTEGER NOT NULL, "
            "token TEXT NOT NULL, pid INTEGER NOT NULL)"
        )
        conn.execute(  # a payment system without idempotency keys: every call pays
            "CREATE TABLE IF NOT EXISTS payments (id INTEGER PRIMARY KEY AUTOINCREMENT, "
            "key TEXT NOT NULL, run_id TEXT NOT NULL, pos INTEGER NOT NULL, "
            "token TEXT NOT NULL, pid INTEGER NOT NULL)"
        )
    app = perdure.App(store_url(workdir))
    try:
        app.list_runs(limit=1)  # opens and migrates the store
    finally:
        app.close()
    url = store_url(workdir)
    if is_postgres(url):
        with _pg_connect(url) as pg:
            pg.execute(
                f"CREATE TABLE IF NOT EXISTS {TX_TABLE} (id BIGSERIAL PRIMARY KEY, "
                "run_id TEXT NOT NULL, pos INTEGER NOT NULL, key TEXT NOT NULL, "
                "pid INTEGER NOT NULL, role TEXT NOT NULL)"
            )
        return
    with sqlite3.connect(workdir / STORE_DB) as conn:
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {TX_TABLE} (id INTEGER PRIMARY KEY AUTOINCREMENT, "
            "run_id TEXT NOT NULL, pos INTEGER NOT NULL, key TEXT NOT NULL, "
            "pid INTEGER NOT NULL, role TEXT NOT NULL)"
        )


def tx_insert(role: str) -> int:
    """Insert the running transactional step's row into the user table; its id.

    `current_step().db` is the store's own connection: sqlite3 (`?`) or psycopg (`%s`).
    """
    info = perdure.current_step()
    params = (info.run_id, info.position, info.idempotency_key, os.getpid(), role)
    columns = f"INSERT INTO {TX_TABLE} (run_id, pos, key, pid, role)"
    if isinstance(info.db, sqlite3.Connection):
        cur = info.db.execute(f"{columns} VALUES (?, ?, ?, ?, ?)", params)
        return int(cur.lastrowid or 0)
    row = info.db.execute(f"{columns} VALUES (%s, %s, %s, %s, %s) RETURNING id", params).fetchone()
    return int(row[0])


def read_tx_rows(workdir: Path) -> list[tuple[int, str, int, str, int]]:
    """Every committed row of the user table: (id, run_id, pos, role, pid), by id."""
    url = store_url(workdir)
    query = f"SELECT id, run_id, pos, role, pid FROM {TX_TABLE} ORDER BY id"
    if is_postgres(url):
        with _pg_connect(url) as pg:
            return [tuple(row) for row in pg.execute(query).fetchall()]
    with sqlite3.connect(Path(workdir) / STORE_DB) as conn:
        return list(conn.execute(query))


def read_service(workdir: Path) -> list[tuple[str, str, int, str]]:
    """Every effect the keyed service recorded: (key, run_id, pos, token)."""
    with sqlite3.connect(Path(workdir) / SERVICE_DB) as conn:
        return list(conn.execute("SELECT key, run_id, pos, token FROM effects ORDER BY id"))


def ledger_write(workdir: Path, effect: str, what: str = "exec", **extra: Any) -> None:
    """Append one line for the running step: one write() on O_APPEND survives kill -9 whole."""
    info = perdure.current_step()
    record = {
        "effect": effect,
        "what": what,
        "run": info.run_id,
        "pos": info.position,
        "step": info.name,
        "key": info.idempotency_key,
        "attempt": info.attempt,
        "pid": os.getpid(),
        "role": os.environ.get("CHAOS_ROLE", ""),
        **extra,
    }
    line = (json.dumps(record, sort_keys=True) + "\n").encode()
    fd = os.open(workdir / LEDGER, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def read_ledger(workdir: Path) -> list[dict[str, Any]]:
    path = workdir / LEDGER
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def service_call(workdir: Path, key: str, run_id: str, pos: int) -> str:
    """An outside service that deduplicates by key: the first call's token, on every call."""
    conn = sqlite3.connect(workdir / SERVICE_DB, timeout=60, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        row = conn.execute("SELECT token FROM effects WHERE key = ?", (key,)).fetchone()
        if row is not None:
            conn.execute("COMMIT")
            return str(row[0])
        token = uuid.uuid4().hex
        conn.execute(
            "INSERT INTO effects (key, run_id, pos, token, pid) VALUES (?, ?, ?, ?, ?)",
            (key, run_id, pos, token, os.getpid()),
        )
        conn.execute("COMMIT")
        return token
    finally:
        conn.close()


def pay_once(workdir: Path, key: str, run_id: str, pos: int) -> str:
    """The payment system's charge: no key, no deduplication (a second call pays twice)."""
    token = uuid.uuid4().hex
    conn = sqlite3.connect(workdir / SERVICE_DB, timeout=60, isolation_level=None)
    try:
        conn.execute(
            "INSERT INTO payments (key, run_id, pos, token, pid) VALUES (?, ?, ?, ?, ?)",
            (key, run_id, pos, token, os.getpid()),
        )
    finally:
        conn.close()
    return token


def find_payment(workdir: Path, key: str) -> str | None:
    """The payment system's lookup, which a probe asks: the token paid under `key`, if any."""
    with sqlite3.connect(workdir / SERVICE_DB, timeout=60) as conn:
        row = conn.execute("SELECT token FROM payments WHERE key = ?", (key,)).fetchone()
    return None if row is None else str(row[0])


def read_payments(workdir: Path) -> list[tuple[str, str, int, str]]:
    """Every payment made: (key, run_id, pos, token)."""
    with sqlite3.connect(Path(workdir) / SERVICE_DB) as conn:
        return list(conn.execute("SELECT key, run_id, pos, token FROM payments ORDER BY id"))


DOUBT_ENV = "CHAOS_PROBE_DOUBT"  # set: the probe cannot tell for runs whose id ends in 0 or 5


def in_doubt(run_id: str) -> bool:
    return run_id[-1] in "05"


def _on_step_pool() -> bool:
    """Whether the calling step body runs on the step pool (not inline on the event loop)."""
    return threading.current_thread().name.startswith("perdure-step")


def _pause(low: float, high: float) -> None:
    time.sleep(random.uniform(low, high))


def build_app(workdir: Path) -> perdure.App:
    """The App on `workdir`'s store with the chaos and zombie workflows registered."""
    workdir = Path(workdir)
    app = perdure.App(store_url(workdir))

    # -- chaos steps: one per effect ---------------------------------------------------

    @app.step(name="read_step", effect="read")
    def read_step(tag: str) -> str:
        ledger_write(workdir, "read")
        _pause(0.0, 0.03)
        return f"read:{tag}"

    @app.step(name="flaky_step", effect="read", retry=perdure.Retry(max_attempts=2, initial=0.05))
    def flaky_step() -> str:
        ledger_write(workdir, "read")
        raise ValueError("flaky_step fails by design")

    @app.step(name="idem_step", effect="idempotent")
    def idem_step(tag: str) -> str:
        info = perdure.current_step()
        ledger_write(workdir, "idempotent")
        content = f"idem:{info.idempotency_key}:{tag}"
        target = workdir / "idem" / f"{info.run_id}_{info.position}.txt"
        tmp = target.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(content)
        _pause(0.0, 0.06)
        os.replace(tmp, target)
        return content

    @app.step(name="keyed_step", effect="keyed")
    def keyed_step(tag: str) -> dict[str, str]:
        info = perdure.current_step()
        ledger_write(workdir, "keyed")
        _pause(0.0, 0.04)
        token = service_call(workdir, info.idempotency_key, info.run_id, info.position)
        _pause(0.0, 0.04)
        return {"key": info.idempotency_key, "token": token}

    @app.step(name="tx_step", effect="transactional")
    def tx_step(tag: str) -> dict[str, Any]:
        info = perdure.current_step()
        ledger_write(workdir, "transactional", "attempt")  # attempts; committed ones are rows
        row = tx_insert("chaos")
        _pause(0.0, 0.005)  # widen the window in which a kill lands mid-transaction
        return {"key": info.idempotency_key, "row": row}

    @app.step(name="once_step", effect="once")
    def once_step(tag: str) -> str:
        info = perdure.current_step()
        _pause(0.0, 0.06)
        ledger_write(workdir, "once")  # the effect that must never happen twice
        _pause(0.0, 0.06)
        return once_value(info.run_id, info.position)

    @app.step(name="quick_once", effect="once")
    def quick_once(i: int) -> str:
        """A once body short enough to run inline: a run alone in its worker commits its
        intent on the loop's thread and runs it right after, on the loop too (no pool)."""
        ledger_write(workdir, "once", at_once=not _on_step_pool())
        info = perdure.current_step()
        return once_value(info.run_id, info.position)

    @app.step(name="slow_keyed", effect="keyed")
    def slow_keyed(i: int) -> int:
        """Long enough (past the engine's linger) that its outcome is committed before the
        workflow goes on: a kill re-runs the one executing, never an earlier one."""
        ledger_write(workdir, "keyed")
        time.sleep(0.02)
        return i

    @app.workflow(name="slow_keys")
    async def slow_keys(n: int) -> int:
        for i in range(n):
            await slow_keyed(i)
        return n

    def payment_probe(order: str) -> perdure.ProbeAnswer:
        info = perdure.current_step()
        if os.environ.get(DOUBT_ENV) and in_doubt(info.run_id):
            return perdure.ProbeAnswer.cannot_tell("the payment system did not answer (by design)")
        token = find_payment(workdir, info.idempotency_key)
        return perdure.ProbeAnswer.done(token) if token else perdure.ProbeAnswer.not_done()

    @app.step(name="pay", effect="once", probe=payment_probe)
    def pay(order: str) -> str:
        """A charge without a key, its probe asking the payment system by the step's key."""
        info = perdure.current_step()
        _pause(0.0, 0.04)
        token = pay_once(workdir, info.idempotency_key, info.run_id, info.position)
        _pause(0.0, 0.04)
        return token

    @app.workflow(name="payments")
    async def payments(order: str) -> list[str]:
        return [await pay(f"{order}-{i}") for i in range(3)]

    @app.workflow(name="charges")
    async def charges(n: int) -> list[str]:
        return [await quick_once(i) for i in range(n)]

    @app.workflow(name="chaos")
    def chaos(n: int, sleeps: list[float], fail: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"n": n}
        out["r0"] = read_step("a")
        out["i0"] = idem_step("b")
        out["k0"] = keyed_step("c")
        perdure.sleep(sleeps[0])
        out["t0"] = tx_step("d")
        out["o0"] = once_step("e")
        out["k1"] = keyed_step("f")
        perdure.sleep(sleeps[1])
        if fail:
            flaky_step()
        out["i1"] = idem_step("g")
        out["t1"] = tx_step("h")
        out["o1"] = once_step("i")
        out["r1"] = read_step("j")
        return out

    @app.workflow(name="chaos_async")
    async def chaos_async(n: int, sleeps: list[float], fail: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"n": n}
        out["r0"], out["k0"] = await asyncio.gather(read_step("a"), keyed_step("c"))
        out["i0"] = await idem_step("b")
        await perdure.sleep(sleeps[0])
        out["o0"] = await once_step("e")
        out["t0"] = await tx_step("d")
        out["k1"] = await keyed_step("f")
        await perdure.sleep(sleeps[1])
        if fail:
            await flaky_step()
        out["t1"] = await tx_step("h")
        out["i1"] = await idem_step("g")
        out["o1"] = await once_step("i")
        out["r1"] = await read_step("j")
        return out

    # -- zombie steps: worker A blocks in zombie_block, worker B holds in zombie_hold ----

    def wait_for(name: str) -> Any:
        async def waiter() -> None:
            while not (workdir / name).exists():
                await asyncio.sleep(0.002)

        return waiter()

    def tx_row(role_label: str) -> dict[str, Any]:
        return {"row": tx_insert(role_label), "pid": os.getpid(), "role": role_label}

    @app.step(name="zombie_prep", effect="transactional")
    def zombie_prep() -> dict[str, Any]:
        return tx_row(os.environ.get("CHAOS_ROLE", "?"))

    @app.step(name="zombie_block", effect="idempotent")
    async def zombie_block() -> str:
        role = os.environ.get("CHAOS_ROLE", "?")
        ledger_write(workdir, "idempotent", "enter")
        if role == "A":
            await wait_for("release_a")
        ledger_write(workdir, "idempotent", "return")
        return f"{role}:{os.getpid()}"

    @app.step(name="zombie_hold", effect="read")
    async def zombie_hold() -> str:
        role = os.environ.get("CHAOS_ROLE", "?")
        ledger_write(workdir, "read", "enter")
        if role == "B":
            await wait_for("release_b")
        return f"{role}:{os.getpid()}"

    @app.step(name="zombie_finish", effect="transactional")
    def zombie_finish() -> dict[str, Any]:
        return tx_row(os.environ.get("CHAOS_ROLE", "?"))

    @app.workflow(name="zombie")
    async def zombie() -> dict[str, Any]:
        prep = await zombie_prep()
        await perdure.sleep(0.01)  # commits what came before, under A's lease
        block = await zombie_block()
        hold = await zombie_hold()
        finish = await zombie_finish()
        return {"prep": prep, "block": block, "hold": hold, "finish": finish}

    return app


def once_value(run_id: str, position: int) -> str:
    """What `once_step` returns, and what an operator resolves it with."""
    return f"once:{run_id}:{position}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--concurrency", type=int, default=6)
    parser.add_argument("--lease", type=float, default=1.0)
    parser.add_argument("--poll", type=float, default=0.05)
    parser.add_argument("--grace", type=float, default=5.0)
    args = parser.parse_args()
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s pid=%(process)d %(name)s %(levelname)s %(message)s",
    )
    app = build_app(args.workdir)
    logging.getLogger("chaos").info("worker process %d starting", os.getpid())
    try:
        app.run_worker(
            concurrency=args.concurrency, lease=args.lease, poll=args.poll, grace=args.grace
        )
    except perdure.errors.ConfigError as exc:  # as `perdure worker` does: one line, exit 2
        print(f"error: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    logging.getLogger("chaos").info("worker process %d stopped", os.getpid())


if __name__ == "__main__":
    main()
