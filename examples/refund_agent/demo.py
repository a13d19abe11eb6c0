"""Run the refund agent durably, end to end, in one process: the payments and mail stubs,
a perdure worker on a thread, a few refund conversations, then what the journal and the
outside world say.

    python examples/refund_agent/demo.py --framework pydantic-ai --model function
    python examples/refund_agent/demo.py --framework agents-sdk --model scripted
    python examples/refund_agent/demo.py --framework pydantic-ai --model local
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import threading
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import refund_app  # noqa: E402
from refund_model import ScriptedModelServer  # noqa: E402
from refund_outside import MailStub, PaymentsStub  # noqa: E402
from refund_tools import Shop  # noqa: E402

import perdure  # noqa: E402

MODELS = {
    "function": "pydantic-ai's FunctionModel running the script (pydantic-ai only)",
    "scripted": "the scripted OpenAI-compatible server on 127.0.0.1 (refund_model.py)",
    "local": "the small llama.cpp model perdure ships, served on 127.0.0.1 (no key)",
}


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--framework", choices=refund_app.FRAMEWORKS, default="pydantic-ai")
    parser.add_argument("--model", choices=list(MODELS), default="scripted")
    parser.add_argument("--refund", choices=refund_app.VARIANTS, default="keyed",
                        help="the effect issue_refund is declared with")  # fmt: skip
    parser.add_argument("--orders", type=int, default=3, help="conversations to run")
    parser.add_argument("--db", default=None, help="store URL (default: a fresh SQLite file)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per conversation")
    return parser.parse_args(argv)


def steps(app: perdure.App, run_id: str) -> list[str]:
    """`name (effect)` of each step the run journaled, in order."""
    found: dict[int, str] = {}
    for entry in app.journal(run_id):
        if entry.position is None or not entry.kind.startswith("step."):
            continue
        if entry.kind == "step.intent":
            found[entry.position] = f"{entry.name} ({json.loads(entry.data or '{}')['effect']})"
        else:
            found.setdefault(entry.position, f"{entry.name} (read)")
    return [found[p] for p in sorted(found)]


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.framework == "agents-sdk" and args.model == "function":
        print("--model function is pydantic-ai's FunctionModel: use --model scripted or local")
        return 2
    payments, mail = PaymentsStub().start(), MailStub().start()
    server = ScriptedModelServer().start() if args.model == "scripted" else None
    state = HERE / ".state"
    if args.db is None:
        shutil.rmtree(state, ignore_errors=True)
        state.mkdir()
    url = args.db or f"sqlite:///{state}/refunds.db"
    app = perdure.App(url)
    choice = server.base_url if server is not None else args.model
    print(f"{args.framework} refund agent, refund {args.refund}, model: {MODELS[args.model]}")
    print(f"store {url}; payments {payments.url}; mail {mail.url}\n")
    built = refund_app.build(app, Shop(payments.url, mail.url), choice, (args.framework,))

    worker = app.worker(perdure.WorkerOptions(poll=0.05, gc_every=None, concurrency=4))
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(worker.run(),), daemon=True)
    thread.start()
    try:
        orders = [f"o{n:04d}" for n in range(1, args.orders + 1)]
        handles = [built.start(args.framework, args.refund, order) for order in orders]
        for handle in handles:
            try:
                output: Any = handle.result(timeout=args.timeout)
            except perdure.PerdureError as exc:
                output = f"[{handle.status()}] {exc}"
            if isinstance(output, dict):  # PerdureAgent's raw result: output and messages
                output = output["output"]
            print(f"{handle.id}: {' '.join(str(output).split())}")  # one line
            for line in steps(app, handle.id):
                print(f"    {line}")
    finally:
        loop.call_soon_threadsafe(worker.stop)
        thread.join(30)
        loop.close()
    refunds, sent = payments.applied(), mail.per_order()
    print(f"\npayments stub: {sum(refunds.values())} refund(s) applied "
          f"({payments.deduplicated} repeated call(s) deduplicated by key); "
          f"mail stub: {sum(sent.values())} e-mail(s)")  # fmt: skip
    for order in orders:
        print(f"    {order}: refunded {refunds[order]}x, e-mailed {sent[order]}x")
    if server is not None:
        print(f"model calls: {len(server.snapshot())} (the script needs 4 per conversation)")
    if args.model == "local" and not sum(refunds.values()):
        print("(the 135M local model answers in words and rarely calls tools: the run is durable"
              " all the same; --model scripted shows the whole refund)")  # fmt: skip
    print(f"\ninspect: perdure --db {url} ls")
    app.close()
    for stub in (payments, mail, server):
        if stub is not None:
            stub.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
