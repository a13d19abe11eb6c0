"""Reading API requests: JSON bodies into pydantic models, query values, opaque cursors, pages.

Bad input is a `BadInput` (400, or 422 for a body that is JSON but does not fit)
whose message and `field` name what is wrong; it never reaches the store. Runs
are paged newest first by keyset on (created_at, id), so a page never repeats or
skips a run whatever is started meanwhile.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Sequence
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request

from ..store.base import ALL_STATUSES, RunRow, Store
from .webhooks import Refused, read_body

MAX_BODY = 1_048_576  # bytes of request body, refused with 413 beyond
MAX_TEXT = 200  # characters of an id or a name
BIG = 2**53  # beyond this an integer does not survive a round trip through JSON numbers

Id = Field(min_length=1, max_length=MAX_TEXT)


class BadInput(Exception):
    """A request refused for its input: status, a one-line message and the field at fault."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field


class Body(BaseModel):
    """A request body: strict types (no "5" for 5), unknown fields refused."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)


class Comment(Body):
    """An operator action's optional comment, kept in the audit log."""

    comment: str = Field("", max_length=2000)


class StartRun(Body):
    """Start a run of `workflow` (or find the run `id` already names: idempotent)."""

    workflow: str = Id
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    id: str | None = Field(None, min_length=1, max_length=MAX_TEXT)
    deadline: float | None = Field(None, gt=0, le=10 * 365 * 86400, description="seconds")
    queue: str | None = Field(None, min_length=1, max_length=MAX_TEXT)
    priority: int = Field(0, ge=-(2**31), le=2**31)
    partition_key: str | None = Field(None, min_length=1, max_length=MAX_TEXT)


class Resolve(Comment):
    """Settle a needs_attention step: give exactly one of `value`, `retry` or `fail`."""

    step: int | str = Field(description="the step's position or name")
    value: Any = Field(None, description="mark the step done with this value")
    retry: bool = False
    fail: bool = False


class Fork(Comment):
    """A new run reusing the first `from_step` positions of this one (retry from there)."""

    from_step: int = Field(ge=0, le=BIG)
    id: str | None = Field(None, min_length=1, max_length=MAX_TEXT)


class SendEvent(Body):
    """An event for the run's `wait_event(name)`; a repeated `key` is delivered once."""

    name: str = Id
    payload: Any = None
    key: str | None = Field(None, min_length=1, max_length=MAX_TEXT)


class Answer(Body):
    """The answer to an agent's question (ask_human)."""

    text: str = Field(max_length=100_000)


class PutSchedule(Body):
    """A schedule stored through the API (it lives until deleted)."""

    workflow: str = Id
    cron: str | None = Field(None, min_length=1, max_length=MAX_TEXT)
    every: float | None = Field(None, gt=0, le=10 * 365 * 86400, description="seconds")
    tz: str = Field("UTC", min_length=1, max_length=64)
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    catchup: Literal["skip", "latest", "all"] = "latest"
    catchup_limit: int = Field(10, ge=1, le=10_000)
    overlap: Literal["skip", "queue", "allow", "cancel_previous"] = "skip"
    jitter: float = Field(0.0, ge=0, le=86400, description="seconds")
    grace: float = Field(60.0, ge=0, le=10 * 365 * 86400, description="seconds")


class PutBudget(Body):
    """An agent's spending limits per rolling hour and day; an absent limit is none."""

    tokens_per_hour: int | None = Field(None, ge=0, le=BIG)
    tokens_per_day: int | None = Field(None, ge=0, le=BIG)
    cost_per_hour: float | None = Field(None, ge=0, le=1e12)
    cost_per_day: float | None = Field(None, ge=0, le=1e12)


class SetPause(Comment):
    """Pause (or resume) every run of a workflow, or a worker (by id, or all of a host)."""

    scope: Literal["workflow", "worker"]
    name: str = Id
    paused: bool = True


M = TypeVar("M", bound=Body)

BODIES: tuple[type[Body], ...] = (
    StartRun, Comment, Resolve, Fork, SendEvent, Answer, PutSchedule, PutBudget, SetPause,
)  # fmt: skip


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _check_strings(value: Any, field: str) -> None:
    """Refuse text no store can keep: NUL characters and lone surrogates."""
    if isinstance(value, str):
        if "\x00" in value:
            raise BadInput(422, f"{field}: text must not contain NUL characters", field)
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise BadInput(422, f"{field}: text is not valid Unicode", field) from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_strings(key, field)
            _check_strings(item, field)
    elif isinstance(value, list):
        for item in value:
            _check_strings(item, field)


async def parse_body(request: Request, model: type[M]) -> M:
    """The request's JSON body as `model`; an empty body is `{}`."""
    try:
        raw = await read_body(request, MAX_BODY)
    except Refused as refused:
        if refused.status == 413:
            raise BadInput(413, f"request body is over {MAX_BODY} bytes", "body") from None
        raise BadInput(refused.status, refused.message, "body") from None
    data: Any = {}
    if raw.strip():
        try:
            data = json.loads(raw, parse_constant=_no_constant)
        except (UnicodeDecodeError, ValueError) as exc:
            raise BadInput(400, f"body is not JSON: {exc}", "body") from None
    if not isinstance(data, dict):
        raise BadInput(422, f"body must be a JSON object, not {type(data).__name__}", "body")
    for key, value in data.items():
        _check_strings(value, str(key))
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        loc = [str(part) for part in error["loc"]]
        field = loc[0] if loc else "body"
        message = "unknown field" if error["type"] == "extra_forbidden" else error["msg"]
        raise BadInput(422, f"{field}: {message}", field) from None


# -- query values -----------------------------------------------------------------------------


def text_param(value: str | None, field: str, *, required: bool = False) -> str | None:
    """An id or name from the path or the query: 1 to MAX_TEXT printable characters."""
    if value is None or value == "":
        if required:
            raise BadInput(400, f"{field}: required", field)
        return None
    if len(value) > MAX_TEXT or not value.isprintable():
        raise BadInput(400, f"{field}: 1 to {MAX_TEXT} printable characters", field)
    return value


def query_text(request: Request, field: str, *, required: bool = False) -> str | None:
    return text_param(request.query_params.get(field), field, required=required)


def query_int(request: Request, field: str, default: int, low: int, high: int) -> int:
    text = request.query_params.get(field)
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise BadInput(400, f"{field}: {text[:40]!r} is not an integer", field) from None
    if not low <= value <= high:
        raise BadInput(400, f"{field}: must be from {low} to {high}", field)
    return value


def query_float(request: Request, field: str, default: float) -> float:
    text = request.query_params.get(field)
    if text is None or text == "":
        return default
    try:
        value = float(text)
    except ValueError:
        raise BadInput(400, f"{field}: {text[:40]!r} is not a number", field) from None
    if not math.isfinite(value) or abs(value) > 1e11:
        raise BadInput(400, f"{field}: not a usable time", field)
    return value


def query_choice(request: Request, field: str, choices: Sequence[str], default: str) -> str:
    value = request.query_params.get(field) or default
    if value not in choices:
        raise BadInput(400, f"{field}: {value[:40]!r}; use one of {', '.join(choices)}", field)
    return value


def query_statuses(request: Request) -> list[str]:
    """`status=a,b` or `status=a&status=b`: every value a run state."""
    values = [v for item in request.query_params.getlist("status") for v in item.split(",") if v]
    unknown = [v for v in values if v not in ALL_STATUSES]
    if unknown:
        raise BadInput(400, f"status: {unknown[0][:40]!r}; use {', '.join(ALL_STATUSES)}", "status")
    return values


# -- cursors and pages --------------------------------------------------------------------------


def encode_cursor(value: Any) -> str:
    """An opaque cursor: base64url of compact JSON, without padding."""
    text = json.dumps(value, separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def decode_cursor(text: str | None) -> Any:
    if text is None or text == "":
        return None
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        return json.loads(raw, parse_constant=_no_constant)
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise BadInput(400, "cursor: not a cursor this API gave out", "cursor") from None


def run_cursor(request: Request) -> tuple[float, str] | None:
    """The (created_at, id) a runs cursor points after."""
    value = decode_cursor(request.query_params.get("cursor"))
    if value is None:
        return None
    if (
        isinstance(value, list)
        and len(value) == 2
        and isinstance(value[0], int | float)
        and not isinstance(value[0], bool)
        and isinstance(value[1], str)
        and text_param(value[1], "cursor")
    ):
        return float(value[0]), value[1]
    raise BadInput(400, "cursor: not a cursor this API gave out", "cursor")


def id_cursor(request: Request) -> int | None:
    """The id an audit cursor points before."""
    value = decode_cursor(request.query_params.get("cursor"))
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value < BIG:
        return value
    raise BadInput(400, "cursor: not a cursor this API gave out", "cursor")


async def runs_page(
    store: Store,
    statuses: Sequence[str],
    workflow: str | None,
    after: tuple[float, str] | None,
    limit: int,
) -> tuple[list[RunRow], tuple[float, str] | None]:
    """Up to `limit` runs after the cursor, newest first, and the next cursor (None: last)."""
    rows = await store.list_runs(statuses=statuses, workflow=workflow, limit=limit + 1, after=after)
    if len(rows) <= limit:
        return rows, None
    last = rows[limit - 1]
    return rows[:limit], (last.created_at, last.id)
