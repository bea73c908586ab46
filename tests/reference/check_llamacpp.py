#!/usr/bin/env python3
"""Greedy token ids of kivi.cpp against llama.cpp itself (node-llama-cpp) on stories260K
stored in each weight type: converts the model to GGUF, writes each type with
`kivi quantize`, then decodes N tokens greedily with both from the same prompt ids.

    /usr/bin/python3 tests/reference/check_llamacpp.py --node-dir DIR [--types f16,q8_0,...]

DIR holds node_modules/node-llama-cpp (`npm install --ignore-scripts node-llama-cpp@3.22.1`).
Prints, per type, the number of equal tokens and the first position where they differ."""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kivi", default=os.path.join(root, "build", "bin", "kivi"))
    ap.add_argument("--shared", default=os.path.join(root, "..", "shared"))
    ap.add_argument("--node-dir", required=True, help="directory with node_modules/node-llama-cpp")
    ap.add_argument("--types", default="f32,f16,bf16,q8_0,q4_0,q4_1,q5_0,q5_1,q4_k_m,q6_k")
    ap.add_argument("-n", type=int, default=100)
    ap.add_argument("-p", "--prompt", default="Once upon a time")
    a = ap.parse_args()
    script = os.path.join(here, "llamacpp_greedy.mjs")
    models = os.path.join(a.shared, "models")
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        base = os.path.join(tmp, "s_f32.gguf")
        subprocess.run([a.kivi, "convert", os.path.join(models, "stories260K.bin"), "-t",
                        os.path.join(models, "tok512.bin"), "-o", base], check=True, capture_output=True)
        for t in a.types.split(","):
            path = base if t == "f32" else os.path.join(tmp, "s_%s.gguf" % t)
            if t != "f32":
                subprocess.run([a.kivi, "quantize", base, path, t], check=True, capture_output=True)
            out = subprocess.run([a.kivi, "generate", "-m", path, "-p", a.prompt, "-n", str(a.n), "--temp", "0",
                                  "--json"], check=True, capture_output=True, text=True).stdout
            k = json.loads(out)
            ids = ",".join(str(i) for i in k["prompt_token_ids"])
            # Run the copy of the script inside --node-dir so that node finds the package.
            mjs = os.path.join(a.node_dir, "llamacpp_greedy.mjs")
            with open(script) as src, open(mjs, "w") as dst:
                dst.write(src.read())
            ref = subprocess.run(["node", mjs, path, str(a.n), ids], check=True, capture_output=True, text=True,
                                 cwd=a.node_dir).stdout.strip().splitlines()[-1]
            l = json.loads(ref)["tokens"]
            mine = k["token_ids"]
            n = min(len(l), len(mine))
            first = next((i for i in range(n) if l[i] != mine[i]), None)
            same = sum(1 for i in range(n) if l[i] == mine[i])
            print("%-7s %3d of %3d tokens equal, first difference at %s" % (t, same, n, first))
            failed |= first is not None
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
