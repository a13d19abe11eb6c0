"""An app with two RabbitMQ triggers, for the views of a trigger a worker cannot consume; its
store is PERDURE_DB. `orders` reads TRUTH_MISSING (a queue that does not exist, declare=False),
`live` reads TRUTH_LIVE (default declare=True, on a queue with a dead-letter exchange)."""

from __future__ import annotations

import os
from typing import Any

import perdure

AMQP = os.environ.get("PERDURE_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672/")

app = perdure.App()


@app.workflow(name="take")
def take(item: Any) -> dict[str, Any]:
    run = perdure.current_run()
    return {"trigger": run.trigger, "origin": run.origin}


missing = perdure.sources.RabbitMQ(AMQP, os.environ.get("TRUTH_MISSING", "q"), declare=False)
app.on_message(missing, take, name="orders")
app.on_message(perdure.sources.RabbitMQ(AMQP, os.environ.get("TRUTH_LIVE", "q")), take,
               name="live")  # fmt: skip
