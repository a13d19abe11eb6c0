"""The dashboard shows stored ids and names made before the id rule (control and bidi
characters in them) escaped, so none can reorder, hide or break a page's text."""

from __future__ import annotations

import re
import sqlite3
import warnings
from collections.abc import Iterator
from urllib.parse import quote

import pytest

from extras_needed import needs

pytest.importorskip("starlette", reason=needs("server"))

import perdure
from perdure.agent.budget_sql import Budgets, UsageRow
from perdure.server import create_app, operations
from perdure.server.access import local_operator
from perdure.store.names import REFUSED

with warnings.catch_warnings():  # starlette 1.x prefers httpx2 for its TestClient; httpx works
    warnings.filterwarnings("ignore", message=".*httpx2", category=UserWarning)
    from starlette.testclient import TestClient

EVIL = "x\u202eevil\x1b[2J\u2066<b>\u200b"


def refused_in(html: str) -> list[str]:
    """Refused characters of a page, line breaks and tabs (HTML whitespace) aside."""
    return [
        f"U+{ord(c):04X}"
        for c in html
        if c not in "\n\t" and any(a <= ord(c) <= b for a, b in REFUSED)
    ]


@pytest.fixture
def signed_in(app: perdure.App, db_url: str) -> Iterator[TestClient]:
    """A dashboard signed in with a read token, over a store holding a run, an agent's budget
    and usage whose id and names break the rule (written straight into the file)."""

    @app.workflow(name="waits")
    async def waits() -> None:
        await perdure.wait_event("go")

    app.start("waits", run_id="r1")
    _, value = app.runtime.sync(
        operations.create_token(app, local_operator(), "ana", ["read"]), "tok"
    )
    app.runtime.sync(Budgets(app.runtime.store).ready(), "budgets")  # its tables, written below
    with sqlite3.connect(db_url.removeprefix("sqlite:///")) as db:
        db.execute("UPDATE runs SET id = ?, queue = ?, waiting_for = ?", (EVIL, EVIL, EVIL))
        db.execute("UPDATE journal SET run_id = ?", (EVIL,))
        db.execute(
            "INSERT INTO agent_budgets (agent, tokens_per_day, updated_at) VALUES (?, 5, 1)",
            (EVIL,),
        )
    usage = UsageRow(EVIL, 0, EVIL, "m", 10, 5, 0.01, app.clock.now())
    app.runtime.sync(
        Budgets(app.runtime.store).record_usage(usage), "usage"
    )  # usage rows take the agent's name as is
    with TestClient(create_app(app)) as client:
        page = client.get("/ui/login").text
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
        assert csrf is not None
        signed = client.post("/ui/login", data={"token": value, "csrf": csrf.group(1),
                             "next": "/ui/runs"}, follow_redirects=False)  # fmt: skip
        assert signed.status_code == 303
        yield client


@pytest.mark.parametrize("page", ["/ui/runs", "/ui/runs/" + quote(EVIL, safe=""), "/ui/agents"])
def test_old_ids_are_shown_escaped(signed_in: TestClient, page: str) -> None:
    """Each page with the old id answers 200, shows it as x\\u202eevil\\x1b[2J..., and holds no
    control, bidi or zero-width character anywhere (attributes and title included)."""
    answer = signed_in.get(page)
    assert answer.status_code == 200, answer.text
    assert refused_in(answer.text) == []
    assert "x\\u202eevil\\x1b[2J\\u2066&lt;b&gt;\\u200b" in answer.text


def test_ids_and_names_are_isolated_from_the_text_around_them(signed_in: TestClient) -> None:
    """The stylesheet isolates links, code and cells (a right-to-left id cannot move its
    neighbours) and a run's queue is in a <bdi>."""
    css = signed_in.get("/ui/static/perdure.css").text
    assert re.search(r"a, code, td, dd, bdi[^{]*\{ unicode-bidi: isolate; \}", css)
    page = signed_in.get("/ui/runs/" + quote(EVIL, safe="")).text
    assert "<dd><bdi>x\\u202eevil" in page
