"""Tests that need an optional extra: they skip, naming the extra, where it is not installed
(`pytest.importorskip(module, reason=needs(extra))`); and, as a pytest plugin (tests/conftest.py
loads it), under CI=true (where every extra is installed) such a skip fails the session.

The reason names the extra and how to install it, so a contributor on a bare install sees
what a skipped module needs: `needs the server extra: pip install 'perdure[server]'`.
"""

from __future__ import annotations

import importlib.util
import os
import re
from typing import Any

import pytest

from perdure.extras import EXTRAS, FIND_ONLY

# Not runtime extras of perdure, but tools: pyproject's `dev` extra (schemathesis, playwright,
# PIL for the browser tests' screenshots, and jsonschema which schemathesis brings) and `docs`
# (mkdocs and its plugins, the site).
DEV = "dev"
TOOLS = {DEV: ("schemathesis", "playwright", "PIL"), "docs": ("mkdocs", "material", "mkdocstrings")}
SKIPPED = re.compile(r"needs the ([\w-]+) extra: pip install")


def needs(extra: str) -> str:
    """The skip reason of a test that needs `extra` (pyproject's name for it).

    Raises:
        KeyError: `extra` is not one of pyproject's extras.
    """
    if extra not in TOOLS and extra not in EXTRAS:
        raise KeyError(f"no extra named {extra!r}: one of {sorted(EXTRAS)} or {sorted(TOOLS)}")
    return f"needs the {extra} extra: pip install 'perdure[{extra}]'"


def require(extra: str, *modules: str) -> None:
    """Skip the calling test (the module, when called at its top) unless `modules` (default:
    every module of `extra`) can be imported; the find-only ones are only looked for."""
    for module in modules or TOOLS.get(extra) or EXTRAS[extra]:
        if module in FIND_ONLY:
            if importlib.util.find_spec(module) is None:
                pytest.skip(needs(extra), allow_module_level=True)
        else:
            pytest.importorskip(module, reason=needs(extra))


# -- the plugin: no skip for a missing extra under CI ------------------------------------------

_skipped: list[tuple[str, str]] = []


def _note(nodeid: str, longrepr: Any) -> None:
    text = str(longrepr[2] if isinstance(longrepr, tuple) else longrepr)
    if SKIPPED.search(text):
        _skipped.append((nodeid, text.removeprefix("Skipped: ")))


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.skipped:
        _note(report.nodeid, report.longrepr)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        _note(report.nodeid, report.longrepr)


def in_ci() -> bool:
    """Whether this session runs in CI (CI=true, as CI services and .ci/run set it)."""
    return os.environ.get("CI", "").lower() in ("true", "1")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _skipped and in_ci():
        terminalreporter.section("skipped for a missing extra, under CI=true", red=True)
        for nodeid, reason in _skipped:
            terminalreporter.line(f"{nodeid}: {reason}")


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _skipped and in_ci() and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
