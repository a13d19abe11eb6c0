"""Inbox folders: stable files only, temp names ignored, one run per content, on every store."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import perdure
from fresh_stores import fresh_store_url
from perdure.errors import ConfigError
from perdure.store.base import RunRow
from perdure.testing import TestClock, TestWorker
from perdure.triggers import inbox as inbox_module
from perdure.triggers.inbox import Inbox


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A URL naming a fresh store of each kind (PostgreSQL: a schema of its own)."""
    with fresh_store_url(request.param, tmp_path) as url:
        yield url


class Drop:
    """An app with one `ingest` workflow and its inbox on `folder`, driven by a TestClock."""

    def __init__(self, url: str, folder: Path, clock: TestClock, **options: Any) -> None:
        self.clock = clock
        self.folder = folder
        self.app = perdure.App(url, clock=clock)
        self.seen: list[tuple[str, str]] = []  # (path, content) as the step read them

        @self.app.step(name="read_file", effect="idempotent")
        def read_file(path: str) -> str:
            content = Path(path).read_text()
            self.seen.append((path, content))
            return content

        @self.app.workflow(name="ingest")
        def ingest(path: str) -> str:
            return read_file(path)

        self.workflow = ingest
        self.inbox: Inbox = self.app.inbox(str(folder), ingest, **options)
        self.worker = TestWorker(self.app)

    def scan(self) -> list[str]:
        """One scan at the clock's current time; the run ids it handed to the engine."""
        return self.app.runtime.sync(self.inbox.scan(self.clock.now()), "scan")  # type: ignore[no-any-return]

    def settle(self) -> list[str]:
        """Scan, let `stable` pass, scan again, then run everything: the ids handed over."""
        ids = self.scan()
        self.clock.advance(self.inbox.stable + 0.01)
        ids += self.scan()
        self.worker.run_until_idle()
        return ids

    def runs(self) -> dict[str, RunRow]:
        return {r.id: r for r in self.app.list_runs(limit=100_000)}

    def inputs(self) -> dict[str, Any]:
        return {r.id: json.loads(r.input)["args"][0] for r in self.runs().values()}

    def close(self) -> None:
        self.app.close()


@pytest.fixture
def make_drop(store_url: str, tmp_path: Path) -> Iterator[Callable[..., Drop]]:
    """Make `Drop`s on one store and one folder (`tmp_path/in`); all closed after the test."""
    made: list[Drop] = []

    def make(**options: Any) -> Drop:
        drop = Drop(store_url, tmp_path / "in", TestClock(), **options)
        made.append(drop)
        return drop

    yield make
    for drop in made:
        drop.close()


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_a_growing_file_is_taken_only_once_stable(make_drop: Callable[..., Drop]) -> None:
    """A file whose size or mtime changed within `stable` seconds is not taken; later it is."""
    drop = make_drop(stable=1.0)
    target = drop.folder / "report.txt"
    target.write_text("part one\n")
    assert drop.scan() == []  # first sight
    drop.clock.advance(0.6)
    with open(target, "a") as f:
        f.write("part two\n")  # still being written
    assert drop.scan() == []
    drop.clock.advance(0.6)  # 1.2 s after first sight, but only 0.6 s after the last write
    assert drop.scan() == []
    drop.clock.advance(0.5)
    whole = "part one\npart two\n"
    assert drop.scan() == [f"inbox:ingest:{sha(whole)[:32]}"]
    drop.worker.run_until_idle()
    assert drop.seen == [(str(target), "part one\npart two\n")]


def test_a_symlink_out_of_the_folder_is_never_followed(
    make_drop: Callable[..., Drop], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`ln -s /etc/shadow inbox/x` must not start a run (its id would reveal the target's
    sha256 to any reader); a link to a file inside the folder is taken as that file."""
    drop = make_drop(stable=0.0, recursive=True)
    secret = tmp_path / "secret.txt"
    secret.write_text("root:hash")
    (drop.folder / "sub").mkdir()
    (drop.folder / "sub" / "inside.txt").write_text("fine")
    (drop.folder / "shadow_link").symlink_to(secret)
    (drop.folder / "near").symlink_to(drop.folder / "sub" / "inside.txt")
    (drop.folder / "up").symlink_to(Path("..") / "secret.txt")
    with caplog.at_level("WARNING", logger="perdure.inbox"):
        drop.settle()
        drop.settle()  # logged once, not every scan
    assert sha("root:hash")[:32] not in " ".join(drop.runs())
    assert {content for _, content in drop.seen} == {"fine"}
    skipped = [r.getMessage() for r in caplog.records if "leading out of the folder" in r.message]
    assert len(skipped) == 2 and all(str(secret) in m for m in skipped)


def test_hidden_and_temporary_names_are_ignored_until_renamed(
    make_drop: Callable[..., Drop],
) -> None:
    """`.*`, `*.tmp`, `*.part`, `*.partial`, `*~`, `*.crdownload` start nothing; a rename does."""
    drop = make_drop(stable=0.5)
    ignored = [".hidden", "a.tmp", "b.part", "c.partial", "d~", "e.crdownload", "F.TMP"]
    for i, name in enumerate(ignored):
        (drop.folder / name).write_text(f"ignored {i}")
    (drop.folder / "real.txt").write_text("real")
    drop.settle()
    assert sorted(drop.inputs().values()) == [str(drop.folder / "real.txt")]
    os.rename(drop.folder / "a.tmp", drop.folder / "a.txt")  # the temp-name convention
    drop.settle()
    assert sorted(drop.inputs().values()) == [
        str(drop.folder / "a.txt"),
        str(drop.folder / "real.txt"),
    ]
    assert {content for _, content in drop.seen} == {"real", "ignored 1"}


def test_identical_content_under_two_names_is_one_run(make_drop: Callable[..., Drop]) -> None:
    """Two files with the same bytes, and a later renamed copy, start one run between them."""
    drop = make_drop(stable=0.5)
    (drop.folder / "b.txt").write_text("same bytes")
    (drop.folder / "a.txt").write_text("same bytes")
    drop.settle()
    assert drop.inputs() == {f"inbox:ingest:{sha('same bytes')[:32]}": str(drop.folder / "a.txt")}
    os.rename(drop.folder / "a.txt", drop.folder / "renamed.txt")
    (drop.folder / "copy.txt").write_text("same bytes")
    drop.settle()
    assert len(drop.runs()) == 1
    assert drop.seen == [(str(drop.folder / "a.txt"), "same bytes")]


def test_a_modified_file_is_processed_again(make_drop: Callable[..., Drop]) -> None:
    """New content under the same name is a new run; going back to old content is not."""
    drop = make_drop(stable=0.5)
    target = drop.folder / "notes.txt"
    target.write_text("version 1")
    first = drop.settle()
    target.write_text("version 2, longer")
    second = drop.settle()
    assert len(first) == len(second) == 1 and first != second
    runs = drop.runs()
    assert sorted(runs) == sorted(first + second)
    assert {r.status for r in runs.values()} == {"completed"}
    assert [content for _, content in drop.seen] == ["version 1", "version 2, longer"]
    target.write_text("version 1")
    drop.settle()
    assert len(drop.runs()) == 2
    assert len(drop.seen) == 2


def test_run_id_format_and_names(make_drop: Callable[..., Drop], tmp_path: Path) -> None:
    """The run id is `inbox:{name}:{sha256[:32]}`; the name defaults to the workflow's."""
    drop = make_drop(stable=0)
    other = drop.app.inbox(str(tmp_path / "other"), drop.workflow, name="invoices", stable=0)
    (drop.folder / "x.bin").write_bytes(b"\x00\x01payload")
    (tmp_path / "other" / "y.bin").write_bytes(b"\x00\x01payload")
    digest = hashlib.sha256(b"\x00\x01payload").hexdigest()
    assert drop.scan() == [f"inbox:ingest:{digest[:32]}"]
    assert drop.app.runtime.sync(other.scan(drop.clock.now()), "scan") == [
        f"inbox:invoices:{digest[:32]}"
    ]
    assert drop.inbox.name == "ingest" and other.name == "invoices"
    assert list(drop.app.runtime.triggers.of(Inbox).values()) == [drop.inbox, other]


def test_pattern_filters_by_file_name(make_drop: Callable[..., Drop]) -> None:
    """Only names matching the glob (or one of several) are taken."""
    drop = make_drop(stable=0, pattern=("*.csv", "*.json"))
    for name in ("a.csv", "b.json", "c.txt", "d.csv.bak"):
        (drop.folder / name).write_text(name)
    drop.settle()
    assert sorted(Path(p).name for p in drop.inputs().values()) == ["a.csv", "b.json"]


def test_subfolders_only_when_recursive(make_drop: Callable[..., Drop], tmp_path: Path) -> None:
    """Files in subfolders are taken with recursive=True, never from hidden subfolders."""
    drop = make_drop(stable=0)
    (drop.folder / "sub").mkdir()
    (drop.folder / ".git").mkdir()
    (drop.folder / "sub" / "deep.txt").write_text("deep")
    (drop.folder / ".git" / "config").write_text("hidden")
    (drop.folder / "top.txt").write_text("top")
    drop.settle()
    assert sorted(drop.inputs().values()) == [str(drop.folder / "top.txt")]
    deep = drop.app.inbox(str(drop.folder), drop.workflow, name="deep", recursive=True, stable=0)
    drop.app.runtime.sync(deep.scan(drop.clock.now()), "scan")
    assert sorted(Path(p).name for p in drop.inputs().values()) == [
        "deep.txt",
        "top.txt",
        "top.txt",
    ]


def test_a_restarted_watcher_starts_nothing_again(make_drop: Callable[..., Drop]) -> None:
    """A new App on the same store (as after a restart) hands over ids that exist: no new run."""
    first = make_drop(stable=0.5)
    for i in range(20):
        (first.folder / f"f{i:02d}.txt").write_text(f"content {i}")
    first.settle()
    before = first.runs()
    assert len(before) == 20 and {r.status for r in before.values()} == {"completed"}
    first.close()

    second = make_drop(stable=0.5)
    again = second.settle()
    assert sorted(again) == sorted(before)  # handed over once by this new process...
    after = second.runs()
    assert {k: (r.created_at, r.status) for k, r in after.items()} == {
        k: (r.created_at, r.status) for k, r in before.items()
    }
    assert second.worker.run_until_idle() == 0 and second.seen == []  # ...and nothing ran
    assert second.scan() == []  # known contents cost no store call on later scans


def test_known_files_are_not_hashed_again(
    make_drop: Callable[..., Drop], monkeypatch: pytest.MonkeyPatch
) -> None:
    """2,000 files: hashed once each, started once; a rescan hashes and starts nothing."""
    hashed: list[str] = []
    real_digest = inbox_module._digest

    def counting(folder: Path, path: str, sig: tuple[int, int, int]) -> str | None:
        hashed.append(path)
        return real_digest(folder, path, sig)

    monkeypatch.setattr(inbox_module, "_digest", counting)
    drop = make_drop(stable=0)
    for i in range(2000):
        (drop.folder / f"doc{i:04d}.txt").write_text(f"document {i}")
    t0 = time.monotonic()
    ids = drop.scan()
    first_scan = time.monotonic() - t0
    assert len(ids) == len(set(ids)) == 2000 and len(hashed) == 2000
    t0 = time.monotonic()
    assert drop.scan() == []
    rescan = time.monotonic() - t0
    assert len(hashed) == 2000
    assert len(drop.runs()) == 2000
    print(f"2,000 files: first scan {first_scan:.2f}s, rescan {rescan * 1000:.0f} ms")


def test_the_digest_is_passed_when_the_workflow_takes_it(tmp_path: Path) -> None:
    """A workflow with a `sha256` parameter gets the full digest; the path stays first."""
    app = perdure.App(f"sqlite:///{tmp_path}/d.db", clock=TestClock())
    try:

        @app.workflow(name="checked")
        def checked(path: str, sha256: str) -> bool:
            return hashlib.sha256(Path(path).read_bytes()).hexdigest() == sha256

        inbox = app.inbox(str(tmp_path / "in"), checked, stable=0)
        (tmp_path / "in" / "a.txt").write_text("abc")
        [run_id] = app.runtime.sync(inbox.scan(0.0), "scan")
        TestWorker(app).run_until_idle()
        assert json.loads(app.get_run(run_id).input)["kwargs"] == {"sha256": sha("abc")}
        assert app.handle(run_id).result(timeout=5) is True
    finally:
        app.close()


def test_bad_configuration_is_one_clear_error(tmp_path: Path) -> None:
    """A file as folder, a taken name, bad durations or a workflow that cannot take a path
    raise ConfigError; a missing folder is created."""
    app = perdure.App(f"sqlite:///{tmp_path}/c.db", clock=TestClock())
    try:

        @app.workflow(name="one")
        def one(path: str) -> None:
            return None

        @app.workflow(name="two")
        def two(path: str, other: int) -> None:
            return None

        (tmp_path / "file").write_text("x")
        with pytest.raises(ConfigError, match="is not a directory") as info:
            app.inbox(str(tmp_path / "file"), one)
        assert "\n" not in str(info.value)
        with pytest.raises(ConfigError, match="must take the file path"):
            app.inbox(str(tmp_path / "a"), two)
        with pytest.raises(ConfigError, match="poll"):
            app.inbox(str(tmp_path / "a"), one, poll=0)
        with pytest.raises(ConfigError, match="stable"):
            app.inbox(str(tmp_path / "a"), one, stable=-1)
        app.inbox(str(tmp_path / "new" / "deeper"), one)
        assert (tmp_path / "new" / "deeper").is_dir()
        with pytest.raises(ConfigError, match="two inboxes are named 'one'"):
            app.inbox(str(tmp_path / "b"), "one")
        assert len(app.runtime.triggers.of(Inbox)) == 1
    finally:
        app.close()


# -- the inbox as a worker service (real clock, real watcher) ---------------------------


def serve(tmp_path: Path, timeout: float, **options: Any) -> tuple[list[str], list[str]]:
    """Run a worker with an inbox (SystemClock); drop two files (one via a temp name) and
    wait until both runs complete. Returns (contents processed, run ids)."""
    app = perdure.App(f"sqlite:///{tmp_path}/w.db")
    processed: list[str] = []

    @app.step(name="take", effect="idempotent")
    def take(path: str) -> str:
        processed.append(Path(path).read_text())
        return path

    @app.workflow(name="ingest")
    async def ingest(path: str) -> str:
        return await take(path)

    inbox = app.inbox(str(tmp_path / "in"), ingest, stable=0.1, **options)

    async def main() -> list[str]:
        worker = app.worker(concurrency=4, lease=5, poll=0.05, gc_every=None)
        task = asyncio.create_task(worker.run())
        try:
            await asyncio.sleep(0.3)  # the service is watching
            (inbox.folder / "one.txt").write_text("first")
            partial = inbox.folder / "two.txt.part"
            partial.write_text("second")
            os.rename(partial, inbox.folder / "two.txt")
            limit = time.monotonic() + timeout
            while True:
                runs = await app.client.list_runs(statuses=["completed"])
                if len(runs) == 2:
                    return sorted(r.id for r in runs)
                assert time.monotonic() < limit, f"only {len(runs)} run(s) completed"
                await asyncio.sleep(0.05)
        finally:
            worker.stop()
            await asyncio.wait_for(task, 10)

    try:
        ids = asyncio.run(main())
    finally:
        app.close()
    return sorted(processed), ids


def test_a_worker_finds_files_through_notifications(tmp_path: Path) -> None:
    """With watchfiles and a 60 s poll, dropped files are found in seconds: by notification."""
    processed, ids = serve(tmp_path, timeout=10, poll=60)
    assert processed == ["first", "second"]
    assert ids == sorted(f"inbox:ingest:{sha(t)[:32]}" for t in ("first", "second"))


def test_force_polling_finds_files_without_a_watcher(tmp_path: Path) -> None:
    """force_polling=True scans every `poll` seconds and finds the files without watchfiles."""
    processed, _ = serve(tmp_path, timeout=10, poll=0.1, force_polling=True)
    assert processed == ["first", "second"]


def test_polling_takes_over_when_watchfiles_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If watchfiles cannot be imported the inbox polls instead of failing."""
    monkeypatch.setitem(sys.modules, "watchfiles", None)  # `import watchfiles` raises
    processed, _ = serve(tmp_path, timeout=10, poll=0.1)
    assert processed == ["first", "second"]
