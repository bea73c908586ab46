#!/usr/bin/python3
"""Quality of block-sparse attention at fixed token budgets, against dense attention on
the same cache.

For each cache format: `kivi perplexity` (streaming, --ctx 512) with dense attention saves
its log-probabilities; then, per budget (a share of the context, in tokens T per KV head
and step), three selections of T tokens run with --kld-base:
  quest      sinks 16 + local 16 + the top (T - 32) / 16 blocks of 16 by the Quest bound
  max, mean  the same with the max or mean representative
  fix        the same with the mean of the keys at offsets 0, 4, 8, 12 of each block
  streaming  sinks 16 + local T - 16, no selected blocks (StreamingLLM)
  random     sinks 16 + local 16 + (T - 32) / 16 random blocks
and prints one Markdown table per format: perplexity, KL divergence against dense (mean,
p99), top-1 agreement and the share of the tokens actually attended (tokens early in a
chunk see fewer than T). The texts: the shared tinytales.txt and --stories N stories
sampled from the model (temperature 1, seeds 1..N), which give more tokens to average.

Usage: /usr/bin/python3 scripts/sparse_quality.py [--kivi build/bin/kivi] [--stories 20]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CTX, BLOCK, SINKS, LOCAL = 512, 16, 16, 16
PROMPT, WINDOW = 384, 16


def kivi(exe, args):
    out = subprocess.run([exe, *args], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"kivi {' '.join(args)} failed: {out.stderr.strip()}")
    return out.stdout


def methods(T):
    blocks = ["--sparse-block", str(BLOCK), "--sparse-sinks", str(SINKS)]
    sel = blocks + ["--sparse-budget", str(T - SINKS - LOCAL), "--sparse-local", str(LOCAL)]
    return [("quest", ["--sparse", "quest", *sel]), ("max", ["--sparse", "max", *sel]),
            ("mean", ["--sparse", "mean", *sel]), ("fix", ["--sparse", "fix", *sel]),
            ("streaming", ["--sparse", "quest", *blocks, "--sparse-budget", "0", "--sparse-local", str(T - SINKS)]),
            ("random", ["--sparse", "random", *sel])]


def policies(T):
    sel = ["--sparse", "quest", "--sparse-block", str(BLOCK), "--sparse-sinks", str(SINKS),
           "--sparse-budget", str(T - SINKS - LOCAL), "--sparse-local", str(LOCAL)]
    prompt = ["--prompt", str(PROMPT)]
    return [("per", sel), ("shared", [*sel, "--sparse-heads", "shared"]),
            ("reselect 4", [*sel, "--sparse-reselect", "4"]),
            ("reselect 16", [*sel, "--sparse-reselect", "16"]),
            ("reuse-layers 2", [*sel, "--sparse-reuse-layers", "2"]),
            (f"prompt {PROMPT}", [*sel, *prompt]),
            (f"prompt {PROMPT} + preselect", [*sel, *prompt, "--sparse-preselect", str(WINDOW),
                                              "--sparse-candidates", str(2 * T)])]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kivi", default=os.path.join(ROOT, "build", "bin", "kivi"))
    ap.add_argument("-m", "--model", default=os.path.join(ROOT, "..", "shared", "models", "stories260K.bin"))
    ap.add_argument("-t", "--tokenizer", default=os.path.join(ROOT, "..", "shared", "models", "tok512.bin"))
    ap.add_argument("-f", "--text", default=os.path.join(ROOT, "..", "shared", "data", "tinytales.txt"))
    ap.add_argument("--stories", type=int, default=20, help="stories sampled from the model and appended")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--policies", action="store_true", help="compare selection policies (see above)")
    a = ap.parse_args()
    model = ["-m", a.model, "-t", a.tokenizer]
    caches = [("kivi2 G=16 R=16", ["--kv-cache", "kivi2", "-G", "16", "-R", "16"]), ("f16", ["--kv-cache", "f16"])]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        text = open(a.text, encoding="utf-8").read()
        for seed in range(1, a.stories + 1):
            g = json.loads(kivi(a.kivi, ["generate", *model, "-p", "Once upon a time", "-n", str(CTX - 12),
                                         "--temp", "1", "--seed", str(seed), "--json"]))
            text += "\n" + g["text"]
        path = os.path.join(tmp, "text.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        for cname, copts in caches:
            base = os.path.join(tmp, "dense.lp")
            common = ["perplexity", *model, "-f", path, "--ctx", str(CTX), *copts, "--json"]
            dense = json.loads(kivi(a.kivi, [*common, "--save-logits", base]))
            print(f"\n{cname}: dense perplexity {dense['ppl']:.4f} over {dense['tokens']} tokens\n")
            print("| budget | selection | perplexity | KL mean | KL p99 | top-1 agree | attended |")
            print("|---|---|---|---|---|---|---|")
            for share in (0.125, 0.25, 0.5):
                T = int(CTX * share)
                for name, opts in (policies(T) if a.policies else methods(T)):
                    r = json.loads(kivi(a.kivi, [*common, *opts, "--kld-base", base]))
                    r.update(cache=cname, budget=T, selection=name, dense_ppl=dense["ppl"])
                    results.append(r)
                    print(f"| {T} ({share:.1%}) | {name} | {r['ppl']:.4f} | {r['kld_mean']:.5f} | {r['kld_p99']:.4f} | "
                          f"{r['top1_agree']:.1f}% | {100 * r['sparse_attended_fraction']:.1f}% |", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
