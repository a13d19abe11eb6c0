"""An OpenAI Agents SDK `Session` whose items live in perdure's store (SQLite or PostgreSQL).

`Runner.run(agent, input, session=PerdureSession("conv-1", app))`: inside a durable run
every session call is a `transactional` step, so what it writes commits in the same
transaction as the step's outcome, and what it read is journaled. A replay gets the
recorded answers (nothing added twice, the history it saw then), a crash before the commit
leaves neither the items nor the outcome, and any worker process resumes the conversation.
Outside a run the same calls go to the store directly (to read or reset a conversation).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agents.memory import SessionABC
from agents.memory.session_settings import SessionSettings

from ..engine.context import current
from ..engine.steps import Step, current_step
from ..errors import ConfigError, PayloadError
from ..store.dialect import Db, PostgresDb
from . import agent_session_sql
from .agent_session_sql import AgentSessions

if TYPE_CHECKING:
    from agents.items import TResponseInputItem

    from ..engine.runtime import Runtime

__all__ = ["PerdureSession"]

STEP = "agents.session."  # the steps' names: agents.session.get_items, .add_items, ...


def _db(raw: Any) -> Db:
    """The transactional step's connection with its dialect (its search_path is the app's
    schema on PostgreSQL, so that is the schema the statements name)."""
    if isinstance(raw, sqlite3.Connection):
        return Db(raw)
    schema = raw.execute("SELECT current_schema()").fetchone()[0]
    return PostgresDb(raw, str(schema))


def _get(session_id: str, limit: int | None) -> list[Any]:
    rows = agent_session_sql.items(_db(current_step().db), session_id, limit)
    return [json.loads(row) for row in rows]


def _add(session_id: str, items: list[str]) -> int:
    agent_session_sql.add(_db(current_step().db), session_id, items, time.time())
    return len(items)


def _pop(session_id: str) -> Any:
    row = agent_session_sql.pop(_db(current_step().db), session_id)
    return None if row is None else json.loads(row)


def _clear(session_id: str) -> int:
    return agent_session_sql.clear(_db(current_step().db), session_id)


_BODIES: dict[str, Callable[..., Any]] = {
    "get_items": _get,
    "add_items": _add,
    "pop_item": _pop,
    "clear_session": _clear,
}


def _steps(app: Runtime) -> dict[str, Step[..., Any]]:
    """The session's four transactional steps, registered on `app` once."""
    steps: dict[str, Step[..., Any]] = {}
    for op, body in _BODIES.items():
        name = STEP + op
        known = app.steps.get(name)
        if known is not None:
            steps[op] = Step(known)
        else:
            steps[op] = app.step(name=name, effect="transactional")(body)
    return steps


def _plain(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)  # an SDK item still as its pydantic model
    if callable(dump):
        return dump(mode="json", exclude_unset=True)
    raise TypeError(f"{type(value).__name__} is not JSON")


def _dumps(item: Any) -> str:
    try:
        return json.dumps(item, default=_plain)
    except (TypeError, ValueError) as exc:
        raise PayloadError(f"session item {str(item)[:80]!r} cannot be stored: {exc}") from exc


class PerdureSession(SessionABC):
    """The SDK's Session protocol over perdure's store: the conversation `session_id`,
    shared by every run (on any worker) that names it.

    Args:
        session_id: the conversation's name (`"conv-1"`), unique within the store.
        app: the perdure app whose store keeps the items.
        session_settings: the SDK's settings (`SessionSettings(limit=20)`: read the
            latest 20 items only).
    """

    def __init__(
        self, session_id: str, app: Runtime, *, session_settings: SessionSettings | None = None
    ) -> None:
        if not isinstance(session_id, str) or not session_id.strip():
            raise ConfigError(
                f"PerdureSession needs a session id (a non-empty string), not {session_id!r}"
            )
        self.session_id = session_id
        self.app = app
        self.session_settings = session_settings
        self._steps = _steps(app)

    def __repr__(self) -> str:
        return f"PerdureSession({self.session_id!r})"

    async def _sessions(self) -> AgentSessions:
        """The sessions' table in the app's store, up to date (a durable call's step writes
        it on the step's own connection)."""
        await self.app.open_store()
        sessions = AgentSessions(self.app.store)
        await sessions.ready()
        return sessions

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The conversation so far, oldest first (with `limit`: its latest `limit` items)."""
        if limit is None and self.session_settings is not None:
            limit = self.session_settings.limit
        sessions = await self._sessions()
        if current() is not None:
            return await self._steps["get_items"](self.session_id, limit)  # type: ignore[no-any-return]
        return [
            json.loads(row) for row in await sessions.agent_session_items(self.session_id, limit)
        ]

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append `items` (exactly once per durable call: the write commits with its step)."""
        if not items:
            return
        rows = [_dumps(item) for item in items]
        sessions = await self._sessions()
        if current() is not None:
            await self._steps["add_items"](self.session_id, rows)
            return
        await sessions.agent_session_add(self.session_id, rows, self.app.clock.now())

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove and return the latest item (None when the conversation is empty)."""
        sessions = await self._sessions()
        if current() is not None:
            return await self._steps["pop_item"](self.session_id)  # type: ignore[no-any-return]
        row = await sessions.agent_session_pop(self.session_id)
        return None if row is None else json.loads(row)

    async def clear_session(self) -> None:
        """Forget the whole conversation."""
        sessions = await self._sessions()
        if current() is not None:
            await self._steps["clear_session"](self.session_id)
            return
        await sessions.agent_session_clear(self.session_id)
