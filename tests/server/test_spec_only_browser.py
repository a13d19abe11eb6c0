"""A spec-only user (a folder with an agent spec and its store, no Python module) gets the
dashboard: `perdure serve --agent SPEC` and `perdure worker --agent SPEC` as real processes,
a run started with `perdure run SPEC`, and its tool call's approval answered in a real
headless Chromium, after which the worker writes the file and the run completes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from extras_needed import needs
from local_servers import free_port, wait_listening
from process_stops import stop_processes

pytest.importorskip("starlette", reason=needs("server"))
pytest.importorskip("playwright", reason=needs("dev"))

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
RUN_ID = "colour-1"

SPEC = """
name = "painter"
goal = "Write the colour down"
instructions = "Write it, then say so."

[models.fast]
provider = "scripted"
script = "script.json"

[tools]
grant = ["write_file", "finish"]
approval = ["write_file"]
write_paths = ["out"]
"""


def perdure(folder: Path, db: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "perdure", "--db", db, *args]


def test_serve_with_an_agent_spec_answers_its_approval_in_chromium(tmp_path: Path) -> None:
    """No --app anywhere: the dashboard served for the spec lists the gate of its run's
    write_file call; approving it in the browser lets the worker write the file."""
    assert Path(CHROMIUM).exists(), f"Debian's chromium is needed at {CHROMIUM}"
    from playwright.sync_api import expect, sync_playwright

    (tmp_path / "agent.toml").write_text(SPEC)
    target = tmp_path / "out" / "colour.txt"
    script = [
        {"content": "", "tool_calls": [
            {"name": "write_file", "arguments": {"path": str(target), "content": "blue"}}
        ]},
        "I wrote blue to the file.",
    ]  # fmt: skip
    (tmp_path / "script.json").write_text(json.dumps(script))
    db = f"sqlite:///{tmp_path}/agent.db"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("PERDURE_APP", None)

    def cli(*args: str) -> str:
        done = subprocess.run(perdure(tmp_path, db, *args), cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert cli("run", "agent.toml", "--id", RUN_ID).strip() == RUN_ID
    token = cli("token", "create", "ana", "--scope", "approve").strip().splitlines()[-1]
    port = free_port()
    logs = {name: (tmp_path / f"{name}.log").open("wb") for name in ("serve", "worker")}
    procs = [
        subprocess.Popen(perdure(tmp_path, db, "serve", "--agent", "agent.toml", "--port",
                                 str(port)), cwd=tmp_path, env=env, stdout=logs["serve"],
                         stderr=subprocess.STDOUT),
        subprocess.Popen(perdure(tmp_path, db, "worker", "--agent", "agent.toml", "--poll",
                                 "0.2"), cwd=tmp_path, env=env, stdout=logs["worker"],
                         stderr=subprocess.STDOUT),
    ]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_listening(port, procs[0], log=(tmp_path / "serve.log").read_text)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
            try:
                page = browser.new_context().new_page()
                errors: list[str] = []
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                page.goto(f"{url}/ui/approvals")
                page.fill("#token", token)
                page.click("button[type=submit]")
                # signed in where it was going, its tab key taken off the address by the
                # script: a goto before that cancels the load, the key is never stored and
                # every action is refused as not from a signed-in tab
                page.wait_for_url(f"{url}/ui/approvals")
                gate = page.locator("article.gate", has_text=RUN_ID)
                deadline = time.monotonic() + 60  # the worker reaches the gate
                while gate.count() == 0:
                    assert all(p.poll() is None for p in procs), (
                        tmp_path / "worker.log"
                    ).read_text()
                    assert time.monotonic() < deadline, (tmp_path / "worker.log").read_text()
                    time.sleep(0.5)
                    page.reload()
                expect(gate).to_contain_text("write_file")
                gate.locator("textarea[name=comment]").fill("blue it is")
                gate.locator("button[value=approve]").click()
                # the answer's POST and redirect on a loaded machine: more than the 5 s default
                expect(page.locator(".flash")).to_contain_text("approved", timeout=30_000)
                page.goto(f"{url}/ui/runs/{RUN_ID}")
                expect(page.locator("#run-status")).to_have_text("completed", timeout=60_000)
                expect(page.locator("#run-audit")).to_contain_text("blue it is", timeout=30_000)
                assert errors == []
            finally:
                browser.close()
    finally:
        stop_processes(procs, grace=10)
        for log in logs.values():
            log.close()
    assert target.read_text() == "blue"
    for name in ("serve", "worker"):  # each says on start which agent it took from the spec
        assert "; agent painter (no trigger" in (tmp_path / f"{name}.log").read_text()
