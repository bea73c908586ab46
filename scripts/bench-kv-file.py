#!/usr/bin/env python3
"""Compute once, use many: what loading a saved KV cache (`kivi generate --kv-load`) saves
against prefilling the same long prompt again.

A prefix of TEXT that fills the context up to --room tokens is the long prompt. Each round
runs, alternating, in the same minutes:
  full:  generate -p "LONG FOLLOW-UP" -n 1           (the prefill a file spares, and more)
  save:  generate -p "LONG" -n 0 --kv-save FILE      (the prefill, once)
  load:  generate --kv-load FILE -p "FOLLOW-UP" -n 1 (load + the follow-up's prefill)
and the medians are printed: the long prompt's prefill, the time to the first token after
loading (load + follow-up prefill; model loading and sampling left out of both), and their
ratio. A benchmark, not a test: the load average is printed beside the numbers.

  scripts/bench-kv-file.py [--kivi build/bin/kivi] [-m MODEL] [-t TOKENIZER] [--text FILE]
                           [--ctx N] [--kv-cache FMT] [--rounds R] [--json]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("failed: %s\n%s" % (" ".join(cmd[:4]), r.stderr.strip()))
    return json.loads(r.stdout)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    shared = os.path.join(here, "..", "..", "shared")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kivi", default=os.path.join(here, "..", "build", "bin", "kivi"))
    ap.add_argument("-m", "--model", default=os.path.join(shared, "models", "stories260K.bin"))
    ap.add_argument("-t", "--tokenizer", default="")
    ap.add_argument("--text", default=os.path.join(shared, "data", "tinytales.txt"))
    ap.add_argument("--ctx", type=int, default=0, help="context (default: the model's)")
    ap.add_argument("--room", type=int, default=64, help="tokens left free after the long prompt")
    ap.add_argument("--kv-cache", default="kivi2")
    ap.add_argument("--follow", default=" And then the little dog said")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    base = [a.kivi, "generate", "-m", a.model, "--kv-cache", a.kv_cache, "--temp", "0", "--json"]
    if a.tokenizer:
        base += ["-t", a.tokenizer]
    if a.ctx:
        base += ["--ctx", str(a.ctx)]
    if a.ctx:
        ctx = a.ctx
    else:
        info = [a.kivi, "info", "-m", a.model, "--json"] + (["-t", a.tokenizer] if a.tokenizer else [])
        ctx = json.loads(subprocess.run(info, capture_output=True, text=True, check=True).stdout)[
            "context_length"]
    text = open(a.text, encoding="utf-8", errors="replace").read()
    target = ctx - a.room
    # The longest prefix of the text whose tokens fit the target (a binary search).
    lo, hi = 1, min(len(text), target * 8)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        n = count_tokens(base, text[:mid])
        if n is not None and n <= target:
            lo = mid
        else:
            hi = mid - 1
    prompt = text[:lo]
    rows = {"full": [], "prefill": [], "load": [], "follow": [], "ttft": [], "save": []}
    with tempfile.TemporaryDirectory() as d:
        kv = os.path.join(d, "long.kv")
        for r in range(a.rounds):
            full = run(base + ["-p", prompt + a.follow, "-n", "1"])
            save = run(base + ["-p", prompt, "-n", "0", "--kv-save", kv])
            load = run(base + ["--kv-load", kv, "-p", a.follow, "-n", "1"])
            rows["full"].append(full["prefill_ms"])
            rows["prefill"].append(save["prefill_ms"])
            rows["save"].append(save["kv_save_ms"])
            rows["load"].append(load["kv_load_ms"])
            rows["follow"].append(load["prefill_ms"])
            rows["ttft"].append(load["kv_load_ms"] + load["prefill_ms"])
        file_bytes = load["kv_file_bytes"]
        n_long, n_follow = save["prompt_tokens"], load["prompt_tokens"]
    med = {k: statistics.median(v) for k, v in rows.items()}
    res = {"model": a.model, "kv_cache": a.kv_cache, "ctx": ctx, "long_prompt_tokens": n_long,
           "follow_tokens": n_follow, "rounds": a.rounds, "file_bytes": file_bytes,
           "median_ms": med, "speedup": med["full"] / med["ttft"] if med["ttft"] else 0.0,
           "loadavg": os.getloadavg()[0]}
    if a.json:
        print(json.dumps(res))
        return
    print("%s, %s, ctx %d: long prompt %d tokens, follow-up %d tokens, file %.1f KiB, %d rounds (load average %.1f)"
          % (os.path.basename(a.model), a.kv_cache, ctx, n_long, n_follow, file_bytes / 1024, a.rounds,
             res["loadavg"]))
    print("  prefill long + follow-up   %9.2f ms (median)" % med["full"])
    print("  prefill long (saved once)  %9.2f ms, save %.2f ms" % (med["prefill"], med["save"]))
    print("  load + follow-up prefill   %9.2f ms (load %.2f, follow-up %.2f)"
          % (med["ttft"], med["load"], med["follow"]))
    print("  time to first token: %.1fx less after loading" % res["speedup"])


def count_tokens(base, prompt):
    """The prompt's tokens, or None when it does not fit the context."""
    r = subprocess.run(base + ["-p", prompt, "-n", "0"], capture_output=True, text=True)
    if r.returncode != 0:
        return None
    return json.loads(r.stdout)["prompt_tokens"]


if __name__ == "__main__":
    main()
