"""The README's main command end to end: the inbox agent demo, with a worker killed mid-run.

Asserts on the protocol (files, templates) and the journal, never on the wording of
a summary. The local model (SmolLM2 on llama.cpp) needs `scripts/setup.sh local`.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

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
    demo = _demo()
    outcome = demo.run_demo(model, tmp_path / "demo", timeout=240.0)
    names = list(demo.SAMPLES)
    assert set(outcome.statuses) == set(names)  # the identical copy started no third run
    assert set(outcome.statuses.values()) == {"completed"}
    for name in names:
        text = outcome.summaries[name]
        assert text.startswith(f"# {name}\n") and "\nsource: " in text and "\nwritten: " in text
        body = text.split("\n---\n")[0].removeprefix(f"# {name}\n").strip()
        assert body, f"the model's summary of {name} is empty"
    # the first file was summarised before the kill: the new worker never asked the model again
    assert outcome.model_calls[names[0]] == 1
    assert outcome.model_calls[names[1]] == 1  # one journaled model call for the killed run too
    if outcome.killed_during == "running":
        assert names[1] in outcome.recovered  # taken over from the killed worker's lease
    assert names[0] not in outcome.recovered
    print(f"\ndemo ({model}): killed while the second run was {outcome.killed_during}; "
          f"model calls {outcome.model_calls}; recovered {outcome.recovered}")  # fmt: skip
