"""The App a worker process runs: `perdure --app refund_worker:app worker`, configured from
the environment: `PERDURE_DB` (the store), `REFUND_PAYMENTS_URL` and `REFUND_MAIL_URL` (the
stubs of refund_outside.py), `REFUND_MODEL` (see refund_app.build; default `function`) and
`REFUND_FRAMEWORKS` (comma-separated; default both) and `REFUND_PROBES` (`0`: no probes for
the `once` tools, so an interrupted call always waits for a person; default `1`)."""

from __future__ import annotations

import os

from refund_app import FRAMEWORKS, build
from refund_tools import Shop

import perdure

shop = Shop(os.environ.get("REFUND_PAYMENTS_URL", ""), os.environ.get("REFUND_MAIL_URL", ""))
frameworks = tuple(os.environ.get("REFUND_FRAMEWORKS", ",".join(FRAMEWORKS)).split(","))
probes = os.environ.get("REFUND_PROBES", "1") != "0"
refunds = build(perdure.App(), shop, os.environ.get("REFUND_MODEL", "function"), frameworks,
                probes)  # fmt: skip
app = refunds.app
