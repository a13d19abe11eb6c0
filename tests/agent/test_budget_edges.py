"""Budget edge cases answered in one line or kept counted: a cost limit over a tier without
prices is refused at validate; a reply without usage keeps its reservation as the estimate,
marked, counted against the budget and listed apart by `perdure usage`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from wire_servers import CountingServer

import perdure
from extras_needed import require
from perdure.agent.budget_sql import Budgets
from perdure.agent.loop import Agent
from perdure.agent.spec import load_spec
from perdure.cli.main import cli
from perdure.errors import ConfigError
from perdure.testing import TestClock, TestWorker

SPEC = """
name = "quiet"
goal = "Answer the question"

[models.fast]
provider = "openai"
model = "counting-1"
base_url = "{base}/v1"
api_key_env = "PERDURE_TEST_COUNTING_KEY"
max_tokens = 100
{price}

[limits]
max_iterations = 1

[budget]
{budget}
"""


@pytest.fixture
def server() -> Iterator[CountingServer]:
    s = CountingServer().start()
    yield s
    s.stop()


def test_a_cost_limit_over_a_tier_without_prices_is_refused_at_validate(
    tmp_path: Path, server: CountingServer
) -> None:
    """Its calls would cost 0 against the limit: refused, naming the tier and the fix."""
    path = tmp_path / "a.toml"
    path.write_text(SPEC.format(base=server.origin, price="", budget="cost_per_day = 1.0"))
    with pytest.raises(ConfigError, match=r"models\.fast\.price: a cost limit is set"):
        load_spec(path)
    out = CliRunner().invoke(cli, ["validate", str(path)])
    assert out.exit_code != 0 and len(out.output.strip().splitlines()) == 1


def test_a_reply_without_usage_keeps_its_reservation_counted_and_marked(
    tmp_path: Path, server: CountingServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server bills but says nothing of usage: the call's reservation stays as its
    estimate (state 'estimated'), counts against the budget, and is listed apart."""
    require("models", "openai")
    monkeypatch.setenv("PERDURE_TEST_COUNTING_KEY", "k")
    server.no_usage = True
    path = tmp_path / "a.toml"
    price = "price = { input_per_mtok = 1.0, output_per_mtok = 1.0 }"
    path.write_text(SPEC.format(base=server.origin, price=price, budget="tokens_per_day = 10000"))
    db = f"sqlite:///{tmp_path}/q.db"
    app = perdure.App(db, clock=TestClock())
    try:
        agent = Agent(app.runtime, load_spec(path))
        handle = app.start(agent.workflow, {"prompt": "hello"}, run_id="q1")
        TestWorker(app).run_until_idle()
        assert handle.result(timeout=5)["status"] == "done"
        [held] = app.runtime.sync(Budgets(app.runtime.store).reservations("quiet", 0.0), "held")
        assert held.state == "estimated" and held.tokens >= server.served[0].total
        spent, _ = app.runtime.sync(Budgets(app.runtime.store).spent("quiet", 0.0), "spent")
        assert spent == held.tokens  # counted, at the estimate
        assert app.runtime.sync(Budgets(app.runtime.store).usage("quiet", 0.0), "usage") == []
    finally:
        app.close()
    shown = CliRunner().invoke(cli, ["--db", db, "usage", "--since", "30000d"])
    assert shown.exit_code == 0 and "answered without usage" in shown.output


def test_a_digit_or_a_cjk_character_is_a_token_of_its_own() -> None:
    """The one token estimate errs high where tokenizers split finely: Qwen's and Llama 2's
    split numbers into digits, and a CJK character is about a token; the rest is text."""
    from perdure.agent.budgets import CHARS_PER_TOKEN, estimate_tokens

    assert estimate_tokens("1,704.00") == 6 + 2 / CHARS_PER_TOKEN
    assert estimate_tokens("会议于11月") == 6
    assert estimate_tokens("a" * 33) == 33 / CHARS_PER_TOKEN
