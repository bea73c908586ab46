#!/usr/bin/env bash
# Formats every tracked C++ file with .clang-format (clang-format 14, from Debian), or with
# --check lists the files that differ and exits non-zero.
set -euo pipefail
cd "$(dirname "$0")/.."
fmt="$(command -v clang-format-14 || command -v clang-format || true)"
if [ -z "$fmt" ]; then
  echo "format: clang-format-14 is not installed (scripts/setup.sh installs it)" >&2
  exit 1
fi
mapfile -t files < <(git ls-files '*.cpp' '*.h')
case "${1:-}" in
  --check) "$fmt" --dry-run -Werror "${files[@]}" && echo "format: ${#files[@]} files formatted" ;;
  "") "$fmt" -i "${files[@]}" ;;
  *) echo "usage: scripts/format.sh [--check]" >&2; exit 2 ;;
esac
