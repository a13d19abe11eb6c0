#!/usr/bin/env bash
# The whole test suite: set up, lint (ruff), type-check (mypy --strict), then every test
# including the slow chaos suite. Extra arguments go to pytest (e.g. -m "not slow").
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh dev,docs,postgres,server,models,mcp,local,local-small,observe,openai-agents,pydantic-ai,claude-agent,rabbitmq,nats,redis,mqtt,kafka
.venv/bin/ruff check src tests bench examples
.venv/bin/ruff format --check src tests bench examples
.venv/bin/mypy
set +e
.venv/bin/pytest --durations=30 "$@"  # the slowest tests, to keep CI near 35 minutes
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: failing on purpose" >&2
  exit 1
fi
exit "$status"
