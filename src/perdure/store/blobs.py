"""Large payloads are stored once in the blob table and referenced from the journal."""

from __future__ import annotations

import hashlib
import json

from .base import Blob

BLOB_KEY = "$perdure_blob"
DEFAULT_BLOB_THRESHOLD = 64 * 1024  # bytes of JSON text kept in the row


def in_row_or_blob(text: str, threshold: int) -> tuple[str, Blob | None]:
    """Keep `text` in the row if small, else return a reference and the blob to store."""
    if len(text) <= threshold:
        return text, None
    key = hashlib.sha256(text.encode()).hexdigest()
    return json.dumps({BLOB_KEY: key}), Blob(key=key, data=text)


def blob_ref(text: str | None) -> str | None:
    """The blob key `text` refers to, if it is a reference."""
    if text is None or not text.startswith('{"' + BLOB_KEY):
        return None
    value = json.loads(text)
    return value.get(BLOB_KEY) if isinstance(value, dict) and len(value) == 1 else None
