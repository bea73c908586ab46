#!/usr/bin/env bash
# Decode speed of kivi.cpp and llama.cpp itself (node-llama-cpp, scripts/setup-llamacpp-ref.sh)
# on the same GGUF file, same prompt ids and thread count, alternating round by round (the
# order flips each round) so that both see the same machine load. Prints one line per round
# and the median tokens/s of each and of their ratio. Options after THREADS go to kivi.cpp
# (e.g. --copy-weights).
#   scripts/bench-vs-llamacpp.sh MODEL.gguf [ROUNDS=5] [TOKENS=32] [THREADS=2] [KIVI OPTION...]
set -euo pipefail
cd "$(dirname "$0")/.."
model="$1"; rounds="${2:-5}"; n="${3:-32}"; threads="${4:-2}"
shift $(($# < 4 ? $# : 4)); extra=("$@")
kivi=build/bin/kivi
ref=tests/reference
[ -f "$ref/node_modules/node-llama-cpp/package.json" ] || { echo "run scripts/setup-llamacpp-ref.sh first" >&2; exit 1; }
ids="$("$kivi" generate -m "$model" -p "Once upon a time" -n 1 --temp 0 --json 2>/dev/null |
       /usr/bin/python3 -c 'import json,sys; print(",".join(map(str, json.load(sys.stdin)["prompt_token_ids"])))')"
kivi_run() {
  "$kivi" generate -m "$model" -p "Once upon a time" -n "$n" --temp 0 --ignore-eos --threads "$threads" --ctx 512 \
      ${extra[@]+"${extra[@]}"} --json 2>/dev/null | /usr/bin/python3 -c 'import json,sys; print("%.3f" % json.load(sys.stdin)["decode_tps"])'
}
llama_run() {
  (cd "$ref" && node llamacpp_decode_speed.mjs "$model" "$n" "$threads" "$ids") |
      tail -1 | /usr/bin/python3 -c 'import json,sys; print("%.3f" % json.load(sys.stdin)["decode_tps"])'
}
model="$(realpath "$model")"
echo "model $model, $n tokens, $threads threads, $rounds rounds (decode tokens/s)${extra[*]:+, kivi.cpp ${extra[*]}}"
k_all=(); l_all=()
for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) -eq 1 ]; then k=$(kivi_run); l=$(llama_run); else l=$(llama_run); k=$(kivi_run); fi
  k_all+=("$k"); l_all+=("$l")
  echo "round $r: kivi.cpp $k  llama.cpp $l  ratio $(/usr/bin/python3 -c "print('%.2f' % ($k / $l))")"
done
/usr/bin/python3 - "${k_all[*]}" "${l_all[*]}" <<'PY'
import statistics, sys
k = [float(x) for x in sys.argv[1].split()]
l = [float(x) for x in sys.argv[2].split()]
r = [a / b for a, b in zip(k, l)]
print("median: kivi.cpp %.2f (%.2f-%.2f)  llama.cpp %.2f (%.2f-%.2f)  ratio %.2f (%.2f-%.2f)" % (
    statistics.median(k), min(k), max(k), statistics.median(l), min(l), max(l), statistics.median(r), min(r), max(r)))
PY
