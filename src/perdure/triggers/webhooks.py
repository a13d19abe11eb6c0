"""Webhooks: a signed POST to `/hooks/{name}` on `perdure serve` starts one run per delivery.

    app.webhook("github", on_push, secret_env="GITHUB_HOOK_SECRET")

    @app.workflow()
    def on_push(payload: dict[str, Any]) -> None: ...

The sender signs the raw body GitHub-style: the signature header holds
`sha256=` and the hex HMAC-SHA256 of the body under the hook's secret. Each
delivery carries an id in the delivery header; the run id is
`hook:{name}:{delivery id}`, so a delivery sent again (a retry, a replay) finds
its run instead of starting another, for as long as the store keeps that run.
The workflow receives the parsed JSON body as its single argument.

The signature covers the body only (as GitHub's does), not the delivery id: a
sender that needs a captured request to be useless under a new delivery id puts
its own unique id or timestamp in the body and checks it in the workflow.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..engine.client import Client
from ..errors import ConfigError
from .ids import MAX_ID, id_problem

if TYPE_CHECKING:
    from ..engine.handles import Workflow
    from ..engine.runtime import Runtime

__all__ = ["Delivery", "Webhook", "add_webhook", "check_delivery_id", "deliver", "sign"]

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
_HEADER = re.compile(r"[A-Za-z0-9-]+")
MAX_DELIVERY_ID = MAX_ID


def sign(secret: str | bytes, body: bytes) -> str:
    """The signature header value for `body`: `sha256=` and its hex HMAC-SHA256 under `secret`."""
    key = secret.encode() if isinstance(secret, str) else secret
    return "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()


def check_delivery_id(value: str | None) -> str:
    """The delivery id if it is usable in a run id, else `ValueError` saying what is wrong.

    Usable: 1 to 200 visible ASCII characters (no spaces or control characters).
    """
    problem = id_problem(value)
    if problem is not None:
        raise ValueError(problem)
    assert value is not None
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class Webhook:
    """A registered webhook: which workflow a delivery starts and how a request is checked."""

    name: str
    workflow: str
    secret: str | None = field(default=None, repr=False)
    secret_env: str | None = None
    delivery_header: str = "X-Perdure-Delivery"
    signature_header: str = "X-Perdure-Signature"
    max_body: int = 1_048_576

    @property
    def path(self) -> str:
        return f"/hooks/{self.name}"

    def key(self, environ: Mapping[str, str] | None = None) -> bytes:
        """The secret as bytes, read from the environment now if the hook names a variable.

        Raises:
            ConfigError: the variable is unset or empty.
        """
        if self.secret is not None:
            return self.secret.encode()
        value = (os.environ if environ is None else environ).get(self.secret_env or "", "")
        if not value:
            raise ConfigError(
                f"webhook {self.name!r}: environment variable {self.secret_env} is not set "
                "(it holds the hook's signing secret)"
            )
        return value.encode()

    def verify(
        self, body: bytes, signature: str | None, environ: Mapping[str, str] | None = None
    ) -> bool:
        """True if `signature` is `sha256=<hex HMAC-SHA256 of body>` under the hook's secret."""
        if not signature:
            return False
        expected = sign(self.key(environ), body).encode()
        given = signature.strip().lower().encode("utf-8", "replace")
        return hmac.compare_digest(expected, given)

    def run_id(self, delivery_id: str) -> str:
        """The id of the run a delivery starts: the same delivery always names the same run."""
        return f"hook:{self.name}:{delivery_id}"

    def check(self, runtime: Runtime, environ: Mapping[str, str] | None = None) -> None:
        """Refuse to serve a hook that cannot work: no secret, or a workflow that is not
        registered or does not take the payload as its one argument.

        Raises:
            ConfigError: naming the hook and the fix.
        """
        self.key(environ)
        _check_workflow(runtime, self.name, self.workflow, required=True)


class Webhooks(dict[str, "Webhook"]):
    """The webhooks of one app by name (served by `perdure serve`), checked against its
    registered workflows."""

    def __init__(self, runtime: Runtime) -> None:
        super().__init__()
        self.runtime = runtime


@dataclass(frozen=True, slots=True)
class Delivery:
    """What a delivery did: the run it names and whether that run existed already."""

    run_id: str
    duplicate: bool


def add_webhook(
    webhooks: Webhooks,
    name: str,
    workflow: Workflow[..., Any] | str,
    *,
    secret: str | None = None,
    secret_env: str | None = None,
    delivery_header: str = "X-Perdure-Delivery",
    signature_header: str = "X-Perdure-Signature",
    max_body: int = 1_048_576,
) -> Webhook:
    """Register webhook `name` on `app` (served by `perdure serve` at `/hooks/{name}`).

    Args:
        app: the App whose store the runs go to.
        name: the last path segment (letters, digits, `_`, `.`, `-`; at most 100).
        workflow: started with the parsed JSON body as its one argument.
        secret: the signing secret; or
        secret_env: the environment variable holding it, read at each request (so
            workers, which import the same app, need not have it).
        delivery_header: the header carrying the delivery id (required on requests).
        signature_header: the header carrying `sha256=<hex HMAC-SHA256 of the body>`.
        max_body: larger bodies are refused with 413 before they are read.

    Returns:
        The `Webhook`, also kept in `webhooks[name]`.

    Raises:
        ConfigError: a bad name or header, no secret (unsigned hooks are refused),
            both `secret` and `secret_env`, or a name already used by another hook.
    """
    if not _NAME.fullmatch(name):
        raise ConfigError(
            f"webhook name {name!r}: use 1-100 letters, digits, '_', '.' or '-' "
            "(it is a URL path segment)"
        )
    if (secret is None) == (secret_env is None):
        raise ConfigError(
            f"webhook {name!r}: pass exactly one of secret=... or secret_env='VARIABLE' "
            "(unsigned webhooks are refused)"
        )
    if secret is not None and not secret:
        raise ConfigError(f"webhook {name!r}: secret is empty")
    if secret_env is not None and not secret_env:
        raise ConfigError(f"webhook {name!r}: secret_env names no variable")
    for label, header in (
        ("delivery_header", delivery_header),
        ("signature_header", signature_header),
    ):
        if not _HEADER.fullmatch(header):
            raise ConfigError(f"webhook {name!r}: {label}={header!r} is not a header name")
    if max_body < 1:
        raise ConfigError(f"webhook {name!r}: max_body must be at least 1 byte")
    wf_name = workflow if isinstance(workflow, str) else workflow.name
    _check_workflow(webhooks.runtime, name, wf_name, required=False)
    hook = Webhook(
        name=name,
        workflow=wf_name,
        secret=secret,
        secret_env=secret_env,
        delivery_header=delivery_header,
        signature_header=signature_header,
        max_body=max_body,
    )
    if name in webhooks and webhooks[name] != hook:
        raise ConfigError(f"two webhooks are named {name!r}; give one another name")
    webhooks[name] = hook
    return hook


async def deliver(runtime: Runtime, hook: Webhook, delivery_id: str, payload: Any) -> Delivery:
    """Start `hook`'s workflow with `payload` for this delivery, or find the run it started.

    Starting is idempotent by run id, so a delivery never starts two runs; `duplicate`
    says the run existed before this call (two copies of one delivery arriving at the
    same instant may both report False, yet only one run exists).

    Raises:
        PayloadError: the payload does not fit the workflow's argument type.
        ConfigError: the workflow is not registered or does not take one argument.
    """
    run_id = hook.run_id(delivery_id)
    await runtime.open_store()
    origin = {"webhook": hook.name, "delivery": delivery_id}
    run, created = await Client(runtime).start_run(
        hook.workflow, (payload,), {}, run_id=run_id, origin=origin
    )
    return Delivery(run.id, not created)


def _check_workflow(runtime: Runtime, hook: str, workflow: str, *, required: bool) -> None:
    definition = runtime.workflows.get(workflow)
    if definition is None:
        if required:
            raise ConfigError(
                f"webhook {hook!r}: no workflow named {workflow!r} is registered "
                f"(known: {', '.join(sorted(runtime.workflows)) or 'none'})"
            )
        return
    try:
        definition.signature.bind(None)
    except TypeError:
        raise ConfigError(
            f"webhook {hook!r}: workflow {workflow!r} must take the payload as its one "
            f"argument, but its signature is {definition.signature}"
        ) from None
