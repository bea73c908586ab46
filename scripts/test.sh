#!/usr/bin/env bash
# Installs dependencies, builds, and runs every test:
#   1. the release build's unit, end-to-end and reference tests (the perplexity
#      reference in --strict mode, see tests/CMakeLists.txt);
#   2. the same tests built with AddressSanitizer + UndefinedBehaviorSanitizer;
#   3. each libFuzzer target for a bounded time (KIVI_FUZZ_SECONDS, default 30);
#   and first, that every C++ file is formatted as .clang-format says (scripts/format.sh).
# Every build treats compiler warnings as errors (KIVI_WERROR=ON).
set -euo pipefail
export KIVI_WERROR=ON
cd "$(dirname "$0")/.."
jobs="$(nproc 2>/dev/null || echo 2)"
start=$(date +%s)
step() { echo; echo "== $* ($(( $(date +%s) - start ))s)"; }

step "setup"
scripts/setup.sh

step "format check"
scripts/format.sh --check

step "release build"
scripts/build.sh release
step "release tests"
ctest --preset release -j "$jobs"

step "sanitizer build (ASan + UBSan)"
scripts/build.sh sanitize
step "sanitizer tests"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --preset sanitize -j "$jobs"

step "fuzzers"
scripts/build.sh fuzz
seconds="${KIVI_FUZZ_SECONDS:-30}"
corpus="build-fuzz/corpus"
/usr/bin/python3 tests/fuzz/make_seeds.py "$corpus"
for f in gguf llama2c model tokenizer bpe openai_request grammar kv_file; do
  echo "-- fuzz_$f for ${seconds}s"
  mkdir -p "$corpus/$f.out"
  build-fuzz/bin/fuzz_$f -max_total_time="$seconds" -max_len=8192 -rss_limit_mb=2048 \
    -artifact_prefix="build-fuzz/crash-$f-" "$corpus/$f.out" "$corpus/$f" 2>&1 | tail -n 3
done

step "all tests passed"
