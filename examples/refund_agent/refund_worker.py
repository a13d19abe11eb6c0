"""The App a worker process runs: `perdure --app refund_worker:app worker`, configured from
the environment: `PERDURE_DB` (the store), `REFUND_PAYMENTS_URL` and `REFUND_MAIL_URL` (the
stubs of refund_outside.py), `REFUND_MODEL` (see refund_app.build; default `function`) and
`REFUND_FRAMEWORKS` (comma-separated; default both), `REFUND_HOLD` (seconds a tool body
holds around its effect, `LO,HI`, drawn uniformly; default `0.02,0.1`) and
`REFUND_PROBES` (`0`: no probes for the `once` tools, so an interrupted call always waits
for a person; default `1`)."""

from __future__ import annotations

import os

from refund_app import FRAMEWORKS, build
from refund_tools import Shop

import perdure

hold = tuple(float(s) for s in os.environ.get("REFUND_HOLD", "0.02,0.1").split(","))
shop = Shop(os.environ.get("REFUND_PAYMENTS_URL", ""), os.environ.get("REFUND_MAIL_URL", ""),
            (hold[0], hold[1]))  # fmt: skip
frameworks = tuple(os.environ.get("REFUND_FRAMEWORKS", ",".join(FRAMEWORKS)).split(","))
probes = os.environ.get("REFUND_PROBES", "1") != "0"
refunds = build(perdure.App(), shop, os.environ.get("REFUND_MODEL", "function"), frameworks,
                probes)  # fmt: skip
app = refunds.app
