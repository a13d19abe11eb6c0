"""A small app for the `perdure serve` test; store from PERDURE_DB, secret from HOOK_SECRET."""

from __future__ import annotations

from typing import Any

import perdure

app = perdure.App()


@app.workflow()
def on_push(payload: dict[str, Any]) -> str:
    return f"pushed {payload['ref']}"


app.webhook("push", on_push, secret_env="HOOK_SECRET")
