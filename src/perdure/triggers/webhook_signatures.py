"""How a webhook delivery proves it came from someone holding the hook's secret: the two
signature schemes, for checking a request (`verify_standard`, `verify_body`) and for
making one (`sign_standard`, `standard_headers`, `sign`).

    standard  Standard Webhooks (standardwebhooks.com, v1 symmetric): headers `webhook-id`,
              `webhook-timestamp` (unix seconds) and `webhook-signature`, a space-separated
              list of `v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`; any one entry
              may match, so a sender rotating its key sends both signatures. The id and the
              time are signed: a captured delivery resent under a new id does not verify, and
              one resent later than the tolerance is refused.
    body      GitHub-style: `sha256=<hex HMAC-SHA256 of the body>`. The delivery id is not
              signed, so a captured delivery resent under a new id verifies.

A secret written `whsec_<base64>` (the spec's serialisation) is the bytes it decodes to;
any other secret is its UTF-8 bytes, as `openssl dgst -hmac` and GitHub use it. (The
spec's reference libraries base64-decode every secret; give them the `whsec_` form.)
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import time
from collections.abc import Mapping, Sequence

__all__ = [
    "ID_HEADER",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "DeliveryRefused",
    "key_of",
    "sign",
    "sign_standard",
    "standard_headers",
    "verify_body",
    "verify_standard",
]

ID_HEADER = "webhook-id"
TIMESTAMP_HEADER = "webhook-timestamp"
SIGNATURE_HEADER = "webhook-signature"
SECRET_PREFIX = "whsec_"
_TIMESTAMP = re.compile(r"[0-9]{1,15}")  # unix seconds; bounded so int() stays cheap


class DeliveryRefused(Exception):
    """Raised when a delivery fails a check: `status` (400 malformed, 401 not authentic or
    outside the tolerance) and a one-line `message` saying which check."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def key_of(secret: str | bytes) -> bytes:
    """The HMAC key of `secret`: bytes as given, `whsec_<base64>` decoded, else UTF-8.

    Raises:
        ValueError: a `whsec_` secret whose rest is not base64 of at least one byte.
    """
    if isinstance(secret, bytes):
        return secret
    if not secret.startswith(SECRET_PREFIX):
        return secret.encode()
    encoded = secret[len(SECRET_PREFIX) :]
    try:
        key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("a whsec_ secret must be base64 after the prefix") from None
    if not key:
        raise ValueError("the whsec_ secret is empty after the prefix")
    return key


def sign(secret: str | bytes, body: bytes) -> str:
    """The body scheme's signature header value: `sha256=` and the hex HMAC-SHA256 of `body`."""
    return "sha256=" + hmac.new(key_of(secret), body, hashlib.sha256).hexdigest()


def _standard_digest(key: bytes, delivery_id: str, timestamp: str, body: bytes) -> bytes:
    signed = f"{delivery_id}.{timestamp}.".encode() + body
    return hmac.new(key, signed, hashlib.sha256).digest()


def sign_standard(secret: str | bytes, delivery_id: str, timestamp: int, body: bytes) -> str:
    """One `webhook-signature` entry: `v1,` and the base64 HMAC-SHA256 of `id.timestamp.body`."""
    digest = _standard_digest(key_of(secret), delivery_id, str(timestamp), body)
    return "v1," + base64.b64encode(digest).decode()


def standard_headers(
    secret: str | bytes | Sequence[str | bytes],
    body: bytes,
    *,
    delivery_id: str,
    timestamp: int | None = None,
) -> dict[str, str]:
    """The three Standard Webhooks headers a sender puts on a POST of `body`.

    Args:
        secret: the hook's secret, or several (a sender rotating keys signs with each).
        body: the exact bytes that will be sent.
        delivery_id: the event's id: the same for every retry of one event.
        timestamp: unix seconds of this attempt; default now.
    """
    secrets = [secret] if isinstance(secret, str | bytes) else list(secret)
    when = int(time.time()) if timestamp is None else timestamp
    signatures = " ".join(sign_standard(s, delivery_id, when, body) for s in secrets)
    return {ID_HEADER: delivery_id, TIMESTAMP_HEADER: str(when), SIGNATURE_HEADER: signatures}


def verify_standard(
    key: bytes, headers: Mapping[str, str], body: bytes, *, now: float, tolerance: float
) -> str:
    """The delivery id of a Standard Webhooks delivery whose signature matches and whose
    timestamp is within `tolerance` seconds of `now` (either way).

    Raises:
        DeliveryRefused: naming the header or the check that failed.
    """
    signatures = headers.get(SIGNATURE_HEADER)
    if not signatures:
        hint = ""
        if any(name.lower() in ("x-perdure-signature", "x-hub-signature-256") for name in headers):
            hint = "; for body-only sha256= signatures register the hook with scheme='body'"
        raise DeliveryRefused(
            401,
            f"missing {SIGNATURE_HEADER} (this hook uses Standard Webhooks: "
            f"v1,<base64 HMAC-SHA256 of id.timestamp.body>){hint}",
        )
    delivery_id = headers.get(ID_HEADER) or ""
    if not delivery_id:
        raise DeliveryRefused(400, f"{ID_HEADER}: missing")
    if "." in delivery_id:  # the spec's advice: a '.' would let id and timestamp shift
        raise DeliveryRefused(400, f"{ID_HEADER}: must not contain '.'")
    stamp = headers.get(TIMESTAMP_HEADER) or ""
    if not _TIMESTAMP.fullmatch(stamp):
        raise DeliveryRefused(
            400, f"{TIMESTAMP_HEADER}: {stamp[:40]!r} is not unix seconds (digits only)"
        )
    expected = _standard_digest(key, delivery_id, stamp, body)
    if not any(hmac.compare_digest(expected, given) for given in _v1_entries(signatures)):
        raise DeliveryRefused(
            401,
            f"no {SIGNATURE_HEADER} entry matches (v1,<base64 HMAC-SHA256 of "
            f"{ID_HEADER}.{TIMESTAMP_HEADER}.body> under the hook's secret)",
        )
    # checked once the delivery is authentic: the clock message helps a real sender only
    skew = int(stamp) - now
    if abs(skew) > tolerance:
        side = "old" if skew < 0 else "in the future"
        raise DeliveryRefused(
            401,
            f"{TIMESTAMP_HEADER} is {abs(skew):.0f} s {side}, outside this hook's "
            f"{tolerance:g} s tolerance (a replay, or the sender's clock is off)",
        )
    return delivery_id


def _v1_entries(header: str) -> list[bytes]:
    """The decoded `v1` signatures of a `webhook-signature` header (others are skipped)."""
    found = []
    for entry in header.split()[:16]:  # a rotation sends two or three; bound the work
        version, _, encoded = entry.partition(",")
        if version != "v1":
            continue
        try:
            found.append(base64.b64decode(encoded, validate=True))
        except (binascii.Error, ValueError):
            continue
    return found


def verify_body(key: bytes, signature: str | None, body: bytes) -> bool:
    """True if `signature` is `sha256=<hex HMAC-SHA256 of body>` under `key`."""
    if not signature:
        return False
    expected = ("sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()).encode()
    given = signature.strip().lower().encode("utf-8", "replace")
    return hmac.compare_digest(expected, given)
