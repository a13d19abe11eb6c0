"""Every examples/*/README.md does what it says from a fresh clone: its ```bash blocks run in
one terminal at the clone's root (a block that cannot run here is marked `no-run` with its
reason, and only parsed), each `expect="TEXT"` a block declares is in what the session
printed, and the session leaves nothing running. first_workflow's README is followed by
test_first_workflow.py, which checks its journal too."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from newcomer import (
    ROOT,
    SHELL_LANGS,
    fresh_clone,
    run_session,
    script_of,
    shell_blocks,
)
from readme_doc import parse

EXAMPLES = ROOT / "examples"
FOLLOWED_ELSEWHERE = {"first_workflow": "tests/examples/test_first_workflow.py"}
READMES = sorted(EXAMPLES.glob("*/README.md"))
INLINE = re.compile(r"`([^`\n]+)`")


def examples_run_here() -> list[Path]:
    return [r for r in READMES if r.parent.name not in FOLLOWED_ELSEWHERE]


def test_every_example_has_a_readme_whose_blocks_are_declared() -> None:
    """Each example folder has a README with a block that runs; every fenced block is a
    shell block (`bash -n` parses it) and a no-run one says why."""
    folders = sorted(p for p in EXAMPLES.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert [p.parent for p in READMES] == folders, "an example without a README.md"
    assert set(FOLLOWED_ELSEWHERE) <= {p.name for p in folders}
    for readme in READMES:
        shown = readme.relative_to(ROOT)
        blocks = parse(readme.read_text(encoding="utf-8"))
        for block in blocks:
            at = f"{shown}:{block.line}"
            assert block.lang in SHELL_LANGS, f"{at}: a ```{block.lang} block nothing runs"
            assert block.has("no-run") == block.has("reason"), f"{at}: no-run needs its reason"
            assert len(block.markers.get("reason", "x" * 10)) >= 10, f"{at}: say why"
            parsed = subprocess.run(["bash", "-n"], input=block.source, capture_output=True,
                                    text=True)  # fmt: skip
            assert parsed.returncode == 0, f"{at}: bash -n: {parsed.stderr}"
        assert any(not b.has("no-run") for b in blocks), f"{shown}: no command runs"


def test_prose_names_no_venv_path_and_only_scripts_that_exist() -> None:
    """Inline code in a README's prose never runs `.venv/bin/...` (a fresh clone has no
    `.venv` until a block makes it), and each `bash scripts/X.sh` it names exists."""
    for readme in READMES:
        prose = re.sub(r"^```.*?^```", "", readme.read_text(encoding="utf-8"), flags=re.S | re.M)
        for span in INLINE.findall(prose):
            assert ".venv/bin/" not in span, f"{readme.relative_to(ROOT)}: `{span}` in prose"
            for script in re.findall(r"\bbash (scripts/\S+\.sh)", span):
                assert (ROOT / script).is_file(), f"{readme.relative_to(ROOT)}: `{span}`"


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One fresh clone the READMEs are followed in, one after the other (they share the
    `.venv` their set-up lines make)."""
    yield fresh_clone(tmp_path_factory.mktemp("examples"))


@pytest.mark.slow
@pytest.mark.parametrize("readme", examples_run_here(), ids=lambda p: p.parent.name)
def test_the_readme_runs_from_a_fresh_clone(readme: Path, clone: Path, tmp_path: Path) -> None:
    """The README's blocks run as written, print what they declare, and stop what they
    start."""
    blocks = shell_blocks(readme)
    session = run_session(clone, readme, blocks, tmp_path / "session.log")
    assert session.returncode == 0, (
        f"failed at {session.failed_at or '?'} (exit {session.returncode}):\n"
        f"{session.output[-6000:]}"
    )
    assert session.left_running == [], session.left_running
    for block in blocks:
        if block.has("expect") and not block.has("no-run"):
            assert block.markers["expect"] in session.output, (
                f"{readme.relative_to(ROOT)}:{block.line}: {block.markers['expect']!r} not "
                f"printed:\n{session.output[-6000:]}"
            )


# -- the harness bites -------------------------------------------------------------------

SAMPLE = """# Sample

```bash
echo one
```

<!-- readme: no-run reason="a placeholder that cannot run" -->
```bash
no-such-command --here
```

```bash
false
echo unreachable
```
"""


def test_a_failing_command_fails_the_session_naming_its_readme_line(tmp_path: Path) -> None:
    """No-run blocks are left out of the script; a failing line stops the session, and its
    README line is named."""
    readme = tmp_path / "README.md"
    readme.write_text(SAMPLE)
    blocks = shell_blocks(readme)
    script, _ = script_of(readme, blocks)
    assert "no-such-command" not in script and "echo one" in script
    session = run_session(tmp_path, readme, blocks, tmp_path / "session.log")
    assert session.returncode != 0 and session.failed_at == f"{readme}:13"
    assert "one" in session.output and "unreachable" not in session.output
    assert session.left_running == []


def test_a_process_left_running_is_reported_and_stopped(tmp_path: Path) -> None:
    """A background process the blocks never stop is named in `left_running` (and ended)."""
    readme = tmp_path / "README.md"
    readme.write_text("```bash\nsleep 600 &\necho started\n```\n")
    session = run_session(
        tmp_path, readme, shell_blocks(readme), tmp_path / "session.log", drain=1.0
    )
    assert session.returncode == 0
    assert [line.split(None, 1)[1] for line in session.left_running] == ["sleep 600"]
