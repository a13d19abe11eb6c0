"""What the approval-gate tests of both agent SDKs check once a gate was decided."""

from __future__ import annotations

import pytest

import perdure
from perdure.server import operations
from perdure.server.access import Principal
from perdure.server.access_sql import Access


def assert_decided_once(
    app: perdure.App, who: Principal, run_id: str, call_id: str, approve: bool
) -> None:
    """A second decision at the gate is refused, and the audit log holds both: the first
    (approve or deny) done, the second refused."""
    with pytest.raises(perdure.PerdureError, match="not waiting at that gate"):
        app.runtime.sync(operations.decide(app, who, run_id, call_id, True), "decide")
    audit = app.runtime.sync(Access(app.runtime.store).audit_log(f"run:{run_id}"), "audit")
    assert [(a.action, a.outcome) for a in reversed(audit)] == [
        ("gate.approve" if approve else "gate.deny", "ok"),
        ("gate.approve", "refused"),
    ]
