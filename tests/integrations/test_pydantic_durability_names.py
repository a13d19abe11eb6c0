"""PerdureDurability's step names are persisted compatibility data (a recorded run replays by
them), pinned here in pydantic-ai's compatibility-pin pattern: every operation kind's name for
one agent, and the names a real run journals. A failure here after a refactor means in-flight
runs would stop at their first step: never update these pins as part of a rename unless
migrating in-flight runs is intended and reviewed."""

from __future__ import annotations

import pytest

from extras_needed import needs

pytest.importorskip("pydantic_ai", reason=needs("pydantic-ai"))

from pydantic_ai import Agent
from pydantic_ai.durable_exec import (
    CapabilityOperationId,
    EventStreamHandlerId,
    ModelCancelSuspendedResponseId,
    ModelCompactMessagesId,
    ModelCountTokensId,
    ModelRequestId,
    ToolsetCallToolId,
    ToolsetGetInstructionsId,
    ToolsetGetToolsId,
    ToolsetValidateToolArgumentsId,
)
from pydantic_ai.models.test import TestModel

import perdure
from perdure.integrations.pydantic_durability import PerdureDurability, PerdureOperationBackend
from perdure.testing import TestWorker

PINNED: list[tuple[object, str | None, str]] = [
    (ModelRequestId(None, model_name="test"), None, "support__model.request"),
    (ModelRequestId(None, streaming=True, model_name="test"), None,
     "support__model.request_stream"),
    (ModelRequestId("fast", model_name="test"), None, "support__model.request.fast"),
    (ModelCancelSuspendedResponseId(None, model_name="test"), None,
     "support__model.cancel_suspended_response"),
    (ModelCompactMessagesId(None, model_name="test"), None, "support__model.compact_messages"),
    (ModelCountTokensId(None, model_name="test"), None, "support__model.count_tokens"),
    (EventStreamHandlerId(), None, "support__event_stream_handler"),
    (CapabilityOperationId("reminder", operation="remind"), None,
     "support__capability__reminder.remind"),
    (ToolsetCallToolId("function", toolset_id="<agent>"), "lookup",
     "support__function_toolset__<agent>.call_tool:lookup"),
    (ToolsetValidateToolArgumentsId("function", toolset_id="<agent>"), None,
     "support__function_toolset__<agent>.validate_args"),
    (ToolsetGetToolsId("mcp", toolset_id="shop"), None, "support__mcp_server__shop.get_tools"),
    (ToolsetGetInstructionsId("shop"), None, "support__mcp_server__shop.get_instructions"),
    (ToolsetCallToolId("mcp", toolset_id="shop"), "refund",
     "support__mcp_server__shop.call_tool:refund"),
    (ToolsetGetToolsId("dynamic", toolset_id="extra"), None,
     "support__dynamic_toolset__extra.get_tools"),
    (ToolsetCallToolId("dynamic", toolset_id="extra"), "x",
     "support__dynamic_toolset__extra.call_tool:x"),
]  # fmt: skip


def backend_of(agent: Agent[None, str]) -> PerdureOperationBackend:
    bound = PerdureDurability.from_agent(agent)
    assert bound is not None
    backend = bound.get_durable_operation_backend()
    assert isinstance(backend, PerdureOperationBackend)
    return backend


def test_every_operation_kinds_step_name_is_pinned(app: perdure.App) -> None:
    """The step name of each kind of operation (model, compaction, events, capability
    methods, function/MCP/dynamic toolsets) for the agent `support`, as pinned."""
    agent = Agent(TestModel(), name="support", capabilities=[PerdureDurability(app)])
    backend = backend_of(agent)
    found = [(op, label, backend.operation_name(op, label)) for op, label, _ in PINNED]  # type: ignore[arg-type]
    assert found == PINNED


def test_a_runs_journal_uses_the_pinned_names(app: perdure.App, worker: TestWorker) -> None:
    """A real run journals its model requests and tool call under the pinned names."""
    durability = PerdureDurability(app, tool_effects={"lookup": "read"})
    agent = Agent(TestModel(), name="support", capabilities=[durability])

    @agent.tool_plain
    def lookup(order: str) -> str:
        return "shipped"

    @app.workflow(name="support")
    async def support(prompt: str) -> str:
        return (await agent.run(prompt)).output

    handle = app.start(support, "where?")
    worker.run_until_idle()
    names = [e.name for e in app.journal(handle.id) if e.kind == "step.outcome"]
    assert names == [PINNED[0][2], PINNED[8][2], PINNED[0][2]]
