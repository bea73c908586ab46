#!/usr/bin/env bash
# Downloads stories260K and its tokenizer (Andrej Karpathy's tinyllamas for llama2.c,
# MIT licence, "Copyright (c) 2023 Andrej") into models/, checking their sha256.
# Needs network access to huggingface.co; where there is none, point kivi at an
# existing copy instead: -m PATH, $KIVI_MODEL, or ../shared/models/.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p models
base="https://huggingface.co/karpathy/tinyllamas/resolve/main/stories260K"
declare -A sums=(
  [stories260K.bin]=b0a507e7ad0f626624f17112325e66691f9076d622e1d3274d103d00299f2696
  [tok512.bin]=037cb335abb25d1fa9e8ecae30ed2a3a8ace9302862ebcdc05d51a6bbb10c312
)
status=0
for f in stories260K.bin tok512.bin; do
  if [ -f "models/$f" ] && echo "${sums[$f]}  models/$f" | sha256sum -c --quiet 2>/dev/null; then
    echo "get-model: models/$f already present and verified"
    continue
  fi
  echo "get-model: downloading $base/$f"
  if command -v curl >/dev/null 2>&1; then
    fetch=(curl -fsSL --connect-timeout 15 --retry 2 -o "models/$f.part" "$base/$f")
  else
    fetch=(wget -q -T 15 -O "models/$f.part" "$base/$f")
  fi
  if ! "${fetch[@]}"; then
    rm -f "models/$f.part"
    echo "get-model: could not download $f (no network access to huggingface.co?)." >&2
    echo "get-model: copy it from another machine into models/, or use -m PATH / \$KIVI_MODEL;" >&2
    echo "get-model: this checkout also finds ../shared/models/$f if it exists." >&2
    status=1
    continue
  fi
  if ! echo "${sums[$f]}  models/$f.part" | sha256sum -c --quiet; then
    echo "get-model: checksum mismatch for $f; not installed" >&2
    rm -f "models/$f.part"
    status=1
    continue
  fi
  mv "models/$f.part" "models/$f"
  echo "get-model: models/$f verified"
done
exit $status
