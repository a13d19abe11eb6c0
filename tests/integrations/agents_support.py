"""Shared pieces of the OpenAI Agents SDK tests: the scripted OpenAI-compatible server of
tests/agent/wire_servers.py (loaded by path, its module name is taken there) and a model
pointed at it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

WIRE = Path(__file__).parent.parent / "agent" / "wire_servers.py"


def wire_servers() -> ModuleType:
    """tests/agent/wire_servers.py as a module (loaded once)."""
    name = "integrations_wire_servers"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, WIRE)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]
