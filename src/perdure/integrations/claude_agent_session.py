"""A Claude Agent SDK `SessionStore` whose transcripts live in perdure's store (SQLite or
PostgreSQL): `ClaudeAgentOptions(session_store=PerdureSessionStore(app))`.

The SDK mirrors every transcript line the CLI writes to `append` (retried batches add
nothing twice: entries are kept once per uuid), and `resume=` a session materializes it
from `load`, on any machine that reaches the store. The SDK's helpers that read a store
(`list_sessions_from_store`, `get_session_messages_from_store`, ...) work on it too.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from claude_agent_sdk import SessionStore
from claude_agent_sdk._internal.session_summary import fold_session_summary
from claude_agent_sdk.types import (
    SessionKey,
    SessionListSubkeysKey,
    SessionStoreEntry,
    SessionStoreListEntry,
    SessionSummaryEntry,
)

from ..errors import PayloadError
from .claude_agent_sql import ClaudeSessions

if TYPE_CHECKING:
    from ..app import App

__all__ = ["PerdureSessionStore"]


class PerdureSessionStore(SessionStore):
    """The SDK's `SessionStore` protocol over the store of `app` (every method of it)."""

    def __init__(self, app: App) -> None:
        self.app = app

    def __repr__(self) -> str:
        return f"PerdureSessionStore({self.app.runtime.url!r})"

    async def _sessions(self) -> ClaudeSessions:
        await self.app.runtime.open_store()
        return ClaudeSessions(self.app.runtime.store)

    async def append(self, key: SessionKey, entries: list[SessionStoreEntry]) -> None:
        """Keep a batch of transcript lines, in order (each uuid once)."""
        rows: list[tuple[str | None, str]] = []
        for entry in entries:
            try:
                text = json.dumps(entry)
            except (TypeError, ValueError) as exc:
                raise PayloadError(f"transcript entry cannot be stored: {exc}") from exc
            uuid = entry.get("uuid")
            rows.append((uuid if isinstance(uuid, str) and uuid else None, text))
        subpath = key.get("subpath") or ""

        def fold(previous: dict[str, Any] | None) -> dict[str, Any]:
            found = fold_session_summary(previous, key, entries)  # type: ignore[arg-type]
            return dict(found)

        sessions = await self._sessions()
        now_ms = int(self.app.clock.now() * 1000)
        await sessions.claude_session_append(
            key["project_key"], key["session_id"], subpath, rows, now_ms,
            None if subpath else fold,
        )  # fmt: skip

    async def load(self, key: SessionKey) -> list[SessionStoreEntry] | None:
        """The transcript's lines in order, or None if it was never written."""
        sessions = await self._sessions()
        rows = await sessions.claude_session_load(
            key["project_key"], key["session_id"], key.get("subpath") or ""
        )
        return None if rows is None else [json.loads(row) for row in rows]

    async def list_sessions(self, project_key: str) -> list[SessionStoreListEntry]:
        """The project's main transcripts with their write times (ms)."""
        sessions = await self._sessions()
        found = await sessions.claude_session_list(project_key)
        return [{"session_id": sid, "mtime": mtime} for sid, mtime in found]

    async def list_session_summaries(self, project_key: str) -> list[SessionSummaryEntry]:
        """The SDK's summaries of the project's sessions, as folded at each append."""
        sessions = await self._sessions()
        return [json.loads(row) for row in await sessions.claude_session_summaries(project_key)]

    async def delete(self, key: SessionKey) -> None:
        """Forget a transcript (a main one with its subagents' and its summary)."""
        sessions = await self._sessions()
        await sessions.claude_session_delete(
            key["project_key"], key["session_id"], key.get("subpath")
        )

    async def list_subkeys(self, key: SessionListSubkeysKey) -> list[str]:
        """The subagent transcripts under a session."""
        sessions = await self._sessions()
        return await sessions.claude_session_subkeys(key["project_key"], key["session_id"])
