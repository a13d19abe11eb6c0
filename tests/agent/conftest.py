"""Fixtures of the agent tests: a fresh store of each kind, a counting model server slow
enough that concurrent first calls overlap (files that want another latency define their own),
and the scripted OpenAI and Anthropic wire servers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from wire_servers import AnthropicServer, CountingServer, OpenAIServer

from extras_needed import require
from fresh_stores import fresh_store_url


@pytest.fixture
def server() -> Iterator[CountingServer]:
    """An OpenAI-compatible server that bills; its tests' agents call it through the openai
    SDK (they skip without the models extra)."""
    require("models", "openai")
    s = CountingServer(latency=0.3).start()  # long enough for all first calls to overlap
    yield s
    s.stop()


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh SQLite file, or a fresh schema on the machine's PostgreSQL (dropped after)."""
    with fresh_store_url(request.param, tmp_path) as url:
        yield url


@pytest.fixture
def openai_server() -> Iterator[OpenAIServer]:
    """A scripted OpenAI-compatible server on 127.0.0.1, for tests that call it through the
    openai SDK (they skip without the models extra)."""
    require("models", "openai")
    server = OpenAIServer().start()
    yield server
    server.stop()


@pytest.fixture
def anthropic_server() -> Iterator[AnthropicServer]:
    """A scripted Anthropic Messages server on 127.0.0.1, for tests that call it through the
    anthropic SDK (they skip without the models extra)."""
    require("models", "anthropic")
    server = AnthropicServer().start()
    yield server
    server.stop()
