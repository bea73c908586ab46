#!/usr/bin/python3
"""Self-tests of the numpy reference (no engine needed).

1. Tokenizer: the heap-based BPE equals a naive rescan-every-merge implementation on the
   whole text file and on random strings (ASCII, accents, emoji, CJK); decode(encode(s)) == s.
2. Greedy generation from "Once upon a time" gives the published stories260K text.
3. Directed float16/float32 rounding helpers round in the right direction by at most one step.
4. Streaming: the vectorized fake-quantized forward (masks over a precomputed quantized
   copy of K and V) equals a token-by-token simulation with an explicit cache per layer that
   appends, applies event-driven flush rules and attends, for many KV configurations.
   The simulator quantizes with its own scalar code (per group, Python floats; tq rows with
   a butterfly Walsh-Hadamard transform and threshold search instead of the matrix and
   nearest-centroid search of llama_ref; with --kv-rotate hadamard, int8 rows and KIVI
   value rows rotated by the same butterflies as they are quantized).
5. tq formats: the Lloyd-Max codebooks (d = 128 mean squared errors of a unit vector, the
   uniform d = 3 case in closed form, the Lloyd conditions, a Monte Carlo check of the
   density at d = 8) and the rotation (orthonormal, block structure, Rng words and signs
   derived by hand from the published splitmix64 seed-0 outputs).
6. Per-layer format maps (--kv-cache-layers): layer lists, ranges, '*', KEY/VALUE and
   the layers each rule covers, and the maps that must be refused (a layer named twice,
   two '*' rules, an uncovered layer, a layer the model lacks, unknown formats).
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


# ---------------------------------------------------------------------------- tq codebook and rotation

def test_tq_codebook():
    # d = 128: E||u - Q(u)||^2 = d * per-coordinate mse for b = 1..4
    want = {1: 0.3609, 2: 0.1160, 3: 0.03397, 4: 0.009315}
    got = {b: 128 * ref.lloyd_max(128, b)[1] for b in want}
    worst = max(abs(got[b] / want[b] - 1) for b in want)
    check(worst < 1e-3, "tq codebook: d=128 unit-vector mse %s (worst rel diff %.1e)"
          % (" ".join("%.5g" % got[b] for b in sorted(got)), worst))
    # d = 3: one coordinate of a unit vector in R^3 is uniform on [-1, 1] (Archimedes), so
    # the optimum is the uniform quantizer: centroids (2k+1)/K - 1, mse (2/K)^2 / 12.
    bad = 0.0
    for b in (1, 2, 3, 4):
        K = 1 << b
        c, mse = ref.lloyd_max(3, b)
        bad = max(bad, float(np.abs(c - ((2 * np.arange(K) + 1) / K - 1)).max()),
                  abs(mse - (2.0 / K) ** 2 / 12))
    check(bad < 1e-12, "tq codebook: d=3 is the uniform quantizer (max deviation %.1e)" % bad)
    # Lloyd conditions at d = 8 (the model's head_dim), by independent quadrature in x
    # (100-point Gauss-Legendre per cell of the unnormalized density (1 - x^2)^(5/2)).
    d = 8
    gx, gw = np.polynomial.legendre.leggauss(100)
    worst = 0.0
    for b in (2, 3, 4):
        c, _ = ref.lloyd_max(d, b)
        t = np.concatenate([[-1.0], (c[1:] + c[:-1]) / 2, [1.0]])
        for k in range(len(c)):
            x = (t[k + 1] - t[k]) / 2 * gx + (t[k + 1] + t[k]) / 2
            f = gw * (1 - x * x) ** ((d - 3) / 2)
            worst = max(worst, abs(float((f * x).sum() / f.sum()) - c[k]))
    check(worst < 1e-11, "tq codebook: d=8 centroids are their cells' means (max |diff| %.1e)" % worst)
    # Monte Carlo: coordinates of uniform random unit vectors in R^8 quantized with the
    # codebook have the predicted mse (checks the density itself).
    rng = np.random.default_rng(5)
    g = rng.standard_normal((200000, d))
    u = (g / np.linalg.norm(g, axis=1, keepdims=True)).ravel()
    worst = 0.0
    for b in (2, 3, 4):
        c, mse = ref.lloyd_max(d, b)
        q = c[np.abs(u[:, None] - c[None]).argmin(axis=1)]
        worst = max(worst, abs(float(np.mean((u - q) ** 2)) / mse - 1))
    check(worst < 0.01, "tq codebook: d=8 Monte Carlo mse within %.2f%% of the predicted" % (100 * worst))


def test_tq_rotation():
    # Rng by hand. splitmix64 from state 0 (published test vector) gives the xoshiro256**
    # state s = (0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F,
    # 0xF88BB8A8724C81EC); the first output is rotl(s1 * 5, 7) * 9 mod 2^64:
    # s1 * 5 = 0x285B1815289EFDC4 (mod 2^64), rotl 7 = 0x2D8C0A944F7EE214,
    # * 9 = 0x99EC5F36CB75F2B4. Its low byte 0xB4 = 0b10110100: bits 0..7 = 0,0,1,0,1,1,0,1,
    # so the signs of coordinates 0..7 for seed 0 are + + - + - - + -.
    M = (1 << 64) - 1
    check(ref.splitmix64(0) == 0xE220A8397B1DCDAF and ref.Rng(0).s[3] == 0xF88BB8A8724C81EC,
          "tq rotation: splitmix64 seeding matches the published seed-0 outputs")
    check(((0x6E789E6AA1B965F4 * 5) & M) == 0x285B1815289EFDC4 and ref.Rng(0).next_u64() == 0x99EC5F36CB75F2B4,
          "tq rotation: first xoshiro256** word of Rng(0) is 0x99EC5F36CB75F2B4")
    sg = ref.rotation_signs(8, 0)
    check(list(sg) == [1, 1, -1, 1, -1, -1, 1, -1], "tq rotation: signs of Rng(0), d=8: %s" % sg.astype(int).tolist())
    # d = 96: coordinates 64..95 take bits 0..31 of the second word
    r = ref.Rng(0)
    r.next_u64()
    w1 = r.next_u64()
    s96 = ref.rotation_signs(96, 0)
    check(all(s96[64 + i] == (-1.0 if w1 >> i & 1 else 1.0) for i in range(32)) and np.all(s96[:8] == sg),
          "tq rotation: coordinates 64..95 use the second word (numbered across the vector)")
    # the per-(layer, head) seed, spelled out
    base = ref.DEFAULT_ROTATION_SEED
    check(base == 1802073705 and
          ref.rotation_seed(base, 0, 0) == ref.splitmix64(base ^ 0xE220A8397B1DCDAF) and
          ref.rotation_seed(base, 3, 1) == ref.splitmix64(base ^ ref.splitmix64((3 << 32) | 1)) and
          ref.rotation_seed(base, 3, 1) != ref.rotation_seed(base, 1, 3),
          "tq rotation: seed = splitmix64(base ^ splitmix64((layer << 32) | head))")
    worst, ok_blocks = 0.0, True
    for d, blocks in ((8, [8]), (96, [64, 32]), (128, [128]), (80, [64, 16]), (112, [64, 32, 16])):
        ok_blocks &= ref.hadamard_blocks(d) == blocks
        R = ref.rotation_matrix(d, ref.rotation_seed(base, 1, 0))
        worst = max(worst, float(np.abs(R @ R.T - np.eye(d)).max()))
        mask = np.zeros((d, d), dtype=bool)
        o = 0
        for n in blocks:   # inside a block every entry is +-1/sqrt(n), zero outside
            ok_blocks &= bool(np.allclose(np.abs(R[o:o + n, o:o + n]), 1 / math.sqrt(n)))
            mask[o:o + n, o:o + n] = True
            o += n
        ok_blocks &= bool(np.all(R[~mask] == 0))
    check(ok_blocks, "tq rotation: power-of-two blocks, largest first, entries +-1/sqrt(n)")
    check(worst < 1e-12, "tq rotation: R R^T = I (max |diff| %.1e)" % worst)
    # R = H D: column j of block k is sign_j times Hadamard column j (row 0 is sign / sqrt(n))
    R = ref.rotation_matrix(8, 0)
    check(np.allclose(R[0] * math.sqrt(8), sg), "tq rotation: row 0 of R (d=8, seed 0) = signs / sqrt(8)")


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


def s_fwht_rotate(x, signs, inverse=False):
    """Scalar randomized Hadamard transform (signs, then butterflies per power-of-two
    block, largest first); inverse: butterflies, then signs."""
    x = [float(v) for v in x]
    d = len(x)
    if not inverse:
        x = [v * sg for v, sg in zip(x, signs)]
    o, rest = 0, d
    while rest:
        n = 1 << (rest.bit_length() - 1)
        h = 1
        while h < n:
            for i in range(o, o + n, 2 * h):
                for j in range(i, i + h):
                    a, b = x[j], x[j + h]
                    x[j], x[j + h] = a + b, a - b
            h *= 2
        for i in range(o, o + n):
            x[i] /= math.sqrt(n)
        o += n
        rest -= n
    if inverse:
        x = [v * sg for v, sg in zip(x, signs)]
    return x


def s_tq(x, fmt, seed, sd):
    """Scalar tq quantize-dequantize of one head's row."""
    d = len(x)
    signs = ref.rotation_signs(d, seed)
    y = s_fwht_rotate(x, signs)
    nrm = math.sqrt(sum(v * v for v in x))
    if nrm == 0:
        return [0.0] * d
    bits = ref.tq_bits(fmt, d)
    c = []
    for i in range(d):
        cb = ref.lloyd_max(d, int(bits[i]))[0]
        u = y[i] / nrm
        k = 0
        while k + 1 < len(cb) and u > (cb[k] + cb[k + 1]) / 2:   # thresholds at midpoints
            k += 1
        c.append(float(cb[k]))
    s = nrm * nrm / sum(a * b for a, b in zip(y, c))
    s = float(np.float16(s)) if sd == "f16" else float(np.float32(s))
    return [s * v for v in s_fwht_rotate(c, signs, inverse=True)]


class Store:
    """One layer's K or V store: appends one [nkv, hs] vector per token and keeps what
    attention would read (`stored`), applying the flush rules as events."""

    def __init__(self, fmt, is_key, spec, hs, layer=0):
        self.fmt, self.is_key, self.spec, self.hs, self.layer = fmt, is_key, spec, hs, layer
        self.raw, self.stored = [], []
        self.nq = 0               # number of oldest tokens stored quantized (kivi)
        self.tensor_scale = None  # int8 "tensor" scale (first append batch)
        # --kv-rotate hadamard: int8 rows and KIVI value rows are quantized rotated, with
        # the signs of the tq rotation of (layer, head); KIVI keys are not rotated
        self.rotate = spec.kv_rotate == "hadamard" and (
            fmt == "int8" or (fmt.startswith("kivi") and not is_key))
        self.signs = None

    def _rotate(self, x, inverse=False):
        """[nkv, hs] rows rotated per head (inverse: rotated back); unchanged without kv_rotate."""
        if not self.rotate:
            return x
        nkv, hs = x.shape
        if self.signs is None:
            self.signs = [ref.rotation_signs(hs, ref.rotation_seed(self.spec.rotation_seed, self.layer, h))
                          for h in range(nkv)]
        return np.array([s_fwht_rotate(list(x[h]), self.signs[h], inverse) for h in range(nkv)])

    def append(self, x):
        sp, fmt = self.spec, self.fmt
        self.raw.append(x.copy())
        nkv, hs = x.shape
        Gc = min(sp.group_size, hs)
        if fmt == "f32" or fmt.startswith("kivi") or fmt in ref.TQ_FORMATS:
            self.stored.append(x.copy())
        elif fmt == "f16":
            self.stored.append(x.astype(np.float16).astype(np.float64))
        elif fmt == "int8":
            g = sp.int8_granularity
            x = self._rotate(x)     # scales (the tensor scale too) come from the rotated row
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
            self.stored.append(self._rotate(y, inverse=True))
        if fmt.startswith("kivi"):
            self._flush(int(fmt[4:]))
        elif fmt in ref.TQ_FORMATS:
            # keys and values: at most R full-precision tokens, the oldest quantized one by one
            while len(self.raw) - self.nq > sp.residual:
                x = self.raw[self.nq]
                y = np.empty_like(x)
                for h in range(nkv):
                    seed = ref.rotation_seed(sp.rotation_seed, self.layer, h)
                    y[h] = s_tq(list(x[h]), fmt, seed, sp.scale_dtype)
                self.stored[self.nq] = y
                self.nq += 1

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
                x = self._rotate(self.raw[self.nq])   # rotated when it leaves the residual window
                nkv, hs = x.shape
                Gc = min(G, hs)
                y = np.empty_like(x)
                for h in range(nkv):
                    for c0 in range(0, hs, Gc):
                        y[h, c0:c0 + Gc] = s_asym(list(x[h, c0:c0 + Gc]), bits, sp.scale_dtype)
                self.stored[self.nq] = self._rotate(y, inverse=True)
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


def test_layer_map():
    got = ref.layer_formats(" 0 : kivi4 ; 3-4,1:int8/tq3 ;; *:kivi2 ;", 6)
    want = [("kivi4", "kivi4"), ("int8", "tq3"), ("kivi2", "kivi2"), ("int8", "tq3"),
            ("int8", "tq3"), ("kivi2", "kivi2")]
    check(got == want, "layer map: lists, ranges, '*', KEY/VALUE, spaces and empty rules")
    check(ref.layer_formats("0-1:f16;*:tq2", 2) == [("f16", "f16")] * 2,
          "layer map: '*' may cover no layer")
    check(ref.KVSpec(k_format="kivi2", layers="*:f32").all_f32(),
          "layer map: replaces k_format and v_format")
    bad = [("0:kivi4;0:kivi2;*:f32", 4), ("0-2:kivi4;2:kivi2;*:f32", 4), ("*:kivi4;*:kivi2", 4),
           ("0:kivi4", 2), ("0-2:kivi4", 2), ("2-1:kivi4;*:f32", 4), ("0:kivi3;*:f32", 4),
           ("0:kivi4/;*:f32", 4), ("0:kivi4/tq3/f32;*:f32", 4), ("0;*:f32", 4), (":kivi4;*:f32", 4),
           ("-1:kivi4;*:f32", 4), ("0:kivi4:kivi2;*:f32", 4), ("", 4), (";", 4)]
    refused = 0
    for text, n in bad:
        try:
            ref.layer_formats(text, n)
        except ValueError:
            refused += 1
        else:
            print("    accepted %r with %d layers" % (text, n))
    check(refused == len(bad), "layer map: %d of %d malformed maps refused" % (refused, len(bad)))


def simulate_stream(model, tokens, spec):
    """Token-by-token forward with explicit per-layer caches; returns logits [T, vocab]."""
    m = model
    hs, nh, nkv = m.head_size, m.n_heads, m.n_kv_heads
    grp = nh // nkv
    fmts = spec.formats(m.n_layers)
    kst = [Store(fmts[l][0], True, spec, hs, l) for l in range(m.n_layers)]
    vst = [Store(fmts[l][1], False, spec, hs, l) for l in range(m.n_layers)]
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
    dict(k_format="tq3", v_format="tq2.5", residual=40),
    dict(k_format="tq4", v_format="tq3.5", residual=0, scale_dtype="f32", rotation_seed=7),
    dict(k_format="tq2", v_format="tq3", residual=100),
    dict(k_format="kivi2", v_format="tq2", group_size=16, residual=32),
    # per-layer formats: each layer's cache with its own key and value formats
    dict(layers="0:kivi4/tq3;2-3:int8/kivi2;*:kivi2/f16", group_size=16, residual=32),
    # --kv-rotate hadamard: int8 keys and values and KIVI values rotated (KIVI keys not)
    dict(k_format="int8", v_format="int8", int8_granularity="token", kv_rotate="hadamard"),
    dict(k_format="int8", v_format="int8", int8_granularity="tensor", kv_rotate="hadamard", rotation_seed=7),
    dict(k_format="int8", v_format="int8", int8_granularity="group", group_size=4, kv_rotate="hadamard"),
    dict(k_format="kivi2", v_format="kivi4", group_size=16, residual=32, kv_rotate="hadamard"),
    dict(layers="0:int8/kivi2;1-2:kivi4/f16;*:tq3/kivi8", group_size=16, residual=16,
         int8_granularity="head", scale_dtype="f32", kv_rotate="hadamard"),
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
    # kv_rotate moves int8 and KIVI values, and leaves KIVI keys, f16 and tq as they are
    moved = []
    for k, v in (("int8", "int8"), ("f32", "kivi4"), ("kivi2", "f16"), ("tq3", "tq2")):
        plain = ref.forward_chunk(model, toks, ref.KVSpec(k, v, residual=0))
        rot = ref.forward_chunk(model, toks, ref.KVSpec(k, v, residual=0, kv_rotate="hadamard"))
        moved.append(float(np.abs(rot - plain).max()))
    check(min(moved[:2]) > 1e-4 and max(moved[2:]) == 0.0,
          "streaming: kv_rotate moves int8 and KIVI values (%.1e, %.1e), not KIVI keys or tq (%.1e, %.1e)"
          % tuple(moved))


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
    test_tq_codebook()
    test_tq_rotation()
    test_layer_map()
    test_streaming(model, tok, text, 140)
    print("time %.1f s" % (time.time() - t0))
    if failures:
        print("FAILED: %d check(s)" % len(failures))
        return 1
    print("all reference self-tests passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
