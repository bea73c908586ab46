#!/usr/bin/python3
"""The engine from Python against the `kivi` command: logits, generation and perplexity give
the same numbers, errors the same messages."""

import json
import os
import re
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

    def test_structured_output_equals_the_cli(self):
        schema = '{"type": "object", "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 99}, ' \
                 '"name": {"type": "string", "maxLength": 8}}, "required": ["age", "name"], ' \
                 '"additionalProperties": false}'
        for seed in (1, 2, 3):
            out = json.loads(cli("generate", "-p", "The answer:", "-n", "200", "--temp", "1", "--seed", str(seed),
                                 "--json-schema", schema, "--json"))
            g = self.model.session().generate("The answer:", max_tokens=200, temperature=1, seed=seed,
                                              json_schema=schema)
            text = "".join(g)
            self.assertEqual(text, out["completion"])
            doc = json.loads(text)
            self.assertEqual(sorted(doc), ["age", "name"])
            self.assertTrue(0 <= doc["age"] <= 99 and len(doc["name"]) <= 8, doc)
        g = self.model.session().generate("Once", temperature=0.9, grammar='root ::= ("yes" | "no") "."')
        self.assertIn("".join(g), ("yes.", "no."))
        with self.assertRaises(kivi.Error) as cm:
            self.model.session().generate("Once", grammar='root ::= "a" | b')
        self.assertIn("line 1, column 16", str(cm.exception))

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
            expect = {}
            for mode in ("prefill", "stream"):
                expect[mode] = cli_logits(prompt, "--mode", mode, *kv)
                got = s.logits(prompt, mode=mode)
                self.assertEqual(got.shape, expect[mode].shape)
                np.testing.assert_array_equal(got, expect[mode], "%s %s" % (kv, mode))
            ids = self.model.tokenize(prompt)
            np.testing.assert_array_equal(s.logits(ids), expect["prefill"])
            self.assertEqual(s.pos, len(ids))

    def test_prefill_and_decode(self):
        s = self.model.session(kv_cache="kivi2", residual=32)
        ids = self.model.tokenize("Once upon a time there was")
        full = s.logits(ids)
        s.reset()
        last = s.prefill(ids[:4])
        np.testing.assert_array_equal(last, full[3])
        # Decoding one token at a time equals the tiled prefill's rows up to float rounding.
        for i in range(4, len(ids)):
            np.testing.assert_allclose(s.decode(ids[i]), full[i], rtol=0, atol=1e-4)
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
        # (batched: the tiled prefill, equal to streaming up to float rounding)
        self.assertEqual(by_text["tokens"], got["tokens"])
        self.assertLess(abs(by_text["ppl"] / got["ppl"] - 1), 1e-4)

    def test_per_layer_formats(self):
        # The CLI's --kv-cache-layers as a keyword: the same scores, and its refusals.
        with tempfile.TemporaryDirectory() as d:
            path = short_text(d)
            mix = "0,3:kivi4;*:kivi2"
            got = kivi.perplexity(self.model, file=path, ctx=128, kv_cache_layers=mix, residual=32)
            expect = json.loads(cli("perplexity", "-f", path, "--json", "--ctx", "128",
                                    "--kv-cache-layers", mix, "--residual", "32"))
        self.assertEqual(json_number(got["ppl"]), expect["ppl"])
        self.assertEqual(got["kv_cache"], expect["kv_cache"])
        self.assertIn("layers 0 kivi4, 1-2 kivi2, 3 kivi4, 4 kivi2", got["kv_cache"])
        # --kv-rotate as a keyword.
        with tempfile.TemporaryDirectory() as d:
            path = short_text(d)
            got = kivi.perplexity(self.model, file=path, ctx=128, kv_cache="int8", kv_rotate="hadamard")
            expect = json.loads(cli("perplexity", "-f", path, "--json", "--ctx", "128",
                                    "--kv-cache", "int8", "--kv-rotate", "hadamard"))
        self.assertEqual(json_number(got["ppl"]), expect["ppl"])
        self.assertTrue(got["kv_cache"].endswith(", rotated"), got["kv_cache"])
        with self.assertRaises(kivi.Error) as cm:
            self.model.session(kv_cache_layers="0-2:kivi4")
        self.assertIn("--kv-cache-layers: layer 3 has no format", str(cm.exception))

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


def gpt2_alphabet():
    """Byte -> character of GPT-2's byte-level alphabet, written out here."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def byte_level_model(directory):
    """A random-weight model (kivi synth) with a byte-level BPE vocabulary: the 256 bytes,
    merges that make multi-byte characters (e, a and o with accents, the euro sign) whole
    tokens, and the end tokens <|eot_id|> and <|im_end|>."""
    alpha = gpt2_alphabet()
    enc = lambda s: "".join(alpha[b] for b in s.encode("utf-8"))
    vocab = {alpha[b]: b for b in range(256)}
    merges = []
    for ch in ["\u00e9", "\u00e0", "\u00f6", "\u20ac"]:
        units = [alpha[b] for b in ch.encode("utf-8")]
        left = units[0]
        for u in units[1:]:
            merges.append(left + " " + u)
            left += u
            vocab.setdefault(left, len(vocab))
    added = []
    for t in ["<|begin_of_text|>", "<|eot_id|>", "<|im_end|>"]:
        added.append({"id": len(vocab) + len(added), "content": t, "special": True})
    tj = {"version": "1.0", "added_tokens": added,
          "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
          "model": {"type": "BPE", "vocab": vocab, "merges": merges}}
    path_tj = os.path.join(directory, "tokenizer.json")
    with open(path_tj, "w") as f:
        json.dump(tj, f)
    model = os.path.join(directory, "bpe.gguf")
    subprocess.run([common.CLI, "synth", "--layers", "2", "--dim", "64", "--heads", "4", "--kv-heads", "2",
                    "--ffn", "128", "--ctx", "1024", "--tokenizer-json", path_tj, "-o", model],
                   check=True, capture_output=True)
    ends = [a["id"] for a in added if a["content"] != "<|begin_of_text|>"]
    return model, ends


class ByteLevelGeneration(unittest.TestCase):
    """The stop rule and the streaming UTF-8 decoding are the CLI's and the server's."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.path, cls.ends = byte_level_model(cls.tmp.name)
        cls.model = kivi.Model(cls.path)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_pieces_are_whole_characters_and_end_tokens_end_the_reply(self):
        s = self.model.session(ctx=512, threads=1)
        reasons = []
        for seed in range(8):
            g = s.generate("h\u00e9llo", max_tokens=300, temperature=1.5, top_k=0, top_p=1.0, seed=seed)
            pieces = list(g)  # raised UnicodeDecodeError when a piece ended inside a character
            self.assertEqual("".join(pieces), g.text)
            self.assertTrue(all(p for p in pieces))
            for t in self.ends:
                self.assertNotIn(t, g.token_ids)
            reasons.append(g.stop_reason)
            self.assertIn(g.stop_reason, ("eos", "length"))
            if g.stop_reason == "length":
                self.assertEqual(len(g.token_ids), 300)
        # The end-of-turn tokens (not EOS for this vocabulary) end some of these replies.
        self.assertIn("eos", reasons)

    def test_ignore_eos_and_stop_strings(self):
        s = self.model.session(ctx=512, threads=1)
        g = s.generate("h\u00e9llo", max_tokens=200, temperature=1.5, top_k=0, top_p=1.0, seed=3,
                       ignore_eos=True)
        list(g)
        self.assertEqual(g.stop_reason, "length")
        self.assertEqual(len(g.token_ids), 200)
        for t in self.ends:
            self.assertNotIn(t, g.token_ids)
        # A stop string cuts the text before it, as the server's `stop` does.
        full = s.generate("h\u00e9llo", max_tokens=40, temperature=0, ignore_eos=True)
        text = "".join(full)
        if len(text) > 3:
            stop = text[2:4]
            cut = s.generate("h\u00e9llo", max_tokens=40, temperature=0, ignore_eos=True, stop=[stop])
            self.assertEqual("".join(cut), text[:text.index(stop)])
            self.assertEqual(cut.stop_reason, "stop")


# The same option cases through the CLI and the Python keywords: one parser, so the same
# cache or the same error.
OPTION_CASES = [
    {"kv_cache": "kivi2", "residual": 64},
    {"kv_cache": "kivi4", "kv_cache_v": "kivi2", "key_rope": "pre"},
    {"kv_cache": "int8", "int8_granularity": "token", "scale_dtype": "f32"},
    {"kv_cache": "f16", "kv_share": 2},
    {"kv_cache": "kivi2", "key_flush": "group", "group_size": 16, "residual": 32},
    {"kv_cache": "kivi3"},
    {"kv_cache": "kivi2", "residual": 40},
    {"kv_share_map": "3-1"},
    {"sparse_block": 32},
    {"kv_cache": "f16", "context_overflow": "shift", "sinks": 8},
    {"sparse": "quest", "sparse_budget": 64, "sparse_block": 32},
]


class OneOptionTable(unittest.TestCase):
    def test_cli_and_python_agree(self):
        m = kivi.Model(common.MODEL)
        for case in OPTION_CASES:
            args = []
            for k, v in case.items():
                args += ["--" + k.replace("_", "-"), str(v)]
            r = subprocess.run([common.CLI, "generate", "-m", common.MODEL, "-p", "x", "-n", "1", "--json",
                                "--threads", "1", *args], capture_output=True, text=True)
            try:
                s = m.session(threads=1, **case)
            except kivi.Error as e:
                self.assertNotEqual(r.returncode, 0, case)
                # The same words, with the option spelled as each front end spells it.
                cli_msg = r.stderr.strip().replace("kivi: error: ", "")
                py_msg = str(e)
                # Options are spelled --kv-cache X on the command line and kv_cache=X here.
                norm = lambda t: re.sub(r"--([a-z0-9-]+)", lambda m: m.group(1).replace("-", "_"),
                                        t).replace("=", " ")
                cli_msg, py_msg = norm(cli_msg), norm(py_msg)
                self.assertEqual(py_msg, cli_msg, case)
                continue
            self.assertEqual(r.returncode, 0, (case, r.stderr))
            self.assertEqual(s.kv_cache, json.loads(r.stdout)["kv_cache"], case)


if __name__ == "__main__":
    unittest.main()
