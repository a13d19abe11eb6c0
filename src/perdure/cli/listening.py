"""Options both HTTP servers (`perdure serve`, `perdure mcp --http`) take about who may reach
them and how slow a client may be."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    from ..server.timeouts import ConnectionLimits

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
        "--body-deadline", default=60.0, show_default=True, metavar="SECONDS",
        type=click.FloatRange(min=0, min_open=True),
        help="Answer 408 and close when a request body is not complete this long after its "
        "headers, however steadily it trickles.",
    ),
    click.option(
        "--max-connections", default=1000, show_default=True, metavar="N",
        type=click.IntRange(min=1),
        help="Open connections at once; one more is answered 503 (a quarter of them at most "
        "may be sending a body without an Authorization header).",
    ),
    click.option(
        "--max-per-address", default=100, show_default=True, metavar="N",
        type=click.IntRange(min=1),
        help="Open connections from one client address (a --trusted-proxy excepted).",
    ),
    click.option(
        "--trusted-proxy", "trusted_proxies", multiple=True, metavar="ADDRESS",
        help="A proxy's address whose X-Forwarded-For/-Proto is believed (repeatable; default: "
        "none, every client is the address it connects from).",
    ),
)  # fmt: skip


def connection_limits(options: dict[str, Any]) -> ConnectionLimits:
    """The `ConnectionLimits` of a command's `listen_options` (its keyword arguments)."""
    from ..server.timeouts import ConnectionLimits

    names = ("header_timeout", "body_timeout", "body_deadline", "max_connections",
             "max_per_address", "trusted_proxies")  # fmt: skip
    return ConnectionLimits(**{name: options[name] for name in names})


def listen_options(command: F) -> F:
    """Add `--allowed-host`, `--header-timeout`, `--body-timeout`, `--body-deadline`,
    `--max-connections`, `--max-per-address`, `--trusted-proxy`."""
    for option in reversed(_OPTIONS):
        command = option(command)
    return command
