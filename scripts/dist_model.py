#!/usr/bin/python3
"""Decode time per token of --dist tp and --dist cp over N machines, from bytes and rates.

A decode step reads every weight and the whole KV cache once; on one machine its time
is bytes / memory bandwidth (the roofline kivi.cpp's decode runs at, docs/PERFORMANCE.md).
Over N machines:

  tp  each machine reads 1/N of the weights and 1/N of the cache, then per layer two
      partial sums of `dim` floats cross the network (kivi gathers every rank's D floats
      and adds them in rank order: each machine receives (N-1) D 4 bytes), plus one
      gather of the logits (V (N-1)/N 4 bytes):
        t = (W + KV) / N / bw + 2 L (a(N) + (N-1) D 4 / net) + a(N) + V (N-1) / N 4 / net
  cp  each machine reads all the weights and 1/N of the cache; per layer one gather of
      the attention states (H (hd + 2) 4 bytes from each machine):
        t = W / bw + KV / N / bw + L (a(N) + (N-1) H (hd + 2) 4 / net)

tp needs N to divide the KV heads (8 in these shapes: N <= 8; 16 machines would run
tp=8,cp=2). a(N) = latency x ceil(log2 N) (a recursive-doubling allgather). Rates: --bw GB/s per
machine, the network's one-way latency and bandwidth per class (10/25/100 GbE, typical
TCP figures; pass measured ones with --net NAME:LAT_US:GBIT). Prints a table per shape,
or --json.

    scripts/dist_model.py [--bw 40] [--json]
"""

import argparse
import json
import math

# name: (layers, dim, heads, kv_heads, head_dim, vocab, params)
SHAPES = {
    "llama-3.2-1b": (16, 2048, 32, 8, 64, 128256, 1.24e9),
    "llama-3-8b": (32, 4096, 32, 8, 128, 128256, 8.03e9),
    "llama-3-70b": (80, 8192, 64, 8, 128, 128256, 70.6e9),
}
WEIGHT_BITS = {"F16": 16.0, "Q4_K_M": 4.85}
KV_BITS = {"f16": 16.0, "kivi2": 2.0 + 2 * 16 / 32 + 0.0}  # 2-bit codes + f16 scale/zero per 32
NETS = {"10GbE": (30.0, 10.0), "25GbE": (15.0, 25.0), "100GbE": (5.0, 100.0)}


def alpha(lat_us, n):
    return lat_us * 1e-6 * math.ceil(math.log2(n)) if n > 1 else 0.0


def tp_time(shape, wbits, kv_tokens, kvbits, n, bw, lat_us, gbit):
    L, D, H, K, hd, V, P = shape
    w = P * wbits / 8
    kv = 2 * L * K * hd * kv_tokens * kvbits / 8
    net = gbit * 1e9 / 8
    comm = 0.0
    if n > 1:
        comm = 2 * L * (alpha(lat_us, n) + (n - 1) * D * 4 / net) + alpha(lat_us, n) + V * (n - 1) / n * 4 / net
    return (w + kv) / n / (bw * 1e9) + comm, comm


def cp_time(shape, wbits, kv_tokens, kvbits, n, bw, lat_us, gbit):
    L, D, H, K, hd, V, P = shape
    w = P * wbits / 8
    kv = 2 * L * K * hd * kv_tokens * kvbits / 8
    net = gbit * 1e9 / 8
    comm = L * (alpha(lat_us, n) + (n - 1) * H * (hd + 2) * 4 / net) if n > 1 else 0.0
    return w / (bw * 1e9) + kv / n / (bw * 1e9) + comm, comm


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bw", type=float, default=40.0, help="memory read bandwidth per machine, GB/s")
    ap.add_argument("--net", action="append", default=[], help="NAME:LATENCY_US:GBIT (adds a network)")
    ap.add_argument("--max-n", type=int, default=16)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    nets = dict(NETS)
    for spec in a.net:
        name, lat, gbit = spec.split(":")
        nets[name] = (float(lat), float(gbit))
    ns = [n for n in (1, 2, 4, 8, 16) if n <= a.max_n]
    rows = []
    for sname in ("llama-3-8b", "llama-3-70b"):
        for wname, wbits in WEIGHT_BITS.items():
            for net, (lat, gbit) in nets.items():
                for n in ns:
                    if SHAPES[sname][3] % n:  # tp gives every rank whole KV heads
                        rows.append(dict(mode="tp", shape=sname, weights=wname, ctx=4096, kv="f16",
                                         net=net, n=n, ms=None, comm_ms=None, tok_s=None))
                        continue
                    t, c = tp_time(SHAPES[sname], wbits, 4096, KV_BITS["f16"], n, a.bw, lat, gbit)
                    rows.append(dict(mode="tp", shape=sname, weights=wname, ctx=4096, kv="f16", net=net,
                                     n=n, ms=1e3 * t, comm_ms=1e3 * c, tok_s=1 / t))
    for sname in ("llama-3.2-1b", "llama-3-8b"):
        for ctx in (1 << 20, 1 << 22, 1 << 24):
            for net, (lat, gbit) in nets.items():
                for n in ns:
                    t, c = cp_time(SHAPES[sname], WEIGHT_BITS["Q4_K_M"], ctx, KV_BITS["kivi2"], n, a.bw, lat, gbit)
                    L, D, H, K, hd, V, P = SHAPES[sname]
                    kv_gib = 2 * L * K * hd * ctx * KV_BITS["kivi2"] / 8 / 2**30
                    rows.append(dict(mode="cp", shape=sname, weights="Q4_K_M", ctx=ctx, kv="kivi2", net=net,
                                     n=n, ms=1e3 * t, comm_ms=1e3 * c, tok_s=1 / t, kv_gib_per_machine=kv_gib / n))
    if a.json:
        print(json.dumps(dict(bw_gbs=a.bw, nets=nets, rows=rows), indent=1))
        return
    print(f"memory bandwidth {a.bw:g} GB/s per machine; networks: "
          + ", ".join(f"{k} {v[0]:g} us {v[1]:g} Gbit/s" for k, v in nets.items()))
    key = lambda r: (r["mode"], r["shape"], r["weights"], r["ctx"], r["net"])
    groups = {}
    for r in rows:
        groups.setdefault(key(r), []).append(r)
    print("\n| mode | shape | weights | context | network | " + " | ".join(f"N={n} tok/s" for n in ns) + " |")
    print("|---|---|---|---|---|" + "---|" * len(ns))
    for k, rs in groups.items():
        mode, shape, w, ctx, net = k
        ctxs = f"{ctx // 1024}K" if ctx < (1 << 20) else f"{ctx >> 20}M"
        cells = []
        for r in rs:
            if r["tok_s"] is None:
                cells.append("- (8 KV heads)")
                continue
            extra = f" ({r['kv_gib_per_machine']:.1f} GiB)" if "kv_gib_per_machine" in r else ""
            cells.append(f"{r['tok_s']:.1f}{extra}")
        print(f"| {mode} | {shape} | {w} | {ctxs} | {net} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
