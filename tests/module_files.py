"""Loading a test's app or helper file by path, as a module of its own (for files whose
folder is not importable, or whose name another folder's module already took)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType


def load_file(name: str, path: Path) -> ModuleType:
    """The Python file `path` run as a new module `name` (not put in sys.modules)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
