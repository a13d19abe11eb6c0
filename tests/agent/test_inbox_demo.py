"""The README's main command end to end: the inbox agent demo, with a worker killed mid-run.

Asserts on the protocol (files, templates), the journal, and that every summary written
is grounded in its file (checked again here), never on the wording of a summary. The
local model (on llama.cpp) needs `scripts/setup.sh local`.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from extras_needed import require
from perdure.agent.facts import HEADING
from perdure.agent.grounding import unsupported

ROOT = Path(__file__).resolve().parents[2]


def _demo() -> ModuleType:
    spec = importlib.util.spec_from_file_location("inbox_demo", ROOT / "examples/inbox/demo.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["inbox_demo"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.parametrize(
    "model",
    ["scripted", "local"],  # local: scripts/setup.sh local (the test command installs it)
)
def test_the_inbox_demo_summarises_each_file_once_across_a_kill(tmp_path: Path, model: str) -> None:
    if model == "local":
        require("local")
    demo = _demo()
    outcome = demo.run_demo(model, tmp_path / "demo", timeout=240.0)
    names = list(demo.SAMPLES)
    assert set(outcome.statuses) == set(names)  # the identical copy started no third run
    assert set(outcome.statuses.values()) == {"completed"}
    for name in names:
        text = outcome.summaries[name]
        assert text.startswith(f"# {name}\n") and "\nsource: " in text and "\nwritten: " in text
        body = text.split("\n---\n")[0].removeprefix(f"# {name}\n").strip()
        source = (ROOT / "examples/inbox/samples" / name).read_text()
        claimed = body.replace(f"\n\n{HEADING}\n", "\n\n")  # the list's heading is ours
        assert body and unsupported(claimed, source) == [], f"{name}: {body}"  # checked again
        assert outcome.tiers[name] in ("local", "extractive")
        # the facts answer, then every summary journaled was checked once; the last held
        assert len(outcome.verdicts[name]) == outcome.model_calls[name] - 1 >= 1
        assert outcome.verdicts[name][-1].startswith("grounded")
    assert names[0] not in outcome.recovered  # finished before the kill: never asked again
    assert outcome.killed_during == "running"
    assert names[1] in outcome.recovered  # taken over from the killed worker
    # killed once a model answer (the facts) was journaled: replayed, not asked again
    assert outcome.replayed_answers >= 1
    assert any(line.startswith("model (position") for line in outcome.anew)
    if model == "scripted":
        assert outcome.model_calls == {names[0]: 2, names[1]: 2}
    print(f"\ndemo ({model}): tiers {outcome.tiers}; model calls {outcome.model_calls}; "
          f"recovered {outcome.recovered}")  # fmt: skip


def test_the_demo_stops_at_once_when_its_worker_dies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A worker that exits at start-up ends the demo in one line, with its log's last lines."""
    import subprocess

    demo = _demo()

    def dying_worker(workdir: Path, model: str, log: Path) -> subprocess.Popen[bytes]:
        out = open(log, "ab")  # noqa: SIM115 - the worker's log
        code = "import sys; print('ModuleNotFoundError: no module named starlette'); sys.exit(3)"
        return subprocess.Popen([sys.executable, "-c", code], stdout=out, stderr=out)

    monkeypatch.setattr(demo, "start_worker", dying_worker)
    with pytest.raises(SystemExit) as stopped:
        demo.run_demo("scripted", tmp_path / "demo", timeout=120.0)
    assert "the worker exited with code 3" in str(stopped.value)
    assert "no module named starlette" in capsys.readouterr().err
