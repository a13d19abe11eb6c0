"""A small app for CLI tests; its store comes from PERDURE_DB, set by the test."""

from __future__ import annotations

import perdure

app = perdure.App()


@app.step(effect="keyed")
def charge(order: str) -> str:
    return f"receipt-{order}"


@app.step()
def send_mail(order: str) -> str:
    return f"mailed {order}"


@app.workflow()
async def checkout(order: str) -> str:
    receipt = await charge(order)
    approved = await perdure.wait_event("approved")
    await send_mail(order)
    return f"{receipt} approved={approved}"
