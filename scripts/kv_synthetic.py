#!/usr/bin/python3
"""Attention error of the quantized KV formats on synthetic heads of real sizes.

stories260K has head_dim 8, where a rotation has only 8 coordinates to spread a key over; this
measures the formats at head_dim 64 and 128 instead, on one attention head with random keys
whose channels have unequal scales (a few outlier channels, as real keys have) and, in a
third case, a mean per channel shared by every token (as real keys have too), random values,
and queries that attend sharply to a few keys. Every token is quantized (no residual window).
For each format: bits per element (codes and parameters), the mean KL divergence of the
attention weights from the exact ones, and the relative error of the attention output.
The codecs are the engine's (kivi.quantize_keys / quantize_values / quantize_tq), so the
numbers are the cache's.

  PYTHONPATH=build/python /usr/bin/python3 scripts/kv_synthetic.py [--json]
"""

import argparse
import json

import numpy as np

import kivi


def heads(d, T, Q, seed, offsets):
    rng = np.random.default_rng(seed)
    scale = np.ones(d)
    scale[rng.choice(d, max(1, d // 32), replace=False)] = 8.0  # outlier channels
    scale *= np.exp(0.5 * rng.standard_normal(d))  # and unequal channels generally
    k = rng.standard_normal((T, d)) * scale
    if offsets:  # a mean per channel shared by every token (real keys have them)
        k += 2.0 * rng.standard_normal(d) * scale
    k = k.astype(np.float32)
    v = rng.standard_normal((T, d)).astype(np.float32)
    # Each query points at a few keys (a sharp softmax), plus noise.
    q = np.zeros((Q, d))
    for i in range(Q):
        for j in rng.choice(T, 3, replace=False):
            q[i] += k[j] / np.linalg.norm(k[j])
        q[i] += 0.3 * rng.standard_normal(d) / np.sqrt(d)
    # Scaled so that the keys a query points at score ~10 above the median key (softmax
    # logits q.k / sqrt(d)): most of the weight on a few tokens, as in real heads.
    s = q @ k.T / np.sqrt(d)
    gap = (np.sort(s, axis=1)[:, -3:].mean(axis=1) - np.median(s, axis=1)).mean()
    return q * (10.0 / gap), k, v


def attend(q, k, v):
    s = q @ k.T.astype(np.float64) / np.sqrt(q.shape[1])
    s -= s.max(axis=1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=1, keepdims=True)
    return p, p @ v.astype(np.float64)


def kivi_rows(x, bits, G, key):
    x3 = x[None]
    if key:
        c, s, z = kivi.quantize_keys(x3, bits, G)
        return kivi.dequantize_keys(c, s, z, bits, G)[0]
    c, s, z = kivi.quantize_values(x3, bits, G)
    return kivi.dequantize_values(c, s, z, bits, G)[0]


def tq_rows(x, fmt):
    c, s = kivi.quantize_tq(x[None], fmt)
    return kivi.dequantize_tq(c, s, fmt, head_dim=x.shape[1])[0]


def bits(fmt, d, G, key):
    if fmt.startswith("kivi"):
        b = int(fmt[4:])
        return b + (2 * 16 / G if key else 2 * 16 / min(G, d))
    b = float(fmt[2:])
    wide = d // 4 if "." in fmt else 0
    return (np.ceil((d * int(b) + wide) / 8) * 8 + 16) / d


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--queries", type=int, default=128)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    G = 32
    formats = ["kivi4", "tq4", "tq3.5", "tq3", "tq2.5", "kivi2", "tq2"]
    rows = []
    for d, offsets in ((64, False), (128, False), (128, True)):
        q, k, v = heads(d, a.tokens, a.queries, d, offsets)
        p, o = attend(q, k, v)
        for fk in formats:
            for fv in formats:
                if fk != fv and not (fk, fv) in (("kivi2", "tq2"), ("kivi2", "tq3"), ("kivi4", "tq2")):
                    continue
                kq = kivi_rows(k, int(fk[4:]), G, True) if fk.startswith("kivi") else tq_rows(k, fk)
                vq = kivi_rows(v, int(fv[4:]), G, False) if fv.startswith("kivi") else tq_rows(v, fv)
                pq, oq = attend(q, kq, vq)
                kl = (p * (np.log(np.maximum(p, 1e-300)) - np.log(np.maximum(pq, 1e-300)))).sum(1).mean()
                err = np.linalg.norm(oq - o) / np.linalg.norm(o)
                rows.append({"head_dim": d, "offsets": offsets, "k": fk, "v": fv, "bits_k": bits(fk, d, G, True),
                             "bits_v": bits(fv, d, G, False), "kl": float(kl), "rel_err": float(err)})
    if a.json:
        print(json.dumps(rows, indent=1))
        return
    print("| head_dim | key offsets | K | V | bits/elem K | bits/elem V | KL of the weights | output rel. error |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print("| %d | %s | %s | %s | %.3g | %.3g | %.3g | %.3g |" % (
            r["head_dim"], "yes" if r["offsets"] else "no", r["k"], r["v"], r["bits_k"], r["bits_v"], r["kl"],
            r["rel_err"]))


if __name__ == "__main__":
    main()
