#!/usr/bin/python3
"""The engine from Python against the `kivi` command: logits, generation and perplexity give
the same numbers, errors the same messages."""

import json
import os
import struct
import subprocess
import tempfile
import threading
import unittest

import numpy as np

import common
import kivi

def json_number(x):
    """x as `kivi ... --json` prints it (9 significant digits)."""
    return float("%.9g" % x)


def short_text(directory):
    """The first stories of the held-out text (a quicker perplexity)."""
    path = os.path.join(directory, "short.txt")
    with open(common.TEXT) as f, open(path, "w") as o:
        o.write(f.read()[:1500])
    return path


PUBLISHED = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
             "One day, she saw a big, red ball. She wanted to play with it, but it was too high")


def cli(*args):
    r = subprocess.run([common.CLI, *args, "-m", common.MODEL], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("kivi %s failed: %s" % (" ".join(args), r.stderr))
    return r.stdout


def cli_error(*args):
    r = subprocess.run([common.CLI, *args], capture_output=True, text=True)
    assert r.returncode == 1, r
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("kivi: error: "), line
    return line[len("kivi: error: "):]


def cli_logits(prompt, *kv):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "logits.bin")
        cli("logits", "-p", prompt, "-o", path, *kv)
        with open(path, "rb") as f:
            data = f.read()
    magic, n, V = struct.unpack("<3I", data[:12])
    assert magic == 0x474C564B
    return np.frombuffer(data, "<f4", offset=12).reshape(n, V)


class Engine(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.model = kivi.Model(common.MODEL)

    def test_model(self):
        m = self.model
        self.assertEqual((m.config["dim"], m.config["n_layers"], m.config["n_kv_heads"], m.vocab_size, m.ctx),
                         (64, 5, 4, 512, 512))
        self.assertEqual(m.format, "llama2.c")
        ids = m.tokenize("Once upon a time")
        self.assertEqual(ids[0], m.bos_id)
        self.assertEqual(m.detokenize(ids), "Once upon a time")

    def test_greedy_generation_is_the_published_text(self):
        s = self.model.session()
        g = s.generate("Once upon a time", max_tokens=56, temperature=0)
        pieces = list(g)
        self.assertEqual("Once upon a time" + "".join(pieces), PUBLISHED)
        self.assertEqual(g.stop_reason, "length")
        self.assertEqual(len(g.token_ids), 56)
        self.assertEqual(g.text, "".join(pieces))

    def test_sampled_generation_equals_the_cli(self):
        for kv in (["--kv-cache", "f32"], ["--kv-cache", "kivi2", "--residual", "32"]):
            out = json.loads(cli("generate", "-p", "Lily saw a", "-n", "60", "--temp", "0.9", "--seed", "7",
                                 "--top-k", "20", "--top-p", "0.9", "--json", *kv))
            s = self.model.session(kv_cache=kv[1], residual=32 if len(kv) > 2 else 128)
            g = s.generate("Lily saw a", max_tokens=60, temperature=0.9, seed=7, top_k=20, top_p=0.9)
            self.assertEqual("".join(g), out["completion"], kv)
            self.assertEqual(g.token_ids, out["token_ids"], kv)
            self.assertEqual(g.stop_reason, out["stop"], kv)

    def test_logits_equal_the_cli(self):
        prompt = "Tim had a red kite. He liked to fly his kite in the big green park near his house. " * 3
        for kv in ([], ["--kv-cache", "kivi2", "--residual", "32"], ["--kv-cache", "kivi4", "--key-flush", "group",
                                                                      "--residual", "64", "--scale-dtype", "f32"]):
            opts = {"kv_cache": kv[1]} if kv else {}
            if len(kv) > 2:
                opts.update(residual=int(kv[kv.index("--residual") + 1]))
            if "--key-flush" in kv:
                opts.update(key_flush="group", scale_dtype="f32")
            s = self.model.session(**opts)
            for mode in ("prefill", "stream"):
                expect = cli_logits(prompt, "--mode", mode, *kv)
                got = s.logits(prompt, mode=mode)
                self.assertEqual(got.shape, expect.shape)
                np.testing.assert_array_equal(got, expect, "%s %s" % (kv, mode))
            ids = self.model.tokenize(prompt)
            np.testing.assert_array_equal(s.logits(ids), expect)
            self.assertEqual(s.pos, len(ids))

    def test_prefill_and_decode(self):
        s = self.model.session(kv_cache="kivi2", residual=32)
        ids = self.model.tokenize("Once upon a time there was")
        full = s.logits(ids)
        s.reset()
        last = s.prefill(ids[:4])
        np.testing.assert_array_equal(last, full[3])
        for i in range(4, len(ids)):
            np.testing.assert_array_equal(s.decode(ids[i]), full[i])
        st = s.memory_stats()
        self.assertEqual(st["n_tokens"], len(ids))
        self.assertLess(st["bytes_used"], st["f32_bytes"] * 2)

    def test_perplexity_equals_the_cli(self):
        with tempfile.TemporaryDirectory() as d:
            path = short_text(d)
            for kv in (["--kv-cache", "f32"], ["--kv-cache", "kivi2", "--residual", "32"]):
                expect = json.loads(cli("perplexity", "-f", path, "--json", "--ctx", "128", *kv))
                got = kivi.perplexity(self.model, file=path, ctx=128, kv_cache=kv[1],
                                      residual=32 if len(kv) > 2 else 128)
                self.assertEqual(sorted(got), sorted(expect))
                self.assertGreater(got["chunks"], 1)
                for key in expect:
                    if key not in ("seconds", "tokens_per_second"):
                        value = json_number(got[key]) if isinstance(got[key], float) else got[key]
                        self.assertEqual(value, expect[key], key)
            with open(path) as f:
                text = f.read()
        # From text instead of a file, the model by path, batched: the same scores.
        by_text = kivi.perplexity(common.MODEL, text=text, ctx=128, mode="batched", kv_cache="kivi2", residual=32)
        self.assertEqual(by_text["mode"], "batched")
        self.assertEqual((by_text["ppl"], by_text["tokens"]), (got["ppl"], got["tokens"]))

    def test_kld_fields(self):
        with tempfile.TemporaryDirectory() as d:
            path = short_text(d)
            base = os.path.join(d, "f32.lp")
            kivi.perplexity(self.model, file=path, ctx=128, save_logits=base)
            got = kivi.perplexity(self.model, file=path, ctx=128, kv_cache="kivi2", residual=32, kld_base=base)
            expect = json.loads(cli("perplexity", "-f", path, "--json", "--ctx", "128", "--kv-cache", "kivi2",
                                    "--residual", "32", "--kld-base", base))
        for key in ("kld_mean", "kld_median", "kld_p99", "kld_max", "top1_agree", "first_disagree", "ppl"):
            value = json_number(got[key]) if isinstance(got[key], float) else got[key]
            self.assertEqual(value, expect[key], key)

    def test_sessions_in_threads(self):
        """Sessions compute without the GIL; two at once give their serial results."""
        ids = self.model.tokenize("The little dog ran to the park and played with a ball. " * 4)
        sessions = [self.model.session(kv_cache=f, residual=32, threads=1) for f in ("kivi2", "kivi4")]
        expect = [s.logits(ids) for s in sessions]
        got = [None, None]

        def run(i):
            for _ in range(3):
                got[i] = sessions[i].logits(ids)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for e, g in zip(expect, got):
            np.testing.assert_array_equal(e, g)


class Errors(unittest.TestCase):
    def assertError(self, fn, *needles):
        with self.assertRaises(kivi.Error) as cm:
            fn()
        for n in needles:
            self.assertIn(n, str(cm.exception))
        return str(cm.exception)

    def test_same_messages_as_the_cli(self):
        missing = os.path.join(tempfile.gettempdir(), "no-such-model.bin")
        msg = self.assertError(lambda: kivi.Model(missing))
        self.assertEqual(msg, cli_error("generate", "-m", missing, "-p", "x"))
        m = kivi.Model(common.MODEL)
        msg = self.assertError(lambda: m.session(kv_cache="kivi3"))
        self.assertIn("kivi3", msg)
        msg = self.assertError(lambda: m.session(kv_cache="kivi2", group_size=32, residual=40))
        self.assertEqual(msg, cli_error("generate", "-m", common.MODEL, "-p", "x", "--kv-cache", "kivi2",
                                        "--residual", "40"))
        msg = self.assertError(lambda: m.session(ctx=1000))
        self.assertEqual(msg, cli_error("generate", "-m", common.MODEL, "-p", "x", "--ctx", "1000"))

    def test_bad_input(self):
        m = kivi.Model(common.MODEL)
        s = m.session(ctx=64)
        self.assertError(lambda: m.session(kv_cach="kivi2"), "unknown session option 'kv_cach'")
        self.assertError(lambda: m.session(residual="32"), "residual: expected an integer")
        self.assertError(lambda: s.logits([1, 2, 9999]), "token id 9999 outside the vocabulary")
        self.assertError(lambda: s.logits([]), "no tokens")
        self.assertError(lambda: s.logits(list(range(100))), "do not fit")
        self.assertError(lambda: s.logits([1, 2], mode="fast"), "mode 'fast'")
        self.assertError(lambda: s.generate("x " * 100), "longer than the context")
        self.assertError(lambda: s.generate("x", temperature=-1), "temperature")
        self.assertError(lambda: m.detokenize([600]), "600")
        self.assertError(lambda: kivi.perplexity(m, text=""), "perplexity needs at least 2")
        self.assertError(lambda: kivi.perplexity(m), "exactly one of file= and text=")
        self.assertError(lambda: kivi.perplexity(m, file="/nonexistent.txt"), "/nonexistent.txt")
        self.assertError(lambda: kivi.perplexity(m, text="Once upon a time", mode="fast"), "fast")

    def test_generator_notices_other_use(self):
        s = kivi.Model(common.MODEL).session()
        g = s.generate("Once", max_tokens=10, temperature=0)
        next(g)
        s.logits([1, 2, 3])
        self.assertRaises(kivi.Error, next, g)
        g2 = s.generate("Once", max_tokens=3, temperature=0)
        self.assertEqual(len(list(g2)), 3)
        self.assertEqual(list(s.generate("Once", max_tokens=0)), [])


if __name__ == "__main__":
    unittest.main()
