"""Issue 35 §7 (in part) against a real `perdure serve`: a run-output stream
(`/api/v1/runs/{id}/stream`) of a run that writes nothing ends once its token is revoked by
another process, within a few RECHECK periods. It used to re-check only when a row came,
so a revoked token's streams on a waiting run held their slots for ever."""

from __future__ import annotations

import time

from served import Served, perdure
from test_sessions import open_stream, read_to_end

from perdure.server.sse import RECHECK


def test_a_revoked_tokens_run_output_stream_ends_without_output(serve: Served) -> None:
    with serve.client("operate") as api:
        assert api.post("/api/v1/runs", json={"workflow": "waits", "id": "quiet"}).is_success
    auth = f"Authorization: Bearer {serve.tokens['read']}"
    streams = [open_stream(serve, "/api/v1/runs/quiet/stream", auth) for _ in range(5)]
    time.sleep(RECHECK / 2)
    perdure(serve.env, "token", "revoke", serve.token_ids["read"])
    revoked = time.monotonic()
    texts = [read_to_end(sock) for sock in streams]  # the socket timeout (30 s) fails it
    assert time.monotonic() - revoked < 4 * RECHECK + 5
    for text in texts:
        assert b"event: end" in text and b"revoked or expired" in text, text[-300:]
