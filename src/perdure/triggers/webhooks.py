"""Webhooks: a signed POST to `/hooks/{name}` on `perdure serve` starts one run per delivery.

    app.webhook("github", on_push, secret_env="GITHUB_HOOK_SECRET")

    @app.workflow()
    def on_push(payload: dict[str, Any]) -> None: ...

Each hook checks one signature scheme (see `webhook_signatures`). `standard` (the
default, Standard Webhooks) signs the delivery id and a timestamp with the body and
refuses a timestamp more than `tolerance` seconds (300) from the server's clock, so a
captured delivery can be neither resent under a new id nor kept for later. `body`
(GitHub-style, `sha256=<hex>` of the body, for senders that can do nothing else) leaves
the id unsigned: a captured delivery resent under a new id starts a new run.

The run id is `hook:{name}:{delivery id}`, so a delivery sent again (a retry, a replay)
finds its run instead of starting another, for as long as the store keeps that run.
The workflow receives the parsed JSON body as its single argument.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from ..engine.client import Client
from ..engine.triggers import TriggerStatus
from ..errors import ConfigError, PerdureError
from .ids import id_problem
from .webhook_signatures import (
    ID_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    DeliveryRefused,
    key_of,
    sign,
    sign_standard,
    standard_headers,
    verify_body,
    verify_standard,
)

if TYPE_CHECKING:
    from ..engine.handles import Workflow
    from ..engine.runtime import Runtime

__all__ = [
    "Delivery",
    "DeliveryRefused",
    "Scheme",
    "Webhook",
    "add_webhook",
    "deliver",
    "sign",
    "sign_standard",
    "standard_headers",
]

Scheme = Literal["standard", "body"]
SCHEMES: tuple[Scheme, ...] = ("standard", "body")
TOLERANCE = 300.0  # seconds either side of the server's clock, as the spec suggests
BODY_DELIVERY_HEADER = "X-Perdure-Delivery"
BODY_SIGNATURE_HEADER = "X-Perdure-Signature"

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
_HEADER = re.compile(r"[A-Za-z0-9-]+")


@dataclass(frozen=True, slots=True, kw_only=True)
class Webhook:
    """A registered webhook: which workflow a delivery starts and how a request is checked.

    The header fields hold the names the scheme reads (`standard`: `webhook-id`,
    `webhook-signature`, `webhook-timestamp`; `body`: the hook's own, no timestamp).
    """

    kind: ClassVar[str] = "webhook"
    name: str
    workflow: str
    secret: str | None = field(default=None, repr=False)
    secret_env: str | None = None
    scheme: Scheme = "standard"
    delivery_header: str = ID_HEADER
    signature_header: str = SIGNATURE_HEADER
    timestamp_header: str | None = TIMESTAMP_HEADER
    tolerance: float | None = TOLERANCE
    max_body: int = 1_048_576

    @property
    def path(self) -> str:
        return f"/hooks/{self.name}"

    def key(self, environ: Mapping[str, str] | None = None) -> bytes:
        """The HMAC key, from the secret or (read now) the environment variable the hook names.

        Raises:
            ConfigError: the variable is unset or empty, or holds a `whsec_` secret that is
                not base64.
        """
        if self.secret is not None:
            value, where = self.secret, "secret"
        else:
            value = (os.environ if environ is None else environ).get(self.secret_env or "", "")
            where = f"environment variable {self.secret_env}"
            if not value:
                raise ConfigError(
                    f"webhook {self.name!r}: {where} is not set (it holds the hook's signing "
                    "secret)"
                )
        try:
            return key_of(value)
        except ValueError as exc:
            raise ConfigError(f"webhook {self.name!r}: {where}: {exc}") from None

    def verify(
        self,
        headers: Mapping[str, str],
        body: bytes,
        *,
        now: float,
        environ: Mapping[str, str] | None = None,
    ) -> str:
        """The delivery id of an authentic delivery (per the hook's scheme), checked usable.

        Args:
            headers: the request's headers (names in any case).
            body: the raw body, as signed.
            now: the server's clock (unix seconds), for the standard scheme's tolerance.

        Raises:
            DeliveryRefused: which check failed (400 malformed, 401 not authentic or stale).
            ConfigError: the hook's secret is unset or malformed.
        """
        lowered = {name.lower(): value for name, value in headers.items()}
        key = self.key(environ)
        if self.scheme == "standard":
            tolerance = TOLERANCE if self.tolerance is None else self.tolerance
            delivery_id = verify_standard(key, lowered, body, now=now, tolerance=tolerance)
        else:
            if not verify_body(key, lowered.get(self.signature_header.lower()), body):
                raise DeliveryRefused(
                    401, f"missing or wrong {self.signature_header} (sha256=<hex HMAC of body>)"
                )
            delivery_id = lowered.get(self.delivery_header.lower(), "")
        problem = id_problem(delivery_id)
        if problem is not None:
            raise DeliveryRefused(400, f"{self.delivery_header}: {problem}")
        return delivery_id

    def run_id(self, delivery_id: str) -> str:
        """The id of the run a delivery starts: the same delivery always names the same run."""
        return f"hook:{self.name}:{delivery_id}"

    def check(self, runtime: Runtime, environ: Mapping[str, str] | None = None) -> None:
        """Refuse to serve a hook that cannot work: no usable secret, or a workflow that is not
        registered or does not take the payload as its one argument.

        Raises:
            ConfigError: naming the hook and the fix.
        """
        self.key(environ)
        _check_workflow(runtime, self.name, self.workflow, required=True)

    async def statuses(self, runtime: Runtime) -> list[TriggerStatus]:
        """`ready`, or `error` with what `check` refuses; `unset here` when all that is
        wrong is a secret variable this process lacks (a shell asking `perdure triggers`
        need not hold what the serving process holds)."""
        unset = self.secret is None and not os.environ.get(self.secret_env or "")
        try:
            if unset:
                _check_workflow(runtime, self.name, self.workflow, required=True)
                state, error = (
                    "unset here",
                    (
                        f"environment variable {self.secret_env} is not set in this process; "
                        "`perdure serve` needs it to verify deliveries"
                    ),
                )
            else:
                self.check(runtime)
                state, error = "ready", None
        except PerdureError as exc:
            state, error = "error", str(exc)
        return [TriggerStatus("webhook", self.name, self.workflow, state, None, error, self.path)]


@dataclass(frozen=True, slots=True)
class Delivery:
    """What a delivery did: the run it names and whether that run existed already."""

    run_id: str
    duplicate: bool


def add_webhook(
    runtime: Runtime,
    name: str,
    workflow: Workflow[..., Any] | str,
    *,
    secret: str | None = None,
    secret_env: str | None = None,
    scheme: Scheme = "standard",
    tolerance: float | None = None,
    delivery_header: str | None = None,
    signature_header: str | None = None,
    max_body: int = 1_048_576,
) -> Webhook:
    """Register webhook `name` on `app` (served by `perdure serve` at `/hooks/{name}`).

    Args:
        app: the App whose store the runs go to.
        name: the last path segment (letters, digits, `_`, `.`, `-`; at most 100).
        workflow: started with the parsed JSON body as its one argument.
        secret: the signing secret (`whsec_<base64>` is decoded, anything else used as
            its UTF-8 bytes); or
        secret_env: the environment variable holding it, read at each request (so
            workers, which import the same app, need not have it).
        scheme: `"standard"` (Standard Webhooks: `webhook-id`, `webhook-timestamp`,
            `webhook-signature` over `id.timestamp.body`) or `"body"` (GitHub-style
            `sha256=<hex HMAC of the body>`; replayable under a new delivery id).
        tolerance: standard scheme: refuse a `webhook-timestamp` more than this many
            seconds from the server's clock, either way (default 300).
        delivery_header: body scheme: the header carrying the delivery id (default
            `X-Perdure-Delivery`; GitHub: `X-GitHub-Delivery`).
        signature_header: body scheme: the header carrying the signature (default
            `X-Perdure-Signature`; GitHub: `X-Hub-Signature-256`).
        max_body: larger bodies are refused with 413 before they are read.

    Returns:
        The `Webhook`, kept with the runtime's triggers.

    Raises:
        ConfigError: a bad name, scheme, header or tolerance; an option of the other
            scheme; no secret (unsigned hooks are refused), both `secret` and
            `secret_env`, a malformed `whsec_` secret, or a name used by another hook.
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
    if scheme not in SCHEMES:
        raise ConfigError(
            f"webhook {name!r}: scheme={scheme!r}: use 'standard' (Standard Webhooks) or "
            "'body' (body-only sha256= HMAC)"
        )
    if scheme == "standard":
        options = {"delivery_header": delivery_header, "signature_header": signature_header}
        given = [option for option, value in options.items() if value is not None]
        if given:
            raise ConfigError(
                f"webhook {name!r}: {' and '.join(given)} belong to scheme='body' (a body-only "
                "sha256= HMAC, GitHub-style): pass scheme='body' to keep them, or drop them "
                "for the Standard Webhooks headers webhook-id/-timestamp/-signature"
            )
        if tolerance is None:
            tolerance = TOLERANCE
        if not (math.isfinite(tolerance) and tolerance > 0):
            raise ConfigError(f"webhook {name!r}: tolerance must be a positive number of seconds")
        headers: tuple[str, str, str | None] = (ID_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER)
    else:
        if tolerance is not None:
            raise ConfigError(
                f"webhook {name!r}: tolerance needs a signed timestamp, which scheme='body' "
                "lacks; use scheme='standard'"
            )
        delivery_header = delivery_header or BODY_DELIVERY_HEADER
        signature_header = signature_header or BODY_SIGNATURE_HEADER
        for label, header in (
            ("delivery_header", delivery_header),
            ("signature_header", signature_header),
        ):
            if not _HEADER.fullmatch(header):
                raise ConfigError(f"webhook {name!r}: {label}={header!r} is not a header name")
        headers = (delivery_header, signature_header, None)
    if max_body < 1:
        raise ConfigError(f"webhook {name!r}: max_body must be at least 1 byte")
    wf_name = workflow if isinstance(workflow, str) else workflow.name
    _check_workflow(runtime, name, wf_name, required=False)
    hook = Webhook(
        name=name,
        workflow=wf_name,
        secret=secret,
        secret_env=secret_env,
        scheme=scheme,
        delivery_header=headers[0],
        signature_header=headers[1],
        timestamp_header=headers[2],
        tolerance=tolerance,
        max_body=max_body,
    )
    if secret is not None:
        hook.key()  # a malformed whsec_ secret fails here, not at the first delivery
    kept = runtime.triggers.find(Webhook, name)
    if kept is not None and kept != hook:
        raise ConfigError(f"two webhooks are named {name!r}; give one another name")
    return runtime.triggers.add(hook)


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
