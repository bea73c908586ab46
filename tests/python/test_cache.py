#!/usr/bin/python3
"""kivi.Cache against the codec functions: at every step of a streamed sequence the cache's
stored bytes (codes, scales, zeros) are the codec's, its residual holds the exact recent
tokens, get_full_cache() is their dequantization, and the flush counts follow the rules;
memory statistics and errors."""

import itertools
import unittest

import numpy as np

import common  # noqa: F401  (paths)
import kivi


def configs():
    """(key bits, value bits, head_dim, G, R, flush, scale dtype): every G/R/flush/bits
    combination, head_dims whose packed rows take each key-group interleave (words, pairs, bytes)."""
    out = []
    for (kb, vb), G, r_groups, flush in itertools.product(((2, 2), (4, 4), (4, 2)), (4, 8, 32), (0, 1, 2),
                                                          ("batch", "group")):
        D = {4: 16, 8: 8, 32: 4}[G] if kb == 2 else {4: 16, 8: 8, 32: 16}[G]
        sd = "f16" if (G + r_groups) % 2 == 0 else "f32"
        out.append((kb, vb, D, G, r_groups * G, flush, sd))
    return out


class Streaming(unittest.TestCase):
    def check_state(self, cache, k, v, n, cfg, msg):
        kb, vb, D, G, R, flush, sd = cfg
        st = cache.stored()
        nk, nv = st["keys_stored"], st["values_stored"]
        self.assertEqual(st["n_tokens"], n, msg)
        self.assertEqual(nk, kivi.keys_quantized_after(n, G, R, flush), msg)
        self.assertEqual(nv, kivi.values_quantized_after(n, R), msg)
        # Keys: the stored group bytes are quantize_keys' output.
        kc, ks, kz = kivi.quantize_keys(k[:, :, :nk], kb, G, sd)
        np.testing.assert_array_equal(st["key_codes"], kc, msg)
        np.testing.assert_array_equal(st["key_scales"], ks, msg)
        np.testing.assert_array_equal(st["key_zeros"], kz, msg)
        self.assertEqual(st["key_scales"].dtype, np.float16 if sd == "f16" else np.float32)
        # Values: the stored quads are quantize_values' rows, interleaved (slots past nv unused).
        vc, vs, vz = kivi.quantize_values(v[:, :, :nv], vb, G, sd)
        quads = kivi.value_quads(vc)
        stored = st["value_quads"]
        self.assertEqual(stored.shape, quads.shape, msg)
        live = (np.arange(stored.shape[2] * 4).reshape(-1, 1, 4) < nv)[None, None] & np.ones(stored.shape, bool)
        np.testing.assert_array_equal(stored[live], quads[live], msg)
        np.testing.assert_array_equal(st["value_scales"], vs, msg)
        np.testing.assert_array_equal(st["value_zeros"], vz, msg)
        # The residual windows hold the exact recent tokens.
        np.testing.assert_array_equal(st["key_residual"], k[:, :, nk:n], msg)
        np.testing.assert_array_equal(st["value_residual"], v[:, :, nv:n], msg)
        # What attention reads.
        fk, fv = cache.get_full_cache(0)
        np.testing.assert_array_equal(fk[:, :, :nk], kivi.dequantize_keys(kc, ks, kz, kb, G), msg)
        np.testing.assert_array_equal(fk[:, :, nk:], k[:, :, nk:n], msg)
        np.testing.assert_array_equal(fv[:, :, :nv], kivi.dequantize_values(vc, vs, vz, vb, G), msg)
        np.testing.assert_array_equal(fv[:, :, nv:], v[:, :, nv:n], msg)
        return nk, nv

    def test_every_step_matches_the_codec(self):
        rng = np.random.default_rng(11)
        for cfg in configs():
            kb, vb, D, G, R, flush, sd = cfg
            B, H, T = 2, 3, 3 * max(R, G) + G + 3
            k = (rng.standard_normal((B, H, T, D)) * 2).astype(np.float32)
            v = rng.standard_normal((B, H, T, D)).astype(np.float32)
            k[..., 1] += 10.0
            cache = kivi.Cache(H, D, T + 5, "kivi%d" % kb, kv_cache_v="kivi%d" % vb, group_size=G, residual=R,
                               key_flush=flush, scale_dtype=sd, batch=B)
            self.assertEqual((cache.key_bits, cache.value_bits, cache.key_flush, cache.scale_dtype),
                             (kb, vb, flush, sd))
            seen_k, seen_v = set(), set()
            for n in range(1, T + 1):
                cache.add_tokens(k[:, :, n - 1:n], v[:, :, n - 1:n])
                nk, nv = self.check_state(cache, k, v, n, cfg, "cfg %s after %d tokens" % (cfg, n))
                seen_k.add(nk)
                seen_v.add(nv)
            self.assertGreater(len(seen_k), 2, cfg)  # the run crossed several flushes
            self.assertGreater(len(seen_v), 2, cfg)

    def test_chunks_equal_single_tokens(self):
        rng = np.random.default_rng(12)
        B, H, T, D = 1, 2, 150, 16
        k = rng.standard_normal((B, H, T, D)).astype(np.float32)
        v = rng.standard_normal((B, H, T, D)).astype(np.float32)
        a = kivi.Cache(H, D, T, "kivi2", group_size=32, residual=64, key_flush="group")
        b = kivi.Cache(H, D, T, "kivi2", group_size=32, residual=64, key_flush="group")
        a.add_tokens(k, v)
        for t0 in range(0, T, 37):
            b.add_tokens(k[:, :, t0:t0 + 37], v[:, :, t0:t0 + 37])
        for x, y in zip(a.get_full_cache(0), b.get_full_cache(0)):
            np.testing.assert_array_equal(x, y)
        self.assertEqual(a.n_tokens(), T)

    def test_batch_rows_are_independent_sequences(self):
        rng = np.random.default_rng(13)
        k = rng.standard_normal((3, 2, 70, 8)).astype(np.float32)
        v = rng.standard_normal((3, 2, 70, 8)).astype(np.float32)
        whole = kivi.Cache(2, 8, 70, "kivi4", group_size=8, residual=16, batch=3)
        whole.add_tokens(k, v)
        fk, fv = whole.get_full_cache(0)
        for b in range(3):
            one = kivi.Cache(2, 8, 70, "kivi4", group_size=8, residual=16)
            one.add_tokens(k[b:b + 1], v[b:b + 1])
            ok, ov = one.get_full_cache(0)
            np.testing.assert_array_equal(fk[b:b + 1], ok)
            np.testing.assert_array_equal(fv[b:b + 1], ov)

    def test_layers(self):
        rng = np.random.default_rng(14)
        c = kivi.Cache(1, 8, 64, "kivi2", group_size=8, residual=8, n_layers=3)
        for layer in range(3):
            c.add_tokens(rng.standard_normal((1, 1, 10 + layer, 8)), rng.standard_normal((1, 1, 10 + layer, 8)), layer)
        full = c.get_full_cache()
        self.assertEqual([f[0].shape[2] for f in full], [10, 11, 12])
        self.assertEqual([c.n_tokens(l) for l in range(3)], [10, 11, 12])
        c.clear()
        self.assertEqual(c.n_tokens(2), 0)
        self.assertEqual(c.get_full_cache(1)[0].shape, (1, 1, 0, 8))


class Memory(unittest.TestCase):
    def test_bytes_used(self):
        rng = np.random.default_rng(15)
        B, H, D, G, R = 2, 4, 32, 32, 64
        for kb, sd in ((2, "f16"), (4, "f32")):
            ps = 2 if sd == "f16" else 4
            c = kivi.Cache(H, D, 512, "kivi%d" % kb, group_size=G, residual=R, scale_dtype=sd, batch=B)
            S = B * H
            for n in (0, 1, 63, 64, 65, 200, 400):
                c.add_tokens(*(rng.standard_normal((B, H, n - c.n_tokens(), D)) for _ in range(2)))
                st = c.memory_stats()
                nk = kivi.keys_quantized_after(n, G, R, "batch")
                nv = kivi.values_quantized_after(n, R)
                expect = (S * nk * D * kb // 8 + S * (nk // G) * D * 2 * ps       # keys: codes, scale + zero per channel
                          + S * nv * (D * kb // 8 + 2 * ps * (D // min(G, D)))    # values: codes, scale + zero per group
                          + S * ((n - nk) + (n - nv)) * D * 4)                    # the residual, f32
                self.assertEqual(st["bytes_used"], expect, (kb, n))
                self.assertEqual(st["f32_bytes"], 2 * S * n * D * 4)
                self.assertEqual(st["layers"][0]["keys_quantized"], nk)
                self.assertGreaterEqual(st["bytes_reserved"], st["bytes_used"])
            self.assertGreater(st["compression"], 3.0 if kb == 2 else 2.0)
            self.assertEqual(st["bits_per_element_k"], kb + 2 * ps * 8 / G)


class Errors(unittest.TestCase):
    def assertError(self, fn, *needles):
        with self.assertRaises(kivi.Error) as cm:
            fn()
        for n in needles:
            self.assertIn(n, str(cm.exception))

    def test_messages(self):
        self.assertError(lambda: kivi.Cache(2, 8, 64, "f16"), "KIVI formats", "f16")
        self.assertError(lambda: kivi.Cache(2, 8, 64, "kivi3"), "kivi3")
        self.assertError(lambda: kivi.Cache(2, 8, 64, residual=20, group_size=8), "multiple of --group-size")
        self.assertError(lambda: kivi.Cache(2, 6, 64), "head_dim = 6")
        self.assertError(lambda: kivi.Cache(2, 8, 64, key_flush="lazy"), "lazy")
        self.assertError(lambda: kivi.Cache(0, 8, 64), "n_heads = 0")
        c = kivi.Cache(2, 8, 16, group_size=4, residual=4)
        x = np.zeros((1, 2, 10, 8), np.float32)
        self.assertError(lambda: c.add_tokens(x, np.zeros((1, 2, 9, 8), np.float32)), "different shapes")
        self.assertError(lambda: c.add_tokens(x[:, :1], x[:, :1]), "[1, 2, T, 8]")
        self.assertError(lambda: c.add_tokens(x[0], x[0]), "4-dimensional")
        self.assertError(lambda: c.add_tokens(x, x, layer=1), "layer 1 is out of range")
        c.add_tokens(x, x)
        self.assertError(lambda: c.add_tokens(x, x), "10 tokens do not fit", "max_tokens = 16")
        self.assertEqual(c.n_tokens(), 10)  # a refused append changes nothing


if __name__ == "__main__":
    unittest.main()
