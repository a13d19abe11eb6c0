"""A run's stream (`perdure.stream`): chunks in order with a gap-free offset, a marker before
each step attempt (a retry marker when the step wrote before), nothing written twice by a
replay, bad chunks refused in one line, a bound on what is kept, and readers that follow a
live run to its end."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import perdure
from extras_needed import require
from live_workers import worker_thread
from perdure.engine import streams
from perdure.testing import SimulatedCrash, TestClock, TestWorker


def kinds(app: perdure.App, run_id: str) -> list[tuple[str, str, Any]]:
    return [(c.kind, c.topic, c.data) for c in app.handle(run_id).stream()]


def test_chunks_follow_their_step_marker_in_order(app: perdure.App, worker: TestWorker) -> None:
    @app.step(effect="read", name="count")
    def count(n: int) -> int:
        for i in range(n):
            perdure.stream.write(f"t{i} ")
        perdure.stream.write({"done": n}, topic="progress")
        return n

    @app.workflow(name="counts")
    async def counts() -> int:
        return await count(3) + await count(2)

    handle = app.start(counts)
    worker.run_until_idle()
    assert handle.result(timeout=5) == 5
    chunks = list(handle.stream())
    assert [c.seq for c in chunks] == list(range(len(chunks)))  # gap-free
    assert [(c.kind, c.topic, c.data) for c in chunks] == [
        ("attempt", "step:0", {"step": "count", "position": 0, "attempt": 1}),
        ("chunk", "out", "t0 "), ("chunk", "out", "t1 "), ("chunk", "out", "t2 "),
        ("chunk", "progress", {"done": 3}),
        ("attempt", "step:1", {"step": "count", "position": 1, "attempt": 1}),
        ("chunk", "out", "t0 "), ("chunk", "out", "t1 "), ("chunk", "progress", {"done": 2}),
    ]  # fmt: skip
    assert [c.seq for c in handle.stream(after=6)] == [7, 8]


def test_a_retried_step_is_marked_so_readers_drop_its_partial_output(
    app: perdure.App, worker: TestWorker
) -> None:
    tries: list[int] = []

    @app.step(effect="idempotent", name="flaky", retry=perdure.Retry(max_attempts=2, initial=0))
    def flaky() -> str:
        tries.append(1)
        perdure.stream.write(f"partial {len(tries)}")
        if len(tries) == 1:
            raise RuntimeError("cut off")
        perdure.stream.write("complete")
        return "ok"

    @app.workflow(name="retries")
    async def retries() -> str:
        return await flaky()

    handle = app.start(retries)
    worker.run_until_idle()
    assert handle.result(timeout=5) == "ok"
    assert [(k, d) for k, _, d in kinds(app, handle.id)] == [
        ("attempt", {"step": "flaky", "position": 0, "attempt": 1}),
        ("chunk", "partial 1"),
        ("retry", {"step": "flaky", "position": 0, "attempt": 2}),
        ("chunk", "partial 2"),
        ("chunk", "complete"),
    ]


def test_a_workflow_writes_only_new_code_never_a_replay(
    app: perdure.App, worker: TestWorker, clock: TestClock
) -> None:
    @app.step(effect="read", name="look")
    def look() -> int:
        return 1

    @app.workflow(name="narrates")
    async def narrates() -> str:
        perdure.stream.write("starting")
        await look()
        await perdure.sleep(60)  # parks; the wake-up replays the lines above
        perdure.stream.write("woke")
        return "done"

    handle = app.start(narrates)
    worker.run_until_idle()
    assert [d for _, _, d in kinds_now(app, handle.id)] == ["starting"]
    clock.advance(61)
    worker.run_until_idle()
    assert handle.result(timeout=5) == "done"
    assert [d for _, _, d in kinds(app, handle.id)] == ["starting", "woke"]


def kinds_now(app: perdure.App, run_id: str) -> list[tuple[str, str, Any]]:
    rows = app.runtime.sync(app.runtime.store.read_stream(run_id), "read")
    return [(r.kind, r.topic, streams.chunk_of(r).data) for r in rows]


def test_bad_chunks_are_refused_in_one_line(app: perdure.App, worker: TestWorker) -> None:
    seen: list[str] = []

    @app.step(effect="read", name="bad")
    def bad() -> None:
        for data, topic in ((object(), "out"), ("x" * (streams.MAX_CHUNK + 1), "out"),
                            ("fine", ""), ("fine", "step:3")):  # fmt: skip
            with pytest.raises(perdure.PayloadError) as info:
                perdure.stream.write(data, topic=topic)
            assert "\n" not in str(info.value)
            seen.append(str(info.value))

    @app.workflow(name="bads")
    async def bads() -> None:
        await bad()

    app.start(bads, run_id="b1")
    worker.run_until_idle()
    assert len(seen) == 4 and "over the" in seen[1] and "topic" in seen[2]
    assert kinds(app, "b1") == []
    with pytest.raises(perdure.PerdureError, match="inside a run"):
        perdure.stream.write("outside")
    with pytest.raises(perdure.RunNotFound):
        list(app.handle("no-such-run").stream())


def test_a_stream_keeps_its_newest_rows_and_says_what_it_dropped(
    app: perdure.App, worker: TestWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(streams, "KEEP", 50)

    @app.step(effect="read", name="chatty")
    def chatty() -> None:
        for i in range(300):
            perdure.stream.write(i)

    @app.workflow(name="chatter")
    async def chatter() -> None:
        await chatty()

    handle = app.start(chatter)
    worker.run_until_idle()
    chunks = list(handle.stream())
    dropped = [c for c in chunks if c.kind == "dropped"]
    assert dropped and len([c for c in chunks if c.kind == "chunk"]) <= 50
    assert chunks[-1].data == 299 or chunks[-1].kind == "dropped"
    assert [c.data for c in chunks if c.kind == "chunk"][-1] == 299


def test_a_reader_follows_a_live_run_to_its_end(tmp_path: Any) -> None:
    """A reader started before the run writes anything sees every chunk as it comes, from a
    real worker thread, and stops when the run is finished."""
    app = perdure.App(f"sqlite:///{tmp_path}/live.db")
    go = threading.Event()

    @app.step(effect="read", name="slow")
    def slow() -> str:
        for i in range(5):
            go.wait(5)
            perdure.stream.write(i)
            time.sleep(0.05)
        return "done"

    @app.workflow(name="slowly")
    def slowly() -> str:
        return slow()

    handle = app.start(slowly)
    try:
        with worker_thread(app, poll=0.05, gc_every=None):
            seen: list[Any] = []
            go.set()
            for chunk in handle.stream():
                seen.append((chunk.kind, chunk.data))
            assert seen == [("attempt", {"step": "slow", "position": 0, "attempt": 1}),
                            *(("chunk", i) for i in range(5))]  # fmt: skip
            assert handle.status() == "completed"
    finally:
        app.close()


def test_the_api_serves_a_run_stream_as_sse_with_resume(
    app: perdure.App, worker: TestWorker
) -> None:
    """GET /api/v1/runs/{id}/stream: one event per row (its kind as the event name, its offset
    as `id:`), `end` after the last; Last-Event-ID resumes; 401 without a token, 404 for an
    unknown run."""
    require("server")
    from starlette.testclient import TestClient

    from perdure.server import create_app
    from perdure.server.access import create_token

    @app.step(effect="read", name="speak")
    def speak() -> None:
        for word in ("a", "b", "c"):
            perdure.stream.write(word)

    @app.workflow(name="speaker")
    async def speaker() -> None:
        await speak()

    handle = app.start(speaker, run_id="sp1")
    worker.run_until_idle()
    _, token = app.runtime.sync(create_token(app, "reader", ["read"]), "token")
    headers = {"Authorization": f"Bearer {token}"}
    with TestClient(create_app(app)) as client:
        text = client.get("/api/v1/runs/sp1/stream", headers=headers).text
        events = [line.split(": ", 1)[1] for line in text.splitlines() if line.startswith("event")]
        assert events == ["attempt", "chunk", "chunk", "chunk", "end"]
        assert '"data":"c"' in text and "id: 3" in text
        again = client.get("/api/v1/runs/sp1/stream", headers={**headers, "Last-Event-ID": "2"})
        assert [x for x in again.text.splitlines() if x.startswith("id:")] == ["id: 3"]
        assert client.get("/api/v1/runs/sp1/stream").status_code == 401
        assert client.get("/api/v1/runs/nope/stream", headers=headers).status_code == 404
    assert handle.status() == "completed"


def test_perdure_tail_prints_the_stream(app: perdure.App, worker: TestWorker) -> None:
    from perdure.cli.tail import line
    from perdure.engine.streams import StreamChunk

    assert line(StreamChunk(0, "chunk", "out", "tok", 0.0)) == "tok"
    assert line(StreamChunk(1, "chunk", "progress", {"n": 1}, 0.0)) == 'progress: {"n": 1}'
    marker = {"step": "ask", "position": 2, "attempt": 2}
    assert line(StreamChunk(2, "retry", "step:2", marker, 0.0)).startswith(
        "[retry: step ask at 2, attempt 2"
    )
    assert "dropped" in line(StreamChunk(3, "dropped", "", {"before": 5, "rows": 5}, 0.0))


def test_perdure_tail_joins_text_chunks_into_text() -> None:
    """A model's tokens print as its text, not a line each; a marker or another topic
    starts a line of its own, and a retry marker ends the partial text before it."""
    from perdure.cli.tail import Joined
    from perdure.engine.streams import StreamChunk

    printed: list[str] = []
    joined = Joined(lambda text, end_line: printed.append(text + ("\n" if end_line else "")))
    marker = {"step": "agent:a.model", "position": 3, "attempt": 1}
    rows = [
        StreamChunk(0, "attempt", "step:3", marker, 0.0),
        StreamChunk(1, "chunk", "out", "The lease ", 0.0),
        StreamChunk(2, "chunk", "out", "ends on 30 June.", 0.0),
        StreamChunk(3, "retry", "step:3", {**marker, "attempt": 2}, 0.0),
        StreamChunk(4, "chunk", "out", "The lease ends.", 0.0),
        StreamChunk(5, "chunk", "tool", {"tool_call": "read_file"}, 0.0),
    ]
    for row in rows:
        joined.show(row)
    joined.close()
    assert "".join(printed).splitlines() == [
        "[step agent:a.model at 3, attempt 1]",
        "The lease ends on 30 June.",
        "[retry: step agent:a.model at 3, attempt 2; what it wrote before is superseded]",
        "The lease ends.",
        'tool: {"tool_call": "read_file"}',
    ]


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_what_a_step_streamed_is_kept_once_a_later_journal_write_lands(
    app: perdure.App, worker: TestWorker, kind: str
) -> None:
    """A step's chunks are committed before the next journal write (here a `once` step's
    intent), so a crash right after it (before the stream's timed flush or the run's end)
    loses none of them, and recovery, replaying the recorded step, streams none again."""
    sent: list[str] = []

    @app.step(effect="keyed", name=f"talk_{kind}")
    def talk() -> str:
        perdure.stream.write("token-1 ")
        perdure.stream.write("token-2")
        return "said"

    @app.step(effect="once", name=f"email_{kind}")
    def email() -> str:
        sent.append("mail")
        return "sent"

    if kind == "async":

        @app.workflow(name="talks")
        async def talks() -> str:
            return await talk() + " " + await email()

    else:

        @app.workflow(name="talks")
        def talks() -> str:  # type: ignore[misc]
            return talk() + " " + email()

    handle = app.start("talks")
    worker.crash_after_intent(f"email_{kind}")
    with pytest.raises(SimulatedCrash):
        worker.run_until_idle()
    rows = app.runtime.sync(
        app.runtime.store.read_stream(handle.id), "read"
    )  # what the store holds now
    chunks = [(c.kind, c.data) for c in map(streams.chunk_of, rows)]
    assert chunks == [
        ("attempt", {"step": f"talk_{kind}", "position": 0, "attempt": 1}),
        ("chunk", "token-1 "),
        ("chunk", "token-2"),
    ]
    assert sent == []
