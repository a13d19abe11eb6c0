"""An app with one trigger of every kind, for `perdure triggers`; its store is PERDURE_DB.

The inbox folder is TRIGGERS_INBOX. `no_table` watches a table that does not exist.
"""

from __future__ import annotations

import os
from typing import Any

import perdure
from perdure.engine.runtime import Runtime
from perdure.engine.triggers import TriggerStatus
from perdure.engine.worker import Worker

app = perdure.App()


@app.workflow(name="handle")
def handle(item: Any) -> Any:
    return item


class FakeSource:
    """A trigger kind of a user's own: one class with a kind, a name, `status()` and a loop."""

    kind = "rabbitmq"
    name = "orders-queue"

    async def run(self, worker: Worker) -> None:
        await worker.stopping.wait()

    async def statuses(self, runtime: Runtime) -> list[TriggerStatus]:
        return [TriggerStatus("rabbitmq", self.name, "handle", "consuming", 3.0)]


app.schedule(every=3600, name="hourly", workflow=handle, args=[1])
app.inbox(os.environ.get("TRIGGERS_INBOX", "inbox"), handle, name="drop")
app.webhook("push", handle, secret="s3cret")
app.on_event("order.paid")(handle)
app.on_table_change("orders", handle, on=["insert"])
app.on_table_change("missing_table", handle, name="no_table")
app.runtime.triggers.add(FakeSource())
