"""The agent-history bench (figure A1) at a small size: every integration's run reaches the
gate, resumes from its journal without asking the model again, and journals the same bytes
for its 40th model call as for its first (no call stores the conversation before it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from extras_needed import require

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # bench/ is a top-level package beside src/, not installed

from bench import agent_history as ah  # noqa: E402

CALLS, TOKENS = 40, 8_000  # 800 characters a tool result; the last request ~8k tokens
GROWTH = 32  # bytes a call's entries may gain as its numbers (ids, positions) get digits
EXTRA = {"capability": "pydantic-ai", "wrapper": "pydantic-ai", "agents-sdk": "openai-agents"}


@pytest.mark.parametrize("integration", ah.INTEGRATIONS)
def test_bytes_per_call_stay_flat_and_the_run_resumes_from_its_journal(
    integration: str, tmp_path: Path
) -> None:
    """Every tool-calling model call journals about the same bytes beyond its tool result,
    from the first to the last; the journal is a fraction of the inputs sent; the resumed
    run (a fresh App) asked the model once, for the answer (`child` raises otherwise)."""
    if integration in EXTRA:
        require(EXTRA[integration])
    got = ah.child({"folder": str(tmp_path), "calls": CALLS, "tokens": TOKENS,
                    "integration": integration, "plain": False})  # fmt: skip
    sizes = got["per_call"]
    assert got["requests"] == CALLS and len(sizes) == CALLS - 1
    assert "read 40 results" in str(got["output"])
    assert min(sizes) > 0 and max(sizes) - min(sizes) <= GROWTH, sizes
    assert got["journal"] < got["payload"] + CALLS * (max(sizes) + 200)
    assert got["journal"] * 5 < got["whole"]  # the inputs repeat the history; the journal not


def test_per_call_counts_each_model_call_with_its_tool_and_sees_growth() -> None:
    """Segments start at each model call (its intent and outcome one segment), hold the tool
    entries after it, and leave the last call (the gate's) out; a journal that stored each
    call's growing input shows bytes per call growing."""

    def rows(grow: int) -> list[tuple[str, str, int]]:
        out: list[tuple[str, str, int]] = [("value.recorded", "uuid", 38)]
        for k in range(5):
            out += [("step.intent", "a.model", 30), ("step.outcome", "a.model", 300 + grow * k),
                    ("step.outcome", "a.tool.fetch", 1_020)]  # fmt: skip
        return [*out, ("step.outcome", "a.gate", 90)]

    assert ah.per_call(rows(0), 1_000) == [350] * 4
    assert ah.per_call(rows(500), 1_000) == [350, 850, 1_350, 1_850]


def test_the_bench_prints_its_table_with_temporals_limits(tmp_path: Path) -> None:
    """`python -m bench.agent_history` at a tiny size prints one row per size, the share of
    Temporal's limits beside."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.agent_history", "--calls", "5,12", "--tokens", "2000",
         "--integrations", "spec", "--plain-up-to", "0"],
        capture_output=True, text=True, cwd=ROOT, timeout=600,
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert "of Temporal's 50 MB / 51,200" in lines[2]
    rows = [line.split() for line in lines if line.startswith("spec ")]
    assert [r[1] for r in rows] == ["5", "12"]
    assert all(r[4] == "0.0%" for r in rows)  # far from Temporal's 50 MB
