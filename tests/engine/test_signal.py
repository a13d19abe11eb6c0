"""Signal: a wait with `since` is woken by a fire after that count, not by an older one."""

from __future__ import annotations

import asyncio
import threading

from perdure.engine.signal import Signal


def test_a_fire_before_the_snapshot_does_not_wake_a_wait_since_it() -> None:
    """Fired before the waiter read its state: old news, the wait runs to its timeout; fired
    after: the wait returns at once."""

    async def main() -> tuple[float, float]:
        signal = Signal()
        signal.listen()
        signal.fire()  # e.g. the start's own notification, before result() read the run
        loop = asyncio.get_running_loop()
        began = loop.time()
        await signal.wait(0.05, signal.fired)
        stale = loop.time() - began
        since = signal.fired
        loop.call_soon(signal.fire)
        began = loop.time()
        await signal.wait(30.0, since)
        return stale, loop.time() - began

    stale, fresh = asyncio.run(main())
    assert stale >= 0.05
    assert fresh < 30.0


def test_a_wait_without_since_is_woken_by_an_earlier_fire() -> None:
    """Without `since` a fire since the last wait counts, as before."""

    async def main() -> float:
        signal = Signal()
        signal.listen()
        signal.fire()
        loop = asyncio.get_running_loop()
        began = loop.time()
        await signal.wait(30.0)
        return loop.time() - began

    assert asyncio.run(main()) < 30.0


def test_waits_that_time_out_leave_no_waiter_behind() -> None:
    """A process idle for days waits again and again with a timeout and nothing fires: each
    wait's future goes with it (no list that grows), and a later fire still wakes a wait."""

    async def main() -> tuple[int, float]:
        signal = Signal()
        flag = signal.listen()
        for _ in range(50):
            await signal.wait(0.0)
        left = len(flag.waiters)
        loop = asyncio.get_running_loop()
        loop.call_later(0.01, signal.fire)
        began = loop.time()
        await signal.wait(30.0)
        return left, loop.time() - began

    left, woken = asyncio.run(main())
    assert left == 0
    assert woken < 30.0


def test_a_fire_from_another_thread_wakes_the_loop() -> None:
    async def main() -> float:
        signal = Signal()
        signal.listen()
        loop = asyncio.get_running_loop()
        loop.call_later(0.01, lambda: threading.Thread(target=signal.fire).start())
        began = loop.time()
        await signal.wait(30.0)
        return loop.time() - began

    assert asyncio.run(main()) < 30.0


def test_a_wait_that_finds_a_fire_still_gives_the_loop_a_turn() -> None:
    """A loop like a worker's (claim, wait, claim) whose waits always find a fire must not
    starve the event loop: a callback scheduled before the wait runs before it returns."""

    async def main() -> bool:
        signal = Signal()
        signal.listen()
        ran: list[bool] = []
        asyncio.get_running_loop().call_soon(ran.append, True)
        signal.fire()
        await signal.wait(30.0)
        return bool(ran)

    assert asyncio.run(main())
