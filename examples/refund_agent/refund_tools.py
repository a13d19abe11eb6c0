"""The refund agent's three tools, written once for both frameworks: plain async functions
that call the payments and mail stubs over HTTP and hold a little (so a kill can land
inside them, before or after the effect).

`issue_refund` sends perdure's idempotency key when it runs as a `keyed` step (the stub then
applies a repeated call once); outside perdure, or as a `once` step, it sends none.

The two `once` tools have probes: read-only look-ups perdure's recovery calls, with an
interrupted call's arguments, before it would park the run for a person. `find_refund`
asks the payment ledger for the order's refund (`GET /refunds?order=`), `find_email` the
mail provider for the order's message (`GET /sent?order=`): found, the call is settled with
what the tool would have returned; not found, it runs again; the provider unreachable or
failing (an exception), the run waits for a person with that in its reason.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
from dataclasses import dataclass
from typing import Any

import httpx

import perdure


@dataclass(frozen=True)
class Shop:
    """Where the tools act, and how long each body holds (seconds, drawn uniformly;
    half before the effect, half after)."""

    payments_url: str
    mail_url: str
    hold: tuple[float, float] = (0.02, 0.1)

    async def _probe(self, client: httpx.AsyncClient, url: str, tool: str, order: str,
                     stage: str) -> None:  # fmt: skip
        body = {"tool": tool, "order": order, "stage": stage, "pid": os.getpid()}
        await client.post(f"{url}/probe", json=body)

    async def _hold(self) -> None:
        await asyncio.sleep(random.uniform(*self.hold) / 2)

    async def lookup_order(self, order: str) -> str:
        """Look an order up: its amount and the customer's e-mail address."""
        async with httpx.AsyncClient(timeout=30) as client:
            found = await client.get(f"{self.payments_url}/orders/{order}")
            found.raise_for_status()
        return json.dumps(found.json())

    async def issue_refund(self, order: str, amount: float) -> str:
        """Refund `amount` EUR of `order` to the customer."""
        key = _idempotency_key()
        headers = {"Idempotency-Key": key} if key else {}
        async with httpx.AsyncClient(timeout=30) as client:
            await self._probe(client, self.payments_url, "issue_refund", order, "begin")
            await self._hold()
            paid = await client.post(
                f"{self.payments_url}/refunds",
                json={"order": order, "amount": amount},
                headers=headers,
            )
            paid.raise_for_status()
            await self._hold()
            await self._probe(client, self.payments_url, "issue_refund", order, "end")
        refund = paid.json()
        return json.dumps({"refund_id": refund["refund_id"], "amount": refund["amount"]})

    async def send_email(self, to: str, order: str, body: str) -> str:
        """Send the customer an e-mail about their order."""
        async with httpx.AsyncClient(timeout=30) as client:
            await self._probe(client, self.mail_url, "send_email", order, "begin")
            await self._hold()
            sent = await client.post(
                f"{self.mail_url}/send", json={"to": to, "order": order, "body": body}
            )
            sent.raise_for_status()
            await self._hold()
            await self._probe(client, self.mail_url, "send_email", order, "end")
        return f"sent {sent.json()['message_id']}"

    async def find_refund(self, order: str, amount: float) -> perdure.ProbeAnswer:
        """The probe of `issue_refund`: is there a refund of `order` in the payment ledger?
        (One refund per order is the agent's rule, so the order id is the call's key.)"""
        async with httpx.AsyncClient(timeout=10) as client:
            found = await client.get(f"{self.payments_url}/refunds", params={"order": order})
            found.raise_for_status()
        refunds = found.json()
        if not refunds:
            return perdure.ProbeAnswer.not_done(f"no refund of {order} in the ledger")
        refund = refunds[0]
        value = json.dumps({"refund_id": refund["refund_id"], "amount": refund["amount"]})
        return perdure.ProbeAnswer.done(value, f"refund {refund['refund_id']} in the ledger")

    async def find_email(self, to: str, order: str, body: str) -> perdure.ProbeAnswer:
        """The probe of `send_email`: did the mail provider send a message about `order`?"""
        async with httpx.AsyncClient(timeout=10) as client:
            found = await client.get(f"{self.mail_url}/sent", params={"order": order})
            found.raise_for_status()
        sent = found.json()
        if not sent:
            return perdure.ProbeAnswer.not_done(f"no message about {order} was sent")
        return perdure.ProbeAnswer.done(f"sent {sent[0]['message_id']}", "found at the provider")


def agent_name(refund: str) -> str:
    """The agent's name for the variant whose `issue_refund` is declared `refund`."""
    return "refunds" if refund == "keyed" else f"refunds_{refund}"


def probes_of(shop: Shop, refund: str) -> dict[str, Any]:
    """The probes of the `once` tools when `issue_refund` is declared `refund`: the mail
    provider's look-up for `send_email`, and the payment ledger's for a `once` refund."""
    asked: dict[str, Any] = {"send_email": shop.find_email}
    if refund == "once":
        asked["issue_refund"] = shop.find_refund
    return asked


def _idempotency_key() -> str:
    """perdure's stable key when the call is a `keyed` step (run id + position), else ''."""
    try:
        step = perdure.current_step()
    except perdure.PerdureError:  # not inside a perdure step: the plain framework
        return ""
    return step.idempotency_key if step.effect == "keyed" else ""
