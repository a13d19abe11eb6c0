"""continue_as_new and waking a parked run from memory hold on every store."""

from __future__ import annotations

import perdure
from perdure.engine import sticky
from perdure.engine.client import continued_as
from perdure.testing import TestWorker


def test_continue_as_new_hands_events_over_in_one_transaction(any_app: perdure.App) -> None:
    """Queued events follow the lineage; every link is there both ways; results follow."""
    app = any_app
    seen: list[str] = []

    @app.step(effect="keyed")
    def note(text: str) -> None:
        seen.append(text)

    @app.workflow()
    async def agent(count: int) -> int:
        text = await perdure.wait_event("msg")
        await note(text)
        if text == "stop":
            return count
        perdure.continue_as_new(count + 1)

    worker = TestWorker(app)
    handle = app.start(agent, 0, run_id="l")
    worker.run_until_idle()
    assert sticky.cache_of(app.runtime).kept.keys() == {"l"}
    for text in ("a", "b", "stop"):
        handle.send_event("msg", text)
    worker.run_until_idle()
    assert handle.result(timeout=5) == 2
    assert seen == ["a", "b", "stop"]
    links = {r.id: continued_as(r) for r in app.list_runs()}
    assert links == {"l": "l~2", "l~2": "l~3", "l~3": None}
    assert sticky.cache_of(app.runtime).resumed == 1  # the first wake-up went on from memory
