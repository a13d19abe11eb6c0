"""The CLI tests' store and app: a fresh SQLite file and a freshly imported `cli_app`."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from perdure.testing import TestClock

HERE = Path(__file__).parent


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """PERDURE_DB and PERDURE_APP for a fresh store, with a freshly imported app module."""
    monkeypatch.syspath_prepend(str(HERE))
    sys.modules.pop("cli_app", None)
    values = {"PERDURE_DB": f"sqlite:///{tmp_path}/cli.db", "PERDURE_APP": "cli_app:app"}
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    importlib.import_module("cli_app").app.clock = TestClock()
    yield values
    module = sys.modules.pop("cli_app", None)
    if module is not None:
        module.app.close()
