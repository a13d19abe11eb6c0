"""Figure R1: refund conversations while a killer `kill -9`s the workers, with and without
perdure, for the refund agent of examples/refund_agent: pydantic-ai (made durable by
`PerdureAgent`, or by the `PerdureDurability` capability: `pydantic-ai-capability`), the
Agents SDK, and the Claude Agent SDK (`claude`: bench/refunds_claude.py, its bundled CLI
against a scripted Anthropic Messages server).

Each trial: N conversations (every second one with `issue_refund` declared `once`, the others
`keyed`), released at a steady rate onto W worker processes; every 0.5-2 s (uniform) a ready
worker is `kill -9`ed and restarted, until every conversation settled. Tool bodies hold
20-100 ms around their effect, so kills land inside them. Counted outside the workers: the
payments and mail stubs count refunds and e-mails, the scripted model server counts (bills)
every model call.

- perdure: the runs are perdure workflows (`perdure worker` processes), their `once` tools
  without probes. When all settled, the runs parked in needs_attention are resolved as an
  operator would (the stub shows the effect happened: resolved with its value; else retried)
  and the workers finish them.
- perdure + probes: the same, the `once` tools with the example's probes (the payment
  ledger's and the mail provider's look-ups, examples/refund_agent/refund_tools.py): recovery
  asks them before parking a run; what they could not tell is resolved as above.
- plain: the same agent without perdure, its conversations in a job queue; a killed worker's
  conversations go back to the queue and start again from the top.

    python -m bench.refunds                    # 200 conversations, 25 kills, every config
    python -m bench.refunds --quick            # 40 conversations, 6 kills
    python -m bench.refunds --stores sqlite --modes perdure,probes --frameworks agents-sdk
    python -m bench.refunds --conversations 20 --stores sqlite \
        --frameworks pydantic-ai-capability,agents-sdk,claude
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .common import ROOT
from .refunds_world import (
    EXAMPLE,
    Chaos,
    Store,
    Workers,
    World,
    describe,
    load,
    perdure_worker_command,
    plain_worker_command,
)

sys.path.insert(0, str(EXAMPLE))
import refund_app
from refund_model import MARKER, TURNS
from refund_tools import Shop

import perdure
from perdure.store.base import COMPLETED, FAILED, NEEDS_ATTENTION, TERMINAL

SETTLED = TERMINAL | {NEEDS_ATTENTION}
CLAUDE = "claude"  # the Claude Agent SDK's refund agent (bench/refunds_claude.py)
FRAMEWORKS = (*refund_app.FRAMEWORKS, CLAUDE)
CLAUDE_APP = "bench.refunds_claude:app"
ONCE_TOOLS = {"send_email"}  # and issue_refund in the `once` conversations


@dataclass(frozen=True)
class Options:
    """One trial's size and pace."""

    conversations: int = 200
    workers: int = 2
    concurrency: int = 8
    kill_every: tuple[float, float] = (0.5, 2.0)
    kills_wanted: int = 20
    backlog: int = 0  # conversations released and unsettled at most (0: 2 per worker slot)
    seed: int = 1
    timeout: float = 900.0
    probes: bool = False  # perdure: the once tools declare the example's probes
    hold: tuple[float, float] = (0.02, 0.1)  # seconds a tool body holds around its effect


@dataclass
class Result:
    """What one trial counted; None: does not apply to this mode."""

    framework: str
    mode: str
    store: str
    conversations: int
    probes: bool = False
    kills: int = 0
    kills_in_tool: int = 0
    once_cut: int = 0  # `once` tool bodies a kill cut short
    finished: int = 0  # when the chaos ended
    parked: int | None = None  # needs_attention when the chaos ended
    resolved: str = "-"  # how the parked runs were resolved (value / retry)
    final_finished: int = 0
    final_needs_attention: int | None = None
    refunds_twice: int = 0
    emails_twice: int = 0
    missing_refunds: int = 0
    model_calls: int = 0
    beyond_min: int = 0
    rebilled_recorded: int | None = None  # calls sent again after their response was journaled
    resent_not_cut: int | None = None  # re-sent calls whose sender had not been killed
    once_rerun: int = 0  # once tool bodies started again without an operator's or probe's word
    probe_answers: str = "-"  # perdure + probes: the answers journaled, by verdict
    seconds: float = 0.0
    settled: bool = True
    notes: list[str] = field(default_factory=list)


def backlog(options: Options) -> int:
    return options.backlog or 2 * options.workers * options.concurrency


def orders(count: int) -> list[str]:
    return [f"o{n:04d}" for n in range(1, count + 1)]


def variant(index: int) -> str:
    return refund_app.VARIANTS[index % 2]


# -- counting ------------------------------------------------------------------------


def count_outside(result: Result, world: World, names: list[str], variants: dict[str, str],
                  retried: Counter[tuple[str, str]]) -> None:  # fmt: skip
    """Refunds, e-mails, model calls and once re-runs, from the stubs and the model server."""
    applied, sent = world.payments.applied(), world.mail.per_order()
    result.refunds_twice = sum(applied[o] > 1 for o in names)
    result.emails_twice = sum(sent[o] > 1 for o in names)
    result.missing_refunds = sum(applied[o] == 0 for o in names)
    calls = world.model.snapshot()
    result.model_calls = len(calls)
    result.beyond_min = len(calls) - TURNS * len(names)
    begun = {"send_email": world.mail.begun("send_email"),
             "issue_refund": world.payments.begun("issue_refund")}  # fmt: skip
    for order in names:
        once = ["send_email"] + (["issue_refund"] if variants[order] == "once" else [])
        for tool in once:
            result.once_rerun += max(0, begun[tool][order] - 1 - retried[(tool, order)])


MODEL_STEPS = (".model", "__model.request")  # the model steps of the integrations


def count_journals(result: Result, world: World, client: perdure.App, ids: list[str],
                   killed: set[int]) -> None:  # fmt: skip
    """Model calls billed again although their response was journaled, and re-sent calls
    whose earlier attempt came from a worker that was not killed."""
    recorded: set[int] = set()
    for run_id in ids:
        for entry in client.journal(run_id):
            if entry.kind == "step.outcome" and (entry.name or "").endswith(MODEL_STEPS):
                recorded.update(int(m) for m in MARKER.findall(entry.data or ""))
    groups: dict[tuple[str, int], list[Any]] = defaultdict(list)
    for call in world.model.snapshot():
        groups[(call.order, call.turn)].append(call)
    rebilled = not_cut = 0
    for calls in groups.values():
        calls.sort(key=lambda c: c.serial)
        kept = [c.serial for c in calls if c.serial in recorded]
        if kept:
            rebilled += sum(c.serial > kept[0] for c in calls)
        not_cut += sum(c.pid not in killed for c in calls[:-1])
    result.rebilled_recorded = rebilled
    result.resent_not_cut = None if result.framework == CLAUDE else not_cut  # no sender pid
    if len(recorded) != TURNS * len(ids):
        result.notes.append(f"{len(recorded)} recorded model responses, not {TURNS * len(ids)}")


# -- perdure ---------------------------------------------------------------------------


def tool_of(step: str | None) -> str:
    """The tool a tool step calls: `pydantic_ai:refunds.tool.send_email`,
    `refunds__function_toolset__<agent>.call_tool:send_email` (PerdureDurability's names) and
    `refunds.tool.send_email` (Claude) all call `send_email`."""
    return (step or "").rsplit(".", 1)[-1].rsplit(":", 1)[-1]


def resolve_parked(client: perdure.App, world: World, framework: str, run_id: str,
                   retried: Counter[tuple[str, str]], how: Counter[str]) -> None:  # fmt: skip
    """Settle a parked tool call as an operator would: look at the payments or mail provider;
    if the effect is there, mark the step done with what the tool would have returned, else
    retry it."""
    stuck = [e for e in client.journal(run_id) if e.kind == "step.needs_attention"]
    if not stuck or stuck[-1].position is None:
        return
    position, tool = stuck[-1].position, tool_of(stuck[-1].name)
    order = run_id.removeprefix("refund-")
    # what GET /refunds?order= and GET /sent?order= answer, read in this process
    if tool == "issue_refund":
        found = world.payments.route("GET", "/refunds", {"order": order}, {})
        text = json.dumps({"refund_id": found[0]["refund_id"], "amount": found[0]["amount"]}
                          if found else {})  # fmt: skip
    else:
        found = world.mail.route("GET", "/sent", {"order": order}, {})
        text = f"sent {found[0]['message_id']}" if found else ""
    try:
        if found:
            client.resolve(run_id, position, value=text)  # what the tool would have returned
            how["value"] += 1
        else:
            client.resolve(run_id, position, retry=True)
            retried[(tool, order)] += 1
            how["retry"] += 1
    except perdure.PerdureError:
        pass  # resolved already (seen parked twice while the resolution was applied)


def count_probes(client: perdure.App, ids: list[str], retried: Counter[tuple[str, str]]) -> str:
    """The probe answers the runs journaled, by verdict; a `not done` one counts in `retried`
    (the probe, not a person, let that once tool run again)."""
    answers: Counter[str] = Counter()
    for run_id in ids:
        for entry in client.journal(run_id):
            if entry.kind != "step.probed":
                continue
            answer = json.loads(entry.data or "{}").get("answer", "?")
            answers[answer] += 1
            if answer == "not_done":
                tool = tool_of(entry.name)
                retried[(tool, run_id.removeprefix("refund-"))] += 1
    words = {"done": "done", "not_done": "not done", "cannot_tell": "cannot tell"}
    return ", ".join(f"{answers[k]} {w}" for k, w in words.items())


def perdure_trial(framework: str, store_kind: str, options: Options, folder: Path) -> Result:
    """N conversations as perdure runs on `perdure worker` processes, under the killer."""
    result = Result(framework, "perdure", store_kind, options.conversations, options.probes)
    world = new_world(framework)
    store = Store.create(store_kind, folder)
    client = perdure.App(store.url)
    workers: Workers | None = None
    try:
        names = orders(options.conversations)
        variants = {o: variant(i) for i, o in enumerate(names)}
        ids = [f"refund-{o}" for o in names]
        env = {**world_env(framework, world, folder), "PERDURE_DB": store.url,
               "REFUND_FRAMEWORKS": framework, "REFUND_PROBES": "1" if options.probes else "0",
               "REFUND_HOLD": ",".join(str(h) for h in options.hold)}  # fmt: skip
        shop = Shop(world.payments.url, world.mail.url)
        if framework == CLAUDE:
            from .refunds_claude import claude_workflow

            flows = {v: claude_workflow(client, shop, world.model.base_url, refund=v,
                                        probes=options.probes)
                     for v in refund_app.VARIANTS}  # fmt: skip
            release = [lambda o=o: client.start(flows[variants[o]], refund_app.prompt(o),
                                                run_id=f"refund-{o}")
                       for o in names]  # fmt: skip
            command, cwd = perdure_worker_command(options.concurrency, CLAUDE_APP), ROOT
        else:
            built = refund_app.build(client, shop, world.model.base_url, (framework,),
                                     options.probes)  # fmt: skip
            release = [lambda o=o: built.start(framework, variants[o], o) for o in names]
            command, cwd = perdure_worker_command(options.concurrency), EXAMPLE
        workers = Workers(command, env, cwd, folder / "logs", options.workers)
        chaos = Chaos(workers, world, options.kill_every, options.kills_wanted,
                      backlog(options), random.Random(options.seed))  # fmt: skip

        def unsettled() -> int:  # a conversation not released yet has no status
            return sum(s not in SETTLED and s is not None for s in client.statuses(ids).values())

        started = time.monotonic()
        result.settled = chaos.run(release, unsettled, lambda pid: None, options.timeout)
        statuses = client.statuses(ids)
        result.finished = sum(s == COMPLETED for s in statuses.values())
        result.parked = sum(s == NEEDS_ATTENTION for s in statuses.values())
        retried: Counter[tuple[str, str]] = Counter()
        how: Counter[str] = Counter()
        limit = time.monotonic() + options.timeout
        while time.monotonic() < limit:
            statuses = client.statuses(ids)
            if all(s in TERMINAL for s in statuses.values()):
                break
            for run_id, status in statuses.items():
                if status == NEEDS_ATTENTION:
                    resolve_parked(client, world, framework, run_id, retried, how)
            time.sleep(0.2)
        result.seconds = time.monotonic() - started
        statuses = client.statuses(ids)
        result.final_finished = sum(s == COMPLETED for s in statuses.values())
        result.final_needs_attention = sum(s == NEEDS_ATTENTION for s in statuses.values())
        result.resolved = f"{how['value']} value, {how['retry']} retry"
        if options.probes:
            result.probe_answers = count_probes(client, ids, retried)
        fill_kills(result, chaos, variants)
        count_outside(result, world, names, variants, retried)
        count_journals(result, world, client, ids, {k.pid for k in chaos.kills})
        result.notes += [f"worker exited by itself: {log}" for log in workers.died()]
        others = Counter(s for s in statuses.values() if s not in (COMPLETED, NEEDS_ATTENTION))
        result.notes += [f"{n} run(s) {s}" for s, n in others.items()]
        result.notes += [f"run {run_id} failed: {client.get_run(run_id).error}"
                         for run_id, status in statuses.items() if status == FAILED]  # fmt: skip
    finally:
        if workers is not None:
            workers.stop()
        client.close()
        store.drop()
        world.stop()
    return result


def new_world(framework: str) -> World:
    """The stubs and the model server a trial of `framework` talks to."""
    if framework == CLAUDE:
        from .refunds_claude import ClaudeScriptedServer

        return World(ClaudeScriptedServer().start())
    return World()


def world_env(framework: str, world: World, folder: Path) -> dict[str, str]:
    """What a worker of `framework` needs to find the world (the Claude CLI: a folder for
    its configuration too)."""
    if framework != CLAUDE:
        return world.env()
    (folder / "claude-config").mkdir(exist_ok=True)
    return {**world.env(), "CLAUDE_CONFIG_DIR": str(folder / "claude-config")}


def fill_kills(result: Result, chaos: Chaos, variants: dict[str, str]) -> None:
    result.kills = len(chaos.kills)
    result.kills_in_tool = sum(bool(k.in_tools) for k in chaos.kills)
    result.once_cut = sum(
        p.tool in ONCE_TOOLS or variants.get(p.order) == "once"
        for k in chaos.kills
        for p in k.in_tools
        if p.tool != "lookup_order"
    )


# -- without perdure: a job queue ------------------------------------------------------------


class Queue:
    """Conversations to run, in a SQLite table: claimed by a worker's pid, done, or back in
    the queue when that worker died (as a broker redelivers an unacknowledged message)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with self._connect() as db:
            db.execute("CREATE TABLE IF NOT EXISTS jobs (ord TEXT PRIMARY KEY, state TEXT, "
                       "owner INTEGER)")  # fmt: skip

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=60, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        return db

    def put(self, order: str) -> None:
        with self._connect() as db:
            db.execute("INSERT INTO jobs VALUES (?, 'queued', NULL)", (order,))

    def claim(self, pid: int) -> str | None:
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            row = db.execute("SELECT ord FROM jobs WHERE state='queued' ORDER BY ord LIMIT 1")
            found = row.fetchone()
            if found is not None:
                db.execute("UPDATE jobs SET state='running', owner=? WHERE ord=?", (pid, found[0]))
            db.execute("COMMIT")
            return None if found is None else str(found[0])

    def finish(self, order: str, state: str = "done") -> None:
        with self._connect() as db:
            db.execute("UPDATE jobs SET state=?, owner=NULL WHERE ord=?", (state, order))

    def requeue(self, pid: int) -> None:
        with self._connect() as db:
            db.execute("UPDATE jobs SET state='queued', owner=NULL "
                       "WHERE owner=? AND state='running'", (pid,))  # fmt: skip

    def left(self) -> int:
        with self._connect() as db:
            return int(db.execute("SELECT count(*) FROM jobs WHERE state!='done'").fetchone()[0])

    def done(self) -> int:
        with self._connect() as db:
            return int(db.execute("SELECT count(*) FROM jobs WHERE state='done'").fetchone()[0])


def plain_trial(framework: str, options: Options, folder: Path) -> Result:
    """The same conversations, the framework alone, restarted conversations from the top."""
    result = Result(framework, "plain", "-", options.conversations)
    world = new_world(framework)
    queue = Queue(folder / "queue.db")
    workers: Workers | None = None
    try:
        names = orders(options.conversations)
        variants = {o: variant(i) for i, o in enumerate(names)}
        command = plain_worker_command(framework, queue.path, options.concurrency)
        workers = Workers(command, world_env(framework, world, folder), ROOT, folder / "logs",
                          options.workers)  # fmt: skip
        chaos = Chaos(workers, world, options.kill_every, options.kills_wanted,
                      backlog(options), random.Random(options.seed))  # fmt: skip
        started = time.monotonic()
        release = [lambda o=o: queue.put(o) for o in names]
        result.settled = chaos.run(release, queue.left, queue.requeue, options.timeout)
        result.seconds = time.monotonic() - started
        result.finished = result.final_finished = queue.done()
        fill_kills(result, chaos, variants)
        count_outside(result, world, names, variants, Counter())
        result.notes += [f"worker exited by itself: {log}" for log in workers.died()]
    finally:
        if workers is not None:
            workers.stop()
        world.stop()
    return result


def plain_worker(framework: str, queue_path: Path, concurrency: int) -> None:
    """A worker process of the plain setup: claim a conversation, run it, mark it done."""
    import os

    shop = Shop(os.environ["REFUND_PAYMENTS_URL"], os.environ["REFUND_MAIL_URL"])
    queue = Queue(queue_path)
    if framework == CLAUDE:
        from .refunds_claude import plain_conversation

        converse = plain_conversation(shop, os.environ["REFUND_MODEL"])
    elif framework.startswith("pydantic-ai"):  # the capability's agent alone is this one
        model = refund_app.model_for(framework, os.environ["REFUND_MODEL"])
        import refund_pydantic_ai

        pai = refund_pydantic_ai.refund_agent(shop, model)

        async def converse(text: str) -> Any:
            return (await pai.run(text)).output

    else:
        import agents
        import refund_agents_sdk

        model = refund_app.model_for(framework, os.environ["REFUND_MODEL"])
        sdk = refund_agents_sdk.refund_agent(shop, model)

        async def converse(text: str) -> Any:
            return (await agents.Runner.run(sdk, text)).final_output

    async def loop() -> None:
        while True:
            order = queue.claim(os.getpid())
            if order is None:
                await asyncio.sleep(0.05)
                continue
            try:
                await converse(refund_app.prompt(order))
            except Exception as exc:  # a job queue retries a failed job
                print(f"{order}: {type(exc).__name__}: {exc}", flush=True)
                queue.finish(order, "queued")
            else:
                queue.finish(order)

    async def main() -> None:
        print("ready", flush=True)
        await asyncio.gather(*(loop() for _ in range(concurrency)))

    asyncio.run(main())


# -- the report -------------------------------------------------------------------------------

COLUMNS = [
    ("configuration", lambda r: f"{'perdure + ' if r.mode == 'perdure' else ''}{r.framework}"
     f"{'' if r.mode == 'perdure' else ' alone'}{' + probes' if r.probes else ''}"),
    ("store", lambda r: r.store),
    ("kills (in a tool)", lambda r: f"{r.kills} ({r.kills_in_tool})"),
    ("finished", lambda r: f"{r.finished}/{r.conversations}"),
    ("needs_attention", lambda r: describe(r.parked)),
    ("refunds >1", lambda r: r.refunds_twice),
    ("e-mails >1", lambda r: r.emails_twice),
    ("missing refunds", lambda r: r.missing_refunds),
    ("model calls beyond min", lambda r: f"{r.beyond_min} of {r.model_calls}"),
    ("re-billed after recorded", lambda r: describe(r.rebilled_recorded)),
    ("once re-run unasked", lambda r: r.once_rerun),
    ("s", lambda r: f"{r.seconds:.0f}"),
]  # fmt: skip

FINAL = [
    ("configuration", COLUMNS[0][1]),
    ("store", lambda r: r.store),
    ("once cut by a kill", lambda r: r.once_cut),
    ("probe answers", lambda r: r.probe_answers),
    ("parked", lambda r: describe(r.parked)),
    ("resolved", lambda r: r.resolved),
    ("finished", lambda r: f"{r.final_finished}/{r.conversations}"),
    ("needs_attention", lambda r: describe(r.final_needs_attention)),
    ("refunds >1", lambda r: r.refunds_twice),
    ("missing refunds", lambda r: r.missing_refunds),
    ("re-sent, sender not killed", lambda r: describe(r.resent_not_cut)),
]


def table(results: list[Result], columns: list[tuple[str, Any]]) -> str:
    rows = [[h for h, _ in columns]] + [[str(f(r)) for _, f in columns] for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    lines = [" | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def report(results: list[Result], options: Options) -> str:
    out = [
        table(results, COLUMNS),
        "",
        "perdure's parked runs resolved from the stubs (value if the effect happened, else "
        "retry), and the final state:",
        table([r for r in results if r.mode == "perdure"], FINAL),
    ]
    for r in results:
        out += [f"note ({r.mode} {r.framework} {r.store}): {n}" for n in r.notes]
        if not r.settled:
            out.append(f"note ({r.mode} {r.framework} {r.store}): did not settle in time")
        if r.kills < options.kills_wanted:
            out.append(f"note ({r.mode} {r.framework} {r.store}): only {r.kills} kills")
    return "\n".join(out)


def commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, cwd=EXAMPLE)  # fmt: skip
    return done.stdout.strip() or "?"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=200)
    parser.add_argument("--kills", type=int, default=25, help="kill -9s per trial (>= 20)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8, help="per worker")
    parser.add_argument("--backlog", type=int, default=0,
                        help="conversations in flight (default: 2 per worker slot)")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="40 conversations, 6 kills")
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS),
                        help=f"some of {', '.join(FRAMEWORKS)}")  # fmt: skip
    parser.add_argument("--modes", default="perdure,probes,plain",
                        help="perdure (no probes), probes (perdure + probes), plain")  # fmt: skip
    parser.add_argument("--stores", default="sqlite,postgres", help="for perdure")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--kill-every", default="0.5,2.0",
                        help="seconds between kills, drawn uniformly: LO,HI")  # fmt: skip
    parser.add_argument("--hold", default="0.02,0.1",
                        help="seconds a tool body holds around its effect (perdure)")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="also print the results as JSON")
    parser.add_argument("--plain-worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--queue", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.plain_worker:
        plain_worker(args.plain_worker, Path(args.queue), args.concurrency)
        return 0
    conversations, kills = (40, 6) if args.quick else (args.conversations, args.kills)
    low, high = (float(s) for s in args.hold.split(","))
    first, last = (float(s) for s in args.kill_every.split(","))
    options = Options(conversations, args.workers, args.concurrency, (first, last), kills,
                      args.backlog, args.seed, hold=(low, high))  # fmt: skip
    print(f"refund crash bench: {conversations} conversations (half refund keyed, half once), "
          f"{args.workers} workers x {args.concurrency}, a kill -9 every "
          f"{args.kill_every.replace(',', '-')} s, "
          f"{kills} kills per trial, tool bodies holding {args.hold} s; commit {commit()}, "
          f"load {load()}", flush=True)  # fmt: skip
    results: list[Result] = []
    for framework in args.frameworks.split(","):
        modes = args.modes.split(",")
        trials = [(m, s) for m in ("perdure", "probes") if m in modes
                  for s in args.stores.split(",")]  # fmt: skip
        # the capability's agent alone is pydantic-ai's alone: one plain trial for both
        alone = "plain" in modes and framework != "pydantic-ai-capability"
        trials += [("plain", "-")] if alone else []
        for mode, store in trials:
            with tempfile.TemporaryDirectory(prefix="perdure-bench-refunds-") as tmp:
                if mode in ("perdure", "probes"):
                    asked = dataclasses.replace(options, probes=mode == "probes")
                    result = perdure_trial(framework, store, asked, Path(tmp))
                else:
                    result = plain_trial(framework, options, Path(tmp))
            results.append(result)
            print(f"  {mode} {framework} {store}: {result.kills} kills, "
                  f"{result.final_finished}/{conversations} finished in {result.seconds:.0f} s, "
                  f"load {load()}", flush=True)  # fmt: skip
    print()
    print(report(results, options))
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
