"""The stream crash test's app: one step that speaks 60 words into the run's stream, slowly.

Store from PERDURE_DB."""

from __future__ import annotations

import time

import perdure

WORDS = 60


def register(app: perdure.App) -> perdure.App:
    """The workflow on `app` (the workers' app below; a test's own client on its store)."""

    @app.step(effect="idempotent", name="speak")
    def speak() -> int:
        for i in range(WORDS):
            perdure.stream.write(f"w{i}")
            time.sleep(0.03)
        return WORDS

    @app.workflow(name="talks")
    def talks() -> int:
        return speak()

    return app


app = register(perdure.App())
