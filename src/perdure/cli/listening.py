"""Options both HTTP servers (`perdure serve`, `perdure mcp --http`) take about who may reach
them and how slow a client may be."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

_OPTIONS = (
    click.option(
        "--allowed-host", "allowed_hosts", multiple=True, metavar="NAME",
        help="A Host name (NAME or NAME:PORT) this server is also reached by, e.g. behind a "
        "proxy (repeatable; `*`: any). Others get 421, against DNS rebinding.",
    ),
    click.option(
        "--header-timeout", default=10.0, show_default=True, metavar="SECONDS",
        type=click.FloatRange(min=0, min_open=True),
        help="Close a connection whose request headers are not complete this long after "
        "its first byte.",
    ),
    click.option(
        "--body-timeout", default=30.0, show_default=True, metavar="SECONDS",
        type=click.FloatRange(min=0, min_open=True),
        help="Answer 408 and close when a request body sends no byte for this long.",
    ),
    click.option(
        "--max-connections", default=1000, show_default=True, metavar="N",
        type=click.IntRange(min=1),
        help="Open connections at once; one more is answered 503.",
    ),
)  # fmt: skip


def listen_options(command: F) -> F:
    """Add `--allowed-host`, `--header-timeout`, `--body-timeout`, `--max-connections`."""
    for option in reversed(_OPTIONS):
        command = option(command)
    return command
