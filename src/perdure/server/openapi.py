"""The OpenAPI 3.1 document of the HTTP API, built from `api.ENDPOINTS`; kept in docs/openapi.json.

Request bodies are the JSON Schemas of the pydantic models that validate them
(with each body's `EXACTLY_ONE` as a `oneOf`), path and query parameters the
patterns and bounds `validation` checks them with: what the document allows is
what the server accepts. Responses are described by `SCHEMAS` below.
`python -m perdure.server.openapi [PATH]` writes the document (default
`docs/openapi.json`); a test checks the committed file is what this module produces.
"""

from __future__ import annotations

import json
import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic.json_schema import models_json_schema

from .api import ENDPOINTS, Endpoint
from .validation import BODIES, MAX_BODY, PATH_MOST, PATH_PARAMS, SCHEMA, TEXT, time_zones

API_VERSION = "1"
DEFAULT_PATH = Path("docs/openapi.json")


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _obj(required: str, **props: Any) -> dict[str, Any]:
    """An object schema; `required` lists the property names every answer has."""
    return {"type": "object", "required": required.split(), "properties": props}


def _placed(value: Any) -> Any:
    """`value` with each `{SCHEMA: name, ...}` of the models made a `$ref` to `name`."""
    if isinstance(value, dict):
        if SCHEMA in value:
            rest = {k: _placed(v) for k, v in value.items() if k not in (SCHEMA, "title")}
            return {**_ref(value[SCHEMA]), **rest}
        return {k: _placed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_placed(v) for v in value]
    return value


def _array(item: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": item}


# fmt: off
STR: dict[str, Any] = {"type": "string"}
NUM: dict[str, Any] = {"type": "number"}
INT: dict[str, Any] = {"type": "integer"}
BOOL: dict[str, Any] = {"type": "boolean"}
OPT_STR: dict[str, Any] = {"type": ["string", "null"]}
OPT_NUM: dict[str, Any] = {"type": ["number", "null"]}
OPT_INT: dict[str, Any] = {"type": ["integer", "null"]}
ANY: dict[str, Any] = {}
_SUMMARY = dict(
    id=STR, workflow=STR, status=STR, created_at=NUM, updated_at=NUM, started_at=OPT_NUM,
    parent_id=OPT_STR, waiting_for=OPT_STR, wake_at=OPT_NUM, deadline_at=OPT_NUM, queue=STR,
    priority=INT, partition_key=OPT_STR, pause_requested=BOOL, recoveries=INT,
    code_version=STR, error=ANY, reason=STR, continued_as=OPT_STR, claimable=BOOL,
    trigger=STR, started_by=OPT_STR,
)
_STATUS_KEYS = "id workflow status created_at updated_at trigger"
_SCHEDULE = _obj(
    "name workflow paused", name=STR, workflow=STR, cron=OPT_STR, every=OPT_NUM, tz=STR,
    input=ANY, catchup=STR, catchup_limit=INT, overlap=STR, jitter=NUM, grace=NUM,
    paused=BOOL, next_fire=OPT_NUM, source=STR, created_at=NUM, updated_at=NUM,
)
_SPENT = _obj("tokens cost", tokens=INT, cost=NUM)
_LIMITS = _obj(
    "", tokens_per_hour=OPT_INT, tokens_per_day=OPT_INT, cost_per_hour=OPT_NUM,
    cost_per_day=OPT_NUM,
)
_IN_FORCE_LIMIT = _obj("limit from", limit={"type": ["number", "null"]},
                       **{"from": {"type": "string", "enum": ["spec", "stored", "none"]}})
_BUDGET = dict(agent=STR, budget={"anyOf": [_LIMITS, {"type": "null"}]},
               in_force=_obj("tokens_per_hour tokens_per_day cost_per_hour cost_per_day",
                             tokens_per_hour=_IN_FORCE_LIMIT, tokens_per_day=_IN_FORCE_LIMIT,
                             cost_per_hour=_IN_FORCE_LIMIT, cost_per_day=_IN_FORCE_LIMIT),
               spent=_obj("hour day", hour=_SPENT, day=_SPENT), parked=INT, shared=OPT_STR)
_SHARED = dict(shared=STR, limits=_LIMITS, spent=_obj("hour day", hour=_SPENT, day=_SPENT),
               agents=_array(STR), parked=INT)

_JSON = _ref("JsonValue")
SCHEMAS: dict[str, dict[str, Any]] = {
    "Any": ANY,
    "JsonValue": {
        "description": "Any JSON value whose strings (and object keys) contain no NUL",
        "anyOf": [
            {"type": ["null", "boolean", "number"]},
            {"type": "string", "pattern": TEXT},
            {"type": "array", "items": _JSON},
            {"type": "object", "propertyNames": {"pattern": TEXT}, "additionalProperties": _JSON},
        ],
    },
    "TimeZone": {
        "type": "string", "description": "an IANA time zone name (tzdata)", "default": "UTC",
        "enum": list(time_zones()),
    },
    "Error": _obj("error", error=STR, field=STR),
    "Ready": _obj("ready", ready=BOOL, error=STR),
    "Stuck": _obj(
        "runs schedules dead_messages triggers store grace at", grace=NUM, at=NUM,
        store=OPT_STR,
        runs=_array(_obj(
            "run_id workflow status cause reason since age fix", run_id=STR, workflow=STR,
            status=STR, reason=STR, since=NUM, age=NUM, fix=OPT_STR,
            cause={"enum": ["interrupted", "stopped", "probe", "dead", "parked", "overdue"]},
        )),
        schedules=_array(_obj(
            "schedule run_id status since held fix", schedule=STR, run_id=STR, status=STR,
            since=NUM, held=INT, fix=STR,
        )),
        dead_messages=_array(_obj(
            "trigger message_id kind reason at", trigger=STR, message_id=STR, kind=STR,
            reason=STR, at=NUM,
        )),
        triggers=_array(_obj(
            "trigger kind worker state error since", trigger=STR, kind=STR, worker=STR,
            state={"enum": ["refused", "down"]}, error=STR, since=NUM,
        )),
    ),
    "StuckCounts": _obj(
        "stuck runs causes schedules dead_messages triggers store", stuck=BOOL, runs=INT,
        causes={"type": "object", "additionalProperties": INT}, schedules=INT,
        dead_messages=INT, triggers=INT, store=BOOL,
    ),
    "RunSummary": _obj(_STATUS_KEYS, **_SUMMARY),
    "Run": _obj(
        _STATUS_KEYS, **_SUMMARY, input=ANY, result=ANY, lease_owner=OPT_STR,
        lease_until=OPT_NUM, lease_epoch=INT,
    ),
    "RunPage": _obj(
        "runs next_cursor",
        runs=_array(_ref("RunSummary")),
        next_cursor=OPT_STR,
        missing=_array(STR),
    ),
    "Started": _obj("run created", run=_ref("Run"), created=BOOL),
    "Entry": _obj(
        "seq kind", seq=INT, kind=STR, name=STR, position=OPT_INT, attempt=INT, final=BOOL,
        at=NUM, data=ANY,
    ),
    "Journal": _obj(
        "run_id status entries next_after", run_id=STR, status=STR,
        entries=_array(_ref("Entry")), next_after=OPT_INT,
    ),
    "Explanation": _obj(
        "run_id status steps", run_id=STR, status=STR,
        steps=_array(_obj(
            "position kind name state", position=INT, kind=STR, name=STR, effect=STR,
            attempts=INT, state=STR, detail=STR, recovery=STR,
        )),
    ),
    "Status": _obj("run_id status", run_id=STR, status=STR),
    "Forked": _obj("run forked_from", run=_ref("Run"), forked_from=STR),
    "EventSent": _obj("run_id event_id", run_id=STR, event_id=INT),
    "Stream": {
        "type": "string",
        "description": "text/event-stream: `event: journal` (an Entry; `id:` its seq), "
        "`event: status` ({run_id, status, updated_at, waiting_for}), `event: end`, and "
        "`: heartbeat` comments",
    },
    "Gates": _obj("gates", gates=_array(_obj(
        "run_id workflow kind call_id", run_id=STR, workflow=STR,
        kind={"enum": ["approval", "question"]}, call_id=STR, tool=STR,
        arguments={"type": "object"}, since=NUM,
    ))),
    "Decision": _obj("run_id call_id decision", run_id=STR, call_id=STR,
                     decision={"enum": ["approve", "deny", "answer"]}),
    "Schedule": _SCHEDULE,
    "Schedules": _obj("schedules", schedules=_array(_ref("Schedule"))),
    "ScheduleDetail": _obj(
        "schedule upcoming ticks", schedule=_ref("Schedule"), upcoming=_array(NUM),
        ticks=_array(_obj(
            "schedule fire_at status", schedule=STR, fire_at=NUM, status=STR,
            run_id=OPT_STR, reason=OPT_STR, at=NUM,
        )),
    ),
    "Triggers": _obj("triggers", triggers=_array(_obj(
        "kind name workflow state lag last_error detail pending since", kind=STR, name=STR,
        workflow=STR, state=STR, lag=OPT_NUM, last_error=OPT_STR, detail=STR,
        pending=OPT_INT, since=OPT_NUM,
    ))),
    "Deleted": _obj("deleted", deleted=STR),
    "Workers": _obj("workers", workers=_array(_obj(
        "id host pid concurrency running started_at heartbeat_at stopped_at state busy why "
        "label triggers", id=STR, host=STR, pid=INT, concurrency=INT, running=INT, started_at=NUM,
        heartbeat_at=NUM, stopped_at=OPT_NUM,
        state={"enum": ["alive", "stopped", "dead", "silent"]}, busy=BOOL, why=STR, label=STR,
        triggers=_array(_ref("Consumer")),
    ))),
    "Consumer": _obj(
        "trigger kind state since error failing", trigger=STR, kind=STR, state=STR, since=NUM,
        error=OPT_STR, failing=BOOL,
    ),
    "Versions": _obj(
        "versions builds waiting_for_version checkout",
        versions=_array(_obj("workflow version runs statuses waiting workers builds current",
                             workflow=STR, version=STR, runs=INT, statuses=ANY, waiting=INT,
                             workers=_array(STR), builds=_array(STR),
                             first_deployed=OPT_NUM, current=BOOL)),
        builds=_array(_obj("build workers live versions holds drained", build=STR,
                           workers=_array(STR), live=BOOL, versions=ANY, holds=INT,
                           drained=BOOL)),
        waiting_for_version=INT, checkout=ANY,
    ),
    "Pauses": _obj("pauses", pauses=_array(_obj("scope name since", scope=STR, name=STR,
                                                since=NUM))),
    "Paused": _obj("scope name paused changed", scope=STR, name=STR, paused=BOOL, changed=BOOL),
    "Usage": _obj(
        "by since groups", by=STR, since=NUM,
        groups=_array(_obj(
            "calls input_tokens output_tokens cost", agent=STR, run_id=STR, day=STR,
            calls=INT, input_tokens=INT, output_tokens=INT, cost=NUM,
        )),
    ),
    "Budget": _obj("agent budget in_force spent parked", **_BUDGET),
    "BudgetSet": _obj("agent budget in_force spent parked woken", **_BUDGET, woken=INT),
    "SharedBudget": _obj("shared limits spent agents parked", **_SHARED),
    "SharedBudgetSet": _obj("shared limits spent agents parked woken", **_SHARED, woken=INT),
    "AuditPage": _obj(
        "entries next_cursor", next_cursor=OPT_STR,
        entries=_array(_obj(
            "id at actor action target detail", id=INT, at=NUM, actor=STR, action=STR,
            target=STR, detail=ANY,
        )),
    ),
}
# fmt: on

ERRORS = {
    400: "A query value, path value or the JSON is malformed; `field` names it",
    401: "No valid `Authorization: Bearer <token>` header",
    403: "The token's scopes do not allow this",
    404: "No such run, schedule or path",
    409: "The run (or gate) is not in a state that allows this",
    413: f"The body is over {MAX_BODY} bytes",
    422: "The JSON body does not fit; `field` names the field",
    503: "The store cannot be reached (or too many event streams are open)",
}


def _operation(endpoint: Endpoint, body_refs: dict[str, Any]) -> dict[str, Any]:
    op: dict[str, Any] = {
        "operationId": endpoint.handler.__name__,
        "summary": endpoint.summary,
        "tags": [endpoint.path.split("/")[3] if endpoint.path.count("/") > 2 else "health"],
    }
    params: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True,
         "schema": {"type": "string", "minLength": 1, "maxLength": PATH_MOST[name],
                    "pattern": PATH_PARAMS[name]}}
        for name in re.findall(r"{(\w+)}", endpoint.path)
    ]  # fmt: skip
    params += [
        {"name": p.name, "in": "query", "required": p.required, "description": p.description,
         "schema": p.schema()}
        for p in endpoint.params
    ]  # fmt: skip
    if params:
        op["parameters"] = params
    errors = set(endpoint.errors)
    if params:
        errors.add(400)
    if endpoint.body is not None:
        needed = any(f.is_required() for f in endpoint.body.model_fields.values())
        op["requestBody"] = {  # an absent body is `{}`, which will do if nothing is required
            "required": needed,
            "content": {"application/json": {"schema": body_refs[endpoint.body.__name__]}},
        }
        errors |= {400, 413, 422}
    if endpoint.scope is not None:
        op["security"] = [{"bearer": []}]
        op["x-perdure-scope"] = endpoint.scope
        op["description"] = f"Needs a token with the `{endpoint.scope}` scope."
        errors |= {401, 403, 503}
    media = "text/event-stream" if endpoint.returns == "Stream" else "application/json"
    ok = {"description": "OK", "content": {media: {"schema": _ref(endpoint.returns)}}}
    responses: dict[str, Any] = {str(endpoint.status): ok}
    if endpoint.status == 201 and endpoint.returns == "Started":
        responses["200"] = {**ok, "description": "A run with this id existed: nothing started"}
    for code in sorted(errors):
        responses[str(code)] = {"$ref": f"#/components/responses/Error{code}"}
    op["responses"] = responses
    return op


@lru_cache(maxsize=1)
def document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of every endpoint in `api.ENDPOINTS` (and `/healthz`)."""
    refs, defs = models_json_schema(
        [(model, "validation") for model in BODIES], ref_template="#/components/schemas/{model}"
    )
    body_refs = {model.__name__: ref for (model, _), ref in refs.items()}
    ok = {"description": "OK", "content": {"application/json": {"schema": _obj("ok", ok=BOOL)}}}
    liveness = {"operationId": "healthz", "summary": "Liveness: the process answers"}
    paths: dict[str, dict[str, Any]] = {
        "/healthz": {"get": {**liveness, "tags": ["health"], "responses": {"200": ok}}}
    }
    for endpoint in ENDPOINTS:
        paths.setdefault(endpoint.path, {})[endpoint.method.lower()] = _operation(
            endpoint, body_refs
        )
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "perdure",
            "version": API_VERSION,
            "description": "The HTTP API of `perdure serve`: runs, gates, schedules, usage, "
            "budgets and the audit log. Tokens: `perdure token create NAME --scope "
            "read|operate|approve|admin`.",
        },
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "responses": {
                f"Error{code}": {
                    "description": text,
                    "content": {"application/json": {"schema": _ref("Error")}},
                }
                for code, text in ERRORS.items()
            },
            "schemas": {**_placed(defs.get("$defs", {})), **SCHEMAS},
        },
    }


def render() -> str:
    """The document as the text kept in docs/openapi.json."""
    return json.dumps(document(), indent=2, ensure_ascii=False) + "\n"


def write(path: Path = DEFAULT_PATH) -> Path:
    """Write the document to `path` (docs/openapi.json by default)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(), encoding="utf-8")
    return path


if __name__ == "__main__":
    print(write(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_PATH))
