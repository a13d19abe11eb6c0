"""Figure R1's refund agent written with the Claude Agent SDK (its bundled Claude Code CLI),
made durable by `perdure.integrations.claude_agent`, and a trial of it under `kill -9`.

The pieces bench/refunds.py can call to put this agent beside the others:
`ClaudeScriptedServer` (refund_model's script on the Anthropic Messages wire, counting
every call as billed), `claude_workflow(app, shop, base_url, refund=...)` (the workflow
`claude.refunds` / `claude.refunds_once`) and `app` (what `perdure worker` processes run:
`--app bench.refunds_claude:app`, configured by REFUND_PAYMENTS_URL, REFUND_MAIL_URL,
REFUND_MODEL and CLAUDE_CONFIG_DIR). Its own trial: N conversations on W worker processes,
a worker `kill -9`ed (and restarted) as soon as it is inside a refund or an e-mail, K
times; parked runs resolved as an operator would (bench/refunds.py's `resolve_parked`);
counted outside the workers.

    python -m bench.refunds_claude --conversations 12 --kills 4 [--store postgres] [--hold 1,3]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from .refunds_world import EXAMPLE, Store, Workers

sys.path.insert(0, str(EXAMPLE))
from refund_model import ORDER, TURNS, Call, next_action
from refund_outside import MailStub, PaymentsStub, QuietServer
from refund_tools import Shop

import perdure
from perdure.store.base import COMPLETED, NEEDS_ATTENTION, TERMINAL

SETTLED = TERMINAL | {NEEDS_ATTENTION}
ROOT = Path(__file__).resolve().parent.parent
MODEL = "claude-sonnet-4-5"


class ClaudeScriptedServer:
    """`POST /v1/messages` on 127.0.0.1 answering refund_model's `next_action` as Anthropic
    server-sent events; every request is counted (billed once it arrived). The sender's pid
    is not known (the CLI sends it through the run's endpoint): 0."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.lock = threading.Lock()
        self._httpd = QuietServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> ClaudeScriptedServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def snapshot(self) -> list[Call]:
        with self.lock:
            return list(self.calls)

    def answer(self, body: dict[str, Any]) -> Iterator[str]:
        messages = body.get("messages") or []
        texts = [b.get("text", "") for b in _blocks(messages[0]) if b.get("type") == "text"]
        found = ORDER.search(texts[-1]) if texts else None
        order = found.group() if found else "o0000"
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        results = [_result_text(b) for m in messages if m.get("role") == "user"
                   for b in _blocks(m) if b.get("type") == "tool_result"]  # fmt: skip
        with self.lock:
            serial = len(self.calls) + 1
            self.calls.append(Call(serial, order, turn, 0, time.monotonic()))
        action = next_action(order, turn, results)
        if action.tool is None:
            block: dict[str, Any] = {"type": "text", "text": f"{action.text} (rq{serial})"}
        else:
            block = {"type": "tool_use", "id": f"toolu_rq{serial}",
                     "name": f"mcp__tools__{action.tool}", "input": action.args}  # fmt: skip
        stop = "end_turn" if action.tool is None else "tool_use"
        usage = {"input_tokens": 50, "output_tokens": 1}
        start = {"id": f"msg_rq{serial}", "type": "message", "role": "assistant",
                 "model": body.get("model", MODEL), "content": [], "stop_reason": None,
                 "stop_sequence": None, "usage": usage}  # fmt: skip
        yield _event("message_start", {"message": start})
        opened = {**block, "input": {}} if action.tool else {"type": "text", "text": ""}
        yield _event("content_block_start", {"index": 0, "content_block": opened})
        delta = ({"type": "input_json_delta", "partial_json": json.dumps(action.args)}
                 if action.tool else {"type": "text_delta", "text": block["text"]})  # fmt: skip
        yield _event("content_block_delta", {"index": 0, "delta": delta})
        yield _event("content_block_stop", {"index": 0})
        yield _event("message_delta", {"delta": {"stop_reason": stop, "stop_sequence": None},
                                       "usage": {"output_tokens": 20}})  # fmt: skip
        yield _event("message_stop", {})

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if not self.path.startswith("/v1/messages") or "count_tokens" in self.path:
                    data = b'{"input_tokens": 50}'
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                payload = "".join(server.answer(json.loads(raw or b"{}"))).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        return Handler


def _event(name: str, data: dict[str, Any]) -> str:
    return f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n"


def _blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content or [] if isinstance(b, dict)]


def _result_text(block: dict[str, Any]) -> str:
    content = block.get("content")
    if isinstance(content, list):
        return "".join(c.get("text", "") for c in content[:1] if isinstance(c, dict)).strip()
    return str(content or "").strip()


def refund_tools(shop: Shop) -> list[Any]:
    """The refund agent's three tools on `shop`, as the SDK's in-process MCP tools."""
    from claude_agent_sdk import tool

    def text(value: str) -> dict[str, Any]:
        return {"content": [{"type": "text", "text": value}]}

    @tool("lookup_order", "Look an order up: its amount and the customer's e-mail", {"order": str})
    async def lookup_order(args: dict[str, Any]) -> dict[str, Any]:
        return text(await shop.lookup_order(args["order"]))

    @tool("issue_refund", "Refund amount EUR of order", {"order": str, "amount": float})
    async def issue_refund(args: dict[str, Any]) -> dict[str, Any]:
        return text(await shop.issue_refund(args["order"], float(args["amount"])))

    @tool("send_email", "E-mail the customer", {"to": str, "order": str, "body": str})
    async def send_email(args: dict[str, Any]) -> dict[str, Any]:
        return text(await shop.send_email(args["to"], args["order"], args["body"]))

    return [lookup_order, issue_refund, send_email]


def claude_options(**more: Any) -> Any:
    """The SDK's options for the refund agent: no built-in tools, no settings files, the CLI's
    configuration in CLAUDE_CONFIG_DIR (or a fresh folder)."""
    from claude_agent_sdk import ClaudeAgentOptions

    config = os.environ.get("CLAUDE_CONFIG_DIR") or tempfile.mkdtemp(prefix="claude-config-")
    env = {"ANTHROPIC_API_KEY": "not-needed", "CLAUDE_CONFIG_DIR": config,
           "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1", **more.pop("env", {})}  # fmt: skip
    return ClaudeAgentOptions(model=MODEL, tools=[], setting_sources=[], env=env, cwd=config,
                              max_turns=8, **more)  # fmt: skip


def claude_workflow(
    app: perdure.App, shop: Shop, base_url: str, *, refund: str, probes: bool = False
) -> Any:
    """The refund agent as the perdure workflow `claude.refunds` (refund `keyed`) or
    `claude.refunds_once` (refund `once`); the e-mail is `once`, the lookup `read`. With
    `probes`, recovery asks the mail provider (and, refund `once`, the payment ledger) about
    an interrupted `once` call before it parks a run (`Shop.find_email`, `Shop.find_refund`,
    given the tool's arguments)."""
    from perdure.integrations.claude_agent import ClaudeAgent

    async def email_sent(args: dict[str, Any]) -> perdure.ProbeAnswer:
        return await shop.find_email(args["to"], args["order"], args["body"])

    async def refunded(args: dict[str, Any]) -> perdure.ProbeAnswer:
        return await shop.find_refund(args["order"], float(args["amount"]))

    asked: dict[str, Any] = {"send_email": email_sent}
    if refund == "once":
        asked["issue_refund"] = refunded
    name = "refunds" if refund == "keyed" else f"refunds_{refund}"
    effects: Any = {"lookup_order": "read", "issue_refund": refund, "send_email": "once"}
    agent = ClaudeAgent(app, name, options=claude_options(), effects=effects, upstream=base_url,
                        tools=refund_tools(shop), probes=asked if probes else None)  # fmt: skip
    return agent.workflow()


def plain_conversation(shop: Shop, base_url: str) -> Any:
    """The same agent without perdure: an async function running one conversation with the
    SDK's `query` straight against the model at `base_url`, returning its result text."""
    from claude_agent_sdk import ResultMessage, create_sdk_mcp_server, query

    tools = refund_tools(shop)
    server = create_sdk_mcp_server("tools", tools=tools)
    options = claude_options(env={"ANTHROPIC_BASE_URL": base_url}, mcp_servers={"tools": server},
                             allowed_tools=[f"mcp__tools__{t.name}" for t in tools])  # fmt: skip

    async def converse(prompt: str) -> str:
        result = ""
        async for message in query(prompt=prompt, options=options):
            if isinstance(message, ResultMessage):
                if message.is_error:
                    raise RuntimeError(f"the conversation ended in error: {message.result}")
                result = message.result or ""
        return result

    return converse


def _worker_app() -> perdure.App:
    """The workers' App: both refund variants, on the world the environment names."""
    built = perdure.App()
    if "REFUND_MODEL" in os.environ:
        low, high = (float(x) for x in os.environ.get("REFUND_HOLD", "0.02,0.1").split(","))
        shop = Shop(os.environ["REFUND_PAYMENTS_URL"], os.environ["REFUND_MAIL_URL"], (low, high))
        probes = os.environ.get("REFUND_PROBES", "0") != "0"
        for variant in ("keyed", "once"):
            claude_workflow(built, shop, os.environ["REFUND_MODEL"], refund=variant,
                            probes=probes)  # fmt: skip
    return built


app = _worker_app()


def trial(
    conversations: int, kills: int, workers: int, store_kind: str, hold: str = "0.02,0.1"
) -> dict[str, Any]:
    """N conversations on `workers` processes, `kills` of them `kill -9`ed on the way."""
    from .refunds import resolve_parked

    payments, mail = PaymentsStub().start(), MailStub().start()
    model = ClaudeScriptedServer().start()
    folder = Path(tempfile.mkdtemp(prefix="refunds-claude-"))
    (folder / "config").mkdir()
    store = Store.create(store_kind, folder)
    client = perdure.App(store.url)
    env = {"PERDURE_DB": store.url, "REFUND_PAYMENTS_URL": payments.url,
           "REFUND_MAIL_URL": mail.url, "REFUND_MODEL": model.base_url,
           "CLAUDE_CONFIG_DIR": str(folder / "config"), "REFUND_HOLD": hold}  # fmt: skip
    command = [sys.executable, "-m", "perdure", "--app", "bench.refunds_claude:app", "worker",
               "--concurrency", "4", "--poll", "0.05", "--lease", "30",
               "--max-recoveries", "-1", "--gc-every", "0", "--grace", "2"]  # fmt: skip
    procs = Workers(command, env, ROOT, folder / "logs", workers)
    world = argparse.Namespace(payments=payments, mail=mail)
    shop = Shop(payments.url, mail.url)
    flows = {v: claude_workflow(client, shop, model.base_url, refund=v) for v in ("keyed", "once")}
    orders = [f"o{1000 + i}" for i in range(conversations)]
    handles = {o: client.start(flows["once" if i % 2 else "keyed"],
                               f"Please refund order {o} in full and let the customer know.",
                               run_id=f"refund-{o}") for i, o in enumerate(orders)}  # fmt: skip
    rng, killed, inside, started = random.Random(1), 0, 0, time.monotonic()
    retried: Counter[tuple[str, str]] = Counter()
    how: Counter[str] = Counter()
    try:
        while time.monotonic() - started < 1800:
            statuses = {o: h.status() for o, h in handles.items()}
            if all(s in SETTLED for s in statuses.values()):
                parked = [o for o, s in statuses.items() if s == NEEDS_ATTENTION]
                if not parked:
                    break
                for order in parked:
                    resolve_parked(client, world, "claude", f"refund-{order}", retried, how)  # type: ignore[arg-type]
            elif killed < kills and procs.ready():
                # the next kill lands inside a refund or an e-mail (its body holding), when
                # one starts within 60 s; else wherever the worker is then
                slot = rng.choice(procs.ready())
                pid, until = procs.pid(slot), time.monotonic() + 60
                while time.monotonic() < until and not (
                    payments.open_calls(pid) or mail.open_calls(pid)
                ):
                    time.sleep(0.05)
                time.sleep(rng.uniform(0.0, 0.5))
                inside += bool(payments.open_calls(pid) or mail.open_calls(pid))
                procs.kill_and_restart(slot)
                killed += 1
                continue
            time.sleep(0.5)
        done = sum(1 for h in handles.values() if h.status() == COMPLETED)
        refunds, emails = payments.applied(), mail.per_order()
        return {
            "store": store_kind, "conversations": conversations, "kills": killed,
            "kills_inside_a_tool": inside, "hold": hold,
            "completed": done, "parked_resolved": dict(how),
            "duplicate_refunds": sum(max(0, refunds[o] - 1) for o in orders),
            "missing_refunds": sum(1 for o in orders if refunds[o] == 0),
            "duplicate_emails": sum(max(0, emails[o] - 1) for o in orders),
            "model_calls": len(model.calls), "rebilled": len(model.calls) - TURNS * conversations,
            "seconds": round(time.monotonic() - started, 1),
        }  # fmt: skip
    finally:
        procs.stop()
        client.close()
        store.drop()
        for server in (payments, mail, model):
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=12)
    parser.add_argument("--kills", type=int, default=4)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--store", default="sqlite", choices=("sqlite", "postgres"))
    parser.add_argument(
        "--hold",
        default="0.02,0.1",
        help="seconds a tool body holds, LOW,HIGH (longer: kills land inside)",
    )
    args = parser.parse_args()
    print(json.dumps(trial(args.conversations, args.kills, args.workers, args.store, args.hold)))


if __name__ == "__main__":
    main()
