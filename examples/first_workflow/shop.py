"""A first workflow: charge an order, wait, send the receipt. Kill its worker at any point."""

from datetime import timedelta
from pathlib import Path

import perdure

app = perdure.App()  # its store: .perdure/perdure.db here, or PERDURE_DB

CHARGES = Path("charges.log")  # stands in for a payment provider
RECEIPTS = Path("receipts.log")  # stands in for a mailer


@app.step(effect="keyed", retry=perdure.Retry(max_attempts=5))
def charge(order: str) -> str:
    key = perdure.current_step().idempotency_key  # the same on every retry and recovery
    charged = CHARGES.read_text().split() if CHARGES.exists() else []
    if key not in charged:  # the provider deduplicates by key, as real ones do
        with CHARGES.open("a") as ledger:
            ledger.write(f"{key}\n")
    return f"receipt-{order}"


@app.step()  # no effect declared: "once", never silently repeated
def send_receipt(order: str, receipt: str) -> None:
    with RECEIPTS.open("a") as outbox:
        outbox.write(f"{order} {receipt}\n")


@app.workflow()
async def checkout(order: str) -> str:
    receipt = await charge(order)
    await perdure.sleep(timedelta(seconds=10))  # durable: parked in the store, no thread
    await send_receipt(order, receipt)
    return receipt
