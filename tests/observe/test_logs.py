"""Structured logs: every line of a run carries its run, step, attempt, worker and trace id;
secrets never reach a line; console on a terminal, JSON lines otherwise."""

from __future__ import annotations

import io
import json
import logging
import sys
from typing import Any

import pytest

from extras_needed import needs

pytest.importorskip("structlog", reason=needs("observe"))

import structlog

import perdure
from perdure.errors import ConfigError
from perdure.observe import configure_logging, trace_id_hex
from perdure.testing import TestWorker

user_log = logging.getLogger("shop.user")


def decoded(stream: io.StringIO) -> list[dict[str, Any]]:
    """The JSON lines written to `stream`."""
    return [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]


def test_json_lines_carry_run_step_attempt_worker_and_trace_id(
    app: perdure.App, worker: TestWorker, log_lines: io.StringIO
) -> None:
    """A stdlib and a structlog line from inside a retried step name the run, step, attempt,
    worker and trace id; the engine's own run and retry lines do too."""
    attempts: list[int] = []

    @app.step(name="charge", effect="keyed", retry=perdure.Retry(initial=0, jitter=0))
    def charge(order: str) -> str:
        attempts.append(perdure.current_step().attempt)
        user_log.info("charging %s", order)
        structlog.get_logger("shop.struct").info("charge attempt", order=order)
        if len(attempts) == 1:
            raise RuntimeError("card declined")
        return "ok"

    @app.workflow(name="checkout")
    def checkout(order: str) -> str:
        user_log.info("checkout begins")
        return charge(order)

    handle = app.start(checkout, "o-1", run_id="checkout-o-1")
    worker.run_until_idle()
    assert handle.result(timeout=5) == "ok"
    assert worker.worker is not None
    records = decoded(log_lines)
    mine = [r for r in records if r.get("run_id") == "checkout-o-1"]
    charging = [r for r in mine if r["event"] == "charging o-1"]
    structured = [r for r in mine if r["event"] == "charge attempt"]
    assert [r["attempt"] for r in charging] == [1, 2]
    assert [r["attempt"] for r in structured] == [1, 2] and structured[0]["order"] == "o-1"
    for line in charging + structured:
        assert line["step"] == "charge" and line["position"] == 0
        assert line["worker"] == worker.worker.id
        assert line["trace_id"] == trace_id_hex("checkout-o-1")
        assert line["workflow"] == "checkout" and line["level"] == "info"
    [begins] = [r for r in mine if r["event"] == "checkout begins"]
    assert "step" not in begins and begins["worker"] == worker.worker.id  # outside a step
    events = [r["event"] for r in mine if r["logger"] == "perdure.run"]
    assert events[0] == "run started" and events[-1] == "run completed"
    [retry] = [r for r in mine if r["event"] == "step retry scheduled"]
    assert (
        retry["error"] == "RuntimeError" and retry["attempt"] == 1 and retry["level"] == "warning"
    )
    assert retry["trace_id"] == trace_id_hex("checkout-o-1")
    outside = [r for r in records if r.get("event") == "outside any run"]
    assert outside == []
    user_log.info("outside any run")
    [line] = [r for r in decoded(log_lines) if r["event"] == "outside any run"]
    assert "run_id" not in line and "trace_id" not in line


def test_secrets_never_reach_a_log_line(
    app: perdure.App, worker: TestWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tokens, keys, bearer credentials, secret env values and configured patterns are masked
    in messages, fields and tracebacks."""
    secret_env = "s3cr3t-value-from-env-0042"
    monkeypatch.setenv("PAYMENTS_API_KEY", secret_env)
    monkeypatch.setenv("SHORT_TOKEN", "1")  # too short to mask: "1" stays readable
    stream = io.StringIO()
    configure_logging(json=True, stream=stream, redact=[r"acct-\d{6}"])
    pdr = "pdr_Zx8eLq0WmT3vB9kNp2RfYc"
    openai_key = "sk-proj-AbCdEf0123456789xyz"

    @app.step(name="pay", effect="read")
    def pay() -> None:
        user_log.info("calling with Authorization: Bearer %s", "opaque.jwt-value")
        user_log.info("token %s key %s env %s account acct-123456 count 1", pdr, openai_key,
                      secret_env)  # fmt: skip
        structlog.get_logger("shop").warning("fields", api=openai_key, nested={"t": [pdr]})
        try:
            raise PermissionError(f"refused key {secret_env}")
        except PermissionError:
            user_log.exception("payment failed")

    @app.workflow(name="payment")
    def payment() -> None:
        pay()

    app.start(payment)
    worker.run_until_idle()
    text = stream.getvalue()
    for secret in (pdr, openai_key, secret_env, "opaque.jwt-value", "acct-123456"):
        assert secret not in text
    records = decoded(stream)
    [bearer] = [r for r in records if r["event"].startswith("calling")]
    assert bearer["event"] == "calling with Authorization: Bearer ***"
    [mixed] = [r for r in records if r["event"].startswith("token")]
    assert mixed["event"] == "token pdr_*** key sk-*** env *** account *** count 1"
    [fields] = [r for r in records if r["event"] == "fields"]
    assert fields["api"] == "sk-***" and fields["nested"] == {"t": ["pdr_***"]}
    [failed] = [r for r in records if r["event"] == "payment failed"]
    assert "PermissionError: refused key ***" in failed["exception"]


def test_a_failed_run_says_why_in_its_line(
    app: perdure.App, worker: TestWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The warning line of a run that failed carries the error recorded (type and the first
    line of its message, secrets masked); a run that completed carries none."""
    monkeypatch.setenv("LEDGER_API_KEY", "s3cr3t-ledger-key-0042")
    log_lines = io.StringIO()
    configure_logging(json=True, stream=log_lines)

    @app.workflow(name="ledger")
    def ledger(fail: bool) -> str:
        if fail:
            raise LookupError("account missing for s3cr3t-ledger-key-0042\nsecond line")
        return "ok"

    app.start(ledger, True, run_id="ledger-bad")
    app.start(ledger, False, run_id="ledger-good")
    worker.run_until_idle()
    ended = ("run failed", "run completed")
    ends = {r["run_id"]: r for r in decoded(log_lines)
            if r.get("logger") == "perdure.run" and r["event"] in ended}  # fmt: skip
    assert ends["ledger-bad"]["event"] == "run failed"
    assert ends["ledger-bad"]["level"] == "warning"
    assert ends["ledger-bad"]["error"] == "LookupError: account missing for ***"
    assert ends["ledger-good"]["event"] == "run completed" and "error" not in ends["ledger-good"]


def test_console_on_a_terminal_json_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a choice, a terminal gets the console format and a pipe JSON lines;
    PERDURE_LOG_FORMAT overrides both."""

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("PERDURE_LOG_FORMAT", raising=False)
    tty, pipe = Terminal(), io.StringIO()
    configure_logging(stream=tty)
    user_log.info("hello %s", "there")
    configure_logging(stream=pipe)  # replaces the terminal handler
    user_log.info("hello %s", "pipe")
    assert "hello there" in tty.getvalue() and "hello pipe" not in tty.getvalue()
    with pytest.raises(json.JSONDecodeError):
        json.loads(tty.getvalue().splitlines()[0])
    assert json.loads(pipe.getvalue().splitlines()[0])["event"] == "hello pipe"
    monkeypatch.setenv("PERDURE_LOG_FORMAT", "json")
    forced = Terminal()
    configure_logging(stream=forced)
    user_log.info("forced")
    assert json.loads(forced.getvalue().splitlines()[0])["event"] == "forced"
    monkeypatch.setenv("PERDURE_LOG_FORMAT", "xml")
    with pytest.raises(ConfigError, match="PERDURE_LOG_FORMAT"):
        configure_logging(stream=forced)


def test_without_structlog_logs_stay_plain_and_json_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without the observe extra a worker still logs (plain text); asking for JSON is one clear
    error naming the extra."""
    monkeypatch.setitem(sys.modules, "structlog", None)  # import structlog now fails
    monkeypatch.delenv("PERDURE_LOG_FORMAT", raising=False)
    with pytest.raises(ConfigError, match=r"perdure\[observe\]"):
        configure_logging(json=True, stream=io.StringIO())
    plain = io.StringIO()
    configure_logging(stream=plain)
    user_log.warning("still %s", "here")
    assert plain.getvalue().rstrip().endswith("shop.user still here")
