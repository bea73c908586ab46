#!/usr/bin/python3
"""kivi.qat and kivi.llama (PyTorch) against the C++ engine: the batched fake quantization
reproduces, bit for bit, what the streaming cache holds at every step (2/4 bits, several G
and R, both flush policies, f16/f32 scales); attention over it equals attention over each
step's cache; the gradients are straight-through; the llama2.c port reads and writes
checkpoints byte for byte and gives the engine's logits."""

import os
import tempfile
import unittest

import numpy as np

import common

common.skip_without_torch()

import torch  # noqa: E402

import kivi  # noqa: E402
from kivi.llama import Llama  # noqa: E402
from kivi.qat import (KiviConfig, fake_quantize_keys, fake_quantize_kv, fake_quantize_values, kivi_attention,
                      round_f16_down, round_f16_up, streaming_masks)

torch.set_num_threads(1)


class F16Rounding(unittest.TestCase):
    def test_directed_rounding_matches_numpy(self):
        rng = np.random.default_rng(21)
        x = np.concatenate([rng.standard_normal(20000) * 10.0 ** rng.integers(-9, 6, 20000),
                            np.array([0.0, -0.0, 1.0, -1.0, 65504.0, -65504.0, 65519.0, 65520.0, 1e30, -1e30,
                                      6e-8, -6e-8, 1e-9, 2.0 ** -24, 2.0 ** -25])]).astype(np.float32)
        with np.errstate(over="ignore"):  # values past the f16 range become infinities, as in C++
            h = x.astype(np.float16)
            up = np.where(h.astype(np.float32) < x, np.nextafter(h, np.float16(np.inf)), h).astype(np.float32)
            down = np.where(h.astype(np.float32) > x, np.nextafter(h, np.float16(-np.inf)), h).astype(np.float32)
        t = torch.from_numpy(x)
        np.testing.assert_array_equal(round_f16_up(t).numpy(), up)
        np.testing.assert_array_equal(round_f16_down(t).numpy(), down)


def configs():
    out = []
    for kb, vb in ((2, 2), (4, 4), (2, 4)):
        for G in (4, 8, 32):
            for r_groups in (0, 1, 2):
                for flush in ("batch", "group"):
                    sd = "f16" if (G + r_groups + kb) % 2 == 0 else "f32"
                    out.append(KiviConfig(kb, vb, G, r_groups * G, flush, sd))
    return out


class AgainstTheCache(unittest.TestCase):
    def test_every_step(self):
        """At every step t, StreamingKV.at(t) is exactly cache.get_full_cache() after token t."""
        rng = np.random.default_rng(22)
        for cfg in configs():
            B, H, D = 2, 2, 16
            T = 3 * max(cfg.residual, cfg.group_size) + cfg.group_size + 3
            k = (rng.standard_normal((B, H, T, D)) * 2).astype(np.float32)
            v = rng.standard_normal((B, H, T, D)).astype(np.float32)
            k[..., 3] -= 20.0  # an outlier channel
            v[:, :, 5] *= 50.0  # an outlier token
            skv = fake_quantize_kv(torch.from_numpy(k), torch.from_numpy(v), cfg)
            cache = kivi.Cache(H, D, T, "kivi%d" % cfg.key_bits, kv_cache_v="kivi%d" % cfg.value_bits,
                               group_size=cfg.group_size, residual=cfg.residual, key_flush=cfg.key_flush,
                               scale_dtype=cfg.scale_dtype, batch=B)
            for t in range(T):
                cache.add_tokens(k[:, :, t:t + 1], v[:, :, t:t + 1])
                ck, cv = cache.get_full_cache(0)
                tk, tv = skv.at(t)
                np.testing.assert_array_equal(tk.numpy(), ck, "%s keys at step %d" % (cfg, t))
                np.testing.assert_array_equal(tv.numpy(), cv, "%s values at step %d" % (cfg, t))
            # The run crossed flushes of both streams.
            self.assertGreater(int(skv.key_mask[-1].sum()), cfg.group_size, cfg)
            self.assertGreater(int(skv.value_mask[-1].sum()), 1, cfg)

    def test_constant_and_outlier_groups(self):
        cfg = KiviConfig(2, 2, 8, 8, "group", "f16")
        k = np.zeros((1, 1, 40, 8), np.float32)
        k[..., :16, :] = 3.25
        k[..., 16:24, 2] = 70000.0  # beyond the f16 range
        v = np.full((1, 1, 40, 8), -0.3, np.float32)
        cache = kivi.Cache(1, 8, 40, "kivi2", group_size=8, residual=8, key_flush="group")
        cache.add_tokens(k, v)
        ck, cv = cache.get_full_cache(0)
        tk, tv = fake_quantize_kv(torch.from_numpy(k), torch.from_numpy(v), cfg).at(39)
        np.testing.assert_array_equal(tk.numpy(), ck)
        np.testing.assert_array_equal(tv.numpy(), cv)
        self.assertTrue(np.all(np.isfinite(ck)))


class Attention(unittest.TestCase):
    def test_equals_attention_over_each_steps_cache(self):
        torch.manual_seed(23)
        B, Hq, Hk, T, D = 2, 4, 2, 70, 8
        for cfg in (KiviConfig(2, 2, 8, 16, "batch"), KiviConfig(4, 2, 16, 16, "group", "f32"), KiviConfig(2, 2, 8, 0)):
            q = torch.randn(B, Hq, T, D)
            k = torch.randn(B, Hk, T, D) * 2
            v = torch.randn(B, Hk, T, D)
            skv = fake_quantize_kv(k, v, cfg)
            out = kivi_attention(q, skv)
            for t in range(T):
                kt, vt = skv.at(t)  # [B, Hk, t+1, D]
                kt = kt.repeat_interleave(Hq // Hk, dim=1)
                vt = vt.repeat_interleave(Hq // Hk, dim=1)
                p = torch.softmax(q[:, :, t:t + 1] @ kt.transpose(-1, -2) / D ** 0.5, dim=-1)
                ref = (p @ vt)[:, :, 0]
                self.assertLess((out[:, :, t] - ref).abs().max().item(), 1e-5, (cfg, t))


class Gradients(unittest.TestCase):
    def test_straight_through(self):
        torch.manual_seed(24)
        k = torch.randn(2, 3, 64, 16, requires_grad=True)
        w = torch.randn(2, 3, 64, 16)
        (fake_quantize_keys(k, 2, 32) * w).sum().backward()
        self.assertTrue(torch.equal(k.grad, w))
        v = torch.randn(2, 3, 10, 16, requires_grad=True)
        (fake_quantize_values(v, 2, 8) * w[:, :, :10]).sum().backward()
        self.assertTrue(torch.equal(v.grad, w[:, :, :10]))

    def test_lsq_reaches_the_range(self):
        torch.manual_seed(25)
        x = torch.randn(1, 1, 32, 8, requires_grad=True)
        w = torch.randn(1, 1, 32, 8)
        out = fake_quantize_keys(x, 2, 32, "f32", grad="lsq")
        np.testing.assert_array_equal(out.detach().numpy(), fake_quantize_keys(x.detach(), 2, 32, "f32").numpy())
        (out * w).sum().backward()
        extra = (x.grad - w).abs() > 1e-6
        # Beyond the identity, only each channel's minimum and maximum receive a gradient.
        ext = (x == x.amin(dim=-2, keepdim=True)) | (x == x.amax(dim=-2, keepdim=True))
        self.assertTrue(bool(extra.any()))
        self.assertFalse(bool((extra & ~ext).any()))


class Masks(unittest.TestCase):
    def test_counts(self):
        for G, R, flush in ((32, 32, "batch"), (32, 32, "group"), (8, 0, "batch"), (8, 0, "group"), (4, 12, "group")):
            cfg = KiviConfig(2, 2, G, R, flush)
            km, vm = streaming_masks(200, cfg)
            for t in range(200):
                self.assertEqual(int(km[t].sum()), kivi.keys_quantized_after(t + 1, G, R, flush))
                self.assertEqual(int(vm[t].sum()), max(0, t + 1 - R))
            self.assertFalse(bool((km & ~torch.ones(200, 200, dtype=torch.bool).tril()).any()))


class LlamaPort(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.model = Llama.from_llama2c(common.MODEL).eval()

    def test_checkpoint_round_trip(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "copy.bin")
            self.model.save_llama2c(out)
            with open(out, "rb") as a, open(common.MODEL, "rb") as b:
                self.assertEqual(a.read(), b.read())

    def test_bad_checkpoints(self):
        with tempfile.TemporaryDirectory() as d:
            bad = os.path.join(d, "bad.bin")
            with open(common.MODEL, "rb") as f:
                data = f.read()
            with open(bad, "wb") as f:
                f.write(data[:-4])
            with self.assertRaisesRegex(ValueError, "header implies"):
                Llama.from_llama2c(bad)
            with open(bad, "wb") as f:
                f.write(data[:10])
            with self.assertRaisesRegex(ValueError, "shorter than the 28-byte"):
                Llama.from_llama2c(bad)

    def test_logits_equal_the_engine(self):
        engine = kivi.Model(common.MODEL)
        with open(common.TEXT) as f:
            text = f.read()[:1000]
        ids = engine.tokenize(text)
        tokens = torch.tensor([ids])
        # Exact cache: the same math, float rounding apart.
        with torch.no_grad():
            got = self.model(tokens)[0].numpy()
        want = engine.session().logits(ids)
        self.assertLess(np.abs(got - want).max(), 2e-4)
        # KIVI caches: a key or value whose float rounding differs by an ulp near a code boundary
        # can take the neighbouring code (and every later position reads it), so logits differ
        # by more than the float rounding; on average they agree, ten times closer than the
        # quantization moves them.
        for cfg in (KiviConfig(2, 2, 32, 32, "batch"), KiviConfig(2, 2, 32, 32, "group"), KiviConfig(4, 4, 32, 64)):
            with torch.no_grad():
                got = self.model(tokens, kivi=cfg)[0].numpy()
            want = engine.session(kv_cache="kivi%d" % cfg.key_bits, residual=cfg.residual,
                                  key_flush=cfg.key_flush).logits(ids)
            err = np.abs(got - want)
            self.assertLess(err.mean(), 1e-3, cfg)
            self.assertGreaterEqual((got.argmax(-1) == want.argmax(-1)).mean(), 0.99, cfg)
            # ... and the quantization shows: far from the exact-cache logits.
            with torch.no_grad():
                exact = self.model(tokens)[0].numpy()
            self.assertGreater(np.abs(exact - want).mean(), 100 * err.mean(), cfg)


if __name__ == "__main__":
    unittest.main()
