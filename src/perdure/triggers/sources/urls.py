"""Broker URLs fit to print: the password replaced, the rest kept."""

from __future__ import annotations

import re


def public(url: str) -> str:
    """`url` without its password (`amqp://user:secret@host` -> `amqp://user@host`)."""
    return re.sub(r"(://[^:/@]*):[^@/]*@", r"\1@", url)
