"""The app the security tests serve: a workflow that waits, and signed webhooks.

Store from PERDURE_DB; the webhooks' secret is `s3cret` (HOOK_SECRET may override it)."""

from __future__ import annotations

import os
from typing import Any

import perdure

app = perdure.App()
SECRET = os.environ.get("HOOK_SECRET", "s3cret")


@app.workflow()
def waits(payload: Any = None) -> str:
    """Never executed here (no worker runs): its runs stay pending for the tests to act on."""
    return "done"


app.webhook("push", waits, secret=SECRET)
