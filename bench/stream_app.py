"""The streams bench's app: steps that stream (or do not) what a model would, for workers
started by bench/streams.py. Store from PERDURE_DB."""

from __future__ import annotations

import time

import perdure

app = perdure.App()


@app.step(effect="read", name="emit")
def emit(n: int, gap: float) -> int:
    """`n` chunks, each carrying the time it was written, `gap` seconds apart."""
    for i in range(n):
        perdure.stream.write({"i": i, "t": time.time()})
        time.sleep(gap)
    return n


@app.step(effect="read", name="tokens")
def tokens(n: int, streamed: bool) -> int:
    """A model-like step: `n` tokens 1 ms apart, streamed or not."""
    for i in range(n):
        time.sleep(0.001)
        if streamed:
            perdure.stream.write(f"tok{i} ")
    return n


@app.step(effect="read", name="flood")
def flood(n: int) -> int:
    """`n` chunks as fast as the writer takes them."""
    for i in range(n):
        perdure.stream.write(i)
    return n


@app.workflow(name="emits")
def emits(n: int, gap: float) -> int:
    return emit(n, gap)


@app.workflow(name="speaks")
def speaks(n: int, streamed: bool) -> int:
    return tokens(n, streamed)


@app.workflow(name="floods")
def floods(n: int) -> int:
    return flood(n)
