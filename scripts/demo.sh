#!/usr/bin/env bash
# Installs dependencies, builds, and generates text from the default model
# (stories260K) with the prompt "Once upon a time".
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh release
echo
echo "== kivi generate (greedy, f32 KV cache): the text llama2.c publishes for stories260K =="
build/bin/kivi generate -p "Once upon a time" --temp 0 -n 56
echo
echo "== the same prompt with a KIVI 2-bit KV cache (G=32, R=32) =="
build/bin/kivi generate -p "Once upon a time" --temp 0 -n 56 --kv-cache kivi2 --residual 32
