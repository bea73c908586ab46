#!/usr/bin/python3
"""Self-tests of the numpy reference (no engine needed).

1. Tokenizer: the heap-based BPE equals a naive rescan-every-merge implementation on the
   whole text file and on random strings (ASCII, accents, emoji, CJK); decode(encode(s)) == s.
2. Greedy generation from "Once upon a time" gives the published stories260K text.
3. Directed float16/float32 rounding helpers round in the right direction by at most one step.
4. Streaming: the vectorized fake-quantized forward (masks over a precomputed quantized
   copy of K and V) equals a token-by-token simulation with an explicit cache per layer that
   appends, applies event-driven flush rules and attends, for many KV configurations.
   The simulator quantizes with its own scalar code (per group, Python floats).
Exit status 0 when everything passes.
"""

import math
import os
import random
import sys
import time

import numpy as np

sys.dont_write_bytecode = True  # keep the source tree free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref as ref  # noqa: E402

GREEDY_PROMPT = "Once upon a time"
GREEDY_TEXT = ("Once upon a time, there was a little girl named Lily. She loved to play outside "
               "in the park. One day, she saw a big, red ball. She wanted to play with it, but "
               "it was too high")

failures = []


def check(cond, msg):
    print(("ok    " if cond else "FAIL  ") + msg)
    if not cond:
        failures.append(msg)


# ---------------------------------------------------------------------------- tokenizer

def naive_encode(tok, text, bos):
    ids = [ref.BOS] if bos else []
    if not text:
        return ids
    seq = [tok.lookup[b" "]]
    for ch in text:
        b = ch.encode("utf-8")
        if b in tok.lookup:
            seq.append(tok.lookup[b])
        else:
            seq += [tok.lookup[b"<0x%02X>" % x] for x in b]
    while True:
        best, bi, bid = None, -1, -1
        for i in range(len(seq) - 1):
            mid = tok.lookup.get(tok.pieces[seq[i]] + tok.pieces[seq[i + 1]])
            if mid is not None and (best is None or tok.scores[mid] > best):
                best, bi, bid = tok.scores[mid], i, mid
        if bi < 0:
            return ids + seq
        seq[bi:bi + 2] = [bid]


def test_tokenizer(tok, text):
    a = tok.encode(text, bos=False)
    check(a == naive_encode(tok, text, False), "tokenizer: heap BPE == naive BPE on the text file (%d tokens)" % len(a))
    check(tok.decode_all(a) == text, "tokenizer: decode(encode(text file)) round-trips")
    check(tok.encode("", True) == [ref.BOS] and tok.encode("", False) == [], "tokenizer: empty text")
    ids = tok.encode(GREEDY_PROMPT, True)
    check(tok.decode_all(ids) == GREEDY_PROMPT, "tokenizer: %r -> %s -> round-trips" % (GREEDY_PROMPT, ids))
    s = "Lily saw a café 🐱 and said: \"Hi!\""
    ids = tok.encode(s, True)
    check(tok.decode_all(ids) == s, "tokenizer: non-ASCII prompt round-trips (byte fallback)")
    rng = random.Random(7)
    alpha = list("abcdefghijklmnopqrstuvwxyz     ,.!?\"'\nTLO") + ["é", "🐱", "中", "ü", "\t"]
    bad = 0
    for _ in range(2000):
        s = "".join(rng.choice(alpha) for _ in range(rng.randint(0, 40)))
        e = tok.encode(s, True)
        if e != naive_encode(tok, s, True) or tok.decode_all(e) != s:
            bad += 1
    check(bad == 0, "tokenizer: 2000 random strings agree with naive BPE and round-trip (%d bad)" % bad)


# ---------------------------------------------------------------------------- rounding

def test_rounding():
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.normal(0, 1, 20000), rng.normal(0, 1e-5, 2000),
                        rng.normal(0, 300, 2000), [0.0, 1.0, -1.0, 0.5, 2.0 ** -20]])
    d = ref.f16_down(x)
    u = ref.f16_up(x)
    d16 = d.astype(np.float16)
    u16 = u.astype(np.float16)
    check(np.all(d16.astype(np.float64) == d) and np.all(u16.astype(np.float64) == u),
          "rounding: results are float16 values")
    check(np.all(d <= x) and np.all(u >= x), "rounding: f16_down <= x <= f16_up")
    up_of_d = np.nextafter(d16, np.float16(np.inf)).astype(np.float64)
    dn_of_u = np.nextafter(u16, np.float16(-np.inf)).astype(np.float64)
    check(np.all(up_of_d > x) and np.all(dn_of_u < x), "rounding: f16 directed results are the nearest such")
    f = ref.f32_up(x)
    f32 = f.astype(np.float32)
    check(np.all(f >= x) and np.all(np.nextafter(f32, np.float32(-np.inf)).astype(np.float64) < x),
          "rounding: f32_up is the smallest float32 >= x")
    exact = np.array([0.25, -3.0, 1024.0])
    check(np.all(ref.f16_down(exact) == exact) and np.all(ref.f16_up(exact) == exact),
          "rounding: representable values unchanged")


# ---------------------------------------------------------------------------- streaming simulator

def s_f16_down(x):
    h = np.float16(x)
    if float(h) > x:
        h = np.nextafter(h, np.float16(-np.inf))
    return float(h)


def s_f16_up(x):
    h = np.float16(x)
    if float(h) < x:
        h = np.nextafter(h, np.float16(np.inf))
    return float(h)


def s_f32_up(x):
    f = np.float32(x)
    if float(f) < x:
        f = np.nextafter(f, np.float32(np.inf))
    return float(f)


def s_asym(vals, bits, sd):
    """Scalar asymmetric quantize-dequantize of a list of floats (one group)."""
    L = 2 ** bits - 1
    mn, mx = min(vals), max(vals)
    if sd == "f32":
        zero = float(np.float32(mn))
        scale = float(np.float32(np.float32(mx) - np.float32(mn)) / np.float32(L))
    else:
        zero = s_f16_down(mn)
        scale = s_f16_up(s_f32_up((mx - zero) / L))
    out = []
    for v in vals:
        q = 0.0 if scale == 0 else min(max(float(np.rint((v - zero) / scale)), 0.0), float(L))
        out.append(q * scale + zero)
    return out


def s_int8_scale(absmax, sd):
    s = float(np.float32(absmax) / np.float32(127.0))
    return s_f16_up(s) if sd == "f16" else s


def s_int8(vals, scale):
    return [0.0 if scale == 0 else min(max(float(np.rint(v / scale)), -127.0), 127.0) * scale
            for v in vals]


class Store:
    """One layer's K or V store: appends one [nkv, hs] vector per token and keeps what
    attention would read (`stored`), applying the flush rules as events."""

    def __init__(self, fmt, is_key, spec, hs):
        self.fmt, self.is_key, self.spec, self.hs = fmt, is_key, spec, hs
        self.raw, self.stored = [], []
        self.nq = 0               # number of oldest tokens stored quantized (kivi)
        self.tensor_scale = None  # int8 "tensor" scale (first append batch)

    def append(self, x):
        sp, fmt = self.spec, self.fmt
        self.raw.append(x.copy())
        nkv, hs = x.shape
        Gc = min(sp.group_size, hs)
        if fmt == "f32" or fmt.startswith("kivi"):
            self.stored.append(x.copy())
        elif fmt == "f16":
            self.stored.append(x.astype(np.float16).astype(np.float64))
        elif fmt == "int8":
            g = sp.int8_granularity
            y = np.empty_like(x)
            if g == "tensor":
                if self.tensor_scale is None:  # first append batch = this (BOS) token
                    self.tensor_scale = s_int8_scale(float(np.abs(x).max()), sp.scale_dtype)
                y[:] = np.array(s_int8(list(x.ravel()), self.tensor_scale)).reshape(x.shape)
            elif g == "token":
                sc = s_int8_scale(float(np.abs(x).max()), sp.scale_dtype)
                y[:] = np.array(s_int8(list(x.ravel()), sc)).reshape(x.shape)
            else:
                width = hs if g == "head" else Gc
                for h in range(nkv):
                    for c0 in range(0, hs, width):
                        seg = list(x[h, c0:c0 + width])
                        sc = s_int8_scale(max(abs(v) for v in seg), sp.scale_dtype)
                        y[h, c0:c0 + width] = s_int8(seg, sc)
            self.stored.append(y)
        if fmt.startswith("kivi"):
            self._flush(int(fmt[4:]))

    def _flush(self, bits):
        sp = self.spec
        G, R = sp.group_size, sp.residual
        n = len(self.raw)
        if self.is_key:
            if sp.key_flush == "batch":
                # when the full-precision residual holds max(R, G) keys, quantize all of them
                r = max(R, G)
                if n - self.nq >= r:
                    for g0 in range(self.nq, self.nq + r, G):
                        self._quant_key_group(g0, G, bits)
                    self.nq += r
            else:
                # quantize the oldest G residual keys whenever more than R remain and a group is full
                while n - self.nq >= max(R + 1, G):
                    self._quant_key_group(self.nq, G, bits)
                    self.nq += G
        else:
            # values: at most R full-precision tokens are kept
            while n - self.nq > R:
                x = self.raw[self.nq]
                nkv, hs = x.shape
                Gc = min(G, hs)
                y = np.empty_like(x)
                for h in range(nkv):
                    for c0 in range(0, hs, Gc):
                        y[h, c0:c0 + Gc] = s_asym(list(x[h, c0:c0 + Gc]), bits, sp.scale_dtype)
                self.stored[self.nq] = y
                self.nq += 1

    def _quant_key_group(self, g0, G, bits):
        assert g0 % G == 0
        blk = np.array(self.raw[g0:g0 + G])          # [G, nkv, hs]
        out = np.empty_like(blk)
        for h in range(blk.shape[1]):
            for c in range(blk.shape[2]):
                out[:, h, c] = s_asym(list(blk[:, h, c]), bits, self.spec.scale_dtype)
        for i in range(G):
            self.stored[g0 + i] = out[i]


def simulate_stream(model, tokens, spec):
    """Token-by-token forward with explicit per-layer caches; returns logits [T, vocab]."""
    m = model
    hs, nh, nkv = m.head_size, m.n_heads, m.n_kv_heads
    grp = nh // nkv
    kst = [Store(spec.k_format, True, spec, hs) for _ in range(m.n_layers)]
    vst = [Store(spec.v_format, False, spec, hs) for _ in range(m.n_layers)]
    out = []
    for t, tid in enumerate(tokens):
        x = m.tok_emb[tid].copy()
        for l in range(m.n_layers):
            xb = ref.rmsnorm(x, m.rms_att[l])
            q = (m.wq[l] @ xb).reshape(nh, hs)
            k = (m.wk[l] @ xb).reshape(nkv, hs)
            v = (m.wv[l] @ xb).reshape(nkv, hs)
            for vec in (q, k):  # RoPE, pair by pair
                for i in range(0, hs, 2):
                    ang = t * (1.0 / 10000.0 ** (i / hs))
                    c, s = math.cos(ang), math.sin(ang)
                    a0, a1 = vec[:, i].copy(), vec[:, i + 1].copy()
                    vec[:, i] = a0 * c - a1 * s
                    vec[:, i + 1] = a0 * s + a1 * c
            kst[l].append(k)
            vst[l].append(v)
            K = np.array(kst[l].stored)   # [t+1, nkv, hs] as the cache stands now
            V = np.array(vst[l].stored)
            o = np.empty((nh, hs))
            for h in range(nh):
                sc = K[:, h // grp] @ q[h] / math.sqrt(hs)
                p = np.exp(sc - sc.max())
                p /= p.sum()
                o[h] = p @ V[:, h // grp]
            x = x + m.wo[l] @ o.ravel()
            xb = ref.rmsnorm(x, m.rms_ffn[l])
            h1, h3 = m.w1[l] @ xb, m.w3[l] @ xb
            x = x + m.w2[l] @ ((h1 / (1.0 + np.exp(-h1))) * h3)
        out.append(m.wcls @ ref.rmsnorm(x, m.rms_final))
    return np.array(out)


STREAM_CONFIGS = [
    dict(k_format="f32", v_format="f32"),
    dict(k_format="f16", v_format="f16"),
    dict(k_format="int8", v_format="int8", int8_granularity="token"),
    dict(k_format="int8", v_format="int8", int8_granularity="head", scale_dtype="f32"),
    dict(k_format="int8", v_format="int8", int8_granularity="group", group_size=4),
    dict(k_format="int8", v_format="int8", int8_granularity="tensor"),
    dict(k_format="kivi2", v_format="kivi2", group_size=32, residual=0),
    dict(k_format="kivi2", v_format="kivi2", group_size=32, residual=32, key_flush="group"),
    dict(k_format="kivi4", v_format="kivi4", group_size=16, residual=32, key_flush="batch"),
    dict(k_format="kivi4", v_format="kivi4", group_size=16, residual=32, key_flush="group", scale_dtype="f32"),
    dict(k_format="kivi8", v_format="kivi8", group_size=32, residual=64),
    dict(k_format="kivi4", v_format="kivi2", group_size=32, residual=64, key_flush="group"),
    dict(k_format="int8", v_format="kivi4", group_size=16, residual=16),
    dict(k_format="kivi2", v_format="f16", group_size=4, residual=0, key_flush="group"),
]


def test_streaming(model, tok, text, n_tokens):
    toks = [ref.BOS] + tok.encode(text, bos=False)[:n_tokens - 1]
    for cfg in STREAM_CONFIGS:
        spec = ref.KVSpec(**cfg)
        spec.validate()
        t0 = time.time()
        a = ref.forward_chunk(model, toks, spec)
        b = simulate_stream(model, toks, spec)
        d = float(np.abs(a - b).max())
        check(d < 1e-9, "streaming: %-36s vectorized vs token-by-token max|diff| %.2e (%.1f s)"
              % (spec.label(), d, time.time() - t0))
    # quantized configs must actually change something
    base = ref.forward_chunk(model, toks, None)
    q = ref.forward_chunk(model, toks, ref.KVSpec("kivi2", "kivi2", residual=0))
    check(float(np.abs(q - base).max()) > 1e-3, "streaming: kivi2 R0 differs from full precision")


def main():
    import argparse
    ap = argparse.ArgumentParser(description="self-tests of the numpy reference")
    ref.add_path_args(ap)
    a = ref.resolve_paths(ap.parse_args())
    t0 = time.time()
    model = ref.load_model(a.model)
    tok = ref.load_tokenizer(a.tokenizer, model.vocab_size)
    text = ref.read_text(a.text)
    test_tokenizer(tok, text)
    gen, out = ref.generate_greedy(model, tok, GREEDY_PROMPT, 56)
    check(out == GREEDY_TEXT and len(gen) == 56, "greedy: %d tokens, text %s" % (len(gen), "matches" if out == GREEDY_TEXT else "DIFFERS: %r" % out))
    test_rounding()
    test_streaming(model, tok, text, 140)
    print("time %.1f s" % (time.time() - t0))
    if failures:
        print("FAILED: %d check(s)" % len(failures))
        return 1
    print("all reference self-tests passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
