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


LEDGER: dict[str, str] = {}  # the payment system `find_refund` asks: refunds by order
PROVIDER_UP = [False]  # while down, the probe cannot tell


def find_refund(order: str) -> perdure.ProbeAnswer:
    """The probe of `refund`: asks the ledger whether the refund was made."""
    if not PROVIDER_UP[0]:
        return perdure.ProbeAnswer.cannot_tell("the payment provider is down")
    found = LEDGER.get(order)
    return perdure.ProbeAnswer.done(found) if found else perdure.ProbeAnswer.not_done()


@app.step(effect="once", probe=find_refund)
def refund(order: str) -> str:
    LEDGER[order] = f"refund-{order}"
    return LEDGER[order]


@app.workflow()
async def return_order(order: str) -> str:
    return await refund(order)
