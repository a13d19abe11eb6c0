"""A once intent whose acknowledgement a partition holds up past the lease: the worker
never runs the body when the answer finally comes (another worker has parked the run
by then), made for real: the worker in a network namespace, its server's answers
dropped (iptables) while the server holds the intent (a trigger sleeps in its insert),
then healed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from extras_needed import needs

pytest.importorskip("psycopg", reason=needs("postgres"))

import psycopg
from netns import Hosts
from private_pg import PrivateServer, served_hosts

from waits import wait_for

LEASE = 2.0
HOLD = 2.0  # seconds the server holds pay's intent before committing it
APP = textwrap.dedent(
    """
    import os, time
    from pathlib import Path
    import perdure

    app = perdure.App(os.environ["LA_DB"])
    HERE = Path(os.environ["LA_DIR"])

    @app.step(name="wait", effect="keyed")
    def wait() -> None:
        (HERE / "waiting").write_text("")
        while not (HERE / "go").exists():
            time.sleep(0.01)

    @app.step(name="pay", effect="once")
    def pay() -> None:
        with open(HERE / "paid", "a") as out:
            out.write(f"{os.getpid()}\\n")

    @app.workflow(name="late")
    def late() -> str:
        wait()
        pay()
        return "done"
    """
)


@pytest.fixture
def host_and_server() -> Iterator[tuple[Hosts, PrivateServer]]:
    with served_hosts(1) as made:
        yield made


def hold_the_intent(url: str, schema: str) -> None:
    """Make the server hold the insert of pay's intent for HOLD seconds before it commits."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            f'CREATE FUNCTION "{schema}".hold_pay() RETURNS trigger LANGUAGE plpgsql AS $$ '
            "BEGIN IF NEW.kind = 'step.intent' AND NEW.name = 'pay' THEN "
            f"PERFORM pg_sleep({HOLD}); END IF; RETURN NEW; END $$"
        )
        conn.execute(
            f'CREATE TRIGGER hold_pay BEFORE INSERT ON "{schema}".journal '
            f'FOR EACH ROW EXECUTE FUNCTION "{schema}".hold_pay()'
        )


def intent_held(url: str) -> bool:
    """A session of the server sleeps in hold_pay: pay's intent reached it, uncommitted."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep' "
            "AND pid <> pg_backend_pid()"
        ).fetchone()
    return bool(row and row[0])


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.timeout(300)
def test_a_once_intent_acknowledged_after_the_lease_never_runs_its_body(
    host_and_server: tuple[Hosts, PrivateServer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hosts, server = host_and_server
    [host] = hosts.hosts
    schema = "late_ack"
    (tmp_path / "late_app.py").write_text(APP)
    env = {**os.environ, "LA_DIR": str(tmp_path), "PYTHONPATH": str(tmp_path),
           "PYTHONUNBUFFERED": "1"}  # fmt: skip
    env.pop("PERDURE_DB", None)
    inside = f"postgresql://postgres@{host.server}:{server.port}/postgres?schema={schema}"
    outside = f"{server.url}?schema={schema}"
    worker = [sys.executable, "-m", "perdure", "--app", "late_app:app", "worker",
              "--lease", str(LEASE), "--concurrency", "1"]  # fmt: skip
    procs: list[subprocess.Popen[bytes]] = []

    def spawn(name: str, url: str, prefix: list[str]) -> subprocess.Popen[bytes]:
        with open(tmp_path / f"{name}.log", "wb") as log:
            proc = subprocess.Popen([*prefix, *worker], cwd=tmp_path, env={**env, "LA_DB": url},
                                    stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
        procs.append(proc)
        return proc

    def journal() -> list[tuple[str, str]]:
        with psycopg.connect(server.url, autocommit=True) as conn:
            rows = conn.execute(
                f'SELECT kind, name FROM "{schema}".journal ORDER BY seq'
            ).fetchall()
        return [(str(k), str(n)) for k, n in rows]

    def status() -> str:
        with psycopg.connect(server.url, autocommit=True) as conn:
            row = conn.execute(f'SELECT status FROM "{schema}".runs').fetchone()
        return str(row[0]) if row else ""

    try:
        spawn("a", inside, host.run)  # worker A, on the host the partition will cut off
        sys.path.insert(0, str(tmp_path))
        monkeypatch.setenv("LA_DB", outside)
        monkeypatch.setenv("LA_DIR", str(tmp_path))
        try:
            import late_app  # the app as its workers build it

            late_app.app.start("late", run_id="r1")
        finally:
            sys.path.remove(str(tmp_path))
        wait_for("A to run the first step", (tmp_path / "waiting").exists, timeout=60, every=0.05)
        hold_the_intent(server.url, schema)
        (tmp_path / "go").write_text("")  # A writes pay's intent; the server holds it
        wait_for(
            "the server to hold pay's intent",
            lambda: intent_held(server.url),
            timeout=30,
            every=0.05,
        )
        # cut now, while the intent is at the server: it lands, its answer is lost. (Cut
        # before the write, a statement of A's own loops sent in the same instant could
        # take both its connections' answers with it, and the intent would never be sent.)
        hosts.partition(host, "server cannot answer")
        wait_for(
            "pay's intent to land",
            lambda: ("step.intent", "pay") in journal(),
            timeout=30,
            every=0.05,
        )
        spawn("b", outside, [])  # B takes the run over once A's lease has run out
        wait_for("B to park the run", lambda: status() == "needs_attention", timeout=60, every=0.05)
        hosts.heal(host)
        a_log = tmp_path / "a.log"
        wait_for("A to hear its intent's answer",
                 lambda: "not starting it" in a_log.read_text() or (tmp_path / "paid").exists(),
                 timeout=120, every=0.05)  # fmt: skip
        time.sleep(1.0)
        assert not (tmp_path / "paid").exists(), "A ran the once body after losing its lease"
        journaled = journal()
        assert ("step.needs_attention", "pay") in journaled, json.dumps(journaled)
        assert "may have ended before step 'pay'" in a_log.read_text()
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(30)
        late_app_module = sys.modules.pop("late_app", None)
        if late_app_module is not None:
            late_app_module.app.close()
