"""The `local` model: SmolLM2-135M-Instruct on llama.cpp, started and stopped by perdure and
reached through the official openai SDK. Never asserts on wording: a 135M model is fluent,
not reliable."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from perdure.agent.local_model import LocalModel, LocalModelError, find_model_path

pytestmark = pytest.mark.slow  # needs scripts/setup.sh local (the test command installs it)

TEXT = """\
The nightly job upgraded twelve dependencies in the payments service.
Two of them broke the build because an API had been renamed.
The agent read the changelogs and patched both call sites.
All 418 tests passed on the second attempt.
A pull request was opened and assigned to the on-call reviewer."""


def _rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_local_model_summarises_through_the_openai_sdk() -> None:
    from openai import AsyncOpenAI

    lm = LocalModel()
    began = time.monotonic()
    lm.start()
    startup = time.monotonic() - began
    try:
        assert lm.running
        assert lm.base_url == f"http://127.0.0.1:{lm.port}/v1"
        pid, port = lm.pid, lm.port
        assert pid is not None and _port_open(port)
        assert lm.start() is lm  # idempotent while running

        async def ask() -> tuple[str, int, int, float]:
            client = AsyncOpenAI(base_url=lm.base_url, api_key="not-needed")
            try:
                t0 = time.monotonic()
                reply = await client.chat.completions.create(
                    model=lm.model,
                    messages=[
                        {"role": "system", "content": "You summarise text in one sentence."},
                        {"role": "user", "content": f"Summarise in one sentence:\n\n{TEXT}"},
                    ],
                    max_tokens=60,
                )
                seconds = time.monotonic() - t0
            finally:
                await client.close()
            assert reply.usage is not None
            text = reply.choices[0].message.content or ""
            timings.update((reply.model_extra or {}).get("timings") or {})  # llama.cpp's own
            return text, reply.usage.prompt_tokens, reply.usage.completion_tokens, seconds

        timings: dict[str, float] = {}
        text, prompt_tokens, completion_tokens, seconds = asyncio.run(ask())
        rss = _rss_mib(pid)
        print(
            f"\nlocal model: startup {startup:.2f} s; call {seconds:.2f} s, "
            f"{prompt_tokens} prompt + {completion_tokens} completion tokens, "
            f"{completion_tokens / seconds:.1f} tokens/s; server RSS "
            + (f"{rss:.0f} MiB" if rss is not None else "n/a")
            + (
                f"; server: prompt {timings['prompt_per_second']:.0f} tokens/s, "
                f"generation {timings['predicted_per_second']:.0f} tokens/s"
                if "predicted_per_second" in timings and "prompt_per_second" in timings
                else ""
            )
            + f"\nreply: {text!r}"
        )
        assert text.strip()
        assert prompt_tokens > 0 and completion_tokens > 0
    finally:
        lm.stop()
    lm.stop()  # safe twice
    assert not lm.running
    assert not _port_open(port)
    assert not _pid_alive(pid)


def test_the_model_file_ships_with_the_extra() -> None:
    path = find_model_path()
    assert path.suffix == ".gguf" and path.stat().st_size > 50_000_000


def test_a_broken_model_file_fails_with_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf file")
    lm = LocalModel(bad, startup_timeout=30)
    with pytest.raises(LocalModelError, match="did not start"):
        lm.start()
    assert not lm.running
    lm.stop()


def _gone(pid: int) -> bool:
    """Exited: no such process, or a zombie waiting for whoever adopted it to reap it."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return not _pid_alive(pid)
    return "\nState:\tZ" in status


def test_the_server_exits_when_the_worker_that_started_it_is_killed() -> None:
    script = (
        "from perdure.agent.local_model import ensure_local_model\n"
        "import time\n"
        "lm = ensure_local_model()\n"
        "assert ensure_local_model() is lm\n"
        "print(lm.pid, lm.port, flush=True)\n"
        "time.sleep(120)\n"
    )
    worker = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout is not None
        line = worker.stdout.readline()
        assert line, "the worker did not start the local model"
        pid, port = map(int, line.split())
        assert _port_open(port)
        worker.kill()  # SIGKILL: no atexit, no stop()
        worker.wait()
        deadline = time.monotonic() + 15
        while not _gone(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _gone(pid), "the server outlived the worker that started it"
        assert not _port_open(port)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
