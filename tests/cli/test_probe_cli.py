"""`perdure resolve RUN STEP --probe`: an operator has a once step's probe ask the world
again (after the provider's outage), audited as the other resolve actions are."""

from __future__ import annotations

import json
import sys

import pytest
from click.testing import CliRunner, Result

from perdure.cli.main import cli
from perdure.server.access_sql import Access
from perdure.testing import SimulatedCrash, TestWorker


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def parked_refund(run_id: str) -> None:
    """A refund cut off after its effect while the provider is down: the probe cannot tell,
    and the run waits for a person."""
    module = sys.modules["cli_app"]
    app = module.app
    module.PROVIDER_UP[0] = False
    assert run("start", "return_order", '["o1"]', "--id", run_id).exit_code == 0
    dying = TestWorker(app)
    dying.crash_after_intent("refund")
    with pytest.raises(SimulatedCrash):
        dying.run_until_idle()
    module.LEDGER["o1"] = "refund-o1 (made before the crash)"  # the effect did happen
    app.clock.advance(31)  # past the dead worker's lease
    TestWorker(app).run_until_idle()
    assert app.get_run(run_id).status == "needs_attention"


def test_resolve_probe_asks_again_and_the_run_goes_on(env: dict[str, str]) -> None:
    """`stuck` offers --probe for a step that has one; `resolve --probe` once the provider
    is back makes the next worker ask, the probe finds the refund, the run completes with
    the ledger's value (not refunded twice), and the audit log says how it was settled."""
    parked_refund("p1")
    module = sys.modules["cli_app"]
    listed = CliRunner().invoke(cli, ["stuck"])
    assert listed.exit_code == 1
    assert "perdure resolve p1 0 --value JSON | --retry | --fail | --probe" in listed.output
    module.PROVIDER_UP[0] = True
    asked = run("resolve", "p1", "refund", "--probe")
    assert asked.exit_code == 0 and asked.output.strip() == "pending"
    TestWorker(module.app).run_until_idle()
    app = module.app
    assert app.get_run("p1").status == "completed"
    assert json.loads(app.get_run("p1").result or "null") == "refund-o1 (made before the crash)"
    answers = [json.loads(e.data or "{}")["answer"] for e in app.journal("p1")
               if e.kind == "step.probed"]  # fmt: skip
    assert answers == ["cannot_tell", "done"]
    [entry] = app.runtime.sync(Access(app.runtime.store).audit_log(target="run:p1", limit=1), "a")
    assert entry.action == "run.resolve" and json.loads(entry.detail)["how"] == "probe"


def test_resolve_probe_is_one_of_the_ways(env: dict[str, str]) -> None:
    """--probe with another way, or for a step without a probe, is one line and exit 2."""
    both = CliRunner().invoke(cli, ["resolve", "x", "0", "--probe", "--retry"])
    assert both.exit_code == 2
    assert both.output.strip() == (
        "error: resolve: give exactly one of --value JSON, --retry, --fail or --probe"
    )
    run("start", "checkout", '["o2"]', "--id", "c2")
    app = sys.modules["cli_app"].app
    TestWorker(app).run_until_idle()
    run("send", "c2", "approved", "1")
    dying = TestWorker(app)
    dying.crash_after_intent("send_mail")
    with pytest.raises(SimulatedCrash):
        dying.run_until_idle()
    app.clock.advance(31)
    TestWorker(app).run_until_idle()
    refused = CliRunner().invoke(cli, ["resolve", "c2", "send_mail", "--probe"])
    assert refused.exit_code == 2 and "has no probe" in refused.output
    assert len(refused.output.strip().splitlines()) == 1
    assert app.get_run("c2").status == "needs_attention"
