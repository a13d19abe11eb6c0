"""The app the security tests serve: a workflow that waits, and signed webhooks (`push`:
Standard Webhooks; `push-body`: the body-only scheme).

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
app.webhook("small", waits, secret=SECRET, max_body=1000)  # a hook that takes little
# GitHub-style: body-only HMAC in X-Perdure-Signature, the id in X-Perdure-Delivery (replayable
# under a new id, as documented; tests/security/test_webhook_replay.py shows it).
app.webhook("push-body", waits, secret=SECRET, scheme="body")


CLIENT_SECRET = "cs-0123456789-client-secret"  # no token shape: masked for its field name
PROVIDER_KEY = "sk-live0123456789abcdefghijklmnop"


@app.step(effect="read")
def fetch_credentials() -> dict[str, Any]:
    """Writes a key to the run's stream (as text and as a field) and returns a payload
    holding a client secret, as a step talking to an OAuth provider might."""
    perdure.stream.write(f"using {PROVIDER_KEY}\n")
    perdure.stream.write({"api_key": PROVIDER_KEY, "n": 1}, topic="log")
    return {"client_id": "perdure", "client_secret": CLIENT_SECRET}


@app.workflow()
def leaky() -> str:
    """A run whose step output and stream hold secrets every view must mask."""
    fetch_credentials()
    return "ok"


@app.step()  # once: a crash inside it leaves the run for a person
def charge() -> str:
    """Kills its worker when CRASH_IN_CHARGE is set (the next worker parks the run)."""
    if os.environ.get("CRASH_IN_CHARGE"):
        os._exit(3)
    return "charged"


@app.workflow()
def charges() -> str:
    """A run that needs an operator once its `charge` step crashed its worker."""
    return charge()


@app.workflow()
def read_drop(path: str) -> int:
    """Reads a dropped file (as a real inbox workflow should: the checked copy of the content
    its run was started for): its length is the result."""
    with perdure.open_inbox_file() as dropped:
        return len(dropped.read())


if os.environ.get("INBOX_DIR"):  # the inbox test's worker watches this folder
    app.inbox(os.environ["INBOX_DIR"], read_drop, stable=0.2, poll=0.2, force_polling=True)
