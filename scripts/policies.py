#!/usr/bin/python3
"""Quality of the cache policies on one model and text, measured as deployed.

Three tables, as Markdown on stdout (progress on stderr):
  1. keys stored before or after RoPE, per format: perplexity, KL divergence against the
     f32 cache, top-1 agreement;
  2. cross-layer KV sharing: adjacent pairs (--kv-share 2) against the best map with as
     many borrowing layers found by a greedy search (each step adds the borrower:owner
     pair with the lowest KL divergence);
  3. generation past the context: streaming perplexity of the whole text through one
     session whose cache keeps a window of W tokens (--context-overflow window), with
     and without attention sinks, keys before and after RoPE, per format.

Usage: /usr/bin/python3 scripts/policies.py [--kivi build/bin/kivi] [-m MODEL] [-t TOK]
       [-f TEXT] [--json FILE] [--only rope,share,window]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORMATS = ("f16", "int8", "kivi4", "kivi2")


def run(kivi, base_args, extra):
    out = subprocess.run([kivi, "perplexity", *base_args, *extra, "--json"], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"kivi perplexity {' '.join(extra)} failed: {out.stderr.strip()}")
    return json.loads(out.stdout)


def layer_count(kivi, model, tok):
    out = subprocess.run([kivi, "info", "-m", model, "-t", tok, "--json"], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"kivi info failed: {out.stderr.strip()}")
    return json.loads(out.stdout)["n_layers"]


def rope_table(kivi, base_args, base):
    rows = []
    for fmt in ("f32",) + FORMATS:
        for where in ("post", "pre"):
            r = run(kivi, base_args, ["--kv-cache", fmt, "--key-rope", where, "--kld-base", base])
            rows.append({"format": fmt, "key_rope": where, **r})
            print(f"  {fmt:6s} keys {where}-RoPE: ppl {r['ppl']:.4f}", file=sys.stderr)
    print("### Keys before and after RoPE\n")
    print("| format | keys | perplexity | KL mean | KL p99 | top-1 agree |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['format']} | {r['key_rope']} RoPE | {r['ppl']:.4f} | {r['kld_mean']:.3g} | {r['kld_p99']:.3g} | "
              f"{r['top1_agree']:.2f}% |")
    print()
    return rows


def share_table(kivi, base_args, base, n_layers):
    def measure(opts):
        return run(kivi, base_args, ["--kv-cache", "f32", "--kld-base", base] + opts)

    rows = [{"config": "no sharing", "stored": n_layers, **measure([])}]
    rows.append({"config": "--kv-share 2 (adjacent pairs)", "stored": (n_layers + 1) // 2, **measure(["--kv-share", "2"])})
    borrowers_of_share2 = n_layers // 2
    chosen = []
    for _ in range(borrowers_of_share2):
        best = None
        borrowers = {b for b, _ in chosen}
        owners = {o for _, o in chosen}
        for b in range(1, n_layers):
            if b in borrowers or b in owners:  # an owner stores its own cache
                continue
            for o in range(b):
                if o in borrowers:
                    continue
                m = ",".join(f"{x}:{y}" for x, y in chosen + [(b, o)])
                r = measure(["--kv-share-map", m])
                print(f"  map {m:16s} KL {r['kld_mean']:.4f}", file=sys.stderr)
                if best is None or r["kld_mean"] < best[1]["kld_mean"]:
                    best = ((b, o), r)
        chosen.append(best[0])
    m = ",".join(f"{x}:{y}" for x, y in chosen)
    rows.append({"config": f"--kv-share-map {m} (best found)", "stored": n_layers - len(chosen),
                 **measure(["--kv-share-map", m])})
    print("### Cross-layer KV sharing (f32 cache)\n")
    print("| configuration | layers storing a cache | perplexity | KL mean | KL p99 | top-1 agree |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['config']} | {r['stored']} of {n_layers} | {r['ppl']:.4f} | "
              f"{r['kld_mean']:.3g} | {r['kld_p99']:.3g} | {r['top1_agree']:.2f}% |")
    print()
    return rows


def window_table(kivi, base_args):
    rows = []
    for fmt in ("f32",) + FORMATS:
        for where in ("pre", "post"):
            for w in (128, 256):
                for sinks in (0, 4):
                    r = run(kivi, base_args, ["--kv-cache", fmt, "--key-rope", where, "--context-overflow", "window",
                                              "--window", str(w), "--sinks", str(sinks), "--ctx", str(w + 128)])
                    rows.append({"format": fmt, "key_rope": where, "window": w, "sinks": sinks, **r})
                    print(f"  {fmt:6s} {where:4s} W={w} S={sinks}: ppl {r['ppl']:.4f}", file=sys.stderr)
    print("### Streaming through a window\n")
    print("| format | keys | W=128, no sinks | W=128, 4 sinks | W=256, no sinks | W=256, 4 sinks |")
    print("|---|---|---|---|---|---|")
    for fmt in ("f32",) + FORMATS:
        for where in ("pre", "post"):
            cells = [f"{r['ppl']:.4f}" for r in rows if r["format"] == fmt and r["key_rope"] == where]
            print(f"| {fmt} | {where} RoPE | " + " | ".join(cells) + " |")
    print()
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kivi", default=os.path.join(ROOT, "build", "bin", "kivi"))
    ap.add_argument("-m", "--model", default=os.path.join(ROOT, "..", "shared", "models", "stories260K.bin"))
    ap.add_argument("-t", "--tokenizer", default=os.path.join(ROOT, "..", "shared", "models", "tok512.bin"))
    ap.add_argument("-f", "--text", default=os.path.join(ROOT, "..", "shared", "data", "tinytales.txt"))
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--only", default="rope,share,window", help="tables to make (rope, share, window)")
    a = ap.parse_args()
    base_args = ["-m", a.model, "-t", a.tokenizer, "-f", a.text, "--threads", "1"]
    only = set(a.only.split(","))
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        base = os.path.join(tmp, "f32.lp")
        run(a.kivi, base_args, ["--kv-cache", "f32", "--save-logits", base])
        if "rope" in only:
            results["rope"] = rope_table(a.kivi, base_args, base)
        if "share" in only:
            results["share"] = share_table(a.kivi, base_args, base, layer_count(a.kivi, a.model, a.tokenizer))
    if "window" in only:
        results["window"] = window_table(a.kivi, base_args)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
