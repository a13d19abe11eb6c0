"""The workflow whose journals are checked in: changing how journals are read must keep
replaying them (rename a kind, change a payload shape, and test_golden fails)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import perdure


@dataclass
class Quote:
    order: str
    cents: int


def build(app: perdure.App, calls: list[str]) -> perdure.Workflow[[str], str]:
    @app.step(name="quote", effect="read")
    def quote(order: str) -> Quote:
        calls.append("quote")
        return Quote(order, 1250)

    @app.step(name="reserve", effect="keyed")
    def reserve(order: str) -> str:
        calls.append("reserve")
        return f"hold-{order}"

    @app.step(name="charge", effect="once")
    def charge(hold: str, cents: int) -> str:
        calls.append("charge")
        return f"paid {cents} on {hold}"

    @app.workflow(name="golden_checkout", version="1")
    async def golden_checkout(order: str) -> str:
        q = await quote(order)
        hold = await reserve(order)
        stamp = perdure.now()
        ref = perdure.uuid()
        await perdure.sleep(timedelta(hours=1))
        audited = perdure.patched("audit")
        approved = await perdure.wait_event("approved", timeout=timedelta(days=3))
        receipt = await charge(hold, q.cents)
        return f"{receipt} by {approved} at {stamp:%Y-%m-%d} ref {str(ref)[:4]} audit={audited}"

    return golden_checkout
