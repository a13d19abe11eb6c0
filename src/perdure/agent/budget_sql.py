"""Agents' spending, a store extension: model usage, budgets, shared budgets, reservations
and runs parked for budget; their tables, SQL and methods (`Budgets(store)`).

Usage rows are keyed by (run, journal position), so recording a model call's
usage again after a crash changes nothing. Before a call is sent its worst case is
reserved against every limit that applies, under one lock per agent (SQLite's single
writer; a transaction-scoped advisory lock on PostgreSQL), so concurrent calls can never
together pass a budget; the reservation is settled to the call's usage when it returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..store.dialect import Db
from ..store.extensions import Extension, Methods, reads, writes
from ..store.names import check

BUDGETS = Extension(
    "budgets",
    [
        # 1: model usage per call (budgets, `perdure usage`) and agents' budgets
        """
        CREATE TABLE agent_usage (
            run_id        TEXT NOT NULL,
            position      INTEGER NOT NULL,
            agent         TEXT NOT NULL,
            model         TEXT NOT NULL,
            input_tokens  INTEGER NOT NULL,
            output_tokens INTEGER NOT NULL,
            cost          REAL NOT NULL,
            at            REAL NOT NULL,
            PRIMARY KEY (run_id, position)
        );
        CREATE INDEX agent_usage_by_agent ON agent_usage (agent, at);
        CREATE TABLE agent_budgets (
            agent           TEXT PRIMARY KEY,
            tokens_per_hour INTEGER,
            tokens_per_day  INTEGER,
            cost_per_hour   REAL,
            cost_per_day    REAL,
            updated_at      REAL NOT NULL
        )
        """,
        # 2: a model call reserves its worst case against the agent's budget before it is
        # sent; the row is the call's durable intent (tier, model, estimate), settled into
        # agent_usage when the reply comes, kept as 'unknown' (its estimate counted) when
        # the call was cut off. Runs parked for budget wait in agent_budget_waits, in the
        # order they parked, with what they asked for. agent_specs: each agent a worker
        # serves, with its spec's [budget] (JSON).
        """
        CREATE TABLE agent_reservations (
            run_id    TEXT NOT NULL,
            position  INTEGER NOT NULL,
            attempt   INTEGER NOT NULL,
            agent     TEXT NOT NULL,
            tier      TEXT NOT NULL,
            model     TEXT NOT NULL,
            tokens    INTEGER NOT NULL,
            cost      REAL NOT NULL,
            state     TEXT NOT NULL,
            at        REAL NOT NULL,
            PRIMARY KEY (run_id, position, attempt)
        );
        CREATE INDEX agent_reservations_by_agent ON agent_reservations (agent, state, at);
        CREATE TABLE agent_budget_waits (
            run_id    TEXT PRIMARY KEY,
            agent     TEXT NOT NULL,
            tokens    INTEGER NOT NULL,
            cost      REAL NOT NULL,
            at        REAL NOT NULL
        );
        CREATE INDEX agent_budget_waits_by_agent ON agent_budget_waits (agent, at);
        CREATE TABLE agent_specs (
            agent   TEXT PRIMARY KEY,
            budget  TEXT NOT NULL,
            at      REAL NOT NULL
        )
        """,
        # 3 (shared budgets; issue 15): budget_pools, a named budget several agents share
        # ([budget] shared = NAME in their specs), per rolling hour/day; the pool each call
        # counts against is kept with its reservation and its usage.
        """
        CREATE TABLE budget_pools (
            name            TEXT PRIMARY KEY,
            tokens_per_hour INTEGER,
            tokens_per_day  INTEGER,
            cost_per_hour   REAL,
            cost_per_day    REAL,
            updated_at      REAL NOT NULL
        );
        ALTER TABLE agent_usage ADD COLUMN pool TEXT;
        ALTER TABLE agent_reservations ADD COLUMN pool TEXT;
        CREATE INDEX agent_usage_by_pool ON agent_usage (pool, at);
        CREATE INDEX agent_reservations_by_pool ON agent_reservations (pool, at)
        """,
    ],
    tables=(
        "agent_usage",
        "agent_budgets",
        "agent_reservations",
        "agent_budget_waits",
        "agent_specs",
        "budget_pools",
    ),
    legacy=(5, 14, 15),  # made by the core's scripts 5, 14 and 15 before
    at_open=True,
)


@dataclass(slots=True)
class UsageRow:
    """One model call's tokens and cost."""

    run_id: str
    position: int
    agent: str
    model: str
    input_tokens: int
    output_tokens: int
    cost: float
    at: float
    pool: str | None = None  # the shared budget the call counted against


@dataclass(slots=True)
class Budget:
    """An agent's spending limits per rolling window (None: no limit)."""

    agent: str
    tokens_per_hour: int | None = None
    tokens_per_day: int | None = None
    cost_per_hour: float | None = None
    cost_per_day: float | None = None


@dataclass(slots=True)
class SharedBudget:
    """A budget several agents share (their specs' `[budget] shared = NAME`), per rolling
    window (None: no limit)."""

    name: str
    tokens_per_hour: int | None = None
    tokens_per_day: int | None = None
    cost_per_hour: float | None = None
    cost_per_day: float | None = None


@dataclass(slots=True)
class Reservation:
    """A model call's worst case, held against budgets from before it is sent until it is
    settled. `state`: open (sent or about to be), unknown (cut off: outcome unknown, the
    estimate counted as spent), estimated (the provider's reply had no usage)."""

    run_id: str
    position: int
    attempt: int
    agent: str
    tier: str
    model: str
    tokens: int
    cost: float
    state: str
    at: float
    pool: str | None = None  # the shared budget it is held against too


@dataclass(slots=True)
class Limit:
    """One budget a call is held to: `window` seconds back (None: the whole run of `run_id`),
    of the agent's calls, or of every call counted against the shared budget `pool`."""

    what: str  # how the refusal names it, e.g. "this day", "run limit"
    window: float | None
    tokens: int | None = None
    cost: float | None = None
    pool: str | None = None


@dataclass(slots=True)
class Refusal:
    """Why a reservation was refused: the limit, what is used and what was asked."""

    limit: Limit
    used_tokens: int
    used_cost: float
    asked_tokens: int
    asked_cost: float
    free_at: float | None = None  # when enough of the window has rolled by (None: never)

    def reason(self) -> str:
        lim = self.limit
        if lim.tokens is not None and self.used_tokens + self.asked_tokens > lim.tokens:
            return (f"budget {lim.what}: {self.used_tokens} of {lim.tokens} tokens used or "
                    f"reserved, this call may take {self.asked_tokens}")  # fmt: skip
        return (f"budget {lim.what}: {self.used_cost:.4f} of {lim.cost} used or reserved, "
                f"this call may cost {self.asked_cost:.4f}")  # fmt: skip


def record_usage(conn: Db, row: UsageRow) -> bool:
    """Record a call's usage once; False if this (run, position) was already recorded."""
    cur = conn.execute(
        "INSERT INTO agent_usage (run_id, position, agent, model, input_tokens, output_tokens, "
        "cost, at, pool) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (run_id, position) DO NOTHING",
        (row.run_id, row.position, row.agent, row.model, row.input_tokens, row.output_tokens,
         row.cost, row.at, row.pool),
    )  # fmt: skip
    return cur.rowcount == 1


def _spent_by(conn: Db, column: str, value: str, since: float) -> tuple[int, float]:
    """Tokens and cost of the usage rows and held reservations whose `column` is `value`,
    since `since`."""
    row = conn.execute(
        "SELECT COALESCE(SUM(input_tokens + output_tokens), 0), COALESCE(SUM(cost), 0) "
        f"FROM agent_usage WHERE {column} = ? AND at >= ?",
        (value, since),
    ).fetchone()
    held = conn.execute(
        "SELECT COALESCE(SUM(tokens), 0), COALESCE(SUM(cost), 0) FROM agent_reservations "
        f"WHERE {column} = ? AND at >= ?",
        (value, since),
    ).fetchone()
    return int(row[0]) + int(held[0]), float(row[1]) + float(held[1])


def pool_spent(conn: Db, pool: str, since: float) -> tuple[int, float]:
    """Tokens and cost every agent sharing `pool` spent since `since`, held reservations
    counted at their estimate."""
    return _spent_by(conn, "pool", pool, since)


def spent(conn: Db, agent: str, since: float) -> tuple[int, float]:
    """Tokens and cost an agent spent since `since`, counting held reservations (calls in
    flight, or cut off with their outcome unknown) at their estimate."""
    return _spent_by(conn, "agent", agent, since)


def run_spent(conn: Db, run_id: str) -> tuple[int, float]:
    """Tokens and cost a run spent, held reservations counted at their estimate."""
    row = conn.execute(
        "SELECT COALESCE(SUM(input_tokens + output_tokens), 0), COALESCE(SUM(cost), 0) "
        "FROM agent_usage WHERE run_id = ?",
        (run_id,),
    ).fetchone()
    held = conn.execute(
        "SELECT COALESCE(SUM(tokens), 0), COALESCE(SUM(cost), 0) FROM agent_reservations "
        "WHERE run_id = ?",
        (run_id,),
    ).fetchone()
    return int(row[0]) + int(held[0]), float(row[1]) + float(held[1])


def _lock(conn: Db, key: str) -> None:
    """Serialise reservations against one budget until the transaction ends (SQLite: its
    single writer already does; PostgreSQL: a transaction-scoped advisory lock). The agent's
    is taken before its shared budget's, always in that order: no two wait on each other."""
    if conn.dialect == "postgres":
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(?))", (f"perdure.budget:{key}",))


def reserve(conn: Db, reservation: Reservation, limits: list[Limit], now: float) -> Refusal | None:
    """Hold `reservation` against every limit, or refuse (nothing held; a window refusal
    puts the run in the agent's queue of parked runs). Earlier attempts of the same call
    still held were cut off: they stay counted, marked outcome unknown. Its `attempt` is
    set here."""
    _lock(conn, reservation.agent)
    if reservation.pool is not None:
        _lock(conn, f"shared:{reservation.pool}")
    conn.execute(
        "UPDATE agent_reservations SET state = 'unknown' WHERE run_id = ? AND position = ? "
        "AND state = 'open'",
        (reservation.run_id, reservation.position),
    )
    for limit in limits:
        if limit.window is None:
            used_tokens, used_cost = run_spent(conn, reservation.run_id)
        elif limit.pool is not None:
            used_tokens, used_cost = pool_spent(conn, limit.pool, now - limit.window)
        else:
            used_tokens, used_cost = spent(conn, reservation.agent, now - limit.window)
        over_tokens = limit.tokens is not None and used_tokens + reservation.tokens > limit.tokens
        over_cost = limit.cost is not None and used_cost + reservation.cost > limit.cost + 1e-12
        if over_tokens or over_cost:
            refusal = Refusal(limit, used_tokens, used_cost, reservation.tokens, reservation.cost)
            if limit.window is not None:
                conn.execute(
                    "INSERT INTO agent_budget_waits (run_id, agent, tokens, cost, at) "
                    "VALUES (?, ?, ?, ?, ?) ON CONFLICT (run_id) DO NOTHING",
                    (
                        reservation.run_id,
                        reservation.agent,
                        reservation.tokens,
                        reservation.cost,
                        now,
                    ),
                )
                refusal.free_at = _free_at(conn, reservation, limit, now)
            return refusal
    row = conn.execute(
        "SELECT COALESCE(MAX(attempt), 0) FROM agent_reservations WHERE run_id = ? "
        "AND position = ?",
        (reservation.run_id, reservation.position),
    ).fetchone()
    reservation.attempt, reservation.state, reservation.at = int(row[0]) + 1, "open", now
    conn.execute(
        "INSERT INTO agent_reservations (run_id, position, attempt, agent, tier, model, tokens, "
        "cost, state, at, pool) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            reservation.run_id, reservation.position, reservation.attempt, reservation.agent,
            reservation.tier, reservation.model, reservation.tokens, reservation.cost,
            reservation.state, reservation.at, reservation.pool,
        ),
    )  # fmt: skip
    conn.execute("DELETE FROM agent_budget_waits WHERE run_id = ?", (reservation.run_id,))
    return None


def _free_at(conn: Db, r: Reservation, limit: Limit, now: float) -> float | None:
    """When enough of what the window holds has rolled out of it for `r` to fit (None: it
    never will, the call alone being over the limit)."""
    assert limit.window is not None
    if (limit.tokens is not None and r.tokens > limit.tokens) or (
        limit.cost is not None and r.cost > limit.cost
    ):
        return None
    since = now - limit.window
    column, key = ("pool", limit.pool) if limit.pool is not None else ("agent", r.agent)
    rows = conn.execute(
        f"SELECT at, input_tokens + output_tokens, cost FROM agent_usage WHERE {column} = ? "
        "AND at >= ? UNION ALL SELECT at, tokens, cost FROM agent_reservations "
        f"WHERE {column} = ? AND at >= ? ORDER BY 1",
        (key, since, key, since),
    ).fetchall()
    tokens = sum(int(x[1]) for x in rows)
    cost = sum(float(x[2]) for x in rows)
    for at, row_tokens, row_cost in rows:  # oldest first: each leaves at at + window
        tokens, cost = tokens - int(row_tokens), cost - float(row_cost)
        fits_tokens = limit.tokens is None or tokens + r.tokens <= limit.tokens
        fits_cost = limit.cost is None or cost + r.cost <= limit.cost + 1e-12
        if fits_tokens and fits_cost:
            return float(at) + limit.window
    return now + limit.window


def settle(conn: Db, reservation: Reservation, usage: UsageRow | None) -> bool:
    """Replace a reservation by the call's usage (None: the reply said nothing of usage, so
    the estimate stays, marked 'estimated'). False if the usage was already recorded."""
    key = (reservation.run_id, reservation.position, reservation.attempt)
    if usage is None:
        conn.execute(
            "UPDATE agent_reservations SET state = 'estimated' WHERE run_id = ? "
            "AND position = ? AND attempt = ?",
            key,
        )
        return True
    conn.execute(
        "DELETE FROM agent_reservations WHERE run_id = ? AND position = ? AND attempt = ?", key
    )
    return record_usage(conn, usage)


def release(conn: Db, reservation: Reservation, state: str | None) -> None:
    """Let go of a reservation (the call failed before it was paid), or keep it counted in
    `state` (e.g. 'unknown': cut off, it may have been paid)."""
    key = (reservation.run_id, reservation.position, reservation.attempt)
    if state is None:
        conn.execute(
            "DELETE FROM agent_reservations WHERE run_id = ? AND position = ? AND attempt = ?",
            key,
        )
    else:
        conn.execute(
            "UPDATE agent_reservations SET state = ? WHERE run_id = ? AND position = ? "
            "AND attempt = ?",
            (state, *key),
        )


def _since(agent: str | None, since: float) -> tuple[str, tuple[object, ...]]:
    """The WHERE clause and parameters of rows since `since`, of one agent or all."""
    if agent is None:
        return "at >= ?", (since,)
    return "at >= ? AND agent = ?", (since, agent)


def reservations(conn: Db, agent: str | None, since: float) -> list[Reservation]:
    """Reservations still held: calls in flight, cut off (unknown) or without usage."""
    where, params = _since(agent, since)
    rows = conn.execute(
        "SELECT run_id, position, attempt, agent, tier, model, tokens, cost, state, at, pool "
        f"FROM agent_reservations WHERE {where} ORDER BY at, run_id, position, attempt",
        params,
    ).fetchall()
    return [Reservation(r[0], int(r[1]), int(r[2]), r[3], r[4], r[5], int(r[6]), float(r[7]),
                        r[8], float(r[9]), r[10]) for r in rows]  # fmt: skip


def parked(conn: Db, agent: str) -> list[tuple[str, int, float]]:
    """The agent's runs parked for budget, first parked first: (run, tokens, cost) asked."""
    rows = conn.execute(
        "SELECT run_id, tokens, cost FROM agent_budget_waits WHERE agent = ? ORDER BY at, run_id",
        (agent,),
    ).fetchall()
    return [(str(r[0]), int(r[1]), float(r[2])) for r in rows]


def unpark(conn: Db, run_id: str) -> None:
    conn.execute("DELETE FROM agent_budget_waits WHERE run_id = ?", (run_id,))


def usage(conn: Db, agent: str | None, since: float) -> list[UsageRow]:
    where, params = _since(agent, since)
    rows = conn.execute(
        "SELECT run_id, position, agent, model, input_tokens, output_tokens, cost, at, pool "
        f"FROM agent_usage WHERE {where} ORDER BY at, run_id, position",
        params,
    ).fetchall()
    return [UsageRow(*r) for r in rows]


_LIMITS = "tokens_per_hour, tokens_per_day, cost_per_hour, cost_per_day"


def _get_limits(conn: Db, table: str, key: str, name: str) -> tuple[Any, ...] | None:
    """The row (key, then the four limits) of a budget table for `name`; None: no row."""
    row = conn.execute(f"SELECT {key}, {_LIMITS} FROM {table} WHERE {key} = ?", (name,)).fetchone()
    return tuple(row) if row else None


def _put_limits(
    conn: Db, table: str, key: str, limits: Budget | SharedBudget, name: str, now: float
) -> None:
    """Insert or replace the four limits of a budget table's row for `name`."""
    conn.execute(
        f"INSERT INTO {table} ({key}, {_LIMITS}, updated_at) VALUES (?, ?, ?, ?, ?, ?) "
        f"ON CONFLICT ({key}) DO UPDATE SET "
        "tokens_per_hour = excluded.tokens_per_hour, tokens_per_day = excluded.tokens_per_day, "
        "cost_per_hour = excluded.cost_per_hour, cost_per_day = excluded.cost_per_day, "
        "updated_at = excluded.updated_at",
        (
            name,
            limits.tokens_per_hour,
            limits.tokens_per_day,
            limits.cost_per_hour,
            limits.cost_per_day,
            now,
        ),
    )
    conn.notify()


def get_budget(conn: Db, agent: str) -> Budget | None:
    row = _get_limits(conn, "agent_budgets", "agent", agent)
    return Budget(*row) if row else None


def put_budget(conn: Db, budget: Budget, now: float) -> None:
    check(budget.agent, "agent name")
    _put_limits(conn, "agent_budgets", "agent", budget, budget.agent, now)


def get_shared_budget(conn: Db, name: str) -> SharedBudget | None:
    row = _get_limits(conn, "budget_pools", "name", name)
    return SharedBudget(*row) if row else None


def put_shared_budget(conn: Db, budget: SharedBudget, now: float) -> None:
    check(budget.name, "shared budget name")
    _put_limits(conn, "budget_pools", "name", budget, budget.name, now)


def clear_shared_budget(conn: Db, name: str) -> bool:
    """Forget a shared budget's limits (its agents are held to none of it); False if none."""
    cur = conn.execute("DELETE FROM budget_pools WHERE name = ?", (name,))
    conn.notify()
    return cur.rowcount == 1


def declared_agents(conn: Db) -> list[tuple[str, str]]:
    """Every agent a worker declared, with its spec budget (JSON)."""
    rows = conn.execute("SELECT agent, budget FROM agent_specs ORDER BY agent").fetchall()
    return [(str(r[0]), str(r[1])) for r in rows]


def declare_agent(conn: Db, agent: str, spec_budget: str, now: float) -> None:
    """Record that a worker serves `agent`, with its spec's budget (JSON)."""
    conn.execute(
        "INSERT INTO agent_specs (agent, budget, at) VALUES (?, ?, ?) ON CONFLICT (agent) "
        "DO UPDATE SET budget = excluded.budget, at = excluded.at",
        (agent, spec_budget, now),
    )


def declared_agent(conn: Db, agent: str) -> str | None:
    """The spec budget (JSON) a worker serving `agent` declared; None: no worker ever did."""
    row = conn.execute("SELECT budget FROM agent_specs WHERE agent = ?", (agent,)).fetchone()
    return str(row[0]) if row else None


def clear_budget(conn: Db, agent: str) -> bool:
    """Forget an agent's stored budget (its spec's is in force again); False if none."""
    cur = conn.execute("DELETE FROM agent_budgets WHERE agent = ?", (agent,))
    conn.notify()
    return cur.rowcount == 1


class Budgets(Methods):
    """Agents' spending over one store: usage per model call, budgets, reservations and
    parked runs."""

    extension = BUDGETS
    record_usage = writes(record_usage)
    spent = reads(spent)
    run_spent = reads(run_spent)
    usage = reads(usage)
    get_budget = reads(get_budget)
    put_budget = writes(put_budget)
    clear_budget = writes(clear_budget)
    declare_agent = writes(declare_agent)
    declared_agent = reads(declared_agent)
    reserve = writes(reserve)
    settle = writes(settle)
    release_reservation = writes(release)
    reservations = reads(reservations)
    budget_parked = reads(parked)
    budget_unpark = writes(unpark)
    # budgets several agents share ([budget] shared = NAME)
    pool_spent = reads(pool_spent)
    get_shared_budget = reads(get_shared_budget)
    put_shared_budget = writes(put_shared_budget)
    clear_shared_budget = writes(clear_shared_budget)
    declared_agents = reads(declared_agents)
