"""What a run's dashboard page draws besides its journal table: the run as bars over time
(each step from its first entry to its outcome, sleeps and waits, a step's time waiting for
an operator as a wait on its row, a recovery as a mark in the gap it left) and its live
output (the run's stream, by step attempt)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..store.base import TERMINAL, Entry, RunRow
from ..store.stream_sql import ATTEMPT, CHUNK, DROPPED, RETRY, StreamRow

MAX_BARS = 80  # positions drawn (the newest)
MAX_TEXT = 20_000  # characters of a step attempt's text shown (the end of it)
WIDTH, ROW, LABEL = 760, 16, 170  # SVG geometry: width, row height, label column


@dataclass
class Bar:
    """One row of the picture: a step (or a sleep/wait) from `x` for `w` pixels."""

    label: str
    kind: str  # step | retried | running | sleep | wait | failed (an operator's wait: wait)
    x: float
    w: float
    y: float
    title: str


@dataclass
class Picture:
    width: int
    height: int
    bars: list[Bar]
    marks: list[tuple[float, str]]  # (x, title): recoveries
    span: float  # seconds from the first entry to the last moment drawn


def picture(run: RunRow, entries: list[Entry], now: float) -> Picture | None:
    """The run as bars over time, or None when it has no step yet."""
    spans: dict[int, list[Entry]] = {}
    for entry in entries:
        if entry.position is not None:
            spans.setdefault(entry.position, []).append(entry)
    if not spans:
        return None
    start = min(e.at for e in entries)
    finished = run.status in TERMINAL
    end = max(max(e.at for e in entries), start + 0.001) if finished else max(now, start + 0.001)
    scale = (WIDTH - LABEL - 10) / (end - start)
    bars: list[Bar] = []
    drawn = sorted(spans.items())[-MAX_BARS:]
    for i, (pos, at) in enumerate(drawn):
        first, last = at[0], at[-1]
        final = next((e for e in at if e.final), None)
        kind = "step"
        if first.kind.startswith("sleep"):
            kind, until = "sleep", _float(first.data)
            stop = min(until, end) if until else (final.at if final else end)
        elif first.kind.startswith("event") or first.kind.startswith("wait"):
            kind, stop = "wait", final.at if final else end
        else:
            stop = final.at if final else (end if not finished else last.at)
            if final is None:
                kind = "running" if not finished else "failed"
            elif any(e.attempt > 1 or e.kind in ("step.retry", "step.attempt_failed") for e in at):
                kind = "retried"
            if final is not None and '"error"' in (final.data or ""):
                kind = "failed"
        label = f"{pos} {first.name or first.kind}"[:26]
        asked = next((e for e in at if e.kind == "step.needs_attention"), None)
        segments = [(kind, first.at, stop, kind)]
        if asked is not None:  # ran until cut off, waited for an operator, maybe ran again
            answer = next((e for e in at if e.seq > asked.seq), None)
            waited = answer.at if answer is not None else (end if not finished else asked.at)
            segments = [("failed", first.at, asked.at, "cut off"),
                        ("wait", asked.at, waited, "waited for an operator")]  # fmt: skip
            if answer is not None and not answer.final:
                segments.append((kind, answer.at, stop, kind))
        for shown, begin, until, what in segments:
            title = f"{label}: {what}, {max(until - begin, 0) * 1000:.0f} ms"
            x = LABEL + (begin - start) * scale
            width = max((until - begin) * scale, 2.0)
            bars.append(Bar(label, shown, x, width, 4 + i * ROW, title))
    marks = [(LABEL + (e.at - start) * scale, f"recovered from {_from(e.data)}")
             for e in entries if e.kind == "run.recovered"]  # fmt: skip
    return Picture(WIDTH, 8 + len(drawn) * ROW, bars, marks, end - start)


def _float(text: str | None) -> float | None:
    try:
        value = json.loads(text or "null")
    except ValueError:
        return None
    return float(value) if isinstance(value, int | float) else None


def _from(text: str | None) -> str:
    try:
        data = json.loads(text or "{}")
    except ValueError:
        return "another worker"
    return str(data.get("from") or "another worker") if isinstance(data, dict) else "?"


@dataclass
class Output:
    """What one step attempt (or the workflow itself) wrote to the run's stream."""

    step: str
    position: int | None
    attempt: int
    retry: bool
    text: str = ""
    topics: dict[str, Any] = field(default_factory=dict)  # the latest value of each topic
    superseded: bool = False  # a later attempt of the same step replaced it


def outputs(rows: list[StreamRow]) -> tuple[list[Output], int]:
    """The stream by step attempt, and how many older rows were dropped."""
    blocks: list[Output] = []
    dropped = 0
    current: Output | None = None
    for row in rows:
        data = json.loads(row.data or "null")
        if row.kind in (ATTEMPT, RETRY):
            marker = data if isinstance(data, dict) else {}
            current = Output(str(marker.get("step", "")), marker.get("position"),
                             int(marker.get("attempt", 1)), row.kind == RETRY)  # fmt: skip
            for earlier in blocks:
                if earlier.position == current.position:
                    earlier.superseded = True
            blocks.append(current)
        elif row.kind == DROPPED:
            dropped += int(data.get("rows", 0)) if isinstance(data, dict) else 0
        elif row.kind == CHUNK:
            if current is None:
                current = Output("(workflow)", None, 1, False)
                blocks.append(current)
            if row.topic == "out" and isinstance(data, str):
                current.text = (current.text + data)[-MAX_TEXT:]
            else:
                current.topics[row.topic] = data
    return blocks, dropped
