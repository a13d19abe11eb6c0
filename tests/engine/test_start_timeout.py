"""`start(timeout=...)`: a bad timeout is refused in one line before anything is written."""

from __future__ import annotations

from pathlib import Path

import pytest

import perdure
from perdure.errors import ConfigError


@pytest.mark.parametrize("bad", [0, -1, "2", True])
def test_a_bad_start_timeout_is_refused(tmp_path: Path, bad: object) -> None:
    """timeout must be seconds above 0; the run is not created."""
    app = perdure.App(f"sqlite:///{tmp_path}/s.db")

    @app.workflow(name="w")
    def w() -> int:
        return 1

    with pytest.raises(ConfigError, match="timeout="):
        app.start("w", run_id="r", timeout=bad)  # type: ignore[arg-type]
    assert app.start("w", run_id="r", timeout=5).id == "r"
    assert [r.id for r in app.list_runs()] == ["r"]
    app.close()
