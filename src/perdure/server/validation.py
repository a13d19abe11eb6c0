"""Reading API requests: JSON bodies into pydantic models, query values, cursors, pages.

Bad input is a `BadInput` (400, or 422 for a body that is JSON but does not fit)
whose message and `field` name what is wrong; it never reaches the store. Runs
are paged newest first by keyset on (created_at, id), so a page never repeats or
skips a run whatever is started meanwhile.

The rules are data the OpenAPI document is built from (`openapi.py`): the
patterns below, the pydantic models' JSON Schemas, `PATH_PARAMS` and each body's
`EXACTLY_ONE`, so what the document allows and what is accepted cannot drift
apart. Every string a pattern allows is accepted, cursors included: a cursor is a
position (`created_at:run id`, or an audit id), and any position is a place to
page from.
"""

from __future__ import annotations

import importlib.resources
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from typing import Annotated, Any, ClassVar, Literal, TypeVar
from urllib.parse import unquote

from annotated_types import Interval
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    field_validator,
)
from starlette.requests import Request
from starlette.routing import Match, Route
from starlette.types import Scope

from ..errors import ConfigError
from ..nesting import nested_message, too_deep
from ..store.base import ALL_STATUSES, RunRow, Store
from ..store.names import (
    MAX_NAME,
    MAX_RUN_ID,
    PATTERN,
    REFUSED_CLASS,
    check,
    check_run_id,
    problem,
)
from .webhooks import Refused, read_body

MAX_BODY = 1_048_576  # bytes of request body, refused with 413 beyond
MAX_TEXT = MAX_RUN_ID  # characters of an id or a name in a path or query (a run id's most)
BIG = 2**53  # beyond this an integer does not survive a round trip through JSON numbers
MAX_TIME = 1e11  # seconds since 1970 (year 5138): a `since` beyond is no usable time
MAX_CURSOR = 1000  # characters of a cursor

# Ids and names meet the id rule (`store.names`): visible characters only, so that none can
# garble or disguise the line a terminal or a page shows it on. Refused in a body it is a 422,
# in the path or the query a 400, each with the rule's one line.
NAME = PATTERN
# A schedule's name also goes without ':' and spaces (`triggers.schedules.validate`).
SCHEDULE_NAME = f"^[^{REFUSED_CLASS} :]*$"
TEXT = r"^[^\x00]*$"  # free text: anything but NUL, which no store keeps
# A page position: the `created_at` and id of the last run shown, or the id of an audit entry.
RUN_CURSOR = r"^-?[0-9]{1,17}(\.[0-9]{1,17})?(e[+-]?[0-9]{1,2})?:[^\x00]+$"
ID_CURSOR = r"^[1-9][0-9]{0,14}$"  # below 2**53
MAX_LIST = 6  # items of a cron field's list


def _cron() -> str:
    """Five fields of numbers (names for months and days), ranges, steps and lists of up to
    MAX_LIST of them, or a macro: the part of croniter's syntax the API takes. The pattern
    bounds the length (a maxLength as well would make a generator hunt for long matches)."""

    def named(*names: str) -> str:
        return "|".join("".join(f"[{c.upper()}{c.lower()}]" for c in n) for n in names)

    months = named("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov",
                   "dec")  # fmt: skip
    days = named("sun", "mon", "tue", "wed", "thu", "fri", "sat")
    values = (
        r"[0-5]?[0-9]", r"([01]?[0-9]|2[0-3])", r"(0?[1-9]|[12][0-9]|3[01])",
        rf"(0?[1-9]|1[0-2]|{months})", rf"([0-7]|{days})",
    )  # fmt: skip
    fields = []
    for value in values:
        item = rf"(\*|{value}(-{value})?)(/[1-9][0-9]?)?"
        fields.append(rf"{item}(,{item}){{0,{MAX_LIST - 1}}}")
    return "^(" + " ".join(fields) + r"|@(yearly|annually|monthly|weekly|daily|hourly))$"


CRON = _cron()


@lru_cache(maxsize=1)
def time_zones() -> tuple[str, ...]:
    """The IANA time zone names of the tzdata package perdure depends on."""
    zones = importlib.resources.files("tzdata").joinpath("zones").read_text(encoding="utf-8")
    return tuple(sorted(zones.split()))


def _integral(value: Any) -> Any:
    # JSON Schema's integers are numbers without a fraction, 5.0 included; pydantic's strict
    # int would refuse 5.0, so it is made 5 first (a bool is no number and stays refused).
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


INTEGRAL = BeforeValidator(_integral)  # after the bounds, so that the document shows them
# Where a schema of openapi.SCHEMAS goes (pydantic cannot point at a schema it did not make).
SCHEMA = "x-perdure-schema"
# any JSON value whose text (strings and object keys) has no NUL (as `_check_strings` says)
Json = Annotated[Any, WithJsonSchema({SCHEMA: "JsonValue"})]
Kwargs = Annotated[
    dict[str, Any],
    WithJsonSchema({"type": "object", "propertyNames": {"pattern": TEXT},
                    "additionalProperties": {SCHEMA: "JsonValue"}}),
]  # fmt: skip


def _rule(most: int) -> WithJsonSchema:
    return WithJsonSchema({"type": "string", "minLength": 1, "maxLength": most, "pattern": NAME})


# A body's run id and its other ids and names: the id rule, documented as a pattern.
RunId = Annotated[str, AfterValidator(check_run_id), _rule(MAX_RUN_ID)]
Name = Annotated[str, AfterValidator(lambda v: check(v, "name")), _rule(MAX_NAME)]


@dataclass(frozen=True)
class Choice:
    """One alternative of a body's `EXACTLY_ONE`: `field` given (and, if `true`, true)."""

    field: str
    true: bool = False
    not_null: bool = False

    def chosen(self, body: BaseModel) -> bool:
        if self.field not in body.model_fields_set:
            return False
        value = getattr(body, self.field)
        return not ((self.true and value is not True) or (self.not_null and value is None))

    def schema(self) -> dict[str, Any]:
        """The JSON Schema a body meets when it makes this choice (one item of a `oneOf`)."""
        if self.true:
            return {"required": [self.field], "properties": {self.field: {"const": True}}}
        if self.not_null:
            return {"required": [self.field], "properties": {self.field: {"not": {"type": "null"}}}}
        return {"required": [self.field]}


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
    EXACTLY_ONE: ClassVar[tuple[Choice, ...]] = ()  # a body makes exactly one of these

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: Any, handler: Any) -> Any:
        schema = handler(core_schema)
        if cls.EXACTLY_ONE:
            handler.resolve_ref_schema(schema)["oneOf"] = [c.schema() for c in cls.EXACTLY_ONE]
        return schema


class Comment(Body):
    """An operator action's optional comment, kept in the audit log."""

    comment: str = Field("", max_length=2000, pattern=TEXT)


class StartRun(Body):
    """Start a run of `workflow` (or find the run `id` already names: idempotent)."""

    workflow: Name
    args: list[Json] = []
    kwargs: Kwargs = {}
    id: RunId | None = None
    deadline: float | None = Field(None, gt=0, le=10 * 365 * 86400, description="seconds")
    queue: Name | None = None
    priority: Annotated[int, Interval(ge=-(2**31), le=2**31 - 1), INTEGRAL] = 0
    partition_key: Name | None = None


class Resolve(Comment):
    """Settle a needs_attention step: give exactly one of `value`, `retry`, `fail` or
    `probe` (ask the step's probe again: done, the run goes on; not done, the step runs
    again; cannot tell, the run waits again)."""

    EXACTLY_ONE = (
        Choice("value"), Choice("retry", true=True), Choice("fail", true=True),
        Choice("probe", true=True),
    )  # fmt: skip
    step: Annotated[int, Interval(ge=0, le=BIG), INTEGRAL] | Name = Field(
        description="the step's position or name"
    )
    value: Json = Field(None, description="mark the step done with this value")
    retry: bool = False
    fail: bool = False
    probe: bool = False


class Fork(Comment):
    """A new run reusing the first `from_step` positions of this one (retry from there)."""

    from_step: Annotated[int, Interval(ge=0, le=BIG), INTEGRAL]
    id: RunId | None = None


class SendEvent(Body):
    """An event for the run's `wait_event(name)`; a repeated `key` is delivered once."""

    name: Name
    payload: Json = None
    key: Name | None = None


class Answer(Body):
    """The answer to an agent's question (ask_human)."""

    text: str = Field(max_length=100_000, pattern=TEXT)


class SteerRun(Body):
    """A steering message for a running agent: it joins the transcript at its next model
    call (a workflow that calls perdure.steering() takes it there)."""

    text: str = Field(min_length=1, max_length=100_000, pattern=TEXT)


class PutSchedule(Body):
    """A schedule stored through the API (it lives until deleted): give exactly one of `cron`
    or `every`."""

    EXACTLY_ONE = (Choice("cron", not_null=True), Choice("every", not_null=True))
    workflow: Name
    cron: str | None = Field(
        None, pattern=CRON, description="five fields (minute hour "
        "day-of-month month day-of-week) or a macro (@daily); one that never fires (30 "
        "February) is refused (422)",
    )  # fmt: skip
    every: float | None = Field(None, gt=0, le=10 * 365 * 86400, description="seconds")
    tz: Annotated[str, WithJsonSchema({SCHEMA: "TimeZone"})] = "UTC"
    args: list[Json] = []
    kwargs: Kwargs = {}
    catchup: Literal["skip", "latest", "all"] = "latest"
    catchup_limit: Annotated[int, Interval(ge=1, le=10_000), INTEGRAL] = 10
    overlap: Literal["skip", "queue", "allow", "cancel_previous"] = "skip"
    jitter: float = Field(0.0, ge=0, le=86400, description="seconds")
    grace: float = Field(60.0, ge=0, le=10 * 365 * 86400, description="seconds")

    @field_validator("tz")
    @classmethod
    def _known_zone(cls, tz: str) -> str:
        if tz not in time_zones():
            raise ValueError(f"unknown time zone {tz[:64]!r} (e.g. 'UTC', 'Europe/Paris')")
        return tz

    @field_validator("cron")
    @classmethod
    def _fires(cls, cron: str | None) -> str | None:
        from croniter import CroniterBadDateError, croniter

        if cron is not None:
            try:  # croniter looks some years ahead for a date that exists
                croniter(cron, datetime(2000, 1, 1, tzinfo=UTC)).get_next(float)
            except (CroniterBadDateError, ValueError, KeyError):
                raise ValueError(f"{cron!r} never fires") from None
        return cron


class PutBudget(Body):
    """Changes to an agent's spending limits per rolling hour and day: an absent limit is
    unchanged; `reset` forgets the stored budget (the spec's is in force again)."""

    tokens_per_hour: Annotated[int, Interval(ge=0, le=BIG), INTEGRAL] | None = None
    tokens_per_day: Annotated[int, Interval(ge=0, le=BIG), INTEGRAL] | None = None
    cost_per_hour: float | None = Field(None, ge=0, le=1e12)
    cost_per_day: float | None = Field(None, ge=0, le=1e12)
    reset: bool = False


class PauseRun(Comment):
    """Pause a run; `now`: abort its model and tool calls in flight that allow it."""

    now: bool = False


class SetPause(Comment):
    """Pause (or resume) every run of a workflow, or a worker (by id, or all of a host);
    `now` (with a pause): abort their model and tool calls in flight that allow it."""

    scope: Literal["workflow", "worker"]
    name: Name
    paused: bool = True
    now: bool = False


M = TypeVar("M", bound=Body)

BODIES: tuple[type[Body], ...] = (
    StartRun, Comment, Resolve, Fork, SendEvent, Answer, PutSchedule, PutBudget, SetPause,
    PauseRun, SteerRun,
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
    try:
        if raw.strip():
            try:
                data = json.loads(raw, parse_constant=_no_constant)
            except (UnicodeDecodeError, ValueError) as exc:
                raise BadInput(400, f"body is not JSON: {exc}", "body") from None
        if not isinstance(data, dict):
            raise BadInput(422, f"body must be a JSON object, not {type(data).__name__}", "body")
        if too_deep(data):
            raise BadInput(400, nested_message("body"), "body")
        for key, value in data.items():
            _check_strings(value, str(key))
    except RecursionError:  # JSON nested thousands deep: the client's fault, never a 500
        raise BadInput(400, nested_message("body"), "body") from None
    try:
        body = model.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        loc = [str(part) for part in error["loc"]]
        field = loc[0] if loc else "body"
        message = "unknown field" if error["type"] == "extra_forbidden" else error["msg"]
        message = message.removeprefix("Value error, ")
        raise BadInput(422, f"{field}: {message}", field) from None
    choices = model.EXACTLY_ONE
    if choices and sum(c.chosen(body) for c in choices) != 1:
        names = ", ".join(c.field for c in choices)
        raise BadInput(422, f"{names}: give exactly one", choices[0].field)
    return body


# -- query values -----------------------------------------------------------------------------


# The path parameters of the API, the pattern each meets and its most characters.
PATH_PARAMS = {"run_id": NAME, "call_id": NAME, "name": SCHEDULE_NAME, "agent": NAME,
               "shared": NAME}  # fmt: skip
PATH_MOST = {"run_id": MAX_TEXT, "call_id": MAX_TEXT, "name": MAX_NAME, "agent": MAX_NAME,
             "shared": MAX_NAME}  # fmt: skip


def text_param(
    value: str | None,
    field: str,
    *,
    required: bool = False,
    pattern: str = NAME,
    most: int = MAX_TEXT,
) -> str | None:
    """An id or name from the path or the query: the id rule (`store.names`), 1 to MAX_TEXT
    characters (`most`: a schedule's or agent's name in a path, MAX_NAME); `SCHEDULE_NAME`
    also refuses ':' and spaces.

    What the rule refuses is a 400 (no id can be so: every id is checked where it is made);
    one it allows that names nothing is for the handler to answer (404)."""
    if value is None or value == "":
        if required:
            raise BadInput(400, f"{field}: required", field)
        return None
    why = problem(value, field.replace("_", " "), most)
    if why is None and pattern == SCHEDULE_NAME and (":" in value or " " in value):
        why = "a schedule name has no ':' or spaces"
    if why is not None:
        raise BadInput(400, f"{field}: {why}", field)
    return value


_KEPT = re.compile(r"(%2[fF5])")  # an encoded '/' or '%' inside a path segment


def _segments_path(scope: Scope) -> str | None:
    """The request's path decoded but for `%2F` and `%25`, so that an id holding '/' stays one
    segment (`IdRoute`); None when the raw path has neither, or disagrees with the path."""
    raw = scope.get("raw_path")
    if not raw or b"%2" not in raw.upper():
        return None
    text = raw.decode("latin-1")
    kept = "".join(
        part.upper() if _KEPT.fullmatch(part) else unquote(part) for part in _KEPT.split(text)
    )
    return kept if unquote(kept) == scope["path"] else None


class IdRoute(Route):
    """A route whose path parameters may hold '/' (sent as %2F): anything the id rule allows
    in an id can be reached by it, `hook:push:a/b` included (`path_param` decodes them)."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        path = _segments_path(scope) if scope["type"] == "http" else None
        return super().matches(scope if path is None else {**scope, "path": path})


def segment(request: Request, field: str) -> str:
    """A path parameter as sent, unchecked: its %2F and %25 decoded (`IdRoute`)."""
    return _KEPT.sub(lambda m: unquote(m.group()), request.path_params[field])


def path_param(request: Request, field: str) -> str:
    """A path parameter of `PATH_PARAMS` (`segment`), checked against its pattern."""
    value = text_param(segment(request, field), field, required=True,
                       pattern=PATH_PARAMS[field], most=PATH_MOST[field])  # fmt: skip
    assert value is not None
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
        try:  # "5.0" is an integer to JSON Schema, so it is to this API
            number = float(text)
        except ValueError:
            number = math.nan
        if not number.is_integer():
            raise BadInput(400, f"{field}: {text[:40]!r} is not an integer", field) from None
        value = int(number)
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
    if not math.isfinite(value) or abs(value) > MAX_TIME:
        raise BadInput(
            400, f"{field}: not a usable time (from {-MAX_TIME:g} to {MAX_TIME:g})", field
        )
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


def _statuses() -> str:
    state = "(" + "|".join(ALL_STATUSES) + ")"
    return rf"^,*({state}(,+{state})*)?,*$"


STATUSES = _statuses()  # what `query_statuses` takes: states, comma-separated


@dataclass(frozen=True, kw_only=True)
class Query:
    """A query parameter: how a handler reads it (`read`) and how the document describes it
    (`schema`), from the same fields."""

    name: str
    description: str
    required: bool = False

    def schema(self) -> dict[str, Any]:
        raise NotImplementedError


@dataclass(frozen=True, kw_only=True)
class IntQuery(Query):
    """An integer from `low` to `high`; `default` when absent."""

    default: int
    low: int
    high: int

    def schema(self) -> dict[str, Any]:
        return {"type": "integer", "minimum": self.low, "maximum": self.high,
                "default": self.default}  # fmt: skip

    def read(self, request: Request) -> int:
        return query_int(request, self.name, self.default, self.low, self.high)


@dataclass(frozen=True, kw_only=True)
class TimeQuery(Query):
    """A Unix time, from -MAX_TIME to MAX_TIME; the handler gives the default."""

    def schema(self) -> dict[str, Any]:
        return {"type": "number", "minimum": -MAX_TIME, "maximum": MAX_TIME}

    def read(self, request: Request, default: float) -> float:
        return query_float(request, self.name, default)


@dataclass(frozen=True, kw_only=True)
class TextQuery(Query):
    """An id or a name (`text_param`); absent (or empty) is None unless required."""

    def schema(self) -> dict[str, Any]:
        low = 1 if self.required else 0
        return {"type": "string", "minLength": low, "maxLength": MAX_TEXT, "pattern": NAME}

    def read(self, request: Request) -> str | None:
        return query_text(request, self.name, required=self.required)


SINCE_TEXT = (
    r"^([0-9]{1,9}(\.[0-9]{1,6})?[smhd]"  # a duration back from now: 90m, 24h, 7d
    r"|[0-9]{1,11}(\.[0-9]{1,6})?"  # Unix seconds
    r"|[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])"  # an ISO date (UTC) ...
    r"(T([01][0-9]|2[0-3]):[0-5][0-9](:[0-5][0-9])?)?)$"  # ... and time
)


@dataclass(frozen=True, kw_only=True)
class SinceQuery(Query):
    """A moment: a duration back from now, Unix seconds or an ISO time (`parse_since`);
    the document's pattern is a part of what the server reads, never more."""

    def schema(self) -> dict[str, Any]:
        return {"type": "string", "pattern": SINCE_TEXT}

    def read(self, request: Request, now: float) -> float | None:
        from .operations import parse_since

        text = query_text(request, self.name)
        if text is None:
            return None
        try:
            return parse_since(text, now)
        except ConfigError as exc:
            raise BadInput(400, str(exc), self.name) from None


@dataclass(frozen=True, kw_only=True)
class ChoiceQuery(Query):
    """One of `choices`; `default` when absent."""

    choices: tuple[str, ...]
    default: str

    def schema(self) -> dict[str, Any]:
        return {"type": "string", "enum": list(self.choices), "default": self.default}

    def read(self, request: Request) -> str:
        return query_choice(request, self.name, self.choices, self.default)


@dataclass(frozen=True, kw_only=True)
class StatusQuery(Query):
    """Run states, comma-separated or repeated (`query_statuses`)."""

    def schema(self) -> dict[str, Any]:
        return {"type": "string", "pattern": STATUSES}

    def read(self, request: Request) -> list[str]:
        return query_statuses(request)


@dataclass(frozen=True, kw_only=True)
class IdsQuery(Query):
    """Run ids, the parameter repeated (`?id=a&id=b`), at most `most` of them, each of at most
    MAX_NAME characters: `most` of those already pass what a request line may hold (uvicorn
    takes 16 KiB), so a longer run id is read by its path (`/runs/{run_id}`) instead."""

    most: int

    def schema(self) -> dict[str, Any]:
        item = {"type": "string", "minLength": 1, "maxLength": MAX_NAME, "pattern": NAME}
        return {"type": "array", "items": item, "maxItems": self.most}

    def read(self, request: Request) -> list[str]:
        values = request.query_params.getlist(self.name)
        if len(values) > self.most:
            raise BadInput(400, f"{self.name}: at most {self.most} ids per call", self.name)
        found = [text_param(v, self.name, required=True, most=MAX_NAME) for v in values]
        return [v for v in found if v is not None]


@dataclass(frozen=True, kw_only=True)
class CursorQuery(Query):
    """The `next_cursor` of the previous page, a position meeting `pattern`."""

    pattern: str

    def schema(self) -> dict[str, Any]:
        return {"type": "string", "maxLength": MAX_CURSOR, "pattern": self.pattern}


# -- cursors and pages --------------------------------------------------------------------------


def encode_cursor(value: int | Sequence[Any]) -> str:
    """A page position as text: an audit entry's id as its digits, a run's (created_at, id)
    as `created_at:id` (`repr` of the float, so it reads back exactly)."""
    if isinstance(value, int):
        return str(value)
    created_at, run_id = value
    return f"{float(created_at)!r}:{run_id}"


def _cursor(request: Request, pattern: str) -> str | None:
    text = request.query_params.get("cursor")
    if text is None or text == "":
        return None
    if len(text) > MAX_CURSOR or not re.fullmatch(pattern, text):
        raise BadInput(400, "cursor: not a cursor this API gave out", "cursor")
    return text


def run_cursor(request: Request) -> tuple[float, str] | None:
    """The (created_at, id) a runs cursor points after."""
    text = _cursor(request, RUN_CURSOR)
    if text is None:
        return None
    created_at, _, run_id = text.partition(":")
    return float(created_at), run_id


def id_cursor(request: Request) -> int | None:
    """The id an audit cursor points before."""
    text = _cursor(request, ID_CURSOR)
    return None if text is None else int(text)


async def runs_page(
    store: Store,
    statuses: Sequence[str],
    workflow: str | None,
    after: tuple[float, str] | None,
    limit: int,
    ids: Sequence[str] = (),
) -> tuple[list[RunRow], tuple[float, str] | None]:
    """Up to `limit` runs after the cursor, newest first, and the next cursor (None: last);
    `ids` keeps only those runs."""
    rows = await store.list_runs(
        statuses=statuses, workflow=workflow, limit=limit + 1, after=after, ids=ids
    )
    if len(rows) <= limit:
        return rows, None
    last = rows[limit - 1]
    return rows[:limit], (last.created_at, last.id)
