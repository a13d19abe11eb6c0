"""`observe.redact.Redactor.text`: a field named like a secret is masked inside text too, as
JSON (`"client_secret": "..."`, cut short or with escaped quotes) and as a query or
environment pair (`api_key=...`), while words that merely mention a secret stay."""

from __future__ import annotations

import pytest

from perdure.observe.redact import Redactor

CASES = [
    ('returned {"client_secret": "cs-abc", "n": 1} in 3 ms',
     'returned {"client_secret": "***", "n": 1} in 3 ms'),
    ('returned {"client_id": "x", "client_secret": "cs-abcdefgh',  # cut at a column's width
     'returned {"client_id": "x", "client_secret": "***"'),
    ('{"DB_PASSWORD": "a\\"b\\"c", "user": "ana"}', '{"DB_PASSWORD": "***", "user": "ana"}'),
    ("GET /cb?code=1&api_key=zzz9&state=2", "GET /cb?code=1&api_key=***&state=2"),
    ("token: revoked, password reset", "token: revoked, password reset"),
    ('{"token": 5, "tokens": "many"}', '{"token": 5, "tokens": "many"}'),
    ("my_api_key_file=conf/keys.txt", "my_api_key_file=conf/keys.txt"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "shown"), CASES)
def test_secret_named_fields_are_masked_inside_text(text: str, shown: str) -> None:
    assert Redactor(env={}).text(text) == shown


def test_json_text_masks_a_secret_quoted_in_a_string_value() -> None:
    """A journal value whose string quotes a JSON object with a secret (a logged request
    body, say) is shown with that secret masked."""
    kept = '{"body": "{\\"password\\": \\"hunter2\\"}"}'
    assert "hunter2" not in (Redactor(env={}).json_text(kept) or "")
