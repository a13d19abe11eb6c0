#!/usr/bin/env bash
# The main job: the inbox agent on the embedded SQLite store, with the local model
# (no key, no network). `bash scripts/demo.sh --model scripted` runs without any model,
# on a bare install of perdure. The demo's venv is .venv-demo, apart from the test venv,
# and holds only what the chosen model needs.
set -euo pipefail
cd "$(dirname "$0")/.."
model=local
if [ "${1:-}" = "--model" ] && [ -n "${2:-}" ]; then model=$2; fi
case "$model" in
  local|local-large) extras=local ;;
  local-small) extras=local-small ;;
  scripted) extras= ;;
  *) extras=models ;;
esac
PERDURE_VENV=.venv-demo scripts/setup.sh "$extras"
exec .venv-demo/bin/python examples/inbox/demo.py --model "$model"
