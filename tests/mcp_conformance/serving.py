"""Real `perdure mcp --http` processes for the MCP tests: on a free port of 127.0.0.1, a store of
their own (SQLite, or a PostgreSQL database made and dropped for the test), tokens made first."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from local_servers import free_port
from perdure import App
from perdure.server.access import create_token, local_operator
from perdure.server.operations import revoke_token
from process_stops import stop_processes

if TYPE_CHECKING:
    from mcp import ClientSession

HERE = Path(__file__).parent
MODERN = "2026-07-28"
TASKS = "io.modelcontextprotocol/tasks"
ACCEPT = {"Accept": "application/json, text/event-stream"}


@dataclass
class Server:
    """One running `perdure mcp --http`: its URL (the endpoint), process and log."""

    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@dataclass
class Store:
    """A store the servers share, with a token per name (`tokens["a"]`)."""

    db: str
    folder: Path
    tokens: dict[str, str] = field(default_factory=dict)
    token_ids: dict[str, str] = field(default_factory=dict)
    servers: list[Server] = field(default_factory=list)
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def token(self, name: str, scopes: tuple[str, ...] = ("read", "operate", "approve")) -> str:
        maker = App(self.db)
        try:
            made = maker.runtime.sync(create_token(maker, name, list(scopes)), "token")
        finally:
            maker.close()
        self.token_ids[name], self.tokens[name] = made
        return made[1]

    def revoke(self, name: str) -> None:
        """Revoke the token `name` as an admin would (`perdure token revoke`)."""
        maker = App(self.db)
        try:
            done = revoke_token(maker, local_operator(), self.token_ids[name])
            maker.runtime.sync(done, "revoke")
        finally:
            maker.close()

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, "PERDURE_DB": self.db, "PYTHONUNBUFFERED": "1", **extra}

    def worker(
        self, *options: str, app: str = "mcp_app:app", **env: str
    ) -> subprocess.Popen[bytes]:
        """Start `perdure worker` (its output in worker-N.log), stopped with the servers."""
        log = self.folder / f"worker-{len(self.workers)}.log"
        argv = [sys.executable, "-m", "perdure", "--app", app, "worker", *options]
        with log.open("wb") as out:
            proc = subprocess.Popen(
                argv, cwd=HERE, env=self.env(**env), stdout=out, stderr=subprocess.STDOUT
            )
        self.workers.append(proc)
        return proc

    def serve(self, *options: str, worker: bool = True, app: str = "mcp_app:app") -> Server:
        """Start `perdure mcp --http` (with `--worker` unless told otherwise) and wait for it."""
        port = free_port()
        log = self.folder / f"mcp-{port}.log"
        env = self.env()
        argv = [sys.executable, "-m", "perdure", "--app", app, "mcp", "--http",
                "--port", str(port), *(["--worker"] if worker else []), *options]  # fmt: skip
        with log.open("wb") as out:
            proc = subprocess.Popen(argv, cwd=HERE, env=env, stdout=out, stderr=subprocess.STDOUT)
        server = Server(f"http://127.0.0.1:{port}/mcp", proc, log)
        self.servers.append(server)
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(server.url, timeout=2)
                return server
            except httpx.TransportError:
                pass
            assert proc.poll() is None, server.output()
            assert time.monotonic() < deadline, "perdure mcp did not come up"
            time.sleep(0.05)

    def stop(self) -> None:
        stop_processes([server.proc for server in self.servers] + self.workers, grace=20)


@contextmanager
def sqlite_store(folder: Path) -> Iterator[Store]:
    store = Store(f"sqlite:///{folder}/mcp.db", folder)
    try:
        yield store
    finally:
        store.stop()


@contextmanager
def postgres_store(folder: Path) -> Iterator[Store]:
    """A PostgreSQL database of its own on the machine's server, dropped afterwards."""
    import psycopg

    name = f"perdure_mcp_{os.getpid()}_{int(time.time() * 1000) % 10**9}"
    admin = "postgresql://postgres@127.0.0.1:5432/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    store = Store(f"postgresql://postgres@127.0.0.1:5432/{name}", folder)
    try:
        yield store
    finally:
        store.stop()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@asynccontextmanager
async def sdk_session(url: str, token: str, **options: Any) -> AsyncIterator[ClientSession]:
    """The official SDK's client session over Streamable HTTP with a bearer token, initialized
    (`options`: ClientSession's, e.g. a message_handler). Needs the mcp extra (imported here,
    as the conftest imports this module)."""
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(30, read=120)) as http,
        streamable_http_client(url, http_client=http) as (read, write, _),
        ClientSession(read, write, **options) as session,
    ):
        await session.initialize()
        yield session


def modern_meta(tasks: bool = True) -> dict[str, Any]:
    """The `_meta` every 2026-07-28 request carries (with the tasks extension declared)."""
    capabilities: dict[str, Any] = {"extensions": {TASKS: {}}} if tasks else {}
    return {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": capabilities,
    }


class Raw:
    """Raw JSON-RPC over HTTP with one token: 2026-07-28 requests, one POST each."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url
        self.http = httpx.Client(headers={"Authorization": f"Bearer {token}", **ACCEPT},
                                 timeout=30)  # fmt: skip
        self.next_id = 0

    def post(self, method: str, params: dict[str, Any] | None = None, *,
             tasks: bool = True, version: str = MODERN) -> httpx.Response:  # fmt: skip
        self.next_id += 1
        body = {"jsonrpc": "2.0", "id": self.next_id, "method": method,
                "params": {**(params or {}), "_meta": {**modern_meta(tasks),
                           "io.modelcontextprotocol/protocolVersion": version}}}  # fmt: skip
        headers = {"MCP-Protocol-Version": version, "Mcp-Method": method}
        if params and "taskId" in params:
            headers["Mcp-Name"] = str(params["taskId"])
        return self.http.post(self.url, json=body, headers=headers)

    def call(self, method: str, params: dict[str, Any] | None = None, **kw: Any) -> Any:
        """The result of a request that must succeed."""
        response = self.post(method, params, **kw)
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("application/json"), response.text
        body = response.json()
        assert "result" in body, body
        return body["result"]

    def error(self, method: str, params: dict[str, Any] | None = None, **kw: Any) -> Any:
        """The JSON-RPC error of a request that must fail."""
        body = self.post(method, params, **kw).json()
        assert "error" in body, body
        return body["error"]

    def until(self, task_id: str, done: Any, within: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + within
        while True:
            task: dict[str, Any] = self.call("tasks/get", {"taskId": task_id})
            if done(task):
                return task
            assert time.monotonic() < deadline, f"task {task_id}: {task}"
            time.sleep(0.05)

    def close(self) -> None:
        self.http.close()
