#!/usr/bin/python3
"""Quality of every KV cache format on one model and text, measured as deployed.

Runs `kivi perplexity` (streaming) once with an f32 cache, saving its log-probabilities,
then once per format configuration with --kld-base, and prints Markdown tables:
perplexity, KL divergence against f32 (mean, p99), top-1 agreement and bits per element
(scales included). --json FILE also writes the raw results (for scripts/plot.py).

Usage: /usr/bin/python3 scripts/quality.py [--kivi build/bin/kivi] [-m MODEL] [-t TOK]
       [-f TEXT] [--json docs/img/quality.json]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(kivi, base_args, extra):
    out = subprocess.run([kivi, "perplexity", *base_args, *extra, "--json"], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"kivi perplexity {' '.join(extra)} failed: {out.stderr.strip()}")
    return json.loads(out.stdout)


def configs():
    """(label, options) for every configuration in the tables."""
    rows = [("f32", ["--kv-cache", "f32"]), ("f16", ["--kv-cache", "f16"])]
    for g in ("tensor", "token", "head", "group"):
        rows.append((f"int8/{g}", ["--kv-cache", "int8", "--int8-granularity", g, "-G", "32"]))
    for fmt in ("kivi8", "kivi4", "kivi2"):
        for G in (32, 64):
            for R in (0, 32, 128):
                if R % G:
                    continue
                for flush in ("batch", "group"):
                    rows.append((f"{fmt} G={G} R={R} {flush}",
                                 ["--kv-cache", fmt, "-G", str(G), "-R", str(R), "--key-flush", flush]))
    rows.append(("K kivi4 / V kivi2 G=32 R=128", ["--kv-cache-k", "kivi4", "--kv-cache-v", "kivi2", "-G", "32", "-R", "128"]))
    rows.append(("K int8 / V kivi4 G=32 R=128", ["--kv-cache-k", "int8", "--kv-cache-v", "kivi4", "-G", "32", "-R", "128"]))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kivi", default=os.path.join(ROOT, "build", "bin", "kivi"))
    ap.add_argument("-m", "--model", default=os.path.join(ROOT, "..", "shared", "models", "stories260K.bin"))
    ap.add_argument("-t", "--tokenizer", default=os.path.join(ROOT, "..", "shared", "models", "tok512.bin"))
    ap.add_argument("-f", "--text", default=os.path.join(ROOT, "..", "shared", "data", "tinytales.txt"))
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args()
    base_args = ["-m", a.model, "-t", a.tokenizer, "-f", a.text]
    with tempfile.TemporaryDirectory() as tmp:
        base = os.path.join(tmp, "f32.lp")
        run(a.kivi, base_args, ["--kv-cache", "f32", "--save-logits", base])
        results = []
        for label, opts in configs():
            r = run(a.kivi, base_args, opts + ["--kld-base", base])
            r["label"] = label
            results.append(r)
            print(f"  {label:32s} ppl {r['ppl']:.4f}  kld {r['kld_mean']:.5f}", file=sys.stderr)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    tokens = results[0]["tokens"]
    print(f"Streaming perplexity of {os.path.basename(a.text)} ({tokens} tokens) with "
          f"{os.path.basename(a.model)}; KL divergence and top-1 agreement against the f32 cache.\n")
    print("| configuration | bits/elem K | bits/elem V | perplexity | KL mean | KL p99 | top-1 agree | first disagreement |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        first = r['first_disagree'] if r['first_disagree'] >= 0 else "none"
        print(f"| {r['label']} | {r['bits_per_element_k']:.3g} | {r['bits_per_element_v']:.3g} | {r['ppl']:.4f} | "
              f"{r['kld_mean']:.3g} | {r['kld_p99']:.3g} | {r['top1_agree']:.2f}% | {first} |")


if __name__ == "__main__":
    main()
