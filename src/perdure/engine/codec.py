"""Journal payloads as JSON: encoding with the path of the first bad value, typed decoding.

Encoding accepts JSON types, pydantic models, dataclasses, datetimes, dates,
times, UUIDs, Decimals, enums, tuples and sets. Decoding uses the type hint of
the receiving side (a step's return annotation, a workflow's parameters) through
pydantic, so a step returning a model gives the same model back on replay.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import uuid
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from functools import lru_cache
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from ..errors import PayloadError
from ..nesting import MAX_DEPTH, nested_message

JSON = Any  # what json.dumps accepts: dicts, lists, str, int, float, bool, None


def to_json(value: Any, where: str, path: str = "$", depth: int = 0) -> JSON:
    """Convert `value` to plain JSON types, or raise PayloadError naming `where` and the path
    (also for a value nested more than `nesting.MAX_DEPTH` deep: never a RecursionError)."""
    if value is None or isinstance(value, (bool, str, int)):
        return value
    if depth > MAX_DEPTH:
        raise PayloadError(f"{nested_message(where)} (at {path[:80]}...)")
    depth += 1
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        raise PayloadError(f"{where}: value at {path} is {value}, which JSON cannot hold")
    if isinstance(value, dict):
        out: dict[str, JSON] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise PayloadError(
                    f"{where}: key {key!r} at {path} is a {type(key).__name__}; "
                    "JSON keys are strings"
                )
            out[key] = to_json(item, where, f"{path}.{key}", depth)
        return out
    if isinstance(value, (list, tuple)):
        return [to_json(item, where, f"{path}[{i}]", depth) for i, item in enumerate(value)]
    if isinstance(value, (set, frozenset)):
        items = [to_json(item, where, f"{path}[{i}]", depth) for i, item in enumerate(value)]
        return sorted(items, key=json.dumps)
    if isinstance(value, BaseModel):
        return to_json(value.model_dump(mode="python"), where, path, depth)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return to_json(fields, where, path, depth)
    if isinstance(value, enum.Enum):
        return to_json(value.value, where, path, depth)
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, (uuid.UUID, Decimal)):
        return str(value)
    raise PayloadError(
        f"{where}: value at {path} is a {type(value).__module__}.{type(value).__qualname__}, "
        "which is not JSON (use JSON types, a pydantic model or a dataclass)"
    )


def _not_json(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


# Compact JSON text (no NaN, non-ASCII kept) by one encoder made once: JSONEncoder.encode
# makes a new one per call, a third of the cost of a step's small payloads. It has no
# circular check; the values are `to_json`'s fresh trees or perdure's own.
_c_make = getattr(json.encoder, "c_make_encoder", None)
_iterencode = (
    _c_make(None, _not_json, json.encoder.encode_basestring, None, ":", ",", False, False, False)
    if _c_make is not None
    else None  # an interpreter without the C accelerator
)
_fallback = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


quoted = json.encoder.encode_basestring  # a str as a JSON string (non-ASCII kept), in C


def dumps(value: Any, where: str) -> str:
    """`value` as compact JSON text (see `to_json`)."""
    return dumps_plain(to_json(value, where))


def dumps_plain(value: JSON) -> str:
    """Compact JSON text of a value that is already plain JSON (skips the `to_json` walk)."""
    if _iterencode is None:
        return _fallback(value)
    return "".join(_iterencode(value, 0))


def loads(text: str | None) -> JSON:
    return None if text is None else json.loads(text)


@lru_cache(maxsize=1024)
def _adapter(hint: Any) -> TypeAdapter[Any]:
    return TypeAdapter(hint)


def from_json(data: JSON, hint: Any, where: str) -> Any:
    """Rebuild a value of type `hint` (None or Any: plain JSON) from decoded JSON."""
    if hint is None or hint is Any or hint is type(None):
        return data
    try:
        adapter = _adapter(hint)
    except (TypeError, Exception):  # unhashable or unsupported hint: give plain JSON back
        return data
    try:
        return adapter.validate_python(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first.get("loc", ()))
        kind = getattr(hint, "__name__", None) or repr(hint)
        raise PayloadError(
            f"{where}: {json.dumps(data)[:60]} does not fit {kind} at ${loc}: {first['msg']}"
        ) from None
