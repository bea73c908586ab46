#!/usr/bin/python3
"""scripts/qat.py for a few steps on a few short sampled sequences: it samples, trains,
writes a checkpoint the engine loads and scores, a JSON log and a loss-curve PNG."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

import common

common.skip_without_torch()


class QatSmoke(unittest.TestCase):
    def test_few_steps(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "qat", "model.bin")
            text = os.path.join(d, "held_out.txt")
            with open(common.TEXT) as f, open(text, "w") as o:
                o.write(f.read()[:800])
            log, png, data = (os.path.join(d, n) for n in ("log.json", "loss.png", "data.npy"))
            cmd = [sys.executable, os.path.join(common.SOURCE, "scripts", "qat.py"), "--model", common.MODEL,
                   "--out", out, "--samples", "3", "--seq-len", "80", "--steps", "4", "--batch", "2",
                   "--log-every", "1", "--threads", "1", "--data", data, "--log", log, "--plot", png,
                   "--eval-text", text, "--grad", "lsq"]
            r = subprocess.run(cmd, capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("gap closed", r.stdout)
            with open(log) as f:
                result = json.load(f)
            self.assertEqual([x["step"] for x in result["log"]], [0, 1, 2, 3])
            self.assertTrue(all(x["kl_quant"] > 0 and x["kl_f32"] >= 0 for x in result["log"]))
            self.assertEqual(result["kivi"]["group_size"], 32)
            with open(png, "rb") as f:
                self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
            # The checkpoint has the original's size and loads in the engine (tokenizer copied beside it).
            self.assertEqual(os.path.getsize(out), os.path.getsize(common.MODEL))
            self.assertTrue(os.path.exists(os.path.join(os.path.dirname(out), "tok512.bin")))
            r = subprocess.run([common.CLI, "perplexity", "-m", out, "-f", text, "--kv-cache", "kivi2",
                                "--residual", "32", "--json"], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            ppl = json.loads(r.stdout)["ppl"]
            self.assertAlmostEqual(ppl, result["eval"]["fine-tuned"]["kivi"], places=4)
            # A second run reuses the sampled data.
            r = subprocess.run(cmd[:cmd.index("--steps") + 1] + ["1"] + cmd[cmd.index("--steps") + 2:],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("using the 3 sampled sequences", r.stdout)


if __name__ == "__main__":
    unittest.main()
