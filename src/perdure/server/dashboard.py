"""The dashboard `perdure serve` shows under /ui: runs, a run's journal, approvals, schedules,
agents, workers and the audit log, refreshed live over server-sent events (/ui/stream).

Sign-in: a person pastes a token (`perdure token create`) once; the server starts a
session (`sessions`: an id in an HttpOnly, SameSite=Strict cookie, ended on sign-out,
with the token's revocation, and by idle and absolute limits), so every page and action
needs the scope the HTTP API would (read to look, approve for gates, operate for runs,
admin for schedules). Every action and the event stream also need the session's tab key,
which the script keeps in this origin's storage and sends as `X-Perdure-Tab` (`?tab=` for
the stream): other ports of the host get the cookie, not the key. Every form POSTs a CSRF
token bound to the session (an HMAC keyed by it) and must come from this origin. Over
HTTPS the cookies are `__Host-` and `Secure`. Wrong tokens and sessions are limited per
client address (`throttle`). Secrets are redacted from all output.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlencode

from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from ..agent.budget_sql import Budgets
from ..app import App
from ..engine import steering
from ..engine.client import unblob_text
from ..engine.durable import internal
from ..engine.inspection import explain
from ..engine.peers import worker_states
from ..engine.progress import executing
from ..engine.reasons import claimable, shown_status
from ..errors import ConfigError, PerdureError, RunNotFound
from ..observe.redact import Redactor
from ..store.base import ALL_STATUSES, FINISHED, Entry, RunRow
from ..store.names import escape
from ..triggers import schedules
from ..triggers.dead_sql import DeadMessages
from ..triggers.health_sql import consumers_by_worker
from ..triggers.messages import MessageTrigger
from ..triggers.schedule_sql import Schedules
from . import operations, sessions
from .access import Principal, authenticate_request, record
from .access_sql import Access
from .answers import parsed, run_starts
from .limits import MAX_FORM
from .operations import APPROVE_PREFIX, QUESTION_PREFIX, Forbidden, require
from .run_picture import outputs, picture
from .sse import Recheck, SlotStream, busy, slots_of
from .throttle import TooManyFailures

HERE = Path(__file__).resolve().parent
templates = Jinja2Templates(directory=HERE / "templates")
SESSION_COOKIE = "perdure_session"
CSRF_COOKIE = "perdure_csrf"
FLASH_COOKIE = "perdure_flash"
REFRESH_HEADER = "X-Perdure-Refresh"  # sent by perdure.js on a live refresh
TAB_HEADER = "X-Perdure-Tab"  # the session's tab key, sent by perdure.js with every action
COOKIE_PATH = "/ui"
PAGE = 50  # rows per page of runs and audit entries
MAX_WAITING = 50  # runs waiting for a person listed above the runs (all: perdure stuck)
MAX_PAGE = 1000  # a page number beyond is the last one asked for (never a 500)
PROBE_TIMEOUT = 2.0  # seconds a message trigger's broker has to answer the Messages page
MAX_ID = 2**62  # an audit cursor beyond any id (SQL integers end at 2**63)
MAX_ENTRIES = 1000  # journal entries shown on a run page (the newest)
MAX_STREAMED = 5000  # stream rows a run page reads (the newest)
MAX_OUTPUTS = 30  # step attempts whose output a run page shows (the newest)
STREAM_SECONDS = 600.0  # one SSE connection lasts this long; the browser then reconnects
STREAM_POLL = 1.0  # seconds between checks for changes made by other processes
HEADERS = {
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",  # no clickjacking of approve buttons
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "frame-ancestors 'none'; form-action 'self'"
    ),
}


def when(ts: float | None) -> str:
    """A UTC timestamp as `2025-01-31 09:00:00Z` ('-' for none)."""
    if not ts:
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def ago(ts: float | None, now: float) -> str:
    """`ts` relative to `now`: `42s ago`, `in 3m`, `2d ago`."""
    if not ts:
        return "-"
    delta = now - ts
    size = abs(delta)
    for unit, seconds in (("d", 86400), ("h", 3600), ("m", 60)):
        if size >= seconds:
            text = f"{int(size // seconds)}{unit}"
            break
    else:
        text = f"{int(size)}s"
    return f"{text} ago" if delta >= 0 else f"in {text}"


def visible(value: Any) -> Any:
    """Every `{{ value }}` a page shows, before HTML escaping: what the id rule refuses (control,
    format and invisible characters) written as an escape, line breaks and tabs kept, so that
    no stored text (old ids made before the rule included) reorders or hides a page's text."""
    if isinstance(value, str):  # Markup stays Markup: the escapes are plain ASCII
        return type(value)(escape(value, keep="\n\t"))
    return value


def duration(seconds: float) -> str:
    """`4 h`, `90 min`, `20 s`: how long a session lasts, for the sign-in page."""
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    return f"{seconds / 60:g} min" if seconds >= 60 else f"{seconds:g} s"


def path_part(value: Any) -> str:
    """`urlencode` for one part of a path: `/` too is encoded, so an id like
    `x/../../ui/runs/other` cannot make a link lead to another run's page."""
    return quote(str(value), safe="")


templates.env.finalize = visible
templates.env.filters["urlencode"] = path_part  # the pages use it for path parts only
templates.env.globals["duration"] = duration
templates.env.filters["when"] = when
templates.env.globals["ago"] = ago
templates.env.globals["shown_status"] = shown_status


# -- sign-in, CSRF, rendering ------------------------------------------------------------


def tls(request: Request) -> bool:
    return request.url.scheme == "https"


def cookie_name(request: Request, name: str) -> str:
    """Over HTTPS a cookie is `__Host-NAME` (Secure, Path=/, only this host may set it)."""
    return f"__Host-{name}" if tls(request) else name


def cookie(request: Request, name: str, default: str = "") -> str:
    return request.cookies.get(cookie_name(request, name), default)


def drop_cookie(request: Request, response: Response, name: str) -> None:
    """Delete cookie `name`, and one of the same name a page of another port may have set
    for the whole host (which the browser would send too)."""
    for path in {"/" if tls(request) else COOKIE_PATH, "/"}:
        response.delete_cookie(cookie_name(request, name), path=path, secure=tls(request))


def tab_of(request: Request) -> str:
    """The tab key the request carries: `X-Perdure-Tab`, or `?tab=` (the event stream)."""
    return request.headers.get(TAB_HEADER) or request.query_params.get("tab", "")


def session_id(request: Request) -> str:
    """The session cookie's value. A page of another port can toss in a cookie of the same
    name (another path, sent as well): of several, only the one the request's tab key
    belongs to counts, and without a key none does (the person signs in again)."""
    name = cookie_name(request, SESSION_COOKIE) + "="
    found = [part.strip()[len(name):] for header in request.headers.getlist("cookie")
             for part in header.split(";") if part.strip().startswith(name)]  # fmt: skip
    if len(found) <= 1:
        return found[0] if found else ""
    tab = tab_of(request)
    return next((value for value in found if sessions.tab_matches(tab, value)), "")


async def principal(request: Request, *, touch: bool = True) -> Principal | None:
    """Who the session cookie is of, or None (no cookie, signed out, expired, token revoked);
    raises TooManyFailures while this address is held back for wrong ones."""
    session = session_id(request)
    return await sessions.request_holder(request, session, touch=touch) if session else None


def tab_ok(request: Request) -> bool:
    """The request carries the tab key of its session cookie (`X-Perdure-Tab`, or `?tab=`)."""
    return sessions.tab_matches(tab_of(request), session_id(request))


def whole_number(text: str) -> int | None:
    """`text` as a number if it is ASCII digits only (`"²"` is a digit to `str.isdigit`, not
    to `int`)."""
    return int(text) if text.isascii() and text.isdigit() and len(text) < 30 else None


def local_path(target: str | None, default: str = "/ui/runs") -> str:
    """`target` if it is a path of this dashboard (never another site), else `default`."""
    if target and target.startswith("/ui/") and "//" not in target and "\\" not in target:
        return target
    return default


async def read_form(request: Request) -> dict[str, str]:
    """The urlencoded form of a POST (first value of each field)."""
    body = await request.body()
    if len(body) > MAX_FORM:
        return {}
    fields = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    return {key: values[0] for key, values in fields.items()}


def csrf_token(request: Request, nonce: str, session: str | None = None) -> str:
    """The token this browser's forms carry: an HMAC of its CSRF nonce keyed by its session
    id (signed out: by the server's own key). A page on another port of this host can set
    cookies here (browsers do not separate cookies by port) but cannot compute this; it
    outlives a restart of the server, as the session does."""
    if session is None:
        session = session_id(request)
    key: bytes = session.encode() if session else request.app.state.csrf_key
    return hmac.new(key, nonce.encode(), hashlib.sha256).hexdigest()


def same_origin(request: Request) -> bool:
    """A state-changing request came from this dashboard's own pages: `Sec-Fetch-Site`
    (when the browser sends it) says same-origin, and `Origin` (when sent) is this server."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return False
    origin = request.headers.get("origin")
    if origin is not None:
        host = request.headers.get("host", "")
        return origin == f"{request.url.scheme}://{host}"
    return True


def csrf_ok(request: Request, form: dict[str, str]) -> bool:
    """The form came from this dashboard: same origin, and its token is the one `csrf_token`
    gives this browser's nonce and session."""
    nonce, sent = cookie(request, CSRF_COOKIE), form.get("csrf", "")
    if not nonce or not same_origin(request):
        return False
    return secrets.compare_digest(csrf_token(request, nonce).encode(), sent.encode())


def set_cookie(request: Request, response: Response, name: str, value: str, age: int) -> None:
    path = "/" if tls(request) else COOKIE_PATH
    response.set_cookie(cookie_name(request, name), value, max_age=age, path=path, httponly=True,
                        samesite="strict", secure=tls(request))  # fmt: skip


async def render(
    request: Request, who: Principal | None, name: str, status: int = 200, **context: Any
) -> Response:
    """Render template `name` for `who`, with the CSRF token and any flash message; every
    secret the redactor knows is hidden from the whole page."""
    app: App = request.app.state.perdure
    nonce = cookie(request, CSRF_COOKIE) or secrets.token_hex(24)
    csrf = csrf_token(request, nonce)
    # a live refresh (perdure.js) neither shows nor spends the flash: it belongs to the page
    # a form redirected to, and a refresh fired by the page being left may come first
    refresh = request.headers.get(REFRESH_HEADER) == "1"
    flash = "" if refresh else unflash(request, cookie(request, FLASH_COOKIE))
    gates = 0
    if who is not None:
        waiting = await app.runtime.store.list_runs(statuses=["waiting"], limit=10_000)
        prefixes = (APPROVE_PREFIX, QUESTION_PREFIX)
        gates = sum(1 for r in waiting if (r.waiting_for or "").startswith(prefixes))
    can = {s: bool(who and who.allows(s)) for s in ("read", "operate", "approve", "admin")}
    html = templates.env.get_template(name).render(
        who=who, can=can, csrf=csrf, flash=flash, gates=gates, path=request.url.path,
        now=app.clock.now(), sessions=request.app.state.sessions, **context,
    )  # fmt: skip
    response = HTMLResponse(Redactor().page(html), status_code=status, headers=HEADERS)
    if nonce != cookie(request, CSRF_COOKIE):
        age = int(request.app.state.sessions.absolute)
        set_cookie(request, response, CSRF_COOKIE, nonce, age)
    if cookie(request, FLASH_COOKIE) and not refresh:
        drop_cookie(request, response, FLASH_COOKIE)
    return response


def flash_mac(request: Request, text: str) -> str:
    key: bytes = request.app.state.csrf_key
    return hmac.new(key, b"flash\0" + text.encode(), hashlib.sha256).hexdigest()[:32]


def unflash(request: Request, value: str) -> str:
    """The message of a flash cookie this server signed; "" for any other (a page of another
    port of the host can set cookies here, not sign them)."""
    text, _, mac = unquote(value).rpartition("|")
    return text if text and secrets.compare_digest(mac, flash_mac(request, text)) else ""


def back(request: Request, target: str, message: str) -> Response:
    """303 to `target` (a GET), showing `message` there once."""
    response = RedirectResponse(target, status_code=303, headers=HEADERS)
    text = message[:300]
    set_cookie(request, response, FLASH_COOKIE, quote(f"{text}|{flash_mac(request, text)}"), 60)
    return response


async def refusal(request: Request, who: Principal | None, exc: PerdureError) -> Response:
    """The page for an action that could not be done, with the status that says why."""
    status = 409  # the run (or schedule) is not in a state that allows it
    if isinstance(exc, Forbidden):
        status = 403
    elif isinstance(exc, RunNotFound):
        status = 404
    elif isinstance(exc, ConfigError):
        status = 400
    return await render(request, who, "message.html", status, title=str(status), message=str(exc))


async def held_back(request: Request, exc: TooManyFailures) -> Response:
    """429: this address sent too many wrong tokens or sessions lately."""
    response = await render(request, None, "message.html", 429, title="429", message=str(exc))
    response.headers["Retry-After"] = str(exc.retry_after)
    return response


Page = Callable[[Request, App, Principal], Awaitable[Response]]
Action = Callable[[Request, App, Principal, dict[str, str]], Awaitable[Response]]


def page(handler: Page) -> Callable[[Request], Awaitable[Response]]:
    """A GET page: signed-in readers only (others are sent to the login page)."""

    async def endpoint(request: Request) -> Response:
        app: App = request.app.state.perdure
        await app.runtime.open_store()
        try:
            who = await principal(request)
        except TooManyFailures as exc:
            return await held_back(request, exc)
        if who is None:
            target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            login = "/ui/login?" + urlencode({"next": local_path(target)})
            response = RedirectResponse(login, status_code=303, headers=HEADERS)
            drop_cookie(request, response, SESSION_COOKIE)  # ended: not sent again
            return response
        try:
            require(who, "read", "viewing the dashboard")
            return await handler(request, app, who)
        except PerdureError as exc:
            return await refusal(request, who, exc)

    return endpoint


def action(handler: Action) -> Callable[[Request], Awaitable[Response]]:
    """A form POST: 401 without a session, 403 without the CSRF token; the handler checks
    its own scope (through `operations`, which also writes the audit log)."""

    async def endpoint(request: Request) -> Response:
        app: App = request.app.state.perdure
        await app.runtime.open_store()
        try:
            who = await principal(request)
        except TooManyFailures as exc:
            return await held_back(request, exc)
        if who is None:
            message = "Your session ended or the token was revoked: sign in again."
            return await render(request, None, "message.html", 401, title="401", message=message)
        form = await read_form(request)
        if not csrf_ok(request, form):
            message = "The form is stale or came from another site (CSRF check failed): reload."
            return await render(request, who, "message.html", 403, title="403", message=message)
        if not tab_ok(request):
            message = ("This action did not come from a signed-in dashboard tab (its tab key "
                       "is missing or wrong): reload the page, or sign in again.")  # fmt: skip
            return await render(request, who, "message.html", 403, title="403", message=message)
        try:
            return await handler(request, app, who, form)
        except PerdureError as exc:
            return await refusal(request, who, exc)

    return endpoint


# -- sign-in -------------------------------------------------------------------------------


async def login_page(request: Request) -> Response:
    app: App = request.app.state.perdure
    await app.runtime.open_store()
    target = local_path(request.query_params.get("next"))
    return await render(request, None, "login.html", target=target, error="")


async def login(request: Request) -> Response:
    app: App = request.app.state.perdure
    await app.runtime.open_store()
    form = await read_form(request)
    target = local_path(form.get("next"))
    if not csrf_ok(request, form):
        error = "The sign-in form was stale (CSRF check failed): try again."
        return await render(request, None, "login.html", 403, target=target, error=error)
    token = form.get("token", "").strip()
    try:
        who = await authenticate_request(request, f"Bearer {token}") if token else None
    except TooManyFailures as exc:
        return await held_back(request, exc)
    if who is None:
        error = "That token is not valid (unknown, revoked or mistyped)."
        return await render(request, None, "login.html", 401, target=target, error=error)
    policy: sessions.SessionPolicy = request.app.state.sessions
    session, tab = await sessions.start(app, who, policy)
    await record(app, who.name, "session.start", f"token:{who.token_id}", {"via": "dashboard"})
    # the tab key goes in the fragment: never sent to a server, taken into this origin's
    # storage and off the address bar by perdure.js
    location = target.partition("#")[0] + "#tab=" + tab
    response = RedirectResponse(location, status_code=303, headers=HEADERS)
    if not tls(request):  # one tossed in from another port for the whole host
        response.delete_cookie(SESSION_COOKIE, path="/")
    set_cookie(request, response, SESSION_COOKIE, session, int(policy.absolute))
    set_cookie(request, response, CSRF_COOKIE, secrets.token_hex(24), int(policy.absolute))
    return response


@action
async def logout(request: Request, app: App, who: Principal, form: dict[str, str]) -> Response:
    await sessions.end(app, session_id(request))
    await record(app, who.name, "session.end", f"token:{who.token_id}", {"via": "dashboard"})
    response = RedirectResponse("/ui/login", status_code=303, headers=HEADERS)
    for name in (SESSION_COOKIE, CSRF_COOKIE):
        drop_cookie(request, response, name)
    return response


# -- runs ----------------------------------------------------------------------------------


@page
async def runs_page(request: Request, app: App, who: Principal) -> Response:
    """Runs, newest first: filter by status chips and workflow, search ids, page through;
    above them, the runs that wait for a person (or that nobody moves), each with its
    reason and the command that moves it, as `perdure stuck` lists them."""
    from .stuck import stuck

    query = request.query_params
    statuses = [s for s in query.getlist("status") if s in ALL_STATUSES]
    workflow = query.get("workflow") or None
    search = query.get("q", "").strip()
    page_text = query.get("page", "1")
    number = min(max(whole_number(page_text) or 1, 1), MAX_PAGE)
    start = (number - 1) * PAGE
    wanted = 10_000 if search else start + PAGE + 1
    rows = await app.runtime.store.list_runs(statuses=statuses, workflow=workflow, limit=wanted)
    if search:
        rows = [r for r in rows if search.lower() in r.id.lower()]
    shown = rows[start : start + PAGE]
    counts = await app.runtime.store.count_runs()
    found = await stuck(app)
    waiting = found["runs"]
    names = sorted(
        set(app.runtime.workflows) | {r.workflow for r in shown} | {workflow or ""} - {""}
    )

    def link(**change: Any) -> str:
        params: dict[str, Any] = {"status": statuses, "workflow": workflow or "", "q": search}
        params.update(change)
        kept = {k: v for k, v in params.items() if v not in ("", [], None)}
        return "/ui/runs?" + urlencode(kept, doseq=True)

    chips = [
        (s, counts.get(s, 0), s in statuses,
         link(status=[x for x in statuses if x != s] if s in statuses else [*statuses, s]))
        for s in ALL_STATUSES
        if counts.get(s) or s in statuses
    ]  # fmt: skip
    return await render(
        request, who, "runs.html", runs=shown, chips=chips, workflows=names, workflow=workflow,
        started=await run_starts(app, shown),
        statuses=statuses, search=search, number=number, total=sum(counts.values()),
        newer=link(page=number - 1) if number > 1 else "",
        older=link(page=number + 1) if len(rows) > start + PAGE else "",
        clear=link(status=[]), waiting=waiting[:MAX_WAITING], waiting_total=len(waiting),
        for_person=sum(1 for w in waiting if w["cause"] != "overdue"),
        not_consuming=found["triggers"],
    )  # fmt: skip


@dataclass(slots=True)
class TimelineRow:
    """One journal entry as the run page shows it."""

    seq: int
    at: float
    position: int | None
    kind: str
    name: str
    effect: str
    attempt: int
    ms: float | None
    tokens: int | None
    cost: float | None
    summary: str
    data: str
    state: str = ""
    recovery: str = ""
    probe: bool = False  # the step has a probe an operator can have asked again


def timeline(app: App, run: RunRow, entries: list[Entry], redactor: Redactor) -> list[TimelineRow]:
    """The journal with each entry's effect, timing, usage and (on the last entry of each
    position) what recovery would do there now."""
    reports = {r.position: r for r in explain(app.runtime, run, entries)}
    last = {e.position: e.seq for e in entries if e.position is not None}
    rows: list[TimelineRow] = []
    for entry in entries:
        data = parsed(entry.data)
        data = redactor.value(data)
        value = data.get("value") if isinstance(data, dict) else None
        usage = value.get("usage") if isinstance(value, dict) else None
        tokens = cost = None
        if isinstance(usage, dict) and entry.kind == "step.outcome":
            tokens = int(usage.get("input_tokens") or 0) + int(usage.get("output_tokens") or 0)
            cost = float(value.get("cost") or 0.0) if isinstance(value, dict) else None
        ms = data.get("ms") if isinstance(data, dict) else None
        report = reports.get(entry.position) if entry.position is not None else None
        row = TimelineRow(
            entry.seq, entry.at, entry.position, entry.kind, entry.name,
            report.effect if report else "", entry.attempt,
            float(ms) if isinstance(ms, int | float) else None, tokens, cost,
            _summary(data), _pretty(data),
        )  # fmt: skip
        if report is not None and last.get(report.position) == entry.seq:
            row.state, row.recovery = report.state, report.recovery
            definition = app.runtime.steps.get(entry.name)
            row.probe = definition is not None and definition.probe is not None
        rows.append(row)
    return rows


def _summary(data: Any) -> str:
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        error = data["error"]
        return f"{error.get('type', 'error')}: {error.get('message', '')}"[:200]
    if isinstance(data, dict) and {"type", "message"} <= data.keys():
        return f"{data['type']}: {data['message']}"[:200]
    if isinstance(data, dict) and "value" in data:
        data = data["value"]
    return "" if data is None else json.dumps(data, default=str)[:200]


def _pretty(data: Any) -> str:
    return "" if data is None else json.dumps(data, indent=2, default=str)[:10_000]


@page
async def run_page(request: Request, app: App, who: Principal) -> Response:
    """One run: its state, error and traceback, journal timeline, and audit entries."""
    run = await app.client.get(request.path_params["run_id"])
    entries = await app.runtime.store.journal(run.id)
    for entry in entries:
        entry.data = await unblob_text(app.runtime.store, entry.data)
    redactor = Redactor()
    shown = [e for e in entries if not internal(e)]  # perdure's own markers: show --all
    rows = timeline(app, run, shown, redactor)
    error = redactor.value(parsed(run.error)) if run.error else None
    if error is not None and not isinstance(error, dict):
        error = {"message": str(error)}
    result = redactor.value(parsed(await unblob_text(app.runtime.store, run.result)))
    arguments = redactor.value(parsed(await unblob_text(app.runtime.store, run.input)))
    audit = await Access(app.runtime.store).audit_log(target=f"run:{run.id}", limit=100)
    tokens, cost = await Budgets(app.runtime.store).run_spent(run.id)
    children = await app.runtime.store.list_runs(parent_id=run.id, limit=200)
    waiting = run.waiting_for or ""
    gate = run.status == "waiting" and waiting.startswith((APPROVE_PREFIX, QUESTION_PREFIX))
    actions = {
        "cancel": run.status not in FINISHED,
        "pause": run.status in ("pending", "running", "sleeping", "waiting")
        and not run.pause_requested,
        "pause_now": run.status == "running",  # its calls in flight are aborted
        "resume": run.status in ("paused", "dead") or run.pause_requested,
        "steer": run.status not in FINISHED
        and (run.workflow.startswith(operations.AGENT_RUNS) or steering.asked(entries)),
    }
    last = await app.runtime.store.stream_last(run.id)
    streamed = await app.runtime.store.read_stream(
        run.id, max(-1, last - MAX_STREAMED), MAX_STREAMED
    )
    output, _ = outputs(streamed)
    now = app.clock.now()
    doing = executing(run, entries, streamed, now)
    for block in output:
        block.text = redactor.text(block.text)
        block.topics = {k: json.dumps(redactor.value(v), default=str)
                        for k, v in block.topics.items()}  # fmt: skip
    return await render(
        request, who, "run.html", run=run, rows=rows[-MAX_ENTRIES:], hidden=len(rows) > MAX_ENTRIES,
        picture=picture(run, shown, app.clock.now()), output=output[-MAX_OUTPUTS:],
        older=streamed[0].seq if streamed else 0,  # stream rows before those read
        error=error, result=_pretty(result), arguments=_pretty(arguments),
        audit=[(a, redactor.value(parsed(a.detail))) for a in audit], tokens=tokens, cost=cost,
        children=children, gate=gate, actions=actions, final=run.status in FINISHED,
        executing=doing.describe(now) if doing else None,
    )  # fmt: skip


@action
async def run_action(request: Request, app: App, who: Principal, form: dict[str, str]) -> Response:
    """cancel | pause | pause_now | resume | steer (its `text`) a run, or retry | fail | probe
    (ask the step's probe again) one of its needs_attention steps."""
    run_id, verb = form.get("run_id", ""), form.get("action", "")
    target = f"/ui/runs/{quote(run_id, safe='')}"
    comment = form.get("comment", "")
    if verb in ("retry", "fail", "probe"):
        found = whole_number(form.get("step", ""))
        step = -1 if found is None else found
        options = {"step": step, verb: True}
        status = await operations.operate(app, who, "resolve", run_id, comment, **options)
        asked = "its probe asked again" if verb == "probe" else f"{verb} requested"
        return back(request, target, f"Step {step}: {asked}; the run is {status}.")
    if verb == "steer":
        await operations.steer(app, who, run_id, form.get("text", ""))
        return back(request, target, "Steered: the run takes the message at its next model call.")
    if verb == "pause_now":  # abort the calls in flight that allow it, then pause
        status = await operations.operate(app, who, "pause", run_id, comment, now=True)
        return back(request, target, f"Pause now: calls in flight aborted; the run is {status}.")
    if verb not in ("cancel", "pause", "resume"):
        raise PerdureError(f"unknown action {verb!r}")
    status = await operations.operate(app, who, verb, run_id, comment)
    return back(request, target, f"{verb.capitalize()}: the run is now {status}.")


# -- approvals -----------------------------------------------------------------------------


@page
async def approvals_page(request: Request, app: App, who: Principal) -> Response:
    """Runs waiting for a person: tool calls to approve or deny, questions to answer."""
    redactor = Redactor()
    gates = [
        (gate, _pretty(redactor.value(gate.arguments)))
        for gate in await operations.pending_gates(app)
    ]
    decided = [
        (a, redactor.value(parsed(a.detail)))
        for a in await Access(app.runtime.store).audit_log(limit=200)
        if a.action.startswith("gate.") and a.outcome == "ok"
    ][:20]
    return await render(request, who, "approvals.html", pending=gates, decided=decided)


@action
async def decide(request: Request, app: App, who: Principal, form: dict[str, str]) -> Response:
    run_id, call_id = form.get("run_id", ""), form.get("call_id", "")
    verdict = form.get("decision", "")
    if verdict not in ("approve", "deny"):
        raise PerdureError(f"decision {verdict!r}: use approve or deny")
    comment = form.get("comment", "").strip()
    await operations.decide(app, who, run_id, call_id, verdict == "approve", comment)
    done = "approved" if verdict == "approve" else "denied"
    return back(request, "/ui/approvals", f"Call {call_id} of run {run_id} {done}.")


@action
async def answer(request: Request, app: App, who: Principal, form: dict[str, str]) -> Response:
    run_id, call_id = form.get("run_id", ""), form.get("call_id", "")
    await operations.answer(app, who, run_id, call_id, form.get("answer", ""))
    return back(request, "/ui/approvals", f"Question {call_id} of run {run_id} answered.")


# -- schedules, agents, workers, audit --------------------------------------------------------


@page
async def schedules_page(request: Request, app: App, who: Principal) -> Response:
    """Every stored schedule: timing, next fire times, the last fire, missed or skipped ticks."""
    now = app.clock.now()
    shown = []
    for row in await Schedules(app.runtime.store).list_schedules():
        coming = [] if row.paused else schedules.upcoming(row, 3, now)
        if row.next_fire is not None and not row.paused and row.next_fire <= now:
            coming = [row.next_fire, *coming[:2]]  # due: the next worker pass fires it
        missed = await Schedules(app.runtime.store).schedule_ticks(
            row.name, statuses=("missed", "skipped"), limit=5
        )
        fired = await Schedules(app.runtime.store).schedule_ticks(
            row.name, statuses=("fired",), limit=1
        )
        timing = f"cron {row.cron} ({row.tz})" if row.cron else f"every {row.every:g}s"
        shown.append((row, timing, coming, fired[0] if fired else None, missed))
    return await render(request, who, "schedules.html", schedules=shown)


@page
async def messages_page(request: Request, app: App, who: Principal) -> Response:
    """The app's message triggers and the messages that could start no run, with why."""
    dead = await DeadMessages(app.runtime.store).dead_messages(limit=200)
    triggers = list(app.runtime.triggers.of(MessageTrigger).values())
    states = await asyncio.gather(*(t.probe(PROBE_TIMEOUT) for t in triggers))
    shown = list(zip(triggers, states, strict=True))
    return await render(request, who, "messages.html", triggers=shown, dead_messages=dead)


@action
async def schedule_action(
    request: Request, app: App, who: Principal, form: dict[str, str]
) -> Response:
    name, verb = form.get("name", ""), form.get("action", "")
    if verb == "pause":
        await operations.pause_schedule(app, who, name)
    elif verb == "resume":
        await operations.resume_schedule(app, who, name)
    else:
        raise PerdureError(f"unknown action {verb!r}")
    return back(request, "/ui/schedules", f"Schedule {name}: {verb}d.")


def usage_bars(days: list[tuple[str, int, float]]) -> dict[str, Any]:
    """Geometry of an inline SVG bar chart of tokens per day (no JavaScript)."""
    top = max((tokens for _, tokens, _ in days), default=0) or 1
    width, height = 28, 120
    bars = []
    for i, (day, tokens, cost) in enumerate(days):
        h = round(tokens / top * (height - 30))  # room for the value above the top bar
        bars.append({"x": i * width + 4, "y": height - 14 - h, "h": h, "w": width - 8,
                     "day": day, "label": day[5:], "tokens": tokens, "cost": cost})  # fmt: skip
    return {"width": len(days) * width + 8, "height": height, "bars": bars, "top": top}


@page
async def agents_page(request: Request, app: App, who: Principal) -> Response:
    """Per agent: spent against budget this hour and day, and tokens per day (14 days)."""
    now = app.clock.now()
    since = (now // 86400 - 13) * 86400
    usage = await Budgets(app.runtime.store).usage(None, since)
    names = sorted(
        {u.agent for u in usage}
        | {w.removeprefix("agent:") for w in app.runtime.workflows if w.startswith("agent:")}
    )
    agents = []
    from ..agent.budgets import current  # the agent layer, for its budget in force

    for name in names:
        try:  # each limit from the stored budget, else the spec's
            budget: Any = (await current(app.runtime, name)).budget
        except PerdureError:  # no worker has served it yet: only a stored budget is known
            budget = await Budgets(app.runtime.store).get_budget(name)
        gauges = []
        for window, seconds in (("hour", 3600.0), ("day", 86400.0)):
            tokens, cost = await Budgets(app.runtime.store).spent(name, now - seconds)
            token_limit = getattr(budget, f"tokens_per_{window}", None) if budget else None
            cost_limit = getattr(budget, f"cost_per_{window}", None) if budget else None
            gauges.append(_gauge(f"tokens this {window}", tokens, token_limit, "{:,.0f}"))
            gauges.append(_gauge(f"cost this {window}", cost, cost_limit, "{:.4f}"))
        per_day: dict[str, list[float]] = {}
        for i in range(14):
            per_day[datetime.fromtimestamp(since + i * 86400, UTC).strftime("%Y-%m-%d")] = [0, 0.0]
        for u in usage:
            if u.agent == name:
                day = per_day.setdefault(
                    datetime.fromtimestamp(u.at, UTC).strftime("%Y-%m-%d"), [0, 0.0]
                )
                day[0] += u.input_tokens + u.output_tokens
                day[1] += u.cost
        days = [(day, int(t), c) for day, (t, c) in sorted(per_day.items())]
        agents.append({"name": name, "gauges": gauges, "chart": usage_bars(days)})
    return await render(request, who, "agents.html", agents=agents,
                        shared=await _shared_gauges(app))  # fmt: skip


async def _shared_gauges(app: App) -> list[dict[str, Any]]:
    """Each budget agents share ([budget] shared = NAME): spent against its limits this hour
    and day, and which agents share it."""
    from ..agent.budgets import describe_shared

    names = set()
    for _, text in await Budgets(app.runtime.store).declared_agents():
        spec = parsed(text)
        shared = spec.get("shared") if isinstance(spec, dict) else None
        if isinstance(shared, str):
            names.add(shared)
    found = []
    for name in sorted(names):
        shown = await describe_shared(app.runtime, name)
        gauges = []
        for window in ("hour", "day"):
            spent, limits = shown["spent"][window], shown["limits"]
            gauges.append(_gauge(f"tokens this {window}", spent["tokens"],
                                 limits[f"tokens_per_{window}"], "{:,.0f}"))  # fmt: skip
            gauges.append(_gauge(f"cost this {window}", spent["cost"],
                                 limits[f"cost_per_{window}"], "{:.4f}"))  # fmt: skip
        found.append({"name": name, "gauges": gauges, "agents": shown["agents"]})
    return found


def _gauge(label: str, used: float, limit: float | None, fmt: str) -> dict[str, Any]:
    share = min(used / limit, 1.0) if limit else 0.0
    level = "over" if limit and used >= limit else "high" if share >= 0.8 else "ok"
    return {
        "label": label, "used": fmt.format(used), "limit": fmt.format(limit) if limit else "",
        "width": round(share * 200), "percent": round(share * 100), "level": level,
    }  # fmt: skip


@page
async def triggers_page(request: Request, app: App, who: Principal) -> Response:
    """Every trigger with its state, lag and last error (as `perdure triggers`)."""
    return await render(
        request, who, "triggers.html", triggers=await app.runtime.triggers.statuses()
    )


@page
async def workers_page(request: Request, app: App, who: Principal) -> Response:
    """Every worker heard of in the last hour with its state (the one judgement of
    `engine.peers.worker_state`: alive busy or idle, stopped, dead with the proof, silent),
    a live one's message-trigger consumers (consuming, refused with the broker's words ...),
    the runs it holds and their lease; runs no worker holds; what is paused."""
    now = app.clock.now()
    held = await app.runtime.store.list_runs(statuses=["running", "cancelling"], limit=10_000)
    owners: dict[str, list[RunRow]] = {}
    for run in held:
        if not claimable(run, now) and run.lease_owner:
            owners.setdefault(run.lease_owner, []).append(run)
    order = {"alive": 0, "silent": 1, "dead": 2, "stopped": 3}
    judged = sorted(await worker_states(app.runtime.store, now, now - 3600),
                    key=lambda w: (order[w[1].state], w[0].id))  # fmt: skip
    live = {row.id for row, state in judged if state.live}
    consumers = await consumers_by_worker(app.runtime.store, live)
    workers = []
    for row, state in judged:
        runs = sorted(owners.pop(row.id, []), key=lambda r: r.id)
        workers.append({"id": row.id, "where": f"{row.host} pid {row.pid}", "state": state,
                        "consumers": consumers.get(row.id, []),
                        "load": f"{row.running}/{row.concurrency}", "beat": row.heartbeat_at,
                        "runs": runs, "until": max((r.lease_until or 0.0) for r in runs)
                        if runs else None})  # fmt: skip
    for owner, runs in sorted(owners.items()):  # a lease owner the registry does not know
        workers.append({"id": owner, "where": "-", "state": None, "consumers": [],
                        "load": str(len(runs)),
                        "beat": None, "runs": sorted(runs, key=lambda r: r.id),
                        "until": max((r.lease_until or 0.0) for r in runs)})  # fmt: skip
    unheld = sorted((r for r in held if claimable(r, now)), key=lambda r: r.id)
    pauses = await app.runtime.store.list_pauses()
    return await render(request, who, "workers.html", workers=workers, unheld=unheld,
                        pauses=pauses)  # fmt: skip


@page
async def versions_page(request: Request, app: App, who: Principal) -> Response:
    """Unfinished runs by workflow and code version, builds and their drain, and what this
    server's code would do with runs of other versions (as `perdure versions`)."""
    from .versions_api import versions_data

    return await render(request, who, "versions.html", report=await versions_data(app, True))


@page
async def audit_page(request: Request, app: App, who: Principal) -> Response:
    """The audit log, newest first: who did what to which run, schedule or token, when, and
    how it ended; filtered by target (or run), actor and since (a duration, time or date)."""
    query = request.query_params
    before_text = query.get("before", "")
    found = whole_number(before_text)
    before = None if found is None else min(found, MAX_ID)
    run = query.get("run") or None
    target = f"run:{run}" if run else query.get("target") or None
    actor = query.get("actor") or None
    since_text = query.get("since") or ""
    since = operations.parse_since(since_text, app.clock.now()) if since_text else None
    rows = await Access(app.runtime.store).audit_log(
        target=target, limit=PAGE + 1, before=before, actor=actor, since=since
    )
    redactor = Redactor()
    shown = [(a, redactor.value(parsed(a.detail)), redactor.value(a.reason)) for a in rows[:PAGE]]
    filters = {"target": target or "", "actor": actor or "", "since": since_text}
    older = ""
    if len(rows) > PAGE:
        older = "/ui/audit?" + urlencode({"before": rows[PAGE - 1].id, **filters})
    return await render(request, who, "audit.html", entries=shown, older=older, target=target,
                        filters=filters)  # fmt: skip


# -- live updates ---------------------------------------------------------------------------


async def digest(app: App, run_id: str | None) -> str:
    """A short fingerprint of what the pages show; it changes when a run or the log does."""
    counts = await app.runtime.store.count_runs()
    recent = await app.runtime.store.list_runs(limit=50)
    audit = await Access(app.runtime.store).audit_log(limit=1)
    parts: list[Any] = [
        sorted(counts.items()),
        [(r.id, r.status, r.updated_at) for r in recent],
        audit[0].id if audit else 0,
    ]
    if run_id:
        run = await app.runtime.store.get_run(run_id)
        if run is not None:
            moving = run.status not in FINISHED and run.status != "waiting"
            size = len(await app.runtime.store.journal(run_id)) if moving else 0
            streamed = await app.runtime.store.stream_last(run_id)
            parts.append((run.status, run.updated_at, run.lease_owner, size, streamed))
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:16]


async def stream(request: Request) -> Response:
    """Server-sent events: `change` whenever the digest moves (the page then re-fetches its
    live parts); a comment every 15 s keeps proxies from closing an idle connection. It
    needs the session's tab key as `?tab=` (EventSource sends no headers). The
    session is checked again every `sse.RECHECK` seconds: the stream ends once it does."""
    app: App = request.app.state.perdure
    await app.runtime.open_store()
    try:
        who = await principal(request, touch=False)
    except TooManyFailures as exc:
        return Response(f"{exc}\n", 429, {"Retry-After": str(exc.retry_after)}, "text/plain")
    if who is None or not who.allows("read"):
        return Response("sign in first\n", status_code=401, media_type="text/plain")
    if not tab_ok(request):
        return Response("this stream needs the tab key of its session (?tab=)\n",
                        status_code=403, media_type="text/plain")  # fmt: skip
    run_id = request.query_params.get("run") or None
    slots = slots_of(request)
    if not slots.take(who.token_id):
        return Response(busy(slots, who.token_id) + "\n", status_code=503,
                        media_type="text/plain")  # fmt: skip

    async def allowed() -> bool:
        who = await principal(request, touch=False)
        return who is not None and who.allows("read")

    async def events() -> AsyncIterator[str]:
        yield "retry: 2000\n\n"
        started = last_sent = time.monotonic()
        last = ""
        check = Recheck(allowed)
        while time.monotonic() - started < STREAM_SECONDS:
            if not await check.still():
                yield "event: signed-out\ndata: {}\n\n"
                return
            current = await digest(app, run_id)
            if current != last:
                last, last_sent = current, time.monotonic()
                yield f"event: change\ndata: {current}\n\n"
            elif time.monotonic() - last_sent > 15:
                last_sent = time.monotonic()
                yield ": ping\n\n"
            await app.runtime.wait_change(STREAM_POLL)

    headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    return SlotStream(events(), slots, who.token_id, media_type="text/event-stream",
                      headers=headers)  # fmt: skip


async def home(request: Request) -> Response:
    return RedirectResponse("/ui/runs", status_code=303)


async def favicon(request: Request) -> Response:
    """The dashboard's icon where browsers ask for it first (an SVG: every current browser
    takes one at /favicon.ico), so no request of a page ends in a 404."""
    return FileResponse(HERE / "static" / "favicon.svg", media_type="image/svg+xml",
                        headers={"Cache-Control": "max-age=86400"})  # fmt: skip


def dashboard_routes() -> list[BaseRoute]:
    """The dashboard's routes: `/` and `/ui` lead to the runs list."""
    return [
        Route("/", home, methods=["GET"]),
        Route("/ui", home, methods=["GET"]),
        Route("/ui/", home, methods=["GET"]),
        Route("/ui/login", login_page, methods=["GET"]),
        Route("/ui/login", login, methods=["POST"]),
        Route("/ui/logout", logout, methods=["POST"]),
        Route("/ui/runs", runs_page, methods=["GET"]),
        Route("/ui/runs/act", run_action, methods=["POST"]),
        Route("/ui/runs/{run_id:path}", run_page, methods=["GET"]),
        Route("/ui/approvals", approvals_page, methods=["GET"]),
        Route("/ui/approvals/decide", decide, methods=["POST"]),
        Route("/ui/approvals/answer", answer, methods=["POST"]),
        Route("/ui/schedules", schedules_page, methods=["GET"]),
        Route("/ui/schedules/act", schedule_action, methods=["POST"]),
        Route("/ui/messages", messages_page, methods=["GET"]),
        Route("/ui/agents", agents_page, methods=["GET"]),
        Route("/ui/triggers", triggers_page, methods=["GET"]),
        Route("/ui/workers", workers_page, methods=["GET"]),
        Route("/ui/versions", versions_page, methods=["GET"]),
        Route("/ui/audit", audit_page, methods=["GET"]),
        Route("/ui/stream", stream, methods=["GET"]),
        Route("/favicon.ico", favicon, methods=["GET"]),
        Mount("/ui/static", StaticFiles(directory=HERE / "static"), name="ui-static"),
    ]
