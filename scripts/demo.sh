#!/usr/bin/env bash
# The main job: the inbox agent on the embedded SQLite store, with the local model
# (no key, no network). `bash scripts/demo.sh --model scripted` runs without any model.
set -euo pipefail
cd "$(dirname "$0")/.."
model=local
if [ "${1:-}" = "--model" ] && [ -n "${2:-}" ]; then model=$2; fi
if [ "$model" = local ]; then scripts/setup.sh local; else scripts/setup.sh models; fi
exec .venv/bin/python examples/inbox/demo.py --model "$model"
