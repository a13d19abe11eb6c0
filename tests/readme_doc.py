"""README.md and the docs pages as data: their fenced code blocks, the heading each sits
under, and their markers.

A marker is an HTML comment on the lines right before a fence (blank lines may
separate them; several markers before one fence are merged):

    <!-- readme: setup=stubs check=checkout-completes -->

Its words are `key` or `key=value` (shell quoting: `reason="needs a key"`). Which
keys exist and what they mean is the vocabulary at the top of tests/test_readme.py;
this module only reads them, and refuses an unknown key, a marker that sits before
no block and an unclosed fence, so a typo cannot silently turn a check off.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"

# key -> whether it takes a value (None: it may)
KEYS: dict[str, bool | None] = {
    "no-run": False,
    "reason": True,
    "name": True,
    "setup": True,
    "continues": None,
    "wrap": True,
    "check": True,
    "stores": True,
    "env": True,
    "exit": True,
    "expect": True,
    "background": False,
    "synopsis": False,
}

MARKER = re.compile(r"^<!--\s*readme\b(?P<body>.*?)-->\s*$")
FENCE = re.compile(r"^(?P<fence>```+)\s*(?P<lang>[\w+-]*)\s*$")


class ReadmeError(Exception):
    """Raised when a document's blocks or markers cannot be read as declared."""


@dataclass(frozen=True)
class Block:
    """One fenced code block of the README or of a docs page."""

    index: int  # its place among its document's blocks
    lang: str  # as written after the fence; "" for a plain block
    line: int  # document line of the opening fence (1-based)
    heading: str  # the nearest heading above it
    source: str
    markers: dict[str, str] = field(default_factory=dict)
    doc: str = "README.md"  # its document, relative to the repository's root

    @property
    def at(self) -> str:
        """`document:line` of the opening fence, as failures name it."""
        return f"{self.doc}:{self.line}"

    @property
    def path(self) -> Path:
        """The document's file, under whose name its code is compiled."""
        return ROOT / self.doc

    @property
    def first_line(self) -> int:
        """Document line of the block's first line of code."""
        return self.line + 1

    @property
    def id(self) -> str:
        slug = re.sub(r"[^a-z0-9]+", "-", self.heading.lower()).strip("-")
        page = "" if self.doc == "README.md" else self.doc.removesuffix(".md") + ":"
        return f"{page}{slug or 'top'}:L{self.line}"

    def has(self, key: str) -> bool:
        return key in self.markers

    def names(self, key: str) -> list[str]:
        """The comma-separated values of `key` (e.g. `setup=app,stubs`)."""
        value = self.markers.get(key, "")
        return [name for name in value.split(",") if name]

    def lines(self) -> list[tuple[int, str]]:
        """(document line, text) for every line of the block."""
        return [(self.first_line + i, text) for i, text in enumerate(self.source.splitlines())]


def parse_marker(body: str, line: int, doc: str = "README.md") -> dict[str, str]:
    """The keys of one marker comment's body (what follows `readme`)."""
    body = body.strip()
    if not body.startswith(":"):
        raise ReadmeError(f"{doc}:{line}: a marker reads `<!-- readme: key=value ... -->`")
    try:
        words = shlex.split(body[1:])
    except ValueError as exc:
        raise ReadmeError(f"{doc}:{line}: marker does not parse ({exc})") from None
    found: dict[str, str] = {}
    for word in words:
        key, has_value, value = word.partition("=")
        if key not in KEYS:
            known = ", ".join(KEYS)
            raise ReadmeError(f"{doc}:{line}: unknown marker key {key!r} (known: {known})")
        takes = KEYS[key]
        if (takes is not None and bool(has_value) != takes) or (has_value and not value):
            form = {True: f"{key}=VALUE", False: key, None: f"{key}[=VALUE]"}[takes]
            raise ReadmeError(f"{doc}:{line}: marker key {key!r} is written `{form}`")
        if key in found:
            raise ReadmeError(f"{doc}:{line}: marker key {key!r} given twice")
        found[key] = value
    if not found:
        raise ReadmeError(f"{doc}:{line}: empty marker")
    return found


def parse(text: str, doc: str = "README.md") -> list[Block]:
    """Every fenced block of a Markdown document, with its heading and markers."""
    blocks: list[Block] = []
    heading = ""
    pending: dict[str, str] = {}
    pending_line = 0
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        number, raw = i + 1, lines[i]
        marker = MARKER.match(raw.strip())
        fence = FENCE.match(raw)
        if raw.lstrip().startswith("<!--") and "readme" in raw and marker is None:
            raise ReadmeError(f"{doc}:{number}: a marker is one line `<!-- readme: ... -->`")
        if marker:
            for key, value in parse_marker(marker.group("body"), number, doc).items():
                if key in pending:
                    raise ReadmeError(f"{doc}:{number}: marker key {key!r} given twice")
                pending[key] = value
            pending_line = pending_line or number
        elif fence:
            close = fence.group("fence")
            body: list[str] = []
            i += 1
            while i < len(lines) and lines[i].rstrip() != close:
                body.append(lines[i])
                i += 1
            if i == len(lines):
                raise ReadmeError(f"{doc}:{number}: the code block opened here never closes")
            source = "\n".join(body) + "\n"
            blocks.append(
                Block(len(blocks), fence.group("lang"), number, heading, source, pending, doc)
            )
            pending, pending_line = {}, 0
        elif raw.strip():
            if pending:
                raise ReadmeError(f"{doc}:{pending_line}: marker is not right before a code block")
            if raw.startswith("#"):
                heading = raw.lstrip("#").strip()
        i += 1
    if pending:
        raise ReadmeError(f"{doc}:{pending_line}: marker is not right before a code block")
    return blocks


def readme_blocks() -> list[Block]:
    """The blocks of the repository's README.md."""
    return parse(README.read_text(encoding="utf-8"))


def documents() -> list[Path]:
    """README.md and every Markdown page of the docs site."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def document_blocks() -> dict[str, list[Block]]:
    """The blocks of README.md and of every docs page, by document (relative path)."""
    found: dict[str, list[Block]] = {}
    for path in documents():
        doc = path.relative_to(ROOT).as_posix()
        found[doc] = parse(path.read_text(encoding="utf-8"), doc)
    return found
