#!/usr/bin/python3
"""The codec functions of the Python module: known values, round-trip bounds, batches and
heads, constant input, the byte layouts, errors; checked against a numpy reference of the
quantizer written here from the specification (kv/codec.h)."""

import threading
import unittest

import numpy as np

import common  # noqa: F401  (paths)
import kivi


def ref_params(mn, mx, bits, scale_dtype):
    """(scale, zero) as float32, from the specification: f32 plainly; f16 with the zero rounded
    down and the scale (max - zero) / L rounded up (in numpy's float16, independently)."""
    L = np.float32((1 << bits) - 1)
    mn = np.asarray(mn, np.float32)
    mx = np.asarray(mx, np.float32)
    if scale_dtype == "f32":
        return ((mx - mn) / L).astype(np.float32), mn

    def f16_down(x):
        h = np.clip(x, -65504, 65504).astype(np.float16)
        return np.where(h.astype(np.float32) > x, np.nextafter(h, np.float16(-np.inf)), h).astype(np.float32)

    def f16_up(x):
        h = x.astype(np.float16)
        return np.where(h.astype(np.float32) < x, np.nextafter(h, np.float16(np.inf)), h).astype(np.float32)

    zero = f16_down(mn)
    s = (mx.astype(np.float64) - zero.astype(np.float64)) / float(L)
    sf = s.astype(np.float32)
    sf = np.where(sf.astype(np.float64) < s, np.nextafter(sf, np.float32(np.inf)), sf).astype(np.float32)
    return np.minimum(f16_up(sf), np.float32(65504)), zero


def ref_codes(x, scale, zero, bits):
    L = (1 << bits) - 1
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.rint((x - zero) / np.where(scale > 0, scale, np.float32(1)))
    q = np.clip(np.nan_to_num(q), 0, L)
    return np.where(scale > 0, q, 0).astype(np.uint8)


class KnownValues(unittest.TestCase):
    """[1, 2, 3, 4] gives scale 1, zero 1 and the packed byte 0 | 1 << 2 | 2 << 4 | 3 << 6 = 228."""

    def test_values(self):
        for sd in ("f16", "f32"):
            v = np.array([[[[1, 2, 3, 4]]]], np.float32)  # [B=1, H=1, T=1, D=4], one group of 4 channels
            codes, scales, zeros = kivi.quantize_values(v, 2, 4, sd)
            self.assertEqual(codes.tolist(), [[[[228]]]])
            self.assertEqual(scales.dtype, np.float16 if sd == "f16" else np.float32)
            self.assertEqual(scales.tolist(), [[[[1.0]]]])
            self.assertEqual(zeros.tolist(), [[[[1.0]]]])
            np.testing.assert_array_equal(kivi.dequantize_values(codes, scales, zeros, 2, 4), v)

    def test_keys(self):
        # Keys laid out [B, H, D, T] elsewhere: 4 channels, each [1, 2, 3, 4] along the tokens; here [B, H, T, D].
        k = np.tile(np.arange(1, 5, dtype=np.float32)[:, None], (1, 4))[None, None]
        codes, scales, zeros = kivi.quantize_keys(k, 2, 4, "f32")
        self.assertEqual(scales.tolist(), [[[[1.0] * 4]]])
        self.assertEqual(zeros.tolist(), [[[[1.0] * 4]]])
        rows = kivi.key_group_rows(codes, 4)  # [1, 1, 4, 1]: token t has code t in every channel
        self.assertEqual(rows[0, 0, :, 0].tolist(), [0, 85, 170, 255])
        per_channel = kivi.unpack_codes(rows, 2)[0, 0].T  # [D, T]: codes 0, 1, 2, 3 along the tokens
        self.assertEqual(kivi.pack_codes(per_channel, 2).ravel().tolist(), [228] * 4)  # packed along the tokens
        np.testing.assert_array_equal(kivi.dequantize_keys(codes, scales, zeros, 2, 4), k)
        # Rotated so that the first token's row is [1, 2, 3, 4]: its stored byte is 228.
        k2 = np.array([[1, 2, 3, 4], [2, 3, 4, 1], [3, 4, 1, 2], [4, 1, 2, 3]], np.float32)[None, None]
        codes2, scales2, zeros2 = kivi.quantize_keys(k2, 2, 4, "f16")
        self.assertEqual(kivi.key_group_rows(codes2, 4)[0, 0, :, 0].tolist(), [228, 57, 78, 147])
        np.testing.assert_array_equal(kivi.dequantize_keys(codes2, scales2, zeros2, 2, 4), k2)


class RoundTrip(unittest.TestCase):
    def test_keys_within_half_a_scale(self):
        rng = np.random.default_rng(1)
        for bits in (2, 4, 8):
            for sd in ("f16", "f32"):
                for G in (1, 4, 32):
                    k = (rng.standard_normal((2, 3, 64, 16)) * 3).astype(np.float32)
                    k[..., 5] += 40.0  # an outlier channel, as keys have
                    codes, scales, zeros = kivi.quantize_keys(k, bits, G, sd)
                    self.assertEqual(codes.shape, (2, 3, 64 // G, G * 16 * bits // 8))
                    self.assertEqual(scales.shape, (2, 3, 64 // G, 16))
                    out = kivi.dequantize_keys(codes, scales, zeros, bits, G)
                    s = np.repeat(scales.astype(np.float32), G, axis=-2)
                    err = np.abs(out - k)
                    self.assertTrue(np.all(err <= 0.5 * s * (1 + 1e-6) + 1e-5 * np.abs(k).max()),
                                    "bits %d %s G %d: max err/scale %g" % (bits, sd, G, np.max(err / np.maximum(s, 1e-30))))

    def test_values_within_half_a_scale(self):
        rng = np.random.default_rng(2)
        for bits in (2, 4, 8):
            for sd in ("f16", "f32"):
                for G in (4, 8, 32, 64):
                    v = rng.standard_normal((2, 2, 40, 32)).astype(np.float32)
                    v[:, :, 7] *= 30.0  # an outlier token
                    codes, scales, zeros = kivi.quantize_values(v, bits, G, sd)
                    gc = min(G, 32)
                    self.assertEqual(codes.shape, (2, 2, 40, 32 * bits // 8))
                    self.assertEqual(scales.shape, (2, 2, 40, 32 // gc))
                    out = kivi.dequantize_values(codes, scales, zeros, bits, G)
                    s = np.repeat(scales.astype(np.float32), gc, axis=-1)
                    self.assertTrue(np.all(np.abs(out - v) <= 0.5 * s * (1 + 1e-6) + 1e-5 * np.abs(v).max()))

    def test_against_reference(self):
        """Scales, zeros and codes equal the numpy reference, bit for bit."""
        rng = np.random.default_rng(3)
        for bits in (2, 4, 8):
            for sd in ("f16", "f32"):
                x = (rng.standard_normal((3, 32, 8)) * rng.uniform(0.01, 100)).astype(np.float32)
                G = 8
                codes, scales, zeros = kivi.quantize_keys(x, bits, G, sd)
                g = x.reshape(3, 4, G, 8)
                rs, rz = ref_params(g.min(axis=2), g.max(axis=2), bits, sd)
                np.testing.assert_array_equal(scales.astype(np.float32), rs)
                np.testing.assert_array_equal(zeros.astype(np.float32), rz)
                rc = ref_codes(g, rs[:, :, None, :], rz[:, :, None, :], bits).reshape(3, 32, 8)
                np.testing.assert_array_equal(kivi.unpack_codes(kivi.key_group_rows(codes, G), bits), rc)
                np.testing.assert_array_equal(codes, kivi.key_group_interleave(kivi.pack_codes(rc, bits), G))

                vc, vs, vz = kivi.quantize_values(x, bits, 4, sd)
                g = x.reshape(3, 32, 2, 4)
                rs, rz = ref_params(g.min(axis=3), g.max(axis=3), bits, sd)
                np.testing.assert_array_equal(vs.astype(np.float32), rs)
                np.testing.assert_array_equal(vz.astype(np.float32), rz)
                rc = ref_codes(g, rs[..., None], rz[..., None], bits).reshape(3, 32, 8)
                np.testing.assert_array_equal(vc, kivi.pack_codes(rc, bits))


class Shapes(unittest.TestCase):
    def test_batches_and_heads_are_independent(self):
        rng = np.random.default_rng(4)
        k = rng.standard_normal((2, 4, 64, 32)).astype(np.float32)
        whole = kivi.quantize_keys(k, 2, 32)
        vwhole = kivi.quantize_values(k, 2, 32)
        for b in range(2):
            for h in range(4):
                part = kivi.quantize_keys(k[b, h], 2, 32)  # [T, D] works too
                vpart = kivi.quantize_values(k[b, h], 2, 32)
                for a, p in zip(whole + vwhole, part + vpart):
                    np.testing.assert_array_equal(a[b, h], p)
        self.assertEqual(kivi.dequantize_keys(*whole, 2, 32).shape, (2, 4, 64, 32))

    def test_float64_and_strided_input(self):
        rng = np.random.default_rng(5)
        x = rng.standard_normal((1, 2, 32, 16))
        a = kivi.quantize_keys(x, 2, 16)
        b = kivi.quantize_keys(x.astype(np.float32), 2, 16)
        for p, q in zip(a, b):
            np.testing.assert_array_equal(p, q)
        y = np.asfortranarray(x.astype(np.float32))
        for p, q in zip(kivi.quantize_values(y, 4, 8), kivi.quantize_values(x.astype(np.float32), 4, 8)):
            np.testing.assert_array_equal(p, q)

    def test_constant_input(self):
        for c in (0.0, 5.0, -3.0, 0.3, 1e-8):
            x = np.full((2, 2, 32, 8), c, np.float32)
            for sd in ("f16", "f32"):
                kc, ks, kz = kivi.quantize_keys(x, 2, 32, sd)
                vc, vs, vz = kivi.quantize_values(x, 2, 32, sd)
                for out in (kivi.dequantize_keys(kc, ks, kz, 2, 32), kivi.dequantize_values(vc, vs, vz, 2, 32)):
                    self.assertTrue(np.all(np.isfinite(out)))
                    if sd == "f32":
                        np.testing.assert_array_equal(out, x)  # scale 0: exactly the zero point
                    else:
                        self.assertLessEqual(np.abs(out - x).max(), abs(c) * 1e-3 + 1e-7)
                if sd == "f32":
                    self.assertTrue(np.all(ks == 0) and np.all(kc == 0) and np.all(vs == 0) and np.all(vc == 0))

    def test_layout_round_trips(self):
        rng = np.random.default_rng(6)
        for W, G in ((4, 8), (8, 4), (2, 16), (1, 4), (6, 8), (3, 4), (32, 32)):
            rows = rng.integers(0, 256, (2, 3, 4 * G, W), dtype=np.uint8)
            inter = kivi.key_group_interleave(rows, G)
            self.assertEqual(inter.shape, (2, 3, 4, G * W))
            np.testing.assert_array_equal(kivi.key_group_rows(inter, G), rows)
            quads = kivi.value_quads(rows[:, :, :4 * G - 1])
            np.testing.assert_array_equal(kivi.value_quad_rows(quads, 4 * G - 1), rows[:, :, :4 * G - 1])
        # The word order: row bytes 0..7 of token 0 in a group of 2 land at 0, 2, 1, 3 and 8, 10, 9, 11.
        rows = np.arange(16, dtype=np.uint8).reshape(2, 8)
        self.assertEqual(kivi.key_group_interleave(rows, 2).ravel().tolist(),
                         [0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15])
        codes = rng.integers(0, 4, (5, 16), dtype=np.uint8)
        np.testing.assert_array_equal(kivi.unpack_codes(kivi.pack_codes(codes, 2), 2), codes)


class Errors(unittest.TestCase):
    def assertError(self, fn, *needles):
        with self.assertRaises(kivi.Error) as cm:
            fn()
        for n in needles:
            self.assertIn(n, str(cm.exception))

    def test_messages(self):
        x = np.zeros((1, 1, 30, 8), np.float32)
        self.assertError(lambda: kivi.quantize_keys(x, 2, 32), "30 tokens is not a multiple of the group size 32")
        self.assertError(lambda: kivi.quantize_keys(x[..., :30, :], 3, 2), "bits = 3")
        self.assertError(lambda: kivi.quantize_keys(np.zeros(8, np.float32), 2, 1), "at least 2 dimensions")
        self.assertError(lambda: kivi.quantize_keys(np.zeros((4, 6), np.float32), 2, 4), "head_dim 6")
        self.assertError(lambda: kivi.quantize_values(np.zeros((4, 12), np.float32), 2, 8), "does not divide")
        self.assertError(lambda: kivi.quantize_values(x, 2, 8, "f64"), "f64")
        c, s, z = kivi.quantize_keys(np.zeros((2, 32, 8), np.float32), 2, 32)
        self.assertError(lambda: kivi.dequantize_keys(c, s, z, 2, 16), "codes have shape")
        self.assertError(lambda: kivi.dequantize_keys(c.astype(np.int32), s, z, 2, 32), "uint8")
        self.assertError(lambda: kivi.dequantize_keys(c, s.astype(np.float64), z, 2, 32), "float16 or float32")
        self.assertError(lambda: kivi.dequantize_keys(c, s, z.astype(np.float32), 2, 32), "different dtypes")
        self.assertError(lambda: kivi.dequantize_keys(c[:1], s, z, 2, 32), "leading dimensions")
        vc, vs, vz = kivi.quantize_values(np.zeros((2, 5, 8), np.float32), 2, 4)
        self.assertError(lambda: kivi.dequantize_values(vc, vs[..., :1], vz[..., :1], 2, 4), "parameters have shape")
        self.assertTrue(issubclass(kivi.Error, RuntimeError))


class Threads(unittest.TestCase):
    def test_concurrent_calls_agree(self):
        """The codecs run without the GIL: threads calling them at once get the serial results."""
        rng = np.random.default_rng(7)
        xs = [rng.standard_normal((4, 4, 256, 64)).astype(np.float32) for _ in range(4)]
        expect = [kivi.quantize_keys(x, 2, 32) for x in xs]
        got = [None] * 4

        def run(i):
            got[i] = kivi.quantize_keys(xs[i], 2, 32)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for e, g in zip(expect, got):
            for a, b in zip(e, g):
                np.testing.assert_array_equal(a, b)


class Tq(unittest.TestCase):
    """kivi.quantize_tq / dequantize_tq: shapes, the scale's identity <x', x> = |x|^2, the
    distortion on random unit vectors, per-(layer, head) rotations, errors."""

    def test_shapes_and_scale_identity(self):
        rng = np.random.default_rng(3)
        x = rng.standard_normal((2, 3, 5, 64)).astype(np.float32)
        for fmt, row in (("tq2", 16), ("tq2.5", 18), ("tq3", 24), ("tq3.5", 26), ("tq4", 32)):
            codes, scales = kivi.quantize_tq(x, fmt, layer=1)
            self.assertEqual(codes.shape, (2, 3, 5, row))
            self.assertEqual(codes.dtype, np.uint8)
            self.assertEqual(scales.shape, (2, 3, 5))
            self.assertEqual(scales.dtype, np.float16)
            y = kivi.dequantize_tq(codes, scales, fmt, head_dim=64, layer=1)
            self.assertEqual(y.shape, x.shape)
            # s = |x|^2 / <Rx, c>: the reconstruction's product with its row is |x|^2, up to
            # the f16 rounding of s.
            self_dot = (y.astype(np.float64) * x).sum(-1)
            np.testing.assert_allclose(self_dot, (x.astype(np.float64) ** 2).sum(-1), rtol=1.5e-3)
            again = kivi.quantize_tq(x, fmt, layer=1)
            np.testing.assert_array_equal(again[0], codes)

    def test_distortion_of_random_unit_vectors(self):
        rng = np.random.default_rng(5)
        x = rng.standard_normal((16, 200, 128))
        x = (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)
        # The codebooks' mean squared error at d = 128 (kv/lloyd_max.h), with the stored
        # scale's small change (tests/test_tq.cpp): within 15% above, 5% below.
        for fmt, mse in (("tq2", 0.1160), ("tq3", 0.03397), ("tq4", 0.009315)):
            codes, scales = kivi.quantize_tq(x, fmt, scale_dtype="f32")
            y = kivi.dequantize_tq(codes, scales, fmt, head_dim=128)
            got = ((y - x) ** 2).sum(-1).mean()
            self.assertGreater(got, 0.95 * mse, fmt)
            self.assertLess(got, 1.15 * mse, fmt)

    def test_rotations_depend_on_layer_head_and_seed(self):
        rng = np.random.default_rng(7)
        row = rng.standard_normal(32).astype(np.float32)
        x = np.stack([row, row])[:, None, :]  # two heads, one token, the same row
        c0, _ = kivi.quantize_tq(x, "tq4")
        self.assertFalse(np.array_equal(c0[0], c0[1]))  # heads rotate differently
        c1, _ = kivi.quantize_tq(x, "tq4", layer=3)
        c2, _ = kivi.quantize_tq(x, "tq4", rotation_seed=99)
        self.assertFalse(np.array_equal(c0, c1))
        self.assertFalse(np.array_equal(c0, c2))
        # Decoding with the wrong layer does not give the row back.
        y_ok = kivi.dequantize_tq(c1, kivi.quantize_tq(x, "tq4", layer=3)[1], "tq4", 32, layer=3)
        y_bad = kivi.dequantize_tq(c1, kivi.quantize_tq(x, "tq4", layer=3)[1], "tq4", 32, layer=0)
        self.assertLess(np.abs(y_ok - x).max(), np.abs(y_bad - x).max())

    def test_errors(self):
        x = np.zeros((2, 4, 16), np.float32)
        with self.assertRaisesRegex(kivi.Error, "not a tq format"):
            kivi.quantize_tq(x, "kivi2")
        with self.assertRaisesRegex(kivi.Error, "tq bits"):
            kivi.quantize_tq(x, "tq5")
        with self.assertRaisesRegex(kivi.Error, "at least 3 dimensions"):
            kivi.quantize_tq(np.zeros((4, 16), np.float32), "tq3")
        with self.assertRaisesRegex(kivi.Error, "head_dim 2"):
            kivi.quantize_tq(np.zeros((1, 1, 2), np.float32), "tq3")
        codes, scales = kivi.quantize_tq(x, "tq3")
        with self.assertRaisesRegex(kivi.Error, "codes have shape"):
            kivi.dequantize_tq(codes, scales, "tq3", head_dim=32)


if __name__ == "__main__":
    unittest.main()
