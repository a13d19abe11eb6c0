"""A PostgreSQL server of a test's own: initdb in a temp folder, its own port, restarted
or killed as the test likes (never the machine's server, which other suites use)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from netns import Hosts, missing

from local_servers import free_port


def _pg_bin(name: str) -> str | None:
    """The PostgreSQL server program `name` (initdb, pg_ctl), on PATH or in Debian's place."""
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: p.parent.name)
    for bin_dir in reversed(versions):
        if (bin_dir / name).exists():
            return str(bin_dir / name)
    return None


class PrivateServer:
    """A throwaway PostgreSQL cluster of this test's own (initdb in a temp dir, its own port).

    The test restarts its server mid-run: that must never be the machine's server, which
    other suites (CI, other checkouts) use at the same time. As root, the server programs
    run as the `postgres` user (PostgreSQL refuses to run as root).
    """

    def __init__(self, listen: tuple[str, ...] = (), trust: str = "") -> None:
        """`listen`: addresses besides 127.0.0.1 (e.g. the host ends of network namespaces'
        links); `trust`: a network (CIDR) whose clients connect without a password."""
        self.listen, self.trust = listen, trust
        self.initdb, self.pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            runuser = shutil.which("runuser")
            self.as_user = [runuser, "-u", "postgres", "--"] if runuser else []
        self.root = Path(tempfile.mkdtemp(prefix="perdure-chaos-pg-"))
        self.data = self.root / "data"
        self.port = 0
        self.url = ""

    def missing(self) -> str | None:
        """Why this machine cannot run a private server, or None."""
        if self.initdb is None or self.pg_ctl is None:
            return "needs PostgreSQL's initdb and pg_ctl (apt-get install postgresql)"
        if os.geteuid() == 0 and not self.as_user:
            return "running as root needs runuser to start PostgreSQL as the postgres user"
        return None

    def _run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run a server program; a failure names its output and the server log's tail."""
        try:
            return subprocess.run(
                [*self.as_user, *args], check=True, capture_output=True, text=True, timeout=timeout
            )
        except subprocess.CalledProcessError as exc:
            tail = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise RuntimeError(
                f"{' '.join(args[:1] + args[-1:])} failed ({exc.returncode}): "
                f"{exc.stdout}{exc.stderr}\nserver log:\n{tail}"
            ) from None

    def init(self) -> None:
        if self.as_user:
            shutil.chown(self.root, user="postgres")
        assert self.initdb is not None
        self._run(self.initdb, "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8")
        if self.trust:
            with (self.data / "pg_hba.conf").open("a") as hba:
                hba.write(f"host all all {self.trust} trust\n")

    def _options(self) -> str:
        addresses = ",".join(("127.0.0.1", *self.listen))
        return f"-p {self.port} -c listen_addresses={addresses} -k {self.root}"

    def start(self) -> None:
        assert self.pg_ctl is not None
        for attempt in range(5):  # another process may take the free port first
            self.port = free_port()
            try:
                self._run(self.pg_ctl, "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60",
                          "-o", self._options(), "start")  # fmt: skip
                break
            except RuntimeError:
                if attempt == 4:
                    raise
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    @property
    def log(self) -> Path:
        return self.root / "server.log"

    def restart(self, mode: str = "fast") -> None:
        """Shut down (`fast`: every session is cut; `immediate`: no checkpoint, crash
        recovery at start), then start again on the same port."""
        assert self.pg_ctl is not None
        self._run(self.pg_ctl, "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60",
                  "-m", mode, "-o", self._options(), "restart")  # fmt: skip

    def kill_postmaster(self) -> None:
        """kill -9 of the postmaster (its backends notice and exit), then start again."""
        assert self.pg_ctl is not None
        pid = int((self.data / "postmaster.pid").read_text().split()[0])
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while True:  # start refuses while the old backends still hold shared memory
            try:
                self._run(self.pg_ctl, "-D", str(self.data), "-l", str(self.log), "-w", "-t",
                          "60", "-o", self._options(), "start")  # fmt: skip
                return
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def destroy(self) -> None:
        if self.pg_ctl is not None and (self.data / "postmaster.pid").exists():
            subprocess.run([*self.as_user, self.pg_ctl, "-D", str(self.data), "-m", "immediate",
                            "-w", "stop"], capture_output=True, timeout=60)  # fmt: skip
        shutil.rmtree(self.root, ignore_errors=True)


def pg_up(url: str) -> bool:
    import psycopg

    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


def wait_pg_up(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not pg_up(url):
        if time.monotonic() > deadline:
            raise RuntimeError(f"PostgreSQL at {url} did not come back within {timeout}s")
        time.sleep(0.2)


def restart_postgres(server: PrivateServer) -> float:
    """Restart the test's server (fast shutdown: every session is cut); seconds until it answers."""
    started = time.monotonic()
    server.restart()
    wait_pg_up(server.url, 60)
    return time.monotonic() - started


@contextlib.contextmanager
def served_hosts(count: int, log_to: Path | None = None) -> Iterator[tuple[Hosts, PrivateServer]]:
    """`count` network namespaces, then a private server listening on their links' host
    ends (its log copied to `log_to` at the end); a machine that cannot make them fails."""
    why = missing()
    if why is not None:
        pytest.fail(why)  # the fault suites run in CI as root: a machine without this fails
    hosts = Hosts(count)
    server = PrivateServer(listen=tuple(h.server for h in hosts.hosts), trust=hosts.network)
    try:
        hosts.create()
        server.init()
        server.start()
        wait_pg_up(server.url, 60)
        yield hosts, server
    finally:
        if log_to is not None and server.log.exists():
            log_to.write_bytes(server.log.read_bytes())
        server.destroy()
        hosts.destroy()
