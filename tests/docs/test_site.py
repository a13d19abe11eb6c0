"""The docs site: it builds with warnings as errors, every page is in its navigation, and
the README stays a short front door (its reference lives in the site)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dashboard_screenshots import SCREENSHOTS, shown_in_docs
from extras_needed import require

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README_MAX_LINES = 250


def nav_pages(nav: Any) -> set[str]:
    """Every page path an mkdocs.yml `nav` names, at any depth."""
    if isinstance(nav, str):
        return {nav}
    if isinstance(nav, list):
        return set().union(*(nav_pages(item) for item in nav))
    if isinstance(nav, dict):
        return set().union(*(nav_pages(value) for value in nav.values()))
    return set()


def load_nav() -> Any:
    require("docs", "yaml")
    import yaml

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    return config["nav"]


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    """`mkdocs build --strict` succeeds: no broken internal link or anchor, no page left out
    of the navigation, no API or CLI reference that fails to render."""
    require("docs")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "NO_MKDOCS_2_WARNING": "1"}
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(site)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    api = (site / "reference" / "api" / "index.html").read_text(encoding="utf-8")
    assert "perdure.App" in api and "current_step" in api and "Retry" in api
    assert "crash_after_intent" in api and "PerdureAgent" in api and "ClaudeAgent" in api
    cli = (site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    assert "perdure worker" in cli and "--concurrency" in cli and "Sentinel" not in cli
    http = (site / "reference" / "http-api" / "index.html").read_text(encoding="utf-8")
    assert "/api/v1/runs/{run_id}/resolve" in http and "schema-startrun" in http


def test_every_page_is_in_the_navigation() -> None:
    """A Markdown page under docs/ that the nav does not name would be unreachable."""
    listed = nav_pages(load_nav())
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert pages - listed == set(), "pages missing from mkdocs.yml's nav"
    assert listed - pages == set(), "nav names pages that do not exist"


def test_the_dashboard_screenshots_the_docs_show_exist() -> None:
    """Each dashboard screenshot a page shows is in docs/images/dashboard/ (the browser test
    tests/server/test_dashboard_browser.py remakes them; see tests/dashboard_screenshots.py),
    and none lies there unshown."""
    shown = shown_in_docs()
    assert len(shown) >= 5, shown
    there = {png.name for png in SCREENSHOTS.glob("*.png")}
    assert shown - there == set(), "shown but missing: run the dashboard browser test"
    assert there - shown == set(), "made but shown by no page"


def test_the_readme_is_short() -> None:
    """The README is a front door of at most README_MAX_LINES lines; the rest is the site."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"


@pytest.mark.parametrize(
    ("nav", "pages"),
    [
        ("a.md", {"a.md"}),
        ([{"A": "a.md"}, {"B": [{"C": "b/c.md"}, "d.md"]}], {"a.md", "b/c.md", "d.md"}),
    ],
)
def test_nav_pages_finds_every_depth(nav: Any, pages: set[str]) -> None:
    """The nav reader finds pages given bare or titled, at any nesting."""
    assert nav_pages(nav) == pages


def test_the_readmes_links_lead_somewhere() -> None:
    """README.md is not built by mkdocs, so its relative links are checked here: each names
    a file of the repository (a docs page, an example)."""
    import re

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    local = [link.split("#", 1)[0] for link in links if "://" not in link]
    assert len(local) >= 10, local
    missing = [link for link in local if link and not (ROOT / link).exists()]
    assert missing == [], missing


def test_the_first_workflow_is_the_example_file() -> None:
    """The first workflow the README and its tutorial show is examples/first_workflow/shop.py,
    as it is, so what a reader copies is what the example's tests run."""
    from readme_doc import document_blocks

    shop = (ROOT / "examples" / "first_workflow" / "shop.py").read_text(encoding="utf-8")
    documents = document_blocks()
    for doc in ("README.md", "docs/tutorials/first-workflow.md"):
        shown = [b.source for b in documents[doc] if b.markers.get("name") == "first-workflow"]
        assert shown == [shop], f"{doc} does not show examples/first_workflow/shop.py as it is"
