"""The example app: onboarding a customer, one durable step at a time.

Every step appends a line to a side ledger (outside perdure) so the demo can
show which side effects ran, and how many times, after a kill -9.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

import perdure

HERE = os.path.dirname(os.path.abspath(__file__))
STATE = os.environ.get("DEMO_STATE", os.path.join(HERE, ".state"))
app = perdure.App(f"sqlite:///{os.path.join(STATE, 'demo.db')}")


def ledger(line: str) -> None:
    """Record a side effect outside perdure (one line per execution)."""
    with open(os.path.join(STATE, "ledger.txt"), "a") as f:
        f.write(line + "\n")


@app.step(effect="keyed")
def create_account(name: str) -> str:
    key = perdure.current_step().idempotency_key
    ledger(f"create_account {name} key={key}")
    return f"acct-{name.lower()}"


@app.step(effect="once")
def send_welcome_email(name: str, account: str) -> str:
    ledger(f"send_welcome_email {name}")
    if name == "Linus":
        time.sleep(4)  # a slow mail server: the demo's kill -9 lands in the middle of this send
    return f"welcome mail sent to {name} for {account}"


@app.step(effect="idempotent")
def build_report(account: str) -> str:
    ledger(f"build_report {account} (started)")
    time.sleep(1.5)  # slow: the demo kills the worker while some reports are being built
    ledger(f"build_report {account} (finished)")
    return f"report for {account}"


@app.step(effect="transactional")
def record_invoice(account: str, amount: int) -> int:
    db = perdure.current_step().db
    db.execute("CREATE TABLE IF NOT EXISTS invoices (account TEXT, amount INTEGER)")
    db.execute("INSERT INTO invoices VALUES (?, ?)", (account, amount))
    return amount


@app.workflow()
async def onboard(name: str) -> dict[str, str]:
    account = await create_account(name)
    mail = await send_welcome_email(name, account)
    await perdure.sleep(timedelta(seconds=1))
    report = await build_report(account)
    await record_invoice(account, 100)
    return {"account": account, "mail": mail, "report": report}
