#!/usr/bin/python3
"""scripts/plot.py on real (small) outputs of the engine: bench-attn, bench and a
perplexity sweep with KL divergence are produced with the CLI, then every chart must be
written as a PNG, and a file of the wrong kind must be a one-line error.

Usage: /usr/bin/python3 tests/test_plot.py --kivi build/bin/kivi --shared ../shared
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {r.returncode}: {r.stderr.strip()}")
    return r.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kivi", required=True)
    ap.add_argument("--shared", required=True)
    a = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    plot = os.path.join(here, "..", "scripts", "plot.py")
    model = ["-m", os.path.join(a.shared, "models", "stories260K.bin"), "-t", os.path.join(a.shared, "models", "tok512.bin")]
    text = os.path.join(a.shared, "data", "tinytales.txt")
    with tempfile.TemporaryDirectory() as d:
        attn = os.path.join(d, "attn.json")
        with open(attn, "w") as f:
            f.write(run([a.kivi, "bench-attn", "--ctx", "256,1024", "--reps", "2", "--heads", "8", "--kv-heads", "2",
                         "--head-dim", "64", "--threads", "1", "--json"]))
        bench = os.path.join(d, "bench.json")
        with open(bench, "w") as f:
            f.write(run([a.kivi, "bench", *model, "-n", "10", "--ctx-fill", "150", "--threads", "1", "--json"]))
        bench2 = os.path.join(d, "bench2.json")
        with open(bench2, "w") as f:
            f.write(run([a.kivi, "bench", *model, "-n", "10", "--ctx-fill", "300", "--ctx-fill-random", "--threads", "1",
                         "--json"]))
        base = os.path.join(d, "base.lp")
        run([a.kivi, "perplexity", *model, "-f", text, "--ctx", "128", "--save-logits", base, "--json"])
        sweep = [json.loads(run([a.kivi, "perplexity", *model, "-f", text, "--ctx", "128", "--kv-cache", fmt, "-R", "32",
                                 "--kld-base", base, "--json"])) for fmt in ("f32", "f16", "int8", "kivi4", "kivi2")]
        quality = os.path.join(d, "quality.json")
        with open(quality, "w") as f:
            json.dump(sweep, f)
        out = os.path.join(d, "img")
        for args in (["--bench-attn", attn, "--bench", bench, "--quality", quality], ["--bench", bench, bench2]):
            r = subprocess.run([sys.executable, plot, *args, "--out", out], capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit(f"FAIL: plot.py {' '.join(args)}: {r.stderr.strip()}")
        for name in ("attn_time_vs_ctx.png", "bench_decode.png", "quality.png"):
            p = os.path.join(out, name)
            with open(p, "rb") as f:
                head = f.read(8)
            if head != b"\x89PNG\r\n\x1a\n" or os.path.getsize(p) < 10000:
                sys.exit(f"FAIL: {p} is not a chart")
        r = subprocess.run([sys.executable, plot, "--bench", attn, "--out", out], capture_output=True, text=True)
        if r.returncode != 1 or not r.stderr.startswith("plot.py: error:") or r.stderr.count("\n") != 1:
            sys.exit(f"FAIL: a bench-attn file given as --bench should be a one-line error, got {r.returncode}: {r.stderr}")
        # An input that is also an output (here: a chart's name in --out) is refused and
        # left as it was, and a failed run leaves the previous charts and no temporary file.
        victim = os.path.join(out, "bench_decode.png")
        with open(bench, "rb") as f:
            bench_bytes = f.read()
        with open(victim, "wb") as f:
            f.write(bench_bytes)
        r = subprocess.run([sys.executable, plot, "--bench", victim, "--out", out], capture_output=True, text=True)
        if r.returncode != 1 or "is the same file as the input" not in r.stderr:
            sys.exit(f"FAIL: an input named as an output should be refused, got {r.returncode}: {r.stderr}")
        with open(victim, "rb") as f:
            if f.read() != bench_bytes:
                sys.exit("FAIL: plot.py overwrote its input")
        before = sorted(os.listdir(out))
        r = subprocess.run([sys.executable, plot, "--bench", bench, "--quality", attn, "--out", out],
                           capture_output=True, text=True)
        if r.returncode != 1 or sorted(os.listdir(out)) != before:
            sys.exit(f"FAIL: a failed run should leave the folder as it was: {before} -> {sorted(os.listdir(out))}")
        # sparse_quality.py's JSON: two selections at two budgets, from real runs.
        sparse_rows = []
        for T in (32, 64):
            for sel, opts in (("quest", ["--sparse", "quest", "--sparse-budget", str(T - 8)]),
                              ("random", ["--sparse", "random", "--sparse-budget", str(T - 8)])):
                r = json.loads(run([a.kivi, "perplexity", *model, "-f", text, "--ctx", "128", "--sparse-block", "8",
                                    "--sparse-sinks", "4", "--sparse-local", "4", *opts, "--kld-base", base,
                                    "--json"]))
                r.update(cache="f32", budget=T, selection=sel)
                sparse_rows.append(r)
        sparse = os.path.join(d, "sparse.json")
        with open(sparse, "w") as f:
            json.dump(sparse_rows, f)
        r = subprocess.run([sys.executable, plot, "--sparse", sparse, "--out", out], capture_output=True, text=True)
        p = os.path.join(out, "sparse_quality.png")
        if r.returncode != 0 or not os.path.exists(p) or os.path.getsize(p) < 10000:
            sys.exit(f"FAIL: plot.py --sparse: {r.stderr.strip()}")
        r = subprocess.run([sys.executable, plot, "--sparse", quality, "--out", out], capture_output=True, text=True)
        if r.returncode != 1 or not r.stderr.startswith("plot.py: error:"):
            sys.exit(f"FAIL: a perplexity list given as --sparse should be a one-line error: {r.stderr}")
        # bench-attn --no-probe has no floor (null): still a chart.
        attn_np = os.path.join(d, "attn_np.json")
        with open(attn_np, "w") as f:
            f.write(run([a.kivi, "bench-attn", "--ctx", "256,512", "--reps", "1", "--heads", "4", "--kv-heads", "2",
                         "--head-dim", "64", "--threads", "1", "--no-probe", "--json"]))
        r = subprocess.run([sys.executable, plot, "--bench-attn", attn_np, "--out", out], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"FAIL: plot.py on bench-attn --no-probe: {r.stderr.strip()}")
    print("plot.py: 4 charts written from real outputs; wrong input reported; inputs never overwritten")


if __name__ == "__main__":
    main()
