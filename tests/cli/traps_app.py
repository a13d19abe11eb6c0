"""An app with a webhook whose secret is in TRAPS_HOOK_SECRET, for `perdure triggers`; its
store is PERDURE_DB."""

from __future__ import annotations

from typing import Any

import perdure

app = perdure.App()


@app.workflow(name="handle")
def handle(payload: Any) -> Any:
    return payload


app.webhook("push", handle, secret_env="TRAPS_HOOK_SECRET")
