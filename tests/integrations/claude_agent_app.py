"""The Claude Agent SDK tests' app: a refund agent run by the SDK's bundled CLI against the
scripted Anthropic-compatible server at CLAUDE_BASE_URL. Its lookup is `read`, its refund
`once` with a probe that reads the ledger (the payments side), its e-mail `once` without
one; the refund and the e-mail log to the ledger file in CLAUDE_LEDGER and hold, so a kill
lands inside them. Store from PERDURE_DB; `perdure --app claude_agent_app:app worker`."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from claude_agent_sdk import ClaudeAgentOptions, tool

import perdure
from perdure.integrations.claude_agent import ClaudeAgent

HOLD = 1.5  # seconds the refund and the e-mail hold after they started


def log(line: str) -> None:
    with Path(os.environ["CLAUDE_LEDGER"]).open("a") as out:
        out.write(line + "\n")


def ledger() -> list[str]:
    return Path(os.environ["CLAUDE_LEDGER"]).read_text().split()


@tool("lookup", "Look an order up", {"order": str})
async def lookup(args: dict[str, Any]) -> dict[str, Any]:
    log("lookup")
    return {"content": [{"type": "text", "text": f"{args['order']}: paid 30 EUR"}]}


@tool("refund", "Refund an order", {"order": str})
async def refund(args: dict[str, Any]) -> dict[str, Any]:
    log("refund-started")
    await asyncio.sleep(float(os.environ.get("CLAUDE_HOLD", HOLD)))
    log("refund-paid")
    await asyncio.sleep(float(os.environ.get("CLAUDE_HOLD", HOLD)))  # paid, not yet journaled
    return {"content": [{"type": "text", "text": f"refunded {args['order']}"}]}


def refund_probe(args: dict[str, Any]) -> perdure.ProbeAnswer:
    """Did the interrupted refund pay? The payments side (the ledger) knows."""
    if "refund-paid" in ledger():
        return perdure.ProbeAnswer.done(f"refunded {args['order']}")
    return perdure.ProbeAnswer.not_done()


@tool("email", "Tell the customer", {"order": str})
async def email(args: dict[str, Any]) -> dict[str, Any]:
    log("email-started")
    await asyncio.sleep(float(os.environ.get("CLAUDE_HOLD", HOLD)))
    log("email-sent")
    return {"content": [{"type": "text", "text": "sent"}]}


def options() -> ClaudeAgentOptions:
    """The CLI on the scripted server: no built-in tools, no settings files, a config
    folder of the test's own, a key the server does not check."""
    env = {"ANTHROPIC_API_KEY": "sk-scripted", "CLAUDE_CONFIG_DIR": os.environ["CLAUDE_CONFIG"],
           "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1"}  # fmt: skip
    return ClaudeAgentOptions(
        model="claude-sonnet-4-5", tools=[], setting_sources=[], env=env,
        cwd=os.environ["CLAUDE_CONFIG"], max_turns=10,
    )  # fmt: skip


def register(app: perdure.App, name: str = "refunds", **extra: Any) -> ClaudeAgent:
    return ClaudeAgent(
        app, name, options=options(), tools=[lookup, refund, email],
        effects={"lookup": "read"}, probes={"refund": refund_probe},
        upstream=os.environ["CLAUDE_BASE_URL"], **extra,
    )  # fmt: skip


app = perdure.App()
refunds = register(app).workflow()
