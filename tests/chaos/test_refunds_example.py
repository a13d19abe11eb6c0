"""examples/refund_agent runs as its README says: the refund agent, written with pydantic-ai
and with the Agents SDK, refunds and e-mails each order once with the scripted models."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from extras_needed import require

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "refund_agent"
# The extras each framework of the example needs (pydantic-ai talks to the scripted model
# server through the openai SDK; the Agents SDK brings it).
FRAMEWORK_EXTRAS = {"pydantic-ai": ("pydantic-ai", "models"),
                    "pydantic-ai-capability": ("pydantic-ai", "models"),
                    "agents-sdk": ("openai-agents",), "claude": ("claude-agent",)}  # fmt: skip


def demo() -> ModuleType:
    """examples/refund_agent/demo.py as a module (it puts its folder on sys.path)."""
    name = "refund_agent_demo"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, EXAMPLE / "demo.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.mark.parametrize(
    ("framework", "model", "refund", "prefix"),
    [
        ("pydantic-ai", "function", "keyed", "pydantic_ai:refunds"),
        ("pydantic-ai", "scripted", "once", "pydantic_ai:refunds_once"),
        ("agents-sdk", "scripted", "keyed", "agents.refunds"),
    ],
)
def test_the_demo_refunds_and_emails_each_order_once(
    framework: str, model: str, refund: str, prefix: str, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """Two conversations: each answers, journals model and tool steps with their effects,
    and the stubs saw one refund and one e-mail per order."""
    for extra in FRAMEWORK_EXTRAS[framework]:
        require(extra)
    argv = ["--framework", framework, "--model", model, "--refund", refund, "--orders", "2",
            "--db", f"sqlite:///{tmp_path}/refunds.db", "--timeout", "120"]  # fmt: skip
    assert demo().main(argv) == 0
    out = capsys.readouterr().out
    assert "refund-o0001: Refunded order o0001 and told the customer." in out, out
    assert "refund-o0002: Refunded order o0002 and told the customer." in out, out
    steps = [f"{prefix}.model (keyed)", f"{prefix}.tool.lookup_order (read)",
             f"{prefix}.model (keyed)", f"{prefix}.tool.issue_refund ({refund})",
             f"{prefix}.model (keyed)", f"{prefix}.tool.send_email (once)",
             f"{prefix}.model (keyed)"]  # fmt: skip
    assert "\n".join(f"    {s}" for s in steps) in out, out
    assert "o0001: refunded 1x, e-mailed 1x" in out and "o0002: refunded 1x, e-mailed 1x" in out
    if model == "scripted":
        assert "model calls: 8 (the script needs 4 per conversation)" in out, out


def test_the_capability_agent_journals_pydantic_ais_operations(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--framework pydantic-ai-capability`: the same agent given `PerdureDurability`; its
    steps are pydantic-ai's operation names, each tool with its effect, once per order."""
    for extra in FRAMEWORK_EXTRAS["pydantic-ai-capability"]:
        require(extra)
    argv = ["--framework", "pydantic-ai-capability", "--model", "function", "--refund",
            "once", "--orders", "2", "--db", f"sqlite:///{tmp_path}/refunds.db",
            "--timeout", "120"]  # fmt: skip
    assert demo().main(argv) == 0
    out = capsys.readouterr().out
    assert "refund-o0002: Refunded order o0002 and told the customer." in out, out
    model, tool = "refunds_once__model.request (keyed)", "refunds_once__function_toolset__<agent>"
    steps = [model, f"{tool}.call_tool:lookup_order (read)", model,
             f"{tool}.call_tool:issue_refund (once)", model,
             f"{tool}.call_tool:send_email (once)", model]  # fmt: skip
    assert out.count("\n".join(f"    {s}" for s in steps)) == 2, out
    assert "o0001: refunded 1x, e-mailed 1x" in out and "o0002: refunded 1x, e-mailed 1x" in out


def test_the_function_model_is_pydantic_ais_own() -> None:
    """Asking the Agents SDK for pydantic-ai's FunctionModel is one line and exit code 2."""
    assert demo().main(["--framework", "agents-sdk", "--model", "function"]) == 2


LOCAL = [("pydantic-ai", "pydantic_ai:refunds"), ("agents-sdk", "agents.refunds")]


@pytest.mark.slow
@pytest.mark.parametrize(("framework", "prefix"), LOCAL)
def test_the_demo_runs_on_the_local_model(
    framework: str, prefix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With the llama.cpp model perdure ships (no key), the same agent runs durably: a
    conversation is answered and its first model request is a journaled keyed step. (What
    a 135M model answers varies: neither its words nor its tool calls are asserted.)"""
    for extra in (*FRAMEWORK_EXTRAS[framework], "local"):
        require(extra)
    argv = ["--framework", framework, "--model", "local", "--orders", "1",
            "--db", f"sqlite:///{tmp_path}/refunds.db", "--timeout", "240"]  # fmt: skip
    assert demo().main(argv) == 0
    out = capsys.readouterr().out
    assert "model: the small llama.cpp model perdure ships" in out, out
    first = out.split("\nrefund-o0001: ", 1)[1].split("\n")[1]
    assert first == f"    {prefix}.model (keyed)", out
