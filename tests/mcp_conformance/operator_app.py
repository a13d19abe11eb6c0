"""The app of the MCP operator-tools test: a charge whose `once` pay step writes the payment to
a ledger file and, in a worker started with HANG=1, then hangs until the worker is killed.

Store from PERDURE_DB; the ledger in OPERATOR_DIR (one line per payment made)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import perdure

app = perdure.App()
LEDGER = Path(os.environ.get("OPERATOR_DIR", ".")) / "ledger.txt"


@app.step(effect="once", name="pay")
def pay(order: str) -> str:
    with LEDGER.open("a") as ledger:
        ledger.write(f"{order}\n")
    while os.environ.get("HANG") == "1":  # paid, but the outcome never reaches the journal
        time.sleep(0.05)
    return f"paid-{order}"


@app.step(effect="idempotent", name="receipt")
def receipt(payment: str) -> str:
    return f"receipt for {payment}"


@app.workflow(name="charge")
async def charge(order: str) -> str:
    """Pay for an order (once) and make its receipt."""
    return str(await receipt(await pay(order)))
