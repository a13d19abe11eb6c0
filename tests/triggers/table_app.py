"""The app the table-change kill test runs as worker processes: `orders` inserts ship.

    python tests/triggers/table_app.py STORE_URL

Each committed insert into `orders` starts one `ship` run, which returns the order's id.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import perdure


def build_app(url: str) -> perdure.App:
    """The App on `url`, with `ship` started by every insert into `orders`."""
    app = perdure.App(url)

    @app.workflow(name="ship")
    def ship(change: dict[str, Any]) -> int:
        return int(change["key"]["id"])

    app.on_table_change("orders", ship, on=["insert"])
    return app


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    build_app(sys.argv[1]).run_worker(concurrency=8, lease=2.0, grace=1.0, announce=True)
