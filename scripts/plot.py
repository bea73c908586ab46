#!/usr/bin/python3
"""Charts of kivi.cpp measurements, written as PNG files.

Inputs (each optional, each may be given several files):
  --bench-attn FILE  `kivi bench-attn --json`: decode-attention time per call against the
                     context length, per format (log-log), with each format's bandwidth
                     floor (bytes read / probed GB/s) dashed in the same colour, and the
                     fraction of the floor reached.          -> attn_time_vs_ctx.png
  --bench FILE       `kivi bench --json`: decode tokens/s per format, annotated with the
                     compression against f16 and the greedy token match; with files at
                     several contexts, decode tokens/s against the context. -> bench_decode.png
  --quality FILE     a JSON list of `kivi perplexity --json` objects (one per cache
                     configuration, normally with --kld-base): perplexity and KL divergence
                     (mean and 99th percentile) against bits per element.   -> quality.png
  --sparse FILE      `scripts/sparse_quality.py --json` output: KL divergence against dense
                     attention (mean) against the token budget, one line per selection,
                     one panel per cache format.                     -> sparse_quality.png

Usage: /usr/bin/python3 scripts/plot.py --bench-attn A.json --bench B.json --quality Q.json --out docs/img
Runs under Debian's python3 with matplotlib (Agg backend, no display needed).
"""
import argparse
import json
import os
import sys
import tempfile

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def die(msg):
    print(f"plot.py: error: {msg}", file=sys.stderr)
    sys.exit(1)


def load(path, kind):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        die(f"cannot read {kind} file '{path}': {e.strerror}")
    except json.JSONDecodeError as e:
        die(f"{kind} file '{path}' is not JSON: {e}")


def need(obj, keys, path, what):
    missing = [k for k in keys if k not in obj]
    if missing:
        die(f"'{path}': {what} lacks {', '.join(missing)} (is it the right kind of file?)")


def short_names(labels):
    """'kivi2 (G=32, R=128, ...)' -> 'kivi2', unless two different labels would collide."""
    short = {lab: lab.split(" (")[0] for lab in labels}
    counts = {}
    for s in short.values():
        counts[s] = counts.get(s, 0) + 1
    return {lab: (s if counts[s] == 1 else lab) for lab, s in short.items()}


def colours(names):
    """The same colour for a format in every chart: f32, f16, int8, kivi4, kivi2, kivi8 fixed."""
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fixed = ["f32", "f16", "int8", "kivi4", "kivi2", "kivi8"]
    out, extra = {}, len(fixed)
    for n in sorted(names):
        base = n.split("/")[0] if n.startswith("int8") else n
        if base in fixed:
            out[n] = cycle[fixed.index(base) % len(cycle)]
        else:
            out[n] = cycle[extra % len(cycle)]
            extra += 1
    return out


def check_not_input(path, inputs):
    """Refuses an output that is one of the input files (same device and inode, so hard
    links and symlinks count): writing it would destroy the input."""
    if not os.path.exists(path):
        return
    for i in inputs:
        if os.path.exists(i) and os.path.samefile(path, i):
            die(f"output '{path}' is the same file as the input '{i}'; writing it would destroy the input "
                f"(choose another --out)")


def save(fig, out, name):
    """Writes the figure to OUT/NAME as PNG through a temporary file in the same folder,
    renamed over the target only when complete (an error leaves the previous chart and no
    temporary file), closes it and returns the path."""
    fig.tight_layout()
    path = os.path.join(out, name)
    target = os.path.realpath(path)  # a symlink is written through to its target
    mode = os.stat(target).st_mode & 0o7777 if os.path.exists(target) else None
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(target) + ".tmp-", dir=os.path.dirname(target))
    try:
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, dpi=120, format="png")
            f.flush()
            os.fsync(f.fileno())
        if mode is None:
            mask = os.umask(0)
            os.umask(mask)
            mode = 0o666 & ~mask
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    finally:
        plt.close(fig)
    return path


def plot_bench_attn(paths, out):
    rows, probes = [], []
    for p in paths:
        d = load(p, "bench-attn")
        need(d, ["results"], p, "the object")
        for r in d["results"]:
            need(r, ["format", "ctx", "threads", "batch", "median_us", "floor_us"], p, "a result")
            rows.append(r)
        if d.get("probe_gbps"):
            probes.append(d["probe_gbps"])
    if not rows:
        die("no bench-attn results to plot")
    names = short_names({r["format"] for r in rows})
    multi = len({(r["threads"], r["batch"]) for r in rows}) > 1
    series = {}
    for r in rows:
        label = names[r["format"]] + (f", {r['threads']} thr, batch {r['batch']}" if multi else "")
        series.setdefault(label, {"name": names[r["format"]], "pts": {}})
        # Several files may measure the same point: keep the fastest median.
        pt = series[label]["pts"].get(r["ctx"])
        if pt is None or r["median_us"] < pt[0]:
            series[label]["pts"][r["ctx"]] = (r["median_us"], r["floor_us"])
    col = colours({s["name"] for s in series.values()})
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 5))
    for label, s in sorted(series.items()):
        ctx = sorted(s["pts"])
        us = [s["pts"][c][0] for c in ctx]
        floor = [s["pts"][c][1] or 0 for c in ctx]  # null (no probe): no floor
        c = col[s["name"]]
        ax.plot(ctx, us, "o-", color=c, label=label)
        if any(f > 0 for f in floor):
            ax.plot(ctx, floor, "--", color=c, alpha=0.6, linewidth=1)
            ax2.plot(ctx, [100.0 * f / u if u > 0 else 0 for f, u in zip(floor, us)], "o-", color=c, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context (tokens in the cache)")
    ax.set_ylabel("decode attention, median time per call (us)")
    probe = f", probe {sorted(probes)[len(probes) // 2]:.1f} GB/s" if probes else ""
    ax.set_title(f"Decode attention per format (dashed: bandwidth floor{probe})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax2.set_xscale("log", base=2)
    ax2.set_xlabel("context (tokens in the cache)")
    ax2.set_ylabel("floor / measured time (%)")
    ax2.set_ylim(0, 105)
    ax2.set_title("Fraction of the memory-bandwidth floor reached")
    ax2.grid(True, alpha=0.3)
    ax2.legend(fontsize=8)
    return save(fig, out, "attn_time_vs_ctx.png")


def plot_bench(paths, out):
    runs = []
    for p in paths:
        d = load(p, "bench")
        need(d, ["results", "n"], p, "the object")
        for r in d["results"]:
            need(r, ["format", "ctx", "decode_tps", "compression_vs_f16", "token_match"], p, "a result")
        runs.append((p, d))
    ctxs = sorted({r["ctx"] for _, d in runs for r in d["results"]})
    fig, ax = plt.subplots(figsize=(9, 5))
    if len(runs) == 1 or len(ctxs) == 1:
        p, d = runs[-1]
        res = d["results"]
        names = [r["format"] + (" (ref)" if r.get("reference") else "") for r in res]
        col = colours({r["format"] for r in res})
        tps = [r["decode_tps"] for r in res]
        bars = ax.bar(range(len(res)), tps, color=[col[r["format"]] for r in res])
        meaningful = d.get("token_match_meaningful", not d.get("ctx_fill_random", False))
        for b, r in zip(bars, res):
            note = f"{r['compression_vs_f16']:.2f}x vs f16"
            if meaningful:
                note += f"\nmatch {r['token_match']:.0f}%"
            share = r.get("attn_share")
            if share is not None:
                note += f"\nattn {100 * share:.0f}%"
            ax.annotate(note, (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(res)))
        ax.set_xticklabels(names)
        ax.set_ylabel("decode tokens/s (median step)")
        ax.set_ylim(0, max(tps) * 1.3 if tps else 1)
        model = os.path.basename(d.get("model", ""))
        fill = "random fill, speed only" if d.get("ctx_fill_random") else f"fill {d.get('ctx_fill', 0)}"
        ax.set_title(f"kivi bench: {model}, decode at ctx {res[0]['ctx']} ({fill}), "
                     f"{d['n']} tokens, {d.get('threads', '?')} threads")
    else:
        series = {}
        for _, d in runs:
            for r in d["results"]:
                series.setdefault(r["format"], {})[r["ctx"]] = r["decode_tps"]
        col = colours(set(series))
        for name, pts in sorted(series.items()):
            cs = sorted(pts)
            ax.plot(cs, [pts[c] for c in cs], "o-", color=col[name], label=name)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context at which decode was measured (tokens)")
        ax.set_ylabel("decode tokens/s (median step)")
        ax.set_title("kivi bench: decode speed against context")
        ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    return save(fig, out, "bench_decode.png")


def plot_quality(paths, out):
    rows = []
    for p in paths:
        d = load(p, "quality")
        if isinstance(d, dict):
            d = [d]
        if not isinstance(d, list):
            die(f"'{p}': expected a JSON list of `kivi perplexity --json` objects")
        for r in d:
            need(r, ["ppl", "kv_cache", "bits_per_element_k", "bits_per_element_v"], p, "an entry")
            rows.append(r)
    if not rows:
        die("no perplexity results to plot")
    names = short_names({r["kv_cache"] for r in rows})
    col = colours(set(names.values()))
    has_kld = any("kld_mean" in r for r in rows)
    fig, axes = plt.subplots(1, 2 if has_kld else 1, figsize=(12 if has_kld else 7, 5))
    if not has_kld:
        axes = [axes]
    ax = axes[0]
    for r in rows:
        bits = (r["bits_per_element_k"] + r["bits_per_element_v"]) / 2
        n = names[r["kv_cache"]]
        ax.plot([bits], [r["ppl"]], "o", color=col.get(n))
        ax.annotate(n, (bits, r["ppl"]), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("bits per cached element (mean of K and V, parameters included)")
    ax.set_ylabel("perplexity")
    ctx = {r.get("ctx") for r in rows}
    ax.set_title("Perplexity against cache size" + (f" (ctx {ctx.pop()})" if len(ctx) == 1 else ""))
    ax.grid(True, which="both", alpha=0.3)
    if has_kld:
        ax = axes[1]
        for r in rows:
            if "kld_mean" not in r:
                continue
            bits = (r["bits_per_element_k"] + r["bits_per_element_v"]) / 2
            n = names[r["kv_cache"]]
            if r["kld_mean"] > 0:
                ax.plot([bits], [r["kld_mean"]], "o", color=col.get(n))
                ax.annotate(n, (bits, r["kld_mean"]), textcoords="offset points", xytext=(4, 4), fontsize=8)
            if r.get("kld_p99", 0) > 0:
                ax.plot([bits], [r["kld_p99"]], "^", color=col.get(n), alpha=0.5)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("bits per cached element (mean of K and V, parameters included)")
        ax.set_ylabel("KL divergence to the base run (nats per token)")
        ax.set_title("KL divergence: mean (o) and 99th percentile (^)")
        ax.grid(True, which="both", alpha=0.3)
    return save(fig, out, "quality.png")


def plot_sparse(paths, out):
    rows = []
    for p in paths:
        d = load(p, "sparse quality")
        if not isinstance(d, list):
            die(f"'{p}': expected the JSON list scripts/sparse_quality.py --json writes")
        for r in d:
            need(r, ["cache", "budget", "selection", "kld_mean", "ctx"], p, "an entry")
            rows.append(r)
    if not rows:
        die("no sparse quality results to plot")
    caches = list(dict.fromkeys(r["cache"] for r in rows))
    sels = list(dict.fromkeys(r["selection"] for r in rows))
    col = colours(set(sels))
    fig, axes = plt.subplots(1, len(caches), figsize=(6 * len(caches), 5), squeeze=False)
    for ax, cache in zip(axes[0], caches):
        for sel in sels:
            pts = sorted((100.0 * r["budget"] / r["ctx"], r["kld_mean"]) for r in rows
                         if r["cache"] == cache and r["selection"] == sel and r["kld_mean"] > 0)
            if pts:
                ax.plot([x for x, _ in pts], [y for _, y in pts], "o-", color=col.get(sel), label=sel)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        shares = sorted({100.0 * r["budget"] / r["ctx"] for r in rows if r["cache"] == cache})
        ax.set_xticks(shares)
        ax.set_xticklabels([f"{x:g}%" for x in shares])
        ax.minorticks_off()
        ax.set_xlabel("token budget per KV head and step (% of the context)")
        ax.set_ylabel("KL divergence to dense attention (nats per token)")
        ax.set_title(f"Block-sparse attention, KV cache {cache}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    return save(fig, out, "sparse_quality.png")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--bench-attn", nargs="+", metavar="FILE", help="kivi bench-attn --json output(s)")
    ap.add_argument("--bench", nargs="+", metavar="FILE", help="kivi bench --json output(s)")
    ap.add_argument("--quality", nargs="+", metavar="FILE", help="JSON list(s) of kivi perplexity --json objects")
    ap.add_argument("--sparse", nargs="+", metavar="FILE", help="scripts/sparse_quality.py --json output(s)")
    ap.add_argument("--out", default="docs/img", help="output directory (default: docs/img)")
    a = ap.parse_args()
    if not (a.bench_attn or a.bench or a.quality or a.sparse):
        ap.error("give at least one of --bench-attn, --bench, --quality, --sparse")
    try:
        os.makedirs(a.out, exist_ok=True)
    except OSError as e:
        die(f"cannot create output directory '{a.out}': {e.strerror}")
    # Every chart this run would write, checked against every input before anything is drawn.
    inputs = (a.bench_attn or []) + (a.bench or []) + (a.quality or []) + (a.sparse or [])
    for given, name in ((a.bench_attn, "attn_time_vs_ctx.png"), (a.bench, "bench_decode.png"),
                        (a.quality, "quality.png"), (a.sparse, "sparse_quality.png")):
        if given:
            check_not_input(os.path.join(a.out, name), inputs)
    written = []
    if a.bench_attn:
        written.append(plot_bench_attn(a.bench_attn, a.out))
    if a.bench:
        written.append(plot_bench(a.bench, a.out))
    if a.quality:
        written.append(plot_quality(a.quality, a.out))
    if a.sparse:
        written.append(plot_sparse(a.sparse, a.out))
    for w in written:
        print(f"wrote {w}")


if __name__ == "__main__":
    main()
