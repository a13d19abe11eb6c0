"""Store selection: turn a URL (or `PERDURE_DB`) into a Store."""

from __future__ import annotations

import os
from collections.abc import Mapping
from urllib.parse import parse_qs, urlsplit

from ..errors import ConfigError
from .base import Store
from .sqlite import SQLiteStore

DEFAULT_URL = "sqlite:///.perdure/perdure.db"

__all__ = ["DEFAULT_URL", "SQLiteStore", "Store", "open_store", "store_url"]


def store_url(url: str | None, environ: Mapping[str, str] | None = None) -> str:
    """The store URL to use: the argument, else `PERDURE_DB`, else the embedded default."""
    env = os.environ if environ is None else environ
    return url or env.get("PERDURE_DB") or DEFAULT_URL


def open_store(url: str | None = None, environ: Mapping[str, str] | None = None) -> Store:
    """Build the Store a URL names (not yet connected).

    `sqlite:///relative/path.db`, `sqlite:////absolute/path.db` and `sqlite:///:memory:`
    name SQLite files; `?synchronous=NORMAL` picks the fsync policy (default FULL).
    """
    url = store_url(url, environ)
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "sqlite":
        if parts.netloc:
            raise ConfigError(
                f"store URL {url!r}: use three slashes, sqlite:///relative.db or sqlite:////abs.db"
            )
        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        if not path:
            raise ConfigError(
                f"store URL {url!r} names no file; e.g. sqlite:///.perdure/perdure.db"
            )
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        unknown = set(query) - {"synchronous"}
        if unknown:
            raise ConfigError(f"store URL {url!r}: unknown option(s) {', '.join(sorted(unknown))}")
        return SQLiteStore(path, synchronous=query.get("synchronous", "FULL"))
    if scheme in {"postgres", "postgresql"}:
        from .postgres import PostgresStore

        return PostgresStore(url)
    raise ConfigError(
        f"store URL {url!r}: unknown scheme {parts.scheme or '(none)'!r}; "
        "use sqlite:///path.db (see docs/how-to/choosing-a-store.md)"
    )
