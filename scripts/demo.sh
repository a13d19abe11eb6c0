#!/usr/bin/env bash
# The main job: set up, then run the crash-and-resume demo on the embedded SQLite store.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python examples/crash_resume/demo.py
