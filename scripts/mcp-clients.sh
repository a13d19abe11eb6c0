#!/usr/bin/env bash
# The real MCP clients the conformance tests drive (tests/mcp_conformance): the official TypeScript SDK
# (npm), FastMCP 3.x (protocol 2025-11-25) and FastMCP 4.x (2026-07-28, tasks extension),
# each in a folder of its own under .mcp-clients/. Kept once installed (a stamp per client).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DIR=.mcp-clients
TS_SDK="@modelcontextprotocol/sdk@1.32.2"
FASTMCP3="fastmcp==3.4.11"
FASTMCP4="fastmcp==4.1.4 fastmcp-tasks==4.1.4"
mkdir -p "$DIR"
if [ "$(cat "$DIR/ts/.stamp" 2>/dev/null)" != "$TS_SDK" ]; then
  mkdir -p "$DIR/ts"
  (cd "$DIR/ts" && { [ -f package.json ] || echo '{"name":"perdure-mcp-clients","private":true,"type":"module"}' > package.json; } \
    && npm install --silent --no-audit --no-fund "$TS_SDK")
  echo "$TS_SDK" > "$DIR/ts/.stamp"
fi
for spec in "fastmcp3 $FASTMCP3" "fastmcp4 $FASTMCP4"; do
  name=${spec%% *}; want=${spec#* }
  if [ "$(cat "$DIR/$name/.stamp" 2>/dev/null)" != "$want" ]; then
    rm -rf "$DIR/$name"
    "$PY" -m venv "$DIR/$name"
    "$DIR/$name/bin/python" -m pip install -q $want
    echo "$want" > "$DIR/$name/.stamp"
  fi
done
