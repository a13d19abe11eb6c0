"""A real `perdure serve` or `perdure mcp --http` in a process of its own on 127.0.0.1, with a
token of each scope made through the CLI first (the security tests' server)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from extras_needed import require
from local_servers import free_port
from perdure import App
from perdure.server.access import create_token
from process_stops import stop_processes

HERE = Path(__file__).parent
SCOPES = ("read", "operate", "approve", "admin")
# The extra each served command needs: the HTTP server, MCP, a worker's metrics endpoint.
SERVES_WITH = {"serve": "server", "mcp": "mcp", "worker": "observe"}


@dataclass
class Served:
    """A running server: where it listens, its store, a token (and its id) per scope, its
    environment (for `perdure` commands on the same store) and its log."""

    url: str
    port: int
    db: str
    env: dict[str, str]
    log: Path
    tokens: dict[str, str] = field(default_factory=dict)
    token_ids: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    def client(self, scope: str | None = None, **kwargs: object) -> httpx.Client:
        """An HTTP client for the server, with the bearer token of `scope` if given."""
        headers = {"Authorization": f"Bearer {self.tokens[scope]}"} if scope else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=10, **kwargs)  # type: ignore[arg-type]

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def perdure(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`perdure ARGS` against the tests' app and store; fails the test if it fails."""
    done = subprocess.run(
        [sys.executable, "-m", "perdure", "--app", "sec_app:app", *args],
        cwd=HERE, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, f"perdure {' '.join(args)}: {done.stdout}{done.stderr}"
    return done


def make_token(env: dict[str, str], name: str, scope: str) -> tuple[str, str]:
    """(id, token) of a new token made with `perdure token create`."""
    out = perdure(env, "token", "create", name, "--scope", scope).stdout.splitlines()
    return out[0].split()[1], out[-1].strip()


def start(
    tmp_path: Path,
    command: list[str],
    health: str,
    extra_env: dict[str, str] | None = None,
    port_option: str = "--port",
) -> Iterator[Served]:
    """Start `perdure COMMAND --port P` (or another `port_option`) and wait until `health`
    answers (any status). The test skips without the extra the command serves with."""
    require(SERVES_WITH[command[0]])
    port = free_port()
    db = f"sqlite:///{tmp_path}/security.db"
    env = {**os.environ, "PERDURE_DB": db, "PYTHONUNBUFFERED": "1", **(extra_env or {})}
    served = Served(f"http://127.0.0.1:{port}", port, db, env, tmp_path / f"{command[0]}.log")
    maker = App(db)  # in this process: four `perdure token create` would take ~2 s
    try:
        for scope in SCOPES:
            made = maker.runtime.sync(create_token(maker, f"sec-{scope}", [scope]), "token")
            served.token_ids[scope], served.tokens[scope] = made
    finally:
        maker.close()
    with served.log.open("wb") as log:
        served.proc = subprocess.Popen(
            [sys.executable, "-m", "perdure", "--app", "sec_app:app", *command,
             port_option, str(port)],
            cwd=HERE, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(served.url + health, timeout=2)
                break
            except httpx.TransportError:
                pass
            assert served.proc.poll() is None, served.output()
            assert time.monotonic() < deadline, f"perdure {command[0]} did not come up"
            time.sleep(0.05)
        yield served
    finally:
        stop_processes([served.proc], grace=20)


@contextmanager
def worker_process(
    env: dict[str, str], log: Path, command: list[str], cwd: Path = HERE
) -> Iterator[subprocess.Popen[bytes]]:
    """A real `perdure COMMAND` (a worker, say) in `cwd` on the store of `env`, its output in
    `log`, stopped (SIGTERM) when the block ends."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "perdure", *command],
            cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        yield proc
    finally:
        stop_processes([proc], grace=20)


def worker(env: dict[str, str], log: Path) -> AbstractContextManager[subprocess.Popen[bytes]]:
    """A real `perdure worker` of the tests' app on the store of `env` (a served one's, or
    its own), its output in `log`, stopped (SIGTERM) when the block ends."""
    return worker_process(env, log, ["--app", "sec_app:app", "worker"])


def form_csrf(html: str) -> str:
    """The CSRF token a dashboard page's forms carry."""
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found, f"no form with a CSRF token on the page: {html[:300]}"
    return found.group(1)


def tab_key(location: str) -> str:
    """The tab key sign-in puts in its redirect's fragment (`/ui/runs#tab=pdt_...`)."""
    found = re.search(r"#tab=(pdt_[\w-]+)$", location)
    assert found, f"no tab key in the sign-in redirect {location!r}"
    return found.group(1)


def sign_in(served: Served, token: str) -> httpx.Client:
    """A browser-like client signed in to the dashboard with `token` (cookie perdure_session),
    sending the session's tab key with every request as the dashboard's script does."""
    client = served.client(follow_redirects=True)
    csrf = form_csrf(client.get("/ui/login").text)
    answer = client.post("/ui/login", data={"token": token, "csrf": csrf})
    assert answer.status_code == 200 and answer.url.path == "/ui/runs", answer.text[:300]
    client.headers["X-Perdure-Tab"] = tab_key(answer.history[0].headers["location"])
    return client
