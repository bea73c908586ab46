#!/usr/bin/env bash
# Decode tokens/s with 1 and 2 threads, on the machine as it is ("idle") and with one
# competing busy process (`yes > /dev/null`), for one or more builds of kivi alternated in
# the same minutes (the build order flips every round). Prints one line per run, then the
# median and range per case. A benchmark, not a test: other load on the machine shows in
# the load-average column.
#
#   scripts/bench-threads.sh [-r ROUNDS] [-o OUT.tsv] LABEL=PATH/TO/kivi [LABEL=PATH ...]
#
# Models: stories260K (up to $KIVI_BENCH_N greedy tokens, default 200, fewer if it ends
# its text; $KIVI_MODEL or ../shared/models) and, when
# $KIVI_BENCH_1B names a GGUF (`kivi synth --preset llama-3.2-1b -o l1b.gguf`), the 1B shape
# (16 greedy tokens, $KIVI_BENCH_1B_N to change).
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=5
out=""
while getopts "r:o:" opt; do
  case $opt in
    r) rounds=$OPTARG ;;
    o) out=$OPTARG ;;
    *) echo "usage: $0 [-r ROUNDS] [-o OUT.tsv] LABEL=KIVI [LABEL=KIVI ...]" >&2; exit 1 ;;
  esac
done
shift $((OPTIND - 1))
if [ $# -lt 1 ]; then
  echo "usage: $0 [-r ROUNDS] [-o OUT.tsv] LABEL=KIVI [LABEL=KIVI ...]" >&2
  exit 1
fi
labels=() bins=()
for b in "$@"; do
  labels+=("${b%%=*}")
  bins+=("${b#*=}")
  [ -x "${b#*=}" ] || { echo "not an executable: ${b#*=}" >&2; exit 1; }
done

shared=../shared/models
small=${KIVI_MODEL:-$shared/stories260K.bin}
models=("stories260K|-m $small|${KIVI_BENCH_N:-200}")
if [ -n "${KIVI_BENCH_1B:-}" ]; then
  models+=("1B|-m $KIVI_BENCH_1B|${KIVI_BENCH_1B_N:-16}")
fi
[ -n "$out" ] || out=$(mktemp /tmp/bench-threads.XXXXXX.tsv)
printf "round\tload\tmodel\tbusy\tbuild\tthreads\tdecode_tps\n" > "$out"

busy_pid=""
cleanup() { [ -z "$busy_pid" ] || kill "$busy_pid" 2>/dev/null || true; }
trap cleanup EXIT

run_one() {  # round model-entry busy build-index threads
  local name args n tps load
  IFS='|' read -r name args n <<< "$2"
  # shellcheck disable=SC2086
  tps=$("${bins[$4]}" generate $args -p "Once upon a time" -n "$n" --temp 0 --threads "$5" --json 2>/dev/null |
        grep -o '"decode_tps":[0-9.e+-]*' | cut -d: -f2)
  load=$(cut -d' ' -f1 /proc/loadavg)
  printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\n" "$1" "$load" "$name" "$3" "${labels[$4]}" "$5" "$tps" | tee -a "$out"
}

# Warm the page cache (the 1B file is a few GB) before the first timed run.
for m in "${models[@]}"; do
  IFS='|' read -r _ args _ <<< "$m"
  # shellcheck disable=SC2086
  "${bins[0]}" generate $args -p "Once" -n 1 --temp 0 > /dev/null 2>&1
done

for ((r = 1; r <= rounds; ++r)); do
  order=()
  for ((i = 0; i < ${#bins[@]}; ++i)); do order+=("$i"); done
  if ((r % 2 == 0)); then
    rev=()
    for ((i = ${#order[@]} - 1; i >= 0; --i)); do rev+=("${order[$i]}"); done
    order=("${rev[@]}")
  fi
  for busy in 0 1; do
    if ((busy)); then
      yes > /dev/null &
      busy_pid=$!
      sleep 0.2
    fi
    for m in "${models[@]}"; do
      for b in "${order[@]}"; do
        for t in 1 2; do run_one "$r" "$m" "$busy" "$b" "$t"; done
      done
    done
    if ((busy)); then
      kill "$busy_pid"
      wait "$busy_pid" 2>/dev/null || true
      busy_pid=""
    fi
  done
done

echo "runs: $out"
/usr/bin/python3 - "$out" <<'EOF'
# Medians and ranges per case; "2T / 1T" is the median over rounds of 2 threads' speed over
# 1 thread's in the same round (run back to back), which cancels slow minutes of the machine.
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
tps = {(r["round"], r["model"], r["busy"], r["build"], r["threads"]): float(r["decode_tps"])
       for r in rows if r["decode_tps"]}
def fmt(v):
    return f"{v:,.0f}" if v >= 100 else f"{v:.2f}"
def cell(v):
    return f"{fmt(statistics.median(v))} ({fmt(min(v))}-{fmt(max(v))})" if v else "-"
def values(m, b, t, busy):
    return [v for k, v in tps.items() if k[1:] == (m, busy, b, t)]
def paired(m, b, busy):
    rounds = sorted({k[0] for k in tps})
    r = [tps[(x, m, busy, b, "2")] / tps[(x, m, busy, b, "1")] for x in rounds
         if (x, m, busy, b, "2") in tps and (x, m, busy, b, "1") in tps]
    return f"{statistics.median(r):.2f}" if r else "-"
print("| model | build | threads | as is: median (range) | one core busy: median (range) | busy / as is | 2T / 1T as is, busy |")
print("|---|---|---|---|---|---|---|")
for m, b, t in sorted({(k[1], k[3], k[4]) for k in tps}, key=lambda k: (k[0] != "stories260K", k)):
    idle, busy = values(m, b, t, "0"), values(m, b, t, "1")
    ratio = f"{statistics.median(busy) / statistics.median(idle):.2f}" if idle and busy else "-"
    pair = f"{paired(m, b, '0')}, {paired(m, b, '1')}" if t == "2" else ""
    print(f"| {m} | {b} | {t} | {cell(idle)} | {cell(busy)} | {ratio} | {pair} |")
EOF
