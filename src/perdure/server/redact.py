"""Hide secrets in what the dashboard shows: what the log redactor masks (tokens, `sk-` keys,
bearer credentials, secret-named environment variables, `PERDURE_REDACT`), plus
`Authorization` values of any scheme and JSON fields named like secrets."""

from __future__ import annotations

import html
import re
from typing import Any

from ..observe.logs import MASK, TOKEN_SHAPED
from ..observe.logs import Redactor as LogRedactor

AUTHORIZATION = re.compile(
    r"(?P<head>authorization[\"']?\s*[:=]\s*[\"']?)"
    r"(?:(?:Bearer|Basic|Token|Digest)\s+)?[^\s\"',;}&<\\]+",
    re.IGNORECASE,
)
# a JSON field with one of these names holds a secret whatever its value looks like
SECRET_FIELD = re.compile(
    r"^(authorization|proxy-authorization|api[_-]?key|x-api-key|token|access[_-]?token|"
    r"secret|password|client[_-]?secret|[a-z_]*_(secret|password))$",
    re.IGNORECASE,
)


class Redactor(LogRedactor):
    """Masks secrets in strings and in JSON-like values (see the module docstring)."""

    def text(self, text: str) -> str:
        return AUTHORIZATION.sub(r"\g<head>" + MASK, super().text(text))

    def value(self, value: Any) -> Any:
        if isinstance(value, dict):
            return {
                self.text(str(k)): MASK
                if isinstance(v, str) and v and SECRET_FIELD.match(str(k))
                else self.value(v)
                for k, v in value.items()
            }
        return super().value(value)

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
