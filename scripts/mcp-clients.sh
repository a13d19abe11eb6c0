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
# The three are independent: installed side by side (most of the time is unpacking and
# compiling, not waiting), each job's log kept for a failure's message.
ts() {
  mkdir -p "$DIR/ts"
  (cd "$DIR/ts" && { [ -f package.json ] || echo '{"name":"perdure-mcp-clients","private":true,"type":"module"}' > package.json; } \
    && npm install --silent --no-audit --no-fund "$TS_SDK")
  echo "$TS_SDK" > "$DIR/ts/.stamp"
}
venv() {  # venv NAME "REQUIREMENTS"
  rm -rf "$DIR/$1"
  "$PY" -m venv "$DIR/$1"
  "$DIR/$1/bin/python" -m pip install -q $2
  echo "$2" > "$DIR/$1/.stamp"
}
pending=()
if [ "$(cat "$DIR/ts/.stamp" 2>/dev/null)" != "$TS_SDK" ]; then
  ts > "$DIR/ts.log" 2>&1 & pending+=("ts:$!")
fi
for spec in "fastmcp3 $FASTMCP3" "fastmcp4 $FASTMCP4"; do
  name=${spec%% *}; want=${spec#* }
  if [ "$(cat "$DIR/$name/.stamp" 2>/dev/null)" != "$want" ]; then
    venv "$name" "$want" > "$DIR/$name.log" 2>&1 & pending+=("$name:$!")
  fi
done
failed=0
for job in "${pending[@]}"; do
  if ! wait "${job#*:}"; then
    echo "installing the MCP client ${job%%:*} failed:" >&2
    tail -20 "$DIR/${job%%:*}.log" >&2
    failed=1
  fi
done
exit "$failed"
