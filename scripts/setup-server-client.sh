#!/usr/bin/env bash
# Installs the official OpenAI JavaScript client (npm package openai, Apache-2.0) and the
# JSON-schema validator ajv (MIT) into
# tests/server_js/node_modules for the server test that drives `kivi serve` with it.
# Nothing is committed; the test skips with a message when npm cannot reach its registry.
set -euo pipefail
dir="$(cd "$(dirname "$0")/.." && pwd)/tests/server_js"
if [ -f "$dir/node_modules/openai/package.json" ] && [ -f "$dir/node_modules/ajv/package.json" ]; then
  echo "setup-server-client: the OpenAI client and ajv are installed"
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "setup-server-client: npm is not installed; the OpenAI client test will skip" >&2
  exit 1
fi
echo "setup-server-client: npm install in $dir"
npm install --prefix "$dir" --no-audit --no-fund --no-save --ignore-scripts >/dev/null
