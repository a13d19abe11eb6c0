"""Model provider outages park, never burn: against a real local HTTP server that answers
429 with Retry-After, 500, hangs or refuses the key, an agent run retries what may pass
(billed once), times out a hung call per its tier's `timeout`, and parks on a refused key
(paused, holding no slot, a one-line reason naming the variable) until `perdure resume`
calls the model again; a blocked agent's schedules start no runs meanwhile."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from wire_servers import AnthropicServer, OpenAIServer, WireServer

import perdure
from extras_needed import require
from fresh_stores import fresh_store_url
from perdure.agent.budget_sql import Budgets
from perdure.agent.loop import Agent
from perdure.agent.messages import Message, ModelRequest, ModelResponse
from perdure.agent.models import provider_for
from perdure.agent.providers.anthropic import AnthropicModel
from perdure.agent.providers.base import ModelAuthError, ModelRetryable
from perdure.agent.providers.openai import OpenAIModel
from perdure.agent.providers.scripted import ScriptedModel
from perdure.agent.serve import attach_trigger
from perdure.agent.spec import load_spec
from perdure.engine.inspection import explain
from perdure.errors import ConfigError
from perdure.store.base import COMPLETED, PAUSED, SLEEPING
from perdure.testing import TestClock, TestWorker
from perdure.triggers import schedules

KEY_ENV = "OUTAGE_TEST_KEY"
SPEC = """
name = "nightly"
goal = "Say hello"

[models.default]
provider = "{provider}"
model = "gpt-x"
base_url = "{base_url}"
api_key_env = "{key_env}"
{timeouts}

[routing]
default = "default"

[memory]
enabled = false
{extra}
"""


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def any_app(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[perdure.App]:
    """An App on a fresh SQLite file or PostgreSQL schema, driven by a TestClock."""
    with fresh_store_url(request.param, tmp_path) as url:
        app = perdure.App(url, clock=TestClock())
        yield app
        app.close()


def write_spec(
    tmp_path: Path,
    server: WireServer,
    *,
    timeouts: str = "timeout = 0.5\nconnect_timeout = 2",
    extra: str = "",
) -> Path:
    provider = "anthropic" if isinstance(server, AnthropicServer) else "openai"
    base = server.origin if provider == "anthropic" else f"{server.origin}/v1"
    path = tmp_path / "spec.toml"
    path.write_text(
        SPEC.format(provider=provider, base_url=base, key_env=KEY_ENV, timeouts=timeouts,
                    extra=extra)
    )  # fmt: skip
    return path


def make_agent(app: perdure.App, tmp_path: Path, server: WireServer, **options: Any) -> Agent:
    return Agent(app.runtime, load_spec(write_spec(tmp_path, server, **options)))


def journal(app: perdure.App, run_id: str, kind: str, name: str) -> list[Any]:
    return [e for e in app.journal(run_id) if e.kind == kind and e.name == name]


def usage_rows(app: perdure.App, run_id: str) -> list[Any]:
    return [
        u
        for u in app.runtime.sync(Budgets(app.runtime.store).usage("nightly", 0.0), "usage")
        if u.run_id == run_id
    ]


def drive(worker: TestWorker, clock: TestClock, app: perdure.App, run_id: str) -> str:
    """Run until the run is no longer sleeping out a retry backoff; its status then."""
    for _ in range(20):
        worker.run_until_idle()
        run = app.get_run(run_id)
        if run.status != SLEEPING:
            return run.status
        clock.advance(max(0.0, (run.wake_at or clock.now()) - clock.now()) + 0.01)
    return app.get_run(run_id).status


# -- the spec's timeouts ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("timeout = 0", "timeout: Input should be greater than 0"),
        ("timeout = -3", "timeout: Input should be greater than 0"),
        ("timeout = inf", "timeout: Input should be a finite number"),
        ('timeout = "30s"', "timeout: Input should be a valid number"),
        ("connect_timeout = 0", "connect_timeout: Input should be greater than 0"),
    ],
)
def test_a_bad_timeout_is_refused_in_one_line_naming_the_line(
    tmp_path: Path, openai_server: OpenAIServer, line: str, says: str
) -> None:
    """A timeout that is not a positive finite number of seconds is a one-line ConfigError
    with the file, the line and the field."""
    path = write_spec(tmp_path, openai_server, timeouts=line)
    with pytest.raises(ConfigError) as caught:
        load_spec(path)
    message = str(caught.value)
    assert "\n" not in message
    assert f"{path}:10: models.default.{says}" in message


def test_a_scripted_tier_refuses_a_timeout(tmp_path: Path) -> None:
    """A timeout on a tier that makes no network call is refused rather than ignored."""
    path = tmp_path / "spec.toml"
    path.write_text(
        'name = "s"\ngoal = "g"\n[models.fast]\nprovider = "scripted"\n'
        'script = "builtin:extractive"\ntimeout = 5\n'
    )
    with pytest.raises(ConfigError, match=r"spec.toml:6: models.fast.timeout: a scripted tier"):
        load_spec(path)


def sdk_timeout(model: Any) -> tuple[float, float]:
    """(read, connect) seconds of the SDK client the provider really uses."""

    async def go() -> tuple[float, float]:
        try:
            timeout = model._client().timeout
            return float(timeout.read), float(timeout.connect)
        finally:
            await model.aclose()

    return asyncio.run(go())


def test_tier_timeouts_reach_the_sdk_client_with_defaults_per_provider(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    openai_server: OpenAIServer,
    anthropic_server: AnthropicServer,
) -> None:
    """The spec's timeout and connect_timeout are the SDK client's read and connect
    timeouts; unset, 60 s (OpenAI-compatible) or 120 s (Anthropic), and 5 s to connect."""
    monkeypatch.setenv(KEY_ENV, "k")
    spec = load_spec(write_spec(tmp_path, openai_server, timeouts="timeout = 7.5\nconnect_timeout = 1.5"))  # fmt: skip  # noqa: E501
    assert sdk_timeout(provider_for(spec, "default")) == (7.5, 1.5)
    spec = load_spec(write_spec(tmp_path, openai_server, timeouts=""))
    assert sdk_timeout(provider_for(spec, "default")) == (60.0, 5.0)
    spec = load_spec(write_spec(tmp_path, anthropic_server, timeouts=""))
    assert isinstance(provider_for(spec, "default"), AnthropicModel)
    assert sdk_timeout(provider_for(spec, "default")) == (120.0, 5.0)


# -- a hung server ------------------------------------------------------------------------


def test_a_hung_server_times_out_per_the_timeout_and_is_retryable(
    openai_server: OpenAIServer, anthropic_server: AnthropicServer
) -> None:
    """A server that accepts and never answers ends the call after `timeout` as a retryable
    error that says so (both SDKs), instead of holding the call for the SDK's minutes."""
    models: list[OpenAIModel | AnthropicModel] = [
        OpenAIModel("m", base_url=f"{openai_server.origin}/v1", api_key="k", timeout=0.3, env={}),
        AnthropicModel("m", base_url=anthropic_server.origin, api_key="k", timeout=0.3, env={}),
    ]
    for server, model in zip((openai_server, anthropic_server), models, strict=True):
        server.hang_next()
        request = ModelRequest(model="m", messages=[Message("user", "hi")])

        async def go(
            model: OpenAIModel | AnthropicModel = model, request: ModelRequest = request
        ) -> None:
            try:
                await model.complete(request)
            finally:
                await model.aclose()

        with pytest.raises(ModelRetryable, match=r"no answer within 0.3s \(timeout\)"):
            asyncio.run(go())
        assert server.hung == 1


def test_a_server_that_never_accepts_fails_after_connect_timeout() -> None:
    """A port whose accept queue is full (SYNs dropped) fails the call after
    `connect_timeout`, named as such, not after the (much longer) read timeout."""
    require("models", "openai")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(4):  # fill the accept queue: later connections are left unanswered
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(("127.0.0.1", port))
        fillers.append(filler)
    model = OpenAIModel(
        "m", base_url=f"http://127.0.0.1:{port}/v1", api_key="k", timeout=300,
        connect_timeout=0.3, env={},
    )  # fmt: skip
    request = ModelRequest(model="m", messages=[Message("user", "hi")])

    async def go() -> None:
        try:
            await model.complete(request)
        finally:
            await model.aclose()

    try:
        with pytest.raises(ModelRetryable, match=r"no connection within 0.3s \(connect_timeout\)"):
            asyncio.run(go())
    finally:
        for s in (*fillers, listener):
            s.close()


def test_a_hung_model_call_is_retried_and_billed_once(
    app: perdure.App,
    worker: TestWorker,
    clock: TestClock,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    openai_server: OpenAIServer,
) -> None:
    """An agent's model call that hangs times out per the tier, is retried by the step's
    policy, and the answer that then comes is journaled and billed once."""
    monkeypatch.setenv(KEY_ENV, "k")
    agent = make_agent(app, tmp_path, openai_server)
    openai_server.hang_next()
    run_id = app.start(agent.workflow, {"prompt": "hello"}).id
    assert drive(worker, clock, app, run_id) == COMPLETED
    failed = journal(app, run_id, "step.attempt_failed", "agent:nightly.model")
    assert len(failed) == 1 and "no answer within 0.5s" in (failed[0].data or "")
    assert openai_server.hung == 1 and len(openai_server.requests) == 2
    rows = usage_rows(app, run_id)
    assert len(rows) == 1 and rows[0].input_tokens == 21


def test_429_and_500_are_retried_honouring_retry_after_and_billed_once(
    app: perdure.App,
    worker: TestWorker,
    clock: TestClock,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    openai_server: OpenAIServer,
) -> None:
    """429 (Retry-After: 7) then 500 then an answer: two journaled failed attempts, the
    first waiting at least the 7 s asked, one usage row."""
    monkeypatch.setenv(KEY_ENV, "k")
    agent = make_agent(app, tmp_path, openai_server)
    openai_server.fail_next(429, retry_after="7")
    openai_server.fail_next(500)
    run_id = app.start(agent.workflow, {"prompt": "hello"}).id
    assert drive(worker, clock, app, run_id) == COMPLETED
    failed = journal(app, run_id, "step.attempt_failed", "agent:nightly.model")
    assert [f.attempt for f in failed] == [1, 2]
    assert json.loads(failed[0].data)["retry_at"] - failed[0].at >= 7.0
    assert len(openai_server.requests) == 3 and len(usage_rows(app, run_id)) == 1


# -- a refused key parks the run ------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "status", "says"),
    [
        ("openai", 401, "authentication failed (401 from "),
        ("openai", 403, "permission denied ("),
        ("anthropic", 401, "authentication failed (401 from "),
        ("anthropic", 403, "permission denied ("),
    ],
)
def test_a_refused_key_parks_the_run_and_resume_continues_from_the_model_call(
    any_app: perdure.App,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    openai_server: OpenAIServer,
    anthropic_server: AnthropicServer,
    kind: str,
    status: int,
    says: str,
) -> None:
    """401/403 pauses the run (no lease, no retry, nothing billed) with a one-line reason
    naming the tier, the variable and `perdure resume RUN`; after the key is fixed, resume
    calls the model again at the same position, earlier steps are not re-run, and the run
    completes, billed once."""
    app, worker = any_app, TestWorker(any_app)
    server: WireServer = openai_server if kind == "openai" else anthropic_server
    monkeypatch.setenv(KEY_ENV, "expired")
    server.key = "rotated"  # the server takes only the new key
    if status == 403:
        server.key = None
        server.fail_next(403)
    agent = make_agent(app, tmp_path, server)
    run_id = app.start(agent.workflow, {"prompt": "hello"}).id
    worker.run_until_idle()
    run = app.get_run(run_id)
    assert run.status == PAUSED and run.lease_owner is None
    reason = json.loads(run.error or "{}")["message"]
    assert reason.startswith(f"model tier 'default' ({kind}:gpt-x): {says}")
    assert KEY_ENV in reason and f"`perdure resume {run_id}`" in reason and "\n" not in reason
    assert len(server.requests) == 1 and not usage_rows(app, run_id)
    stuck = app.runtime.sync(
        app.client.stuck(), "stuck"
    )  # `perdure stuck` lists it, with the reason
    assert [(r.id, why) for r, why in stuck] == [(run_id, f"parked: {reason}")]
    [report] = [
        r for r in explain(app.runtime, run, app.journal(run_id)) if r.name.endswith(".model")
    ]
    assert report.state == "parked (attempt 1 failed)" and report.detail == reason
    assert report.recovery == f"attempt 2 runs once resumed: perdure resume {run_id}"
    assert worker.run_until_idle() == 0  # parked: nothing claims it, nothing calls the model
    assert len(server.requests) == 1

    monkeypatch.setenv(KEY_ENV, "rotated")
    server.key = "rotated"
    assert app.resume(run_id) == "pending"
    worker.run_until_idle()
    run = app.get_run(run_id)
    assert run.status == COMPLETED and run.error is None
    assert server.sent_key(server.requests[-1]) == "rotated" and len(server.requests) == 2
    model = journal(app, run_id, "step.outcome", "agent:nightly.model")
    parked = journal(app, run_id, "step.attempt_failed", "agent:nightly.model")
    assert len(model) == 1 and len(parked) == 1
    assert model[0].position == parked[0].position and model[0].attempt == parked[0].attempt + 1
    assert len(journal(app, run_id, "step.outcome", "agent:nightly.context")) == 1
    assert len(usage_rows(app, run_id)) == 1


def test_after_a_resume_the_step_has_its_whole_retry_policy_again(
    app: perdure.App,
    worker: TestWorker,
    clock: TestClock,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    openai_server: OpenAIServer,
) -> None:
    """A parked attempt does not count against the model step's six attempts: resumed,
    five 500s in a row are still retried and the sixth call's answer completes the run."""
    monkeypatch.setenv(KEY_ENV, "expired")
    openai_server.key = "rotated"
    agent = make_agent(app, tmp_path, openai_server)
    run_id = app.start(agent.workflow, {"prompt": "hello"}).id
    worker.run_until_idle()
    assert app.get_run(run_id).status == PAUSED
    monkeypatch.setenv(KEY_ENV, "rotated")
    for _ in range(5):
        openai_server.fail_next(500)
    app.resume(run_id)
    assert drive(worker, clock, app, run_id) == COMPLETED
    assert len(openai_server.requests) == 7
    model = journal(app, run_id, "step.outcome", "agent:nightly.model")
    assert [m.attempt for m in model] == [7]


def test_a_provider_given_in_python_is_kept_across_a_park(
    app: perdure.App,
    worker: TestWorker,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    openai_server: OpenAIServer,
) -> None:
    """A provider passed to Agent(providers=...) that refuses its key parks the run, and
    after the resume answers again itself: it is not replaced by one made from the spec."""
    monkeypatch.setenv(KEY_ENV, "k")
    calls: list[int] = []

    def answer(request: ModelRequest) -> ModelResponse:
        calls.append(1)
        if len(calls) == 1:
            raise ModelAuthError("key refused", status=401, setting=KEY_ENV)
        return ModelResponse(message=Message("assistant", "hello from python"))

    spec = load_spec(write_spec(tmp_path, openai_server))
    agent = Agent(app.runtime, spec, providers={"default": ScriptedModel(responder=answer)})
    run_id = app.start(agent.workflow, {"prompt": "hello"}).id
    worker.run_until_idle()
    assert app.get_run(run_id).status == PAUSED
    app.resume(run_id)
    worker.run_until_idle()
    assert app.get_run(run_id).status == COMPLETED and len(calls) == 2
    assert not openai_server.requests


def test_an_unset_key_variable_parks_the_run_naming_it(
    app: perdure.App,
    worker: TestWorker,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    openai_server: OpenAIServer,
) -> None:
    """A worker without the spec's key variable parks the run saying which variable, rather
    than failing it; set, a resume completes it."""
    monkeypatch.delenv(KEY_ENV, raising=False)
    agent = make_agent(app, tmp_path, openai_server)
    run_id = app.start(agent.workflow, {"prompt": "hello"}).id
    worker.run_until_idle()
    run = app.get_run(run_id)
    assert run.status == PAUSED
    assert f"no key in {KEY_ENV}" in json.loads(run.error or "{}")["message"]
    assert not openai_server.requests
    monkeypatch.setenv(KEY_ENV, "k")
    app.resume(run_id)
    worker.run_until_idle()
    assert app.get_run(run_id).status == COMPLETED


@pytest.mark.slow
def test_on_the_command_line_a_parked_run_says_why_and_resume_continues_it(
    tmp_path: Path, openai_server: OpenAIServer
) -> None:
    """`perdure run SPEC --wait` with an expired key stops waiting and prints, in one line,
    the reason with `perdure resume RUN` (exit 2; the run stays parked); with the key
    rotated, that command and the same `run --id RUN --wait` complete the run."""
    openai_server.key = "rotated"
    spec = write_spec(tmp_path, openai_server)
    env = {k: v for k, v in os.environ.items() if k not in ("PERDURE_APP", "PERDURE_DB")}
    db = f"sqlite:///{tmp_path}/cli.db"

    def perdure_cli(*args: str, key: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "perdure", "--db", db, *args],
            capture_output=True, text=True, env={**env, KEY_ENV: key}, timeout=120,
            check=False,
        )  # fmt: skip

    parked = perdure_cli("run", str(spec), "--id", "nightly-1", "--wait", key="expired")
    assert parked.returncode == 2, parked.stderr
    [line] = parked.stderr.strip().splitlines()
    assert line.startswith("error: run nightly-1 is parked: model tier 'default' (openai:gpt-x)")
    assert line.endswith(f"set {KEY_ENV} (the spec's api_key_env) where the workers run, "
                         "then `perdure resume nightly-1`")  # fmt: skip
    resumed = perdure_cli("resume", "nightly-1", key="rotated")
    assert resumed.returncode == 0, resumed.stderr
    done = perdure_cli("run", str(spec), "--id", "nightly-1", "--wait", key="rotated")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.split("\n", 1)[1])["status"] == "done"
    assert [openai_server.sent_key(r) for r in openai_server.requests] == ["expired", "rotated"]


# -- schedules of a blocked agent ---------------------------------------------------------


def test_a_blocked_agent_s_schedules_start_no_runs_until_it_is_resumed(
    app: perdure.App,
    worker: TestWorker,
    clock: TestClock,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    openai_server: OpenAIServer,
) -> None:
    """While a run of the agent is parked for its key, every tick of its schedules (its own
    trigger, and one with overlap="allow") is skipped saying the agent is blocked, and
    `perdure stuck` lists them with `perdure resume RUN`; resumed, the schedules fire again."""
    monkeypatch.setenv(KEY_ENV, "expired")
    openai_server.key = "rotated"
    agent = make_agent(app, tmp_path, openai_server, extra="[trigger]\nevery = 60")
    attach_trigger(app, agent)
    app.schedule(every=60, name="extra", overlap="allow", workflow=agent.workflow,
                 args=[{"prompt": "more"}])  # fmt: skip
    worker.run_until_idle()  # stores the schedules
    clock.advance(60)
    worker.run_until_idle()  # one tick each: two runs, both parked for the key
    parked = app.list_runs(statuses=[PAUSED])
    assert len(parked) == 2
    for _ in range(3):  # three more ticks: nothing starts
        clock.advance(60)
        worker.run_until_idle()
    assert len(app.list_runs()) == 2 and len(openai_server.requests) == 2
    for name in ("nightly", "extra"):
        skipped = [t for t in app.schedule_ticks(name) if t.status == "skipped"]
        assert len(skipped) == 3
        assert all((t.reason or "").startswith("blocked: run ") for t in skipped)
        assert all("authentication failed (401 from " in (t.reason or "") for t in skipped)
    stuck = app.runtime.sync(schedules.blocked(app.runtime), "blocked")
    assert {b.schedule for b in stuck} == {"nightly", "extra"}
    assert all(b.fix.startswith("perdure resume ") and b.held == 3 for b in stuck)

    monkeypatch.setenv(KEY_ENV, "rotated")
    for run in parked:
        app.resume(run.id)
    worker.run_until_idle()
    assert {r.status for r in app.list_runs()} == {COMPLETED}
    assert not app.runtime.sync(schedules.blocked(app.runtime), "blocked")
    clock.advance(60)
    worker.run_until_idle()
    runs = app.list_runs()
    assert len(runs) == 4 and {r.status for r in runs} == {COMPLETED}
