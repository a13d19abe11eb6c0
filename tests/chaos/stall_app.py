"""The app the SQLite stall test freezes: a transactional step that holds the write lock, and
quick runs that need it too.

Run by the test as `perdure --app stall_app:app --db URL worker` from this folder. The
transactional step appends `{pid, run}` to the file named by `STALL_MARK` (one `write()` on
an O_APPEND file) once it is inside the store's write transaction, then keeps it for
`STALL_HOLD` seconds, so the test can SIGSTOP the very process that holds the lock.
"""

from __future__ import annotations

import json
import os
import time

import perdure


def build(url: str | None = None) -> perdure.App:
    """The app on `url` (None: `--db` / PERDURE_DB)."""
    app = perdure.App(url)

    @app.step(name="hold_lock", effect="transactional")
    def hold_lock(n: int) -> int:
        info = perdure.current_step()
        info.db.execute("CREATE TABLE IF NOT EXISTS stall_ledger (run TEXT, n INTEGER)")
        info.db.execute("INSERT INTO stall_ledger VALUES (?, ?)", (info.run_id, n))
        path = os.environ.get("STALL_MARK")
        if path:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, (json.dumps({"pid": os.getpid(), "run": info.run_id}) + "\n").encode())
            finally:
                os.close(fd)
        time.sleep(float(os.environ.get("STALL_HOLD", "0")))
        return n

    @app.workflow(name="held")
    def held(n: int) -> int:
        return hold_lock(n)

    @app.step(name="double", effect="idempotent")
    def double(n: int) -> int:
        return 2 * n

    @app.workflow(name="quick")
    def quick(n: int) -> int:
        return double(n)

    return app


app = build()
