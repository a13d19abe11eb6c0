"""The dashboard screenshots the docs show, made by the browser tests.

tests/server/test_dashboard_browser.py takes them on every run (`shoot`), into
docs/images/dashboard/, so they follow the dashboard and cannot go stale silently; a docs
page shows one as `![alt](../images/dashboard/NAME.png)`. tests/docs/test_site.py fails
if a page shows one that is missing, and the browser test fails if a page shows one it
did not make. To refresh them after a dashboard change, run the browser test and commit
the PNGs it rewrote:

    PYTHONPATH=$PWD/src .venv/bin/pytest tests/server/test_dashboard_browser.py -q
    git add docs/images/dashboard
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from PIL import Image
    from playwright.sync_api import Page, ViewportSize

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SCREENSHOTS = DOCS / "images" / "dashboard"
VIEWPORT: ViewportSize = {"width": 1200, "height": 800}  # what a docs page shows; small PNGs
COLOURS = 256  # a palette: small PNGs; fewer would lose small accents (the green "live")
SHOWN = re.compile(r"images/dashboard/([\w.-]+\.png)")


def shown_in_docs() -> set[str]:
    """The names of the screenshots that the docs pages and the README show."""
    pages = [*DOCS.rglob("*.md"), ROOT / "README.md"]
    return {name for page in pages for name in SHOWN.findall(page.read_text(encoding="utf-8"))}


def shoot(page: Page, name: str, top: str | None = None) -> str:
    """Save what the page's viewport shows as docs/images/dashboard/NAME.png; return NAME.png.
    `top`: a selector of what should be at the top of the picture (scrolled there)."""
    file = f"{name}.png"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    if top is not None:
        page.locator(top).evaluate("element => element.scrollIntoView()")
    shot = page.screenshot(animations="disabled", caret="hide")
    small(shot).save(SCREENSHOTS / file, "PNG", optimize=True)
    return file


def small(png: bytes) -> Image.Image:
    """The picture in COLOURS colours, undithered: a third of the size, the same to the eye
    (the dashboard is flat colour and anti-aliased text)."""
    from PIL import Image

    picture = Image.open(io.BytesIO(png)).convert("RGB")
    return picture.quantize(COLOURS, Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
