"""Issue 35 §11: a failed run's traceback (what the API and dashboard show of its error)
keeps the user's frames, their file names relative to the working directory, and names no
install path of the server (site-packages, the standard library, perdure's own files)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import perdure
from perdure.testing import TestWorker


def test_a_failed_runs_traceback_names_no_install_path(tmp_path: Path) -> None:
    # a name no other test's module has (an imported `shop` would be found in sys.modules)
    (tmp_path / "traced_shop.py").write_text(
        "import json\n\ndef parse(text):\n    return json.loads(text)\n"
    )
    sys.path.insert(0, str(tmp_path))
    cwd = os.getcwd()
    os.chdir(tmp_path)
    app = perdure.App(f"sqlite:///{tmp_path}/t.db")
    try:
        import traced_shop  # type: ignore[import-not-found]

        @app.workflow()
        def broken(text: str) -> object:
            return traced_shop.parse(text)

        handle = app.start(broken, "{")
        TestWorker(app).run_until_idle()
        run = app.get_run(handle.id)
        error = json.loads(run.error) if isinstance(run.error, str) else run.error
    finally:
        app.close()
        os.chdir(cwd)
        sys.path.remove(str(tmp_path))
        sys.modules.pop("traced_shop", None)
    text = json.dumps(error)
    assert 'File \\"traced_shop.py\\", line 4, in parse' in text, text
    for installed in ("site-packages", "/lib/python3", "perdure/engine", str(tmp_path)):
        assert installed not in text, (installed, text)
