"""Tokens: created once, stored hashed, scoped, revocable; the audit log records actions."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

import perdure
from perdure.cli.main import cli
from perdure.server.access import Principal, authenticate, digest, record
from perdure.server.access_sql import Access


def test_a_token_is_shown_once_stored_hashed_and_revocable(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/s.db"
    created = CliRunner().invoke(cli, ["--db", db, "token", "create", "ana", "--scope", "approve"])
    assert created.exit_code == 0, created.output
    token = created.output.strip().splitlines()[-1]
    assert token.startswith("pdr_")
    raw = b"".join(f.read_bytes() for f in tmp_path.glob("s.db*"))  # the file and its WAL
    assert token.encode() not in raw and digest(token).encode() in raw  # only the hash is kept
    app = perdure.App(db)
    try:
        who = app.runtime.sync(authenticate(app, f"Bearer {token}"), "auth")
        assert who == Principal("ana", frozenset({"approve"}))
        assert who.allows("approve") and who.allows("read") and not who.allows("operate")
        assert app.runtime.sync(authenticate(app, "Bearer pdr_wrong"), "auth") is None
        assert app.runtime.sync(authenticate(app, token), "auth") is None  # not a bearer header
        token_id = created.output.split()[1]
        listing = CliRunner().invoke(cli, ["--db", db, "token", "ls"]).output
        assert token_id in listing and token not in listing
        revoked = CliRunner().invoke(cli, ["--db", db, "token", "revoke", token_id])
        assert revoked.output.strip() == f"{token_id}: revoked"
        assert app.runtime.sync(authenticate(app, f"Bearer {token}"), "auth") is None
        log = app.runtime.sync(Access(app.runtime.store).audit_log(), "audit")
        assert [r.action for r in log] == ["token.revoke", "token.create"]
        assert token not in json.dumps([r.detail for r in log])
    finally:
        app.close()


def test_admin_allows_everything_and_the_audit_log_pages(tmp_path: Path) -> None:
    app = perdure.App(f"sqlite:///{tmp_path}/s.db")
    try:
        assert Principal("root", frozenset({"admin"})).allows("approve")
        ids = [
            app.runtime.sync(record(app, "ana", "run.approve", f"run:r{i}", {"comment": "ok"}), "a")
            for i in range(5)
        ]
        page = app.runtime.sync(Access(app.runtime.store).audit_log(limit=2), "log")
        assert [r.id for r in page] == ids[:-3:-1]
        older = app.runtime.sync(
            Access(app.runtime.store).audit_log(limit=10, before=page[-1].id), "log"
        )
        assert [r.id for r in older] == ids[-3::-1]
        [one] = app.runtime.sync(Access(app.runtime.store).audit_log(target="run:r1"), "log")
        assert (one.actor, json.loads(one.detail)) == ("ana", {"comment": "ok"})
    finally:
        app.close()
