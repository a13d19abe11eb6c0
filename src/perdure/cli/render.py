"""Plain-text rendering of runs, journals and reports for the terminal.

Run data (results, errors, journal data, step details) is shown through
`observe.redact.Redactor`, the one the API, the dashboard and MCP use, and masked
before it is cut to fit a column, so a cut never leaves part of a secret showing.

Everything is printed through `echo`, which writes every character the id rule refuses
(`store.names`: control, format and invisible ones) as an escape, line breaks aside; a stored
value in a table cell or a field is `shown`, its line breaks escaped too. So nothing stored,
old rows made before the rule included, can move the cursor, retitle or clear the terminal,
reorder a line or split one.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import click

from ..engine.client import continued_as, origin_of
from ..engine.inspection import EffectRow, ReplayReport, StepReport
from ..engine.origins import started_by
from ..engine.reasons import reason_of, shown_status
from ..engine.versions import summary
from ..observe.redact import Redactor
from ..store.base import Entry, RunRow
from ..store.names import escape
from ..triggers.schedule_sql import ScheduleRow, TickRow


def shown(value: object) -> str:
    """One value (an id, a name, a cell) as it may be printed: every refused character,
    line breaks included, as an escape."""
    return escape(str(value))


def echo(text: object = "", *, err: bool = False) -> None:
    """`click.echo` of `text` with every refused character but the line break escaped."""
    click.echo(escape(str(text), keep="\n"), err=err)


def print_json(value: object) -> None:
    """One JSON document on stdout (ASCII: every other character, control ones included, as
    a JSON escape, so nothing stored can reach the terminal raw)."""
    click.echo(json.dumps(value))


def cut(text: str, width: int | None) -> str:
    """`text` cut to `width` characters, ending in "…" when cut (None: never cut)."""
    if width is None or len(text) <= width:
        return text
    return text[: width - 1] + "…"


def cut_note(what: str, command: str) -> str:
    """The line that says values were cut, and how to see them whole."""
    return f"({what} cut to fit, ending in …: {command} --wide prints every value in full)"


def when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")


def table(rows: Sequence[Sequence[object]], header: Sequence[str]) -> str:
    """Rows in columns; every cell `shown`, so no stored value can break the table."""
    rows = [[shown(c) for c in r] for r in rows]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(header, widths, strict=True)).rstrip()]
    lines += [
        "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    ]
    return "\n".join(lines)


def runs(
    rows: Sequence[RunRow], origins: Mapping[str, dict[str, Any]],
    paused: Collection[str] = (), now: float | None = None,
) -> str:  # fmt: skip
    """The runs as `perdure ls` prints them; `origins` (run id -> origin): what started
    each (TRIGGER: `message orders`, `schedule nightly`, `client`)."""
    if not rows:
        return "no runs"
    return table(
        [(r.id, r.workflow, shown_status(r, paused, now), started(origins.get(r.id, {})),
          when(r.created_at), when(r.updated_at),
          reason_of(r)) for r in rows],
        ("RUN", "WORKFLOW", "STATUS", "TRIGGER", "CREATED", "UPDATED", "REASON"),
    )  # fmt: skip


def started(origin: dict[str, Any]) -> str:
    """What started a run in one phrase: its trigger kind and short source
    (`message orders`; `client`)."""
    kind, by = started_by(origin)
    return kind if by is None else f"{kind} {shown(by)}"


def run_header(
    run: RunRow,
    entries: Sequence[Entry] = (),
    paused: Collection[str] = (),
    now: float | None = None,
    wide: bool = False,
) -> str:
    """The run's fields (its status as `ls` shows it: `paused` when its workflow is);
    with its journal, also the run it continued from (continue_as_new); `wide`: the result
    uncut and the error's traceback."""
    redactor = Redactor()
    status = shown_status(run, paused, now)
    held = "  (its workflow is paused: perdure resume --workflow)" if status == "paused" else ""
    lines = [
        f"run       {shown(run.id)}",
        f"workflow  {shown(run.workflow)}  (code version {shown(run.code_version)})",
        f"status    {status}" + ("  (pause requested)" if run.pause_requested else "") + held,
        f"created   {when(run.created_at)}   updated {when(run.updated_at)}",
    ]
    if run.wake_at:
        lines.append(f"wakes     {when(run.wake_at)}  ({shown(run.waiting_for or 'timer')})")
    elif run.waiting_for and run.status == "waiting":
        lines.append(f"waits for {shown(run.waiting_for)}")
    if run.parent_id:
        lines.append(f"parent    {shown(run.parent_id)}")
    previous = origin_of(entries).get("continued")
    if previous:
        lines.append(f"continued from {shown(previous)}  (continue_as_new)")
    successor = continued_as(run)
    if successor:
        lines.append(f"continued as   {shown(successor)}  (continue_as_new; result() follows it)")
    if run.lease_owner and run.status in ("running", "cancelling"):
        until = f"until {when(run.lease_until)}" if run.lease_until else "released (claimable now)"
        lines.append(
            f"lease     {shown(run.lease_owner)} {until} "
            f"(epoch {run.lease_epoch}, recoveries {run.recoveries})"
        )
    if run.result is not None:
        result = cut(redactor.json_text(run.result) or "", None if wide else 200)
        lines.append(f"result    {shown(result)}")
        if result.endswith("…"):
            lines.append(cut_note("result", f"perdure show {shown(run.id)}"))
    if run.error is not None:
        err = redactor.value(json.loads(run.error))
        if not isinstance(err, dict):
            err = {"message": err}
        lines.append(f"error     {shown(err.get('type'))}: {shown(err.get('message'))}")
        trace = err.get("traceback")
        if isinstance(trace, str) and trace:
            if wide:
                lines += [f"  {line}" for line in trace.rstrip().splitlines()]
            else:
                lines.append(f"          (its traceback: perdure show {shown(run.id)} --wide)")
    return "\n".join(lines)


def timeline(entries: Sequence[Entry], wide: bool = False, run_id: str = "RUN") -> str:
    """The journal, one entry a line; DATA cut to 70 characters unless `wide` (a line says
    so when anything was cut)."""
    redactor = Redactor()
    rows = []
    was_cut = False
    for e in entries:
        pos = "" if e.position is None else str(e.position)
        attempt = str(e.attempt) if e.attempt else ""
        full = redactor.json_text(e.data) or ""
        data = cut(full, None if wide else 70)
        was_cut = was_cut or data != full
        rows.append((str(e.seq), when(e.at), pos, e.kind, e.name, attempt, data))
    shown_rows = table(rows, ("SEQ", "AT", "POS", "KIND", "NAME", "ATT", "DATA"))
    if not was_cut:
        return shown_rows
    note = cut_note("DATA", f"perdure show {shown(run_id)}")
    return f"{shown_rows}\n{note}; one step whole: perdure show {shown(run_id)} --step POS"


def step_entries(entries: Sequence[Entry]) -> str:
    """One step's entries in full: each entry's data as indented JSON, and the traceback of
    any error in it as text."""
    redactor = Redactor()
    out: list[str] = []
    for e in entries:
        attempt = f"  attempt {e.attempt}" if e.attempt else ""
        out.append(f"#{e.seq}  {when(e.at)}  {e.kind}  {shown(e.name)}{attempt}")
        data = redactor.value(json.loads(e.data)) if e.data else None
        traces: list[str] = []
        _pop_tracebacks(data, traces)
        if data is not None:
            out += [f"  {line}" for line in json.dumps(data, indent=2).splitlines()]
        for trace in traces:
            out.append("  traceback:")
            out += [f"    {line}" for line in trace.rstrip().splitlines()]
    return "\n".join(out)


def _pop_tracebacks(value: object, into: list[str]) -> None:
    """Move every `traceback` text out of `value`'s dicts into `into` (shown as text)."""
    if isinstance(value, dict):
        trace = value.get("traceback")
        if isinstance(trace, str):
            into.append(trace)
            value["traceback"] = "(below)"
        for item in value.values():
            _pop_tracebacks(item, into)
    elif isinstance(value, list):
        for item in value:
            _pop_tracebacks(item, into)


def explanation(reports: Sequence[StepReport], wide: bool = False, run_id: str = "RUN") -> str:
    """Per step, what happened (cut to 60 characters unless `wide`, a line saying so) and
    what recovery would do now."""
    if not reports:
        return "no steps recorded yet"
    redactor = Redactor()
    details = [redactor.text(r.detail) for r in reports]
    width = None if wide else 60
    shown_rows = table(
        [
            (
                str(r.position),
                f"{r.kind} {r.name}",
                r.effect or "-",
                str(r.attempts or ""),
                r.state,
                cut(detail, width),
                r.recovery,
            )
            for r, detail in zip(reports, details, strict=True)
        ],
        ("POS", "CALL", "EFFECT", "ATT", "STATE", "WHAT HAPPENED", "IF THE WORKER DIED NOW"),
    )
    if wide or all(len(d) <= 60 for d in details):
        return shown_rows
    return f"{shown_rows}\n{cut_note('WHAT HAPPENED', f'perdure explain {shown(run_id)}')}"


def effects(rows: Sequence[EffectRow]) -> str:
    if not rows:
        return "no steps registered"
    return table(
        [(r.name, r.effect, r.retry, r.timeout, r.recovery) for r in rows],
        ("STEP", "EFFECT", "RETRY", "TIMEOUT", "RECOVERY AFTER A CRASH MID-STEP"),
    )


def replay(report: ReplayReport) -> str:
    said = _replay(report)
    if report.outlook.upgrade or report.outlook.wait or report.outlook.pinned:
        said += f"\nversions: {summary(report.outlook)}"
    return said


def _replay(report: ReplayReport) -> str:
    if not report.divergences:
        return f"replay-check: {report.checked} unfinished run(s) replay cleanly"
    rows = [
        (
            d.run_id,
            d.workflow,
            "-" if d.position is None else str(d.position),
            d.expected,
            d.found,
            d.run_version,
        )
        for d in report.divergences
    ]
    head = (
        f"replay-check: {len(report.divergences)} of {report.checked} unfinished run(s) "
        "diverge from the current code"
    )
    return (
        head
        + "\n"
        + table(rows, ("RUN", "WORKFLOW", "POS", "JOURNAL HAS", "CODE CALLS", "RUN VERSION"))
    )


def _timing(row: ScheduleRow) -> str:
    if row.cron is not None:
        return f"cron '{row.cron}' {row.tz}"
    return f"every {row.every:g}s"


def schedules(rows: Sequence[ScheduleRow]) -> str:
    if not rows:
        return "no schedules"
    body = [
        [
            r.name,
            r.workflow,
            _timing(r),
            "paused" if r.paused else when(r.next_fire),
            f"{r.catchup}/{r.overlap}",
            r.source,
        ]
        for r in rows
    ]
    return table(body, ["NAME", "WORKFLOW", "WHEN", "NEXT (UTC)", "CATCHUP/OVERLAP", "FROM"])


def schedule(row: ScheduleRow, upcoming: Sequence[float], ticks: Sequence[TickRow]) -> str:
    lines = [
        f"schedule  {shown(row.name)}  ({row.source})",
        f"workflow  {shown(row.workflow)}  input {shown(row.input)}",
        f"timing    {_timing(row)}  jitter {row.jitter:g}s  grace {row.grace:g}s",
        f"policies  catchup={row.catchup} (limit {row.catchup_limit})  overlap={row.overlap}",
        f"state     {'paused' if row.paused else 'active'}",
        "next      " + (", ".join(when(t) for t in upcoming) if upcoming else "-"),
        "",
    ]
    if not ticks:
        return "\n".join([*lines, "no ticks yet"])
    body = [[when(t.fire_at), t.status, t.run_id or "", t.reason or ""] for t in ticks]
    return "\n".join([*lines, table(body, ["TICK (UTC)", "STATUS", "RUN", "WHY"])])
