#!/usr/bin/env bash
# Installs llama.cpp as the npm package node-llama-cpp 3.22.1 with only its prebuilt
# x86-64 CPU binaries (@node-llama-cpp/linux-x64; optional GPU builds omitted, about
# 70 MB in all) into tests/reference/node_modules, for tests/reference/check_llamacpp.py.
# Nothing is committed; the test skips with a message when the package is missing.
set -euo pipefail
dir="$(cd "$(dirname "$0")/.." && pwd)/tests/reference"
if [ -f "$dir/node_modules/node-llama-cpp/package.json" ] && [ -d "$dir/node_modules/@node-llama-cpp/linux-x64" ]; then
  echo "setup-llamacpp-ref: node-llama-cpp is installed"
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "setup-llamacpp-ref: npm is not installed; the llama.cpp reference test will skip" >&2
  exit 1
fi
echo "setup-llamacpp-ref: npm install in $dir"
npm install --prefix "$dir" --no-audit --no-fund --no-save --ignore-scripts --omit=optional >/dev/null
