"""Store URLs: store_url picks the URL, open_store turns it into a store (or a clear error)."""

from __future__ import annotations

from pathlib import Path

import pytest

import perdure
from extras_needed import require
from perdure.store import DEFAULT_URL, SQLiteStore, open_store, store_url


def sqlite_store(url: str | None, environ: dict[str, str] | None = None) -> SQLiteStore:
    store = open_store(url, environ=environ if environ is not None else {})
    assert isinstance(store, SQLiteStore)
    return store


def test_relative_path() -> None:
    """sqlite:///rel.db names a file relative to the working directory."""
    store = sqlite_store("sqlite:///rel.db")
    assert store.path == "rel.db"
    assert sqlite_store("sqlite:///data/dir/x.db").path == "data/dir/x.db"


def test_absolute_path() -> None:
    """sqlite:////abs.db (four slashes) names an absolute path."""
    assert sqlite_store("sqlite:////abs.db").path == "/abs.db"
    assert sqlite_store("sqlite:////var/lib/perdure/x.db").path == "/var/lib/perdure/x.db"


def test_memory() -> None:
    """sqlite:///:memory: names an in-memory database."""
    assert sqlite_store("sqlite:///:memory:").path == ":memory:"


def test_relative_path_is_created_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opening a relative URL creates the file (and its folder) under the current directory."""
    monkeypatch.chdir(tmp_path)
    store = sqlite_store("sqlite:///sub/dir/rel.db")
    store.start()
    store.stop()
    assert (tmp_path / "sub" / "dir" / "rel.db").is_file()


def test_synchronous_option() -> None:
    """?synchronous=NORMAL selects that fsync policy; the default is FULL; case does not matter."""
    assert sqlite_store("sqlite:///x.db").synchronous == "FULL"
    assert sqlite_store("sqlite:///x.db?synchronous=NORMAL").synchronous == "NORMAL"
    assert sqlite_store("sqlite:///x.db?synchronous=off").synchronous == "OFF"
    assert sqlite_store("sqlite:////abs/x.db?synchronous=EXTRA").path == "/abs/x.db"


def test_synchronous_is_applied_to_the_connection(tmp_path: Path) -> None:
    """The synchronous option is the PRAGMA the store's connection actually runs with."""
    store = sqlite_store(f"sqlite:///{tmp_path}/x.db?synchronous=NORMAL")
    store.start()
    try:
        value = store.submit(
            lambda c: c.execute("PRAGMA synchronous").fetchone()[0], write=False
        ).result()
    finally:
        store.stop()
    assert value == 1  # NORMAL


def test_bad_synchronous_value_is_a_config_error() -> None:
    """An unknown synchronous value is refused with a ConfigError naming the allowed values."""
    with pytest.raises(perdure.ConfigError, match="NORMAL"):
        open_store("sqlite:///x.db?synchronous=sometimes", environ={})


def test_unknown_query_option_is_a_config_error() -> None:
    """A query option the store does not know is refused, naming the option."""
    with pytest.raises(perdure.ConfigError, match="journal"):
        open_store("sqlite:///x.db?journal=delete", environ={})


@pytest.mark.parametrize(
    "url",
    ["mysql://localhost/db", "redis://x", "file:///tmp/x.db", "just/a/path.db", "x.db"],
)
def test_unknown_scheme_is_a_one_line_config_error(url: str) -> None:
    """A URL whose scheme is not supported raises a one-line ConfigError that shows a valid form."""
    with pytest.raises(perdure.ConfigError) as info:
        open_store(url, environ={})
    message = str(info.value)
    assert "\n" not in message
    assert url in message
    assert "sqlite:///" in message


def test_postgres_scheme_selects_the_postgres_store() -> None:
    """postgres:// and postgresql:// URLs give a PostgresStore; `?schema=` picks its schema."""
    require("postgres")
    from perdure.store.postgres import PostgresStore

    store = open_store(
        "postgres://ana:secret@db.example/app?schema=billing&sslmode=disable", environ={}
    )
    assert isinstance(store, PostgresStore)
    assert store.schema == "billing"
    assert "secret" not in store.url and "ana:***@" in store.url
    assert store.conninfo == "postgresql://ana:secret@db.example/app?sslmode=disable"
    assert store.prepare_threshold == 5  # server-side prepared statements by default
    default = open_store("postgresql://user@host/db", environ={})
    assert isinstance(default, PostgresStore) and default.schema == "perdure"
    pooled = open_store("postgresql://user@host/db?pooler=transaction", environ={})
    assert isinstance(pooled, PostgresStore) and pooled.prepare_threshold is None
    assert "pooler" not in pooled.conninfo


def test_postgres_schema_must_be_a_plain_identifier() -> None:
    """A schema name that is not a plain lower-case identifier is refused before connecting."""
    require("postgres")
    with pytest.raises(perdure.ConfigError, match="schema"):
        open_store("postgresql://user@host/db?schema=Robert');DROP", environ={})


def test_host_in_sqlite_url_is_a_config_error() -> None:
    """sqlite://host/x.db (two slashes) is refused with a hint about three slashes."""
    with pytest.raises(perdure.ConfigError, match="three slashes"):
        open_store("sqlite://rel.db", environ={})


def test_sqlite_url_without_a_path_is_a_config_error() -> None:
    """sqlite:/// with no file name is refused."""
    with pytest.raises(perdure.ConfigError, match="names no file"):
        open_store("sqlite:///", environ={})


def test_perdure_db_env_var_is_used_when_no_url_is_given() -> None:
    """Without a URL, PERDURE_DB from the given environment names the store."""
    env = {"PERDURE_DB": "sqlite:////srv/perdure.db"}
    assert store_url(None, env) == "sqlite:////srv/perdure.db"
    assert sqlite_store(None, env).path == "/srv/perdure.db"


def test_explicit_url_wins_over_env_var() -> None:
    """An explicit URL is used even when PERDURE_DB is set."""
    env = {"PERDURE_DB": "sqlite:////srv/perdure.db"}
    assert store_url("sqlite:///mine.db", env) == "sqlite:///mine.db"
    assert sqlite_store("sqlite:///mine.db", env).path == "mine.db"


def test_default_url_without_env_var() -> None:
    """With neither URL nor PERDURE_DB the embedded default under .perdure/ is used."""
    assert store_url(None, {}) == DEFAULT_URL
    assert sqlite_store(None, {}).path == ".perdure/perdure.db"


def test_bad_env_var_is_a_config_error() -> None:
    """A PERDURE_DB with an unsupported scheme fails the same way as an explicit bad URL."""
    with pytest.raises(perdure.ConfigError, match="unknown scheme"):
        open_store(None, environ={"PERDURE_DB": "mongodb://x"})


def test_app_reads_perdure_db_from_the_process_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """perdure.App() with no URL uses the PERDURE_DB environment variable."""
    url = f"sqlite:///{tmp_path}/env.db"
    monkeypatch.setenv("PERDURE_DB", url)
    app = perdure.App()
    try:
        assert app.url == url
        assert app.list_runs() == []
    finally:
        app.close()
    assert (tmp_path / "env.db").is_file()
