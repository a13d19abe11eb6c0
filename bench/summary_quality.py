"""Summary quality of the inbox agent per model tier: facts recalled, invented claims, truncations.

    python -m bench.summary_quality [--tiers scripted,spec,local] [--docs N] [--json out.json]
                                    [--verbose] [--set models.local.temperature=0.2 ...]
                                    [--timeout SECONDS] [--corpus bench/summary_heldout]

For each tier the real inbox agent (examples/inbox/agent.toml, served by that tier through
`with_model`) summarises every document of bench/summary_docs/ on a fresh SQLite store;
the figures come from what landed in outbox/ and from the runs' journals. Documents and
their reference facts: bench/summary_docs/facts.toml; bench/summary_heldout/ is a second
set of the same kinds, written after the agent was tuned and never tuned on. A tier is any
`--model` choice (`spec`: the spec's own tiers, as shipped); `--set` changes the spec for an
experiment.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
import tomllib
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from perdure.agent.facts import HEADING as FACTS_HEADING
from perdure.agent.grounding import COPY, copy_ratio, unsupported
from perdure.agent.sentences import has_one

from .common import ROOT, Table

DOCS = Path(__file__).resolve().parent / "summary_docs"
HELDOUT = Path(__file__).resolve().parent / "summary_heldout"  # never tuned on
SPEC = ROOT / "examples" / "inbox" / "agent.toml"
AGENT = "agent:inbox-summariser"  # the workflow's name: its steps are f"{AGENT}.model" etc.
RUN_TIMEOUT = 900.0  # seconds one document may take before the bench stops waiting for it


# -- the corpus --------------------------------------------------------------------------


@dataclass(frozen=True)
class Fact:
    """One reference fact: every `all` key, and one `any` key if there are any, recalled."""

    what: str
    all: tuple[str, ...] = ()
    any: tuple[str, ...] = ()


@dataclass(frozen=True)
class Doc:
    file: str
    kind: str
    facts: tuple[Fact, ...]
    folder: Path = DOCS  # the corpus it belongs to

    @property
    def path(self) -> Path:
        return self.folder / self.file

    def text(self) -> str:
        return self.path.read_text(encoding="utf-8")


def load_corpus(folder: Path = DOCS) -> list[Doc]:
    """The documents and their facts, in the order of facts.toml."""
    data = tomllib.loads((folder / "facts.toml").read_text(encoding="utf-8"))
    docs = []
    for d in data["doc"]:
        facts = [
            Fact(f["what"], tuple(f.get("all", ())), tuple(f.get("any", ()))) for f in d["facts"]
        ]
        docs.append(Doc(d["file"], d.get("kind", ""), tuple(facts), folder))
    return docs


def normalise(text: str) -> str:
    return " ".join(text.split()).casefold()


def contains(text: str, key: str) -> bool:
    """`key` in `text`, case- and whitespace-insensitive, not inside a longer ASCII word or
    number ("18" is not in "2018"; CJK text has no word gaps, so only ASCII counts)."""
    pattern = r"(?<![a-z0-9])" + re.escape(normalise(key)) + r"(?![a-z0-9])"
    return re.search(pattern, normalise(text)) is not None


def recalled(fact: Fact, summary: str) -> bool:
    return all(contains(summary, k) for k in fact.all) and (
        not fact.any or any(contains(summary, k) for k in fact.any)
    )


# -- one tier ----------------------------------------------------------------------------


@dataclass
class Answer:
    """One model answer, from the journal's `...model` step outcome."""

    text: str
    stop_reason: str
    model: str
    seconds: float


@dataclass
class DocResult:
    """One document through one tier: the run, what landed in outbox/, and the figures."""

    tier: str
    file: str
    status: str
    seconds: float
    facts: int
    recalled: list[str] = field(default_factory=list)  # the `what` of each recalled fact
    first_recalled: int = 0  # facts in the model's first answer, whether it landed or not
    landed: str = ""  # the summary in outbox/ ("" if none)
    answers: list[Answer] = field(default_factory=list)
    rejections: list[str] = field(default_factory=list)  # evidence of each failed acceptance
    unsupported_landed: list[str] = field(default_factory=list)
    unsupported_first: list[str] = field(default_factory=list)
    truncated_landed: bool = False
    copy_landed: float = 0.0  # the landed summary's likeness to a passage of its document
    no_sentence_landed: bool = False  # a title, heading or signature alone
    answered_by: str = ""  # the provider whose answer landed (the outbox file's footer says)
    retries: int = 0  # model call attempts that failed (timeouts, server errors) and were retried
    error: str = ""

    @property
    def truncated_answers(self) -> int:
        return sum(a.stop_reason == "length" for a in self.answers)


def _outcomes(journal: list[Any], step: str) -> list[tuple[Any, dict[str, Any]]]:
    """(entry, recorded value) of each final outcome of `step`, in journal order."""
    found = []
    for entry in journal:
        if entry.kind == "step.outcome" and entry.final and entry.name == step and entry.data:
            found.append((entry, json.loads(entry.data)))
    return found


_FOOTER = re.compile(r"model tier (\S+) \((\S+)\)")


def _landed_body(path: Path, name: str) -> str:
    """The summary inside the output template (`# name`, blank line, summary, `---`)."""
    if not path.exists():
        return ""
    text = path.read_text(encoding="utf-8")
    return text.split("\n---\n", 1)[0].removeprefix(f"# {name}\n").strip()


def read_result(tier: str, doc: Doc, run: Any, journal: list[Any], outbox: Path) -> DocResult:
    """The figures of one run, from its journal, its outbox file and the document."""
    source = doc.text()
    model_step = f"{AGENT}.model"
    answers = []
    for _, data in _outcomes(journal, model_step):
        value = data.get("value") or {}
        answers.append(Answer(
            str((value.get("message") or {}).get("content") or ""),
            str(value.get("stop_reason") or ""), str(value.get("model") or ""),
            float(data.get("ms", 0.0)) / 1000,
        ))  # fmt: skip
    if _outcomes(journal, f"{AGENT}.facts"):  # facts first: that call listed the facts
        answers = answers[1:]
    rejections = []  # a `.ground` verdict not ok, or an `.accept` outcome not done
    for entry in journal:
        if entry.kind != "step.outcome" or not entry.final or not entry.data:
            continue
        value = json.loads(entry.data).get("value") or {}
        if (entry.name == f"{AGENT}.ground" and not value.get("ok")) or (
            entry.name == f"{AGENT}.accept" and not value.get("done")
        ):
            rejections.append(str(value.get("evidence", "")))
    retries = sum(e.kind == "step.attempt_failed" and e.name == model_step for e in journal)
    stamps = [e.at for e in journal]
    result = DocResult(
        tier, doc.file, run.status, max(stamps) - min(stamps) if stamps else 0.0,
        len(doc.facts), answers=answers, rejections=rejections, retries=retries,
        error=(run.error or "")[:300],
    )  # fmt: skip
    outfile = outbox / f"{Path(doc.file).stem}_summary.md"
    footer = _FOOTER.search(outfile.read_text(encoding="utf-8")) if outfile.exists() else None
    if footer:  # "model tier local (local:default)": the provider says more than the tier name
        result.answered_by = footer.group(2).partition(":")[0]
    result.landed = _landed_body(outfile, doc.file)
    result.recalled = [f.what for f in doc.facts if recalled(f, result.landed)]
    if result.landed:
        # the list's heading is the template's, not a claim about the document
        claimed = result.landed.replace(f"\n\n{FACTS_HEADING}\n", "\n\n")
        result.unsupported_landed = unsupported(claimed, source)
        result.copy_landed = round(copy_ratio(result.landed.removeprefix("Summary: "), source), 3)
        result.no_sentence_landed = not has_one(result.landed)
        said = result.landed.split(f"\n\n{FACTS_HEADING}\n", 1)[0]  # the answer, no facts list
        landed = next((a for a in answers if a.text.strip() == said), None)
        result.truncated_landed = landed is not None and landed.stop_reason == "length"
    if answers:
        result.first_recalled = sum(recalled(f, answers[0].text) for f in doc.facts)
        result.unsupported_first = unsupported(answers[0].text, source)
    return result


def run_tier(
    tier: str,
    docs: list[Doc],
    *,
    overrides: dict[str, Any] | None = None,
    timeout: float | None = None,
    keep: Path | None = None,
) -> list[DocResult]:
    """Summarise `docs` with the inbox agent served by `tier`; one DocResult per document.

    Args:
        overrides: spec fields to change, by dotted path (`models.local.temperature`),
            applied after `with_model`.
        timeout: seconds a local tier's model call may take (default: the provider's).
        keep: a folder to work in and leave behind (default: a temporary one, removed).
    """
    import perdure
    from perdure.agent.loop import Agent
    from perdure.agent.serve import with_model
    from perdure.agent.spec import load_spec

    folder = Path(keep) if keep else Path(tempfile.mkdtemp(prefix=f"perdure-summary-{tier}-"))
    try:
        shutil.rmtree(folder, ignore_errors=True)
        (folder / "inbox").mkdir(parents=True)
        shutil.copy(SPEC, folder / "agent.toml")
        for doc in docs:
            shutil.copy(doc.path, folder / "inbox" / doc.file)
        spec = with_overrides(with_model(load_spec(folder / "agent.toml"), tier), overrides or {})
        app = perdure.App(f"sqlite:///{folder}/state.db")
        try:
            agent = Agent(app.runtime, spec, providers=_local_providers(spec, timeout))
            agent.provider(spec.routing.default)  # starts a local model now, not in the timing
            runs = asyncio.run(_work(app, agent, [folder / "inbox" / d.file for d in docs]))
            return [
                read_result(tier, doc, run, journal, folder / "outbox")
                for doc, (run, journal) in zip(docs, runs, strict=True)
            ]
        finally:
            app.close()
    finally:
        if keep is None:
            shutil.rmtree(folder, ignore_errors=True)


def _local_providers(spec: Any, timeout: float | None) -> dict[str, Any]:
    """The local tiers' providers with a longer call timeout. On a loaded machine a call
    that times out keeps llama.cpp's one slot generating, and its retry queues behind it:
    timeouts then cascade, and the bench measures the machine rather than the model."""
    if timeout is None:
        return {}
    from perdure.agent.local_model import ensure_local_model
    from perdure.agent.providers.registry import make_provider

    found = {}
    for name, model in spec.models.items():
        if model.provider == "local":  # as perdure.agent.models.provider_for, but the timeout
            local = ensure_local_model()
            found[name] = make_provider("openai", model=model.model or local.model,
                                        base_url=local.base_url, api_key="local",
                                        timeout=timeout)  # fmt: skip
    return found


def with_overrides(spec: Any, overrides: dict[str, Any]) -> Any:
    """`spec` with the fields at the dotted paths of `overrides` set (validated again)."""
    if not overrides:
        return spec
    data = spec.model_dump()
    for path, value in overrides.items():
        *parents, last = path.split(".")
        node = data
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
    changed = type(spec).model_validate(data)
    changed.folder = spec.folder
    return changed


def parse_set(items: list[str]) -> dict[str, Any]:
    """`key.path=value` pairs; a value is JSON if it parses (0.2, [], true), else text."""
    found: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set {item!r}: write it as dotted.key=value")
        try:
            found[key] = json.loads(text)
        except json.JSONDecodeError:
            found[key] = text
    return found


async def _work(app: Any, agent: Any, files: list[Path]) -> list[tuple[Any, list[Any]]]:
    """One run per file, each started when the one before has ended (a run's deadline counts
    from its start, and its journal span is then its own time), worked by one in-process
    worker; each run's row and journal."""
    from perdure.errors import PerdureError

    worker = app.worker(concurrency=1, poll=0.05)
    runner = asyncio.create_task(worker.run())
    handles = []
    try:
        for file in files:
            handle = await app.start_async(
                agent.workflow, {"file": str(file)}, run_id=f"summary-{file.stem}"
            )
            handles.append(handle)
            with contextlib.suppress(PerdureError):  # failed, or not done: the row says which
                await handle.result_async(timeout=RUN_TIMEOUT)
    finally:
        worker.stop()
        await runner
    return [(await app.client.get(h.id), await app.runtime.store.journal(h.id)) for h in handles]


# -- the figures -------------------------------------------------------------------------


def tier_summary(results: list[DocResult]) -> dict[str, Any]:
    """One tier's totals (the JSON and the table are made from these)."""
    seconds = [r.seconds for r in results]
    rejected = [r for r in results if r.rejections]
    return {
        "docs": len(results),
        "completed": sum(r.status == "completed" for r in results),
        "failed": sum(r.status != "completed" for r in results),
        "facts": sum(r.facts for r in results),
        "recalled": sum(len(r.recalled) for r in results),
        "first_recalled": sum(r.first_recalled for r in results),
        "unsupported_landed": sum(len(r.unsupported_landed) for r in results),
        "docs_unsupported_landed": sum(bool(r.unsupported_landed) for r in results),
        "unsupported_first": sum(len(r.unsupported_first) for r in results),
        "docs_unsupported_first": sum(bool(r.unsupported_first) for r in results),
        "truncated_answers": sum(r.truncated_answers for r in results),
        "truncated_first": sum(r.answers[0].stop_reason == "length" for r in results if r.answers),
        "truncated_landed": sum(r.truncated_landed for r in results),
        "copies_landed": sum(r.copy_landed >= COPY for r in results),
        "model_copies_landed": sum(
            r.copy_landed >= COPY and r.answered_by != "scripted" for r in results
        ),
        "no_sentence_landed": sum(r.no_sentence_landed for r in results),
        "rejected": len(rejected),
        "rejected_then_passed": sum(r.status == "completed" for r in rejected),
        "answered_by": dict(Counter(r.answered_by for r in results if r.answered_by)),
        "model_calls": sum(len(r.answers) for r in results),
        "model_retries": sum(r.retries for r in results),
        "seconds_p50": statistics.median(seconds) if seconds else 0.0,
        "seconds_max": max(seconds, default=0.0),
    }


def _pct(part: int, whole: int) -> str:
    return f"{part}/{whole} ({100 * part / whole:.0f}%)" if whole else "0/0"


def tier_table(summaries: dict[str, dict[str, Any]], corpus: str = "bench/summary_docs") -> Table:
    table = Table(
        f"Summary quality of the inbox agent, per tier ({corpus})",
        ["tier", "docs", "done/failed", "facts in outbox", "facts 1st answer",
         "answered by", "invented: outbox", "invented: 1st", "truncated 1st/outbox",
         "copies (model)", "no sentence", "rejected (then ok)", "calls (retried)",
         "s/doc p50", "s/doc max"],
    )  # fmt: skip
    for tier, s in summaries.items():
        table.rows.append([
            tier, str(s["docs"]), f"{s['completed']}/{s['failed']}",
            _pct(s["recalled"], s["facts"]), _pct(s["first_recalled"], s["facts"]),
            " ".join(f"{t}:{n}" for t, n in sorted(s["answered_by"].items())) or "-",
            f"{s['unsupported_landed']} in {s['docs_unsupported_landed']} docs",
            f"{s['unsupported_first']} in {s['docs_unsupported_first']} docs",
            f"{s['truncated_first']}/{s['truncated_landed']}",
            f"{s['copies_landed']} ({s['model_copies_landed']})", str(s["no_sentence_landed"]),
            f"{s['rejected']} ({s['rejected_then_passed']})",
            f"{s['model_calls']} ({s['model_retries']})",
            f"{s['seconds_p50']:.1f}", f"{s['seconds_max']:.1f}",
        ])  # fmt: skip
    table.notes += [
        "facts: reference facts (facts.toml) found in the summary that landed in outbox/,",
        "  and in the model's first answer; invented: numbers, dates, times and names of the",
        "  summary not found in its document; truncated: the answer stopped at max_tokens;",
        "  answered by: the provider (local, scripted, ...) whose answer landed, per run;",
        f"  copies: summaries >= {COPY} alike to a same-length passage of their document (of",
        "  them from a model); no sentence: a title, heading or signature alone;",
        "  rejected: runs whose acceptance check failed at least once (then ok: completed);",
        "  calls: model answers journaled (retried: attempts that failed, e.g. timed out);",
        "  s/doc: a run's first to last journal entry (runs one after another).",
        f"load avg {', '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cpus "
        "(other processes slow the local model down)",
    ]
    return table


def doc_table(results: list[DocResult]) -> Table:
    table = Table("Per document", ["document", "tier", "status", "by", "facts", "1st", "calls",
                                   "stop reasons", "s", "invented in outbox"])  # fmt: skip
    for r in results:
        calls = f"{len(r.answers)}" + (f" (+{r.retries})" if r.retries else "")
        table.rows.append([
            r.file, r.tier, r.status, r.answered_by or "-", f"{len(r.recalled)}/{r.facts}",
            f"{r.first_recalled}",
            calls, ",".join(a.stop_reason or "-" for a in r.answers),
            f"{r.seconds:.1f}", " ".join(", ".join(r.unsupported_landed).split())[:60] or "-",
        ])  # fmt: skip
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiers", default="scripted,spec",
                        help="comma-separated --model choices (spec: as shipped)")  # fmt: skip
    parser.add_argument("--docs", type=int, default=None, help="only the first N documents")
    parser.add_argument(
        "--corpus", default=str(DOCS),
        help="a folder of documents and their facts.toml (default: bench/summary_docs; "
        "bench/summary_heldout was never tuned on)",
    )  # fmt: skip
    parser.add_argument("--json", default=None, help="also write every figure to this file")
    parser.add_argument("--verbose", action="store_true", help="print a row per document")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="change the spec, e.g. models.local.temperature=0 (repeatable)",
    )  # fmt: skip
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds a local model call may take (default: 60)")  # fmt: skip
    args = parser.parse_args(argv)
    docs = load_corpus(Path(args.corpus))[: args.docs]
    overrides = parse_set(args.set)
    summaries: dict[str, dict[str, Any]] = {}
    everything: list[DocResult] = []
    for tier in [t.strip() for t in args.tiers.split(",") if t.strip()]:
        began = time.monotonic()
        try:
            results = run_tier(tier, docs, overrides=overrides, timeout=args.timeout)
        except Exception as exc:  # one broken tier must not hide the others
            print(f"[{tier}] FAILED: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            continue
        summaries[tier] = tier_summary(results)
        everything += results
        print(f"[{tier}: {len(docs)} docs in {time.monotonic() - began:.0f}s]", flush=True)
    corpus = os.path.relpath(args.corpus, ROOT) if Path(args.corpus).is_absolute() else args.corpus
    print(tier_table(summaries, corpus).render(), flush=True)
    if args.verbose:
        print("\n" + doc_table(everything).render())
    if args.json:
        out = {"tiers": summaries, "docs": [asdict(r) for r in everything],
               "overrides": overrides, "timeout": args.timeout}  # fmt: skip
        Path(args.json).write_text(json.dumps(out, indent=2, ensure_ascii=False) + "\n")
    return 0 if summaries else 1


if __name__ == "__main__":
    raise SystemExit(main())
