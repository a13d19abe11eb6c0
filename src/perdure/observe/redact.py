"""One redaction for everything perdure shows of a run: the CLI, the HTTP API, the dashboard
and MCP all mask the same secrets the same way.

What the log redactor masks (perdure tokens as `pdr_***`, `sk-` keys as `sk-***`, bearer
credentials, the values of secret-named environment variables, `PERDURE_REDACT`), plus
`Authorization` values of any scheme and JSON fields named like secrets (masked whole, as
values and inside text: `"client_secret": "..."`, `api_key=...`).
Plain Python: the CLI of a bare install imports it.
"""

from __future__ import annotations

import html
import json
import re
from typing import Any

from ..nesting import MAX_DEPTH
from .logs import MASK, TOKEN_SHAPED, TOO_DEEP
from .logs import Redactor as LogRedactor

AUTHORIZATION = re.compile(
    r"(?P<head>authorization[\"']?\s*[:=]\s*[\"']?)"
    r"(?:(?:Bearer|Basic|Token|Digest)\s+)?[^\s\"',;}&<\\]+",
    re.IGNORECASE,
)
# a JSON field with one of these names holds a secret whatever its value looks like
SECRET_NAMES = (
    r"(?:authorization|proxy-authorization|api[_-]?key|x-api-key|token|access[_-]?token|"
    r"secret|password|client[_-]?secret|[a-z_]*_(?:secret|password))"
)
SECRET_FIELD = re.compile(f"^{SECRET_NAMES}$", re.IGNORECASE)
# the same fields inside text: as JSON (`"client_secret": "..."`, the string possibly cut
# short, as a view cuts a long value) and as a query or environment pair (`api_key=...`)
SECRET_PAIR = re.compile(
    rf"(?P<head>\"{SECRET_NAMES}\"\s*:\s*)\"(?:[^\"\\]|\\.)*(?:\"|\\?$)"
    rf"|(?P<qhead>(?<![\w-]){SECRET_NAMES}=)[^\s&\"',;}}<]+",
    re.IGNORECASE,
)


def _masked_pair(found: re.Match[str]) -> str:
    if found.group("head") is not None:
        return f'{found.group("head")}"{MASK}"'
    return found.group("qhead") + MASK


class Redactor(LogRedactor):
    """Masks secrets in strings, JSON-like values, JSON text and rendered pages.

    Args:
        patterns: regular expressions to mask besides the built-in ones.
        env: where secret-named variables are read (default `os.environ`), read once here.
    """

    def text(self, text: str) -> str:
        text = AUTHORIZATION.sub(r"\g<head>" + MASK, super().text(text))
        return SECRET_PAIR.sub(_masked_pair, text)

    def value(self, value: Any, depth: int = 0) -> Any:
        if isinstance(value, dict) and depth < MAX_DEPTH:
            return {
                self.text(str(k)): MASK
                if isinstance(v, str) and v and SECRET_FIELD.match(str(k))
                else self.value(v, depth + 1)
                for k, v in value.items()
            }
        if isinstance(value, list | tuple) and depth < MAX_DEPTH:
            return [self.value(v, depth + 1) for v in value]
        return super().value(value, depth)

    def json_text(self, text: str | None) -> str | None:
        """JSON text (as a journal or a run row keeps it) with its secrets masked: the text
        as it was when nothing needed masking, else the masked value as JSON again; text that
        is not JSON is masked as text."""
        if text is None:
            return None
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            return self.text(text)
        masked = self.value(value)
        try:
            return text if masked == value else json.dumps(masked, ensure_ascii=False)
        except RecursionError:  # a value kept before the nesting limit: shown cut
            return json.dumps(TOO_DEEP)

    def page(self, markup: str) -> str:
        """A last pass over a rendered page, for what escaped the per-value pass: secret
        values (as written and HTML-escaped), token-shaped strings and configured patterns;
        never the context-dependent rules, which could eat the page's own markup."""
        for value in self.values:
            for form in {value, html.escape(value)}:
                markup = markup.replace(form, MASK)
        for pattern, replacement in TOKEN_SHAPED:
            markup = pattern.sub(replacement, markup)
        for pattern in self.patterns:
            markup = pattern.sub(MASK, markup)
        return markup
