"""Schedules with a driven clock: ticks, catch-up and overlap policies, time zones, DST."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

import perdure
from perdure.testing import SimulatedCrash, TestClock, TestWorker
from perdure.triggers import schedules
from perdure.triggers.schedules import next_tick, run_id_for


def utc(*args: int) -> float:
    return datetime(*args, tzinfo=UTC).timestamp()  # type: ignore[misc]


def run_pass(app: perdure.App, clock: TestClock) -> int:
    """One scheduler pass at `clock`'s time, as a worker's scheduler makes; runs started."""
    return app.runtime.sync(schedules.scheduler_of(app.runtime).run_pass(clock.now()), "pass")  # type: ignore[no-any-return]


def fired(app: perdure.App, name: str) -> list[str]:
    """Run ids started by a schedule, oldest first (from its tick records)."""
    ticks = app.schedule_ticks(name, limit=1000)
    return sorted(t.run_id for t in ticks if t.status == "fired" and t.run_id)


def statuses(app: perdure.App, name: str) -> list[tuple[str, str]]:
    """(UTC time, status) of every recorded tick, oldest first."""
    ticks = sorted(app.schedule_ticks(name, limit=1000), key=lambda t: t.fire_at)
    return [(datetime.fromtimestamp(t.fire_at, UTC).strftime("%H:%M"), t.status) for t in ticks]


def test_every_tick_starts_one_run_with_the_task_spec(
    app: perdure.App, worker: TestWorker, clock: TestClock
) -> None:
    seen: list[tuple[str, int]] = []

    @app.schedule(every=60, args=["digest"], kwargs={"size": 3})
    @app.workflow(name="report")
    async def report(kind: str, size: int) -> str:
        seen.append((kind, size))
        return kind

    worker.run_until_idle()  # stores the schedule; nothing due yet
    assert seen == [] and [s.name for s in app.schedules()] == ["report"]
    for _ in range(3):
        clock.advance(60)
        worker.run_until_idle()
    assert seen == [("digest", 3)] * 3
    ids = fired(app, "report")
    assert ids == [run_id_for("report", utc(2026, 1, 1, 0, m)) for m in (1, 2, 3)]
    assert ids[0] == "sched:report:2026-01-01T00:01:00Z"
    assert all(app.get_run(i).status == "completed" for i in ids)
    origin = app.journal(ids[0])[0]
    assert origin.kind == "run.origin"
    assert json.loads(origin.data or "") == {"schedule": "report", "tick": "2026-01-01T00:01:00Z"}


def test_two_schedulers_fire_each_tick_once(db_url: str, clock: TestClock) -> None:
    """Two workers' schedulers on one store, each passing over every tick: one run per tick."""
    apps = [perdure.App(db_url, clock=clock) for _ in range(2)]
    try:
        for a in apps:

            @a.schedule(every=10, overlap="allow")  # no worker runs them here
            @a.workflow(name="job")
            async def job() -> None:
                return None

        for a in apps:  # each stores the declared schedule (the same row)
            assert run_pass(a, clock) == 0
        for _ in range(5):
            clock.advance(10)
            counts = [run_pass(a, clock) for a in apps]
            assert sorted(counts) == [0, 1]
        assert len(fired(apps[0], "job")) == 5
        assert len(apps[0].list_runs(workflow="job")) == 5
    finally:
        for a in apps:
            a.close()


def _downtime_app(app: perdure.App, catchup: str, limit: int = 10) -> None:
    @app.schedule(every=60, catchup=catchup, catchup_limit=limit, grace=30, overlap="allow")
    @app.workflow(name="tick")
    async def tick() -> None:
        return None


@pytest.mark.parametrize(
    ("catchup", "limit", "expected_fired"),
    [
        ("skip", 10, []),
        ("latest", 10, ["00:10"]),
        ("all", 10, [f"00:{m:02d}" for m in range(1, 11)]),
        ("all", 3, ["00:08", "00:09", "00:10"]),
    ],
)
def test_catchup_after_downtime(
    app: perdure.App,
    worker: TestWorker,
    clock: TestClock,
    catchup: str,
    limit: int,
    expected_fired: list[str],
) -> None:
    """Ten ticks pass with no worker; the first pass back applies the policy, recording all."""
    _downtime_app(app, catchup, limit)
    worker.run_until_idle()
    clock.advance(timedelta(minutes=10, seconds=45))  # 00:01 .. 00:10 all later than grace
    worker.run_until_idle()
    got = statuses(app, "tick")
    assert [t for t, s in got if s == "fired"] == expected_fired
    assert len(got) == 10  # every tick accounted for: fired or missed, none silent
    assert {s for _, s in got} <= {"fired", "missed"}
    missed = [t for t in app.schedule_ticks("tick", limit=100) if t.status == "missed"]
    assert all("late by" in (t.reason or "") for t in missed)
    clock.advance(15)  # 00:11 is on time again and fires whatever the policy
    worker.run_until_idle()
    assert statuses(app, "tick")[-1] == ("00:11", "fired")


def test_overlap_policies(db_url: str, clock: TestClock) -> None:
    """A run still waiting when the next tick comes: skip, queue, allow, cancel_previous."""
    results: dict[str, list[tuple[str, str]]] = {}
    for policy in ("skip", "queue", "allow", "cancel_previous"):
        app = perdure.App(db_url.replace("x.db", f"{policy}.db"), clock=TestClock())
        worker = TestWorker(app)

        @app.schedule(every=60, overlap=policy)
        @app.workflow(name="slow")
        async def slow() -> str:
            return str(await perdure.wait_event("go"))

        worker.run_until_idle()
        for _ in range(3):
            app.clock.advance(60)  # type: ignore[attr-defined]
            worker.run_until_idle()
        first = run_id_for("slow", utc(2026, 1, 1, 0, 1))
        if policy != "cancel_previous":  # there, the first was cancelled by the second
            app.send_event(first, "go", "done")
        worker.run_until_idle()
        worker.run_until_idle()  # the next pass sees the first run finished
        results[policy] = statuses(app, "slow")
        runs = {r.id: r.status for r in app.list_runs(workflow="slow")}
        if policy == "skip":
            assert runs == {first: "completed"}
        elif policy == "queue":  # 00:02 started once 00:01 finished; 00:03 still queued
            second = run_id_for("slow", utc(2026, 1, 1, 0, 2))
            assert runs == {first: "completed", second: "waiting"}
        elif policy == "allow":
            assert len(runs) == 3 and list(runs.values()).count("waiting") == 2
        else:
            assert runs[first] == "cancelled" and list(runs.values()).count("cancelled") == 2
            assert runs[run_id_for("slow", utc(2026, 1, 1, 0, 3))] == "waiting"
        app.close()
    assert results["skip"] == [("00:01", "fired"), ("00:02", "skipped"), ("00:03", "skipped")]
    assert results["queue"] == [("00:01", "fired"), ("00:02", "fired"), ("00:03", "queued")]
    assert results["allow"] == [("00:01", "fired"), ("00:02", "fired"), ("00:03", "fired")]
    assert results["cancel_previous"] == [
        ("00:01", "fired"),
        ("00:02", "fired"),
        ("00:03", "fired"),
    ]


def test_cron_in_a_time_zone_keeps_local_time_across_dst() -> None:
    """09:00 in Paris is 08:00Z in winter and 07:00Z in summer (from 29 March 2026)."""
    row = perdure.ScheduleRow(name="d", workflow="w", cron="0 9 * * *", tz="Europe/Paris")
    winter = next_tick(row, utc(2026, 3, 27, 12))
    summer = next_tick(row, next_tick(row, winter))
    assert datetime.fromtimestamp(winter, UTC) == datetime(2026, 3, 28, 8, tzinfo=UTC)
    assert datetime.fromtimestamp(summer, UTC) == datetime(2026, 3, 30, 7, tzinfo=UTC)


def test_dst_gap_and_repeat_fire_once() -> None:
    """02:30 Paris: the spring-forward day has no 02:30 (fires at 03:30 CEST, 01:30Z); the
    fall-back day has two (fires once, the first); an hourly job fires once per wall hour."""
    daily = perdure.ScheduleRow(name="d", workflow="w", cron="30 2 * * *", tz="Europe/Paris")
    spring = schedules.upcoming(daily, 2, utc(2026, 3, 28, 12))
    assert [datetime.fromtimestamp(t, UTC).strftime("%m-%d %H:%M") for t in spring] == [
        "03-29 01:30",
        "03-30 00:30",
    ]
    autumn = schedules.upcoming(daily, 2, utc(2026, 10, 24, 12))
    assert [datetime.fromtimestamp(t, UTC).strftime("%m-%d %H:%M") for t in autumn] == [
        "10-25 00:30",
        "10-26 01:30",
    ]
    hourly = perdure.ScheduleRow(name="h", workflow="w", cron="0 * * * *", tz="Europe/Paris")
    night = schedules.upcoming(hourly, 3, utc(2026, 10, 24, 23, 30))
    assert [datetime.fromtimestamp(t, UTC).strftime("%H:%M") for t in night] == [
        "00:00",  # 02:00 CEST
        "02:00",  # 03:00 CET (the repeated 02:00 CET is the same wall time: not again)
        "03:00",
    ]


def test_interval_ticks_are_aligned_and_strictly_increasing() -> None:
    row = perdure.ScheduleRow(name="i", workflow="w", every=15)
    assert schedules.upcoming(row, 3, 100.0) == [105.0, 120.0, 135.0]
    assert next_tick(row, 105.0) == 120.0


def test_jitter_delays_a_tick_the_same_on_every_worker(
    app: perdure.App, worker: TestWorker, clock: TestClock
) -> None:
    @app.schedule(every=3600, jitter=600)
    @app.workflow(name="hourly")
    async def hourly() -> None:
        return None

    worker.run_until_idle()
    row = app.schedules()[0]
    tick = row.next_fire or 0.0
    delay = schedules.jitter_of(row, tick)
    assert 0 <= delay < 600 and delay == schedules.jitter_of(row, tick)
    clock.set(datetime.fromtimestamp(tick + delay - 1, UTC))
    worker.run_until_idle()
    assert fired(app, "hourly") == []
    clock.advance(1.5)
    worker.run_until_idle()
    assert fired(app, "hourly") == [run_id_for("hourly", tick)]


def test_pause_is_immediate_and_resume_records_what_passed(
    app: perdure.App, worker: TestWorker, clock: TestClock
) -> None:
    @app.schedule(every=60)
    @app.workflow(name="beat")
    async def beat() -> None:
        return None

    worker.run_until_idle()
    assert app.pause_schedule("beat").paused
    clock.advance(300)
    worker.run_until_idle()
    assert fired(app, "beat") == []
    resumed = app.resume_schedule("beat")
    assert not resumed.paused and resumed.next_fire == utc(2026, 1, 1, 0, 6)
    [skipped] = app.schedule_ticks("beat")
    assert skipped.status == "skipped" and "5 tick(s) passed while the schedule was paused" in (
        skipped.reason or ""
    )
    clock.advance(60)
    worker.run_until_idle()
    assert fired(app, "beat") == [run_id_for("beat", utc(2026, 1, 1, 0, 6))]


def test_a_changed_timing_restarts_from_the_next_tick(db_url: str, clock: TestClock) -> None:
    def make(every: float) -> perdure.App:
        app = perdure.App(db_url, clock=clock)

        @app.schedule(every=every, name="s")
        @app.workflow(name="w")
        async def w() -> None:
            return None

        return app

    first = make(60)
    run_pass(first, clock)
    assert first.schedules()[0].next_fire == utc(2026, 1, 1, 0, 1)
    first.close()
    clock.advance(10)
    same = make(60)  # a restarted worker with the same code keeps the schedule's state
    run_pass(same, clock)
    assert same.schedules()[0].next_fire == utc(2026, 1, 1, 0, 1)
    same.close()
    changed = make(15)
    run_pass(changed, clock)
    assert changed.schedules()[0].next_fire == utc(2026, 1, 1, 0, 0, 15)
    changed.close()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"cron": "every day"}, "not a cron expression"),
        ({"cron": "0 9 * * *", "tz": "Mars/Olympus"}, "unknown time zone"),
        ({"cron": "0 9 * * *", "every": 60}, "exactly one of cron"),
        ({}, "exactly one of cron"),
        ({"every": 60, "overlap": "sometimes"}, "overlap='sometimes'"),
        ({"every": 60, "catchup": "never"}, "catchup='never'"),
        ({"every": -1}, "positive"),
    ],
)
def test_a_bad_schedule_is_refused_in_one_line(
    app: perdure.App, options: dict[str, object], message: str
) -> None:
    @app.workflow(name="w")
    async def w() -> None:
        return None

    with pytest.raises(perdure.ConfigError, match=message) as info:
        app.schedule(workflow=w, **options)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)


def test_a_schedule_with_ill_typed_input_is_refused_when_stored(
    app: perdure.App, worker: TestWorker
) -> None:
    @app.schedule(every=60, args=["not a number"])
    @app.workflow(name="typed")
    async def typed(n: int) -> int:
        return n

    with pytest.raises(perdure.PerdureError, match="typed"):
        worker.run_until_idle()
    assert app.schedules() == []


def test_workers_storing_the_same_schedule_at_once_never_lose_or_repeat_a_tick(
    db_url: str,
) -> None:
    """Storing a declaration again (another worker starting, its clock a little off) keeps
    the next tick wherever the first worker left it."""
    clocks = [TestClock(datetime(2026, 1, 1, tzinfo=UTC)) for _ in range(2)]
    apps = [perdure.App(db_url, clock=c) for c in clocks]
    try:
        for a in apps:

            @a.schedule(every=1, overlap="allow")
            @a.workflow(name="beat")
            async def beat() -> None:
                return None

        first, second = apps
        clocks[0].advance(0.5)
        run_pass(first, clocks[0])  # stores: next 00:00:01
        clocks[1].advance(1.2)  # a second worker, a little later: must not skip 00:00:01
        assert run_pass(second, clocks[1]) == 1
        assert fired(first, "beat") == [run_id_for("beat", utc(2026, 1, 1, 0, 0, 1))]
        clocks[0].advance(0.5)  # the first worker, behind: must not fire 00:00:01 again
        third = perdure.App(db_url, clock=clocks[0])
        third.schedule(every=1, overlap="allow", workflow=third.workflow(name="beat")(beat))
        assert run_pass(third, clocks[0]) == 0
        assert first.schedules()[0].next_fire == utc(2026, 1, 1, 0, 0, 2)
        [tick] = first.schedule_ticks("beat")
        assert tick.at == utc(2026, 1, 1, 0, 0, 1) + 0.2  # recorded once, by the second worker
        third.close()
    finally:
        for a in apps:
            a.close()


def test_skip_behind_a_run_that_needs_attention_says_so_and_is_listed_as_blocked(
    app: perdure.App, worker: TestWorker, clock: TestClock
) -> None:
    """overlap=skip keeps skipping while its run needs attention (no pile-up behind an
    operator's problem), records that true reason, and `blocked` names the run and the fix;
    once resolved, the next tick fires again. A paused run holds it the same way."""

    @app.step(name="charge", effect="once")
    def charge(n: int) -> int:
        return n

    @app.schedule(every=60, overlap="skip")
    @app.workflow(name="bill")
    async def bill() -> int:
        return await charge(1)

    worker.run_until_idle()
    clock.advance(60)  # 00:01 fires; its worker dies mid-charge
    worker.crash_after_intent("charge")
    with pytest.raises(SimulatedCrash):
        worker.run_until_idle()
    first = run_id_for("bill", utc(2026, 1, 1, 0, 1))
    clock.advance(31)  # past the dead worker's lease: recovery parks the once step
    TestWorker(app).run_until_idle()
    assert app.get_run(first).status == "needs_attention"
    for _ in range(2):  # 00:02 and 00:03
        clock.advance(60)
        TestWorker(app).run_until_idle()
    skipped = sorted(
        (t for t in app.schedule_ticks("bill", limit=100) if t.status == "skipped"),
        key=lambda t: t.fire_at,
    )
    assert [t.reason for t in skipped] == [
        f"previous run {first} needs attention; overlap=skip skips until an operator acts "
        "(perdure stuck)"
    ] * 2
    assert app.runtime.sync(schedules.blocked(app.runtime), "blocked") == [
        schedules.Blocked(
            schedule="bill", run_id=first, status="needs_attention",
            since=app.get_run(first).updated_at, held=2,
            fix=f"perdure resolve {first} charge --value JSON | --retry | --fail",
        )
    ]  # fmt: skip
    app.resolve(first, "charge", value=1)
    TestWorker(app).run_until_idle()
    assert app.get_run(first).status == "completed"
    assert app.runtime.sync(schedules.blocked(app.runtime), "blocked") == []
    clock.advance(60)  # 00:04 fires again
    TestWorker(app).run_until_idle()
    assert statuses(app, "bill")[-1] == ("00:04", "fired")


def test_skip_behind_a_paused_run_says_it_is_paused(
    app: perdure.App, worker: TestWorker, clock: TestClock
) -> None:
    """A paused run holds a skip schedule; the reason and the fix say `paused` and `resume`."""

    @app.schedule(every=60, overlap="skip")
    @app.workflow(name="slow")
    async def slow() -> str:
        return str(await perdure.wait_event("go"))

    worker.run_until_idle()
    clock.advance(60)
    worker.run_until_idle()
    first = run_id_for("slow", utc(2026, 1, 1, 0, 1))
    clock.advance(60)  # waiting for its event: an ordinary busy run, not a blocked schedule
    worker.run_until_idle()
    assert app.runtime.sync(schedules.blocked(app.runtime), "blocked") == []
    assert app.pause(first) == "paused"
    clock.advance(60)
    worker.run_until_idle()
    reasons = [t.reason for t in sorted(app.schedule_ticks("slow"), key=lambda t: t.fire_at)]
    assert reasons[1:] == [
        f"previous run {first} is still waiting; overlap=skip",
        f"previous run {first} is paused; overlap=skip skips until an operator acts "
        "(perdure stuck)",
    ]
    [held] = app.runtime.sync(schedules.blocked(app.runtime), "blocked")
    assert (held.status, held.fix) == ("paused", f"perdure resume {first}")


def test_queue_behind_a_paused_run_names_it_and_is_listed_as_blocked(
    app: perdure.App, worker: TestWorker, clock: TestClock
) -> None:
    """overlap=queue queues behind a parked run (saying which, and why) and is blocked too."""

    @app.schedule(every=60, overlap="queue")
    @app.workflow(name="slow")
    async def slow() -> str:
        return str(await perdure.wait_event("go"))

    worker.run_until_idle()
    clock.advance(60)
    worker.run_until_idle()
    first = run_id_for("slow", utc(2026, 1, 1, 0, 1))
    app.pause(first)
    clock.advance(60)
    worker.run_until_idle()
    [queued] = [t for t in app.schedule_ticks("slow") if t.status == "queued"]
    assert queued.reason == f"waiting for the previous run {first}, which is paused (perdure stuck)"
    [held] = app.runtime.sync(schedules.blocked(app.runtime), "blocked")
    assert (held.schedule, held.run_id, held.held) == ("slow", first, 1)
