#!/usr/bin/env bash
# Create .venv (if missing) and install perdure with the given extras, e.g. `scripts/setup.sh dev`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
fi
extras=${1:-}
if [ -n "$extras" ]; then target=".[$extras]"; else target="."; fi
.venv/bin/python -m pip install -q -e "$target"
