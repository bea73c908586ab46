#!/usr/bin/env bash
# Configures and builds one CMake preset (default: release) into build*/.
# KIVI_WERROR=ON treats compiler warnings as errors (scripts/test.sh sets it).
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-release}"
jobs="$(nproc 2>/dev/null || echo 2)"
cmake --preset "$preset" -DKIVI_WERROR="${KIVI_WERROR:-OFF}" >/dev/null
cmake --build --preset "$preset" -j "$jobs"
