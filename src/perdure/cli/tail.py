"""`perdure tail RUN`: print what a run's steps write to its stream (`perdure.stream`)."""

from __future__ import annotations

import functools
import json

import click

from ..engine.streams import StreamChunk, chunk_of
from ..observe.redact import Redactor
from ..store.names import escape
from . import render


@functools.cache
def redactor() -> Redactor:
    return Redactor()


def line(chunk: StreamChunk) -> str:
    """How a row prints: text chunks as they are, other data as JSON, markers in brackets."""
    if chunk.kind == "chunk":  # masked as every other view of a run masks it
        data = redactor().value(chunk.data)
        text = data if isinstance(data, str) else json.dumps(data)
        return text if chunk.topic == "out" else f"{chunk.topic}: {text}"
    data = chunk.data if isinstance(chunk.data, dict) else {}
    if chunk.kind == "dropped":
        return f"[{data.get('rows')} older row(s) dropped before offset {data.get('before')}]"
    what = f"step {data.get('step')!s} at {data.get('position')}, attempt {data.get('attempt')}"
    if chunk.kind == "retry":
        return f"[retry: {what}; what it wrote before is superseded]"
    return f"[{what}]"


class Joined:
    """Prints a stream as text: `out` text chunks run together as they were written (a
    model's tokens make its answer, not a line each), every other row on a line of its own."""

    def __init__(self, echo: object = None) -> None:
        self.echo = echo or _echo
        self.open = False  # text was printed that did not end its line

    def show(self, chunk: StreamChunk) -> None:
        if chunk.kind == "chunk" and chunk.topic == "out" and isinstance(chunk.data, str):
            text = redactor().text(chunk.data)  # masked as `line` masks every other row
            self.echo(text, False)  # type: ignore[operator]
            self.open = not text.endswith("\n")
            return
        self.close()
        self.echo(line(chunk), True)  # type: ignore[operator]

    def close(self) -> None:
        if self.open:
            self.echo("", True)  # type: ignore[operator]
            self.open = False


def _echo(text: str, end_line: bool) -> None:
    click.echo(escape(text, keep="\n"), nl=end_line)


@click.command("tail")
@click.argument("run_id")
@click.option("--follow", "-f", is_flag=True, help="Keep printing until the run is finished.")
@click.option("--after", default=-1, show_default=True, help="Start after this offset.")
@click.pass_context
def tail(ctx: click.Context, run_id: str, follow: bool, after: int) -> None:
    """What RUN's steps wrote to its stream, with a marker where each step attempt began (a
    `retry` marker when an attempt began again after a crash or a failure)."""
    from .main import get_app

    app = get_app(ctx, existing=True)
    handle = app.handle(run_id)
    joined = Joined()
    if follow:
        for chunk in handle.stream(after):
            joined.show(chunk)
        joined.close()
        render.echo(f"[run {run_id} is {handle.status()}]", err=True)
        return
    rows = app.runtime.sync(
        app.runtime.store.read_stream(app.get_run(run_id).id, after, 100_000), "tail"
    )
    for row in rows:
        joined.show(chunk_of(row))
    joined.close()
