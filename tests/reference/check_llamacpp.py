#!/usr/bin/env python3
"""Greedy token ids of kivi.cpp against llama.cpp itself (node-llama-cpp):

  * stories: stories260K converted to GGUF and stored in each weight type with
    `kivi quantize`;
  * arch: synthetic models (`kivi synth`, random weights) of each architecture: llama
    with Q/K/V biases, llama with llama3 RoPE scaling (rope_freqs.weight), qwen2 (Q/K/V
    biases, NeoX RoPE) and
    qwen3 (per-head Q/K norms, head dimension apart from dim / heads, NeoX RoPE),
    qwen3moe, gemma3 (windowed layers with their own RoPE, post-norms, GeGLU) and gemma2
    (soft caps), phi3 (fused QKV and gate-up; LongRoPE; partial rotary embeddings, 24 of
    32 channels turned, with LongRoPE) and gpt-oss (sinks, YaRN, biased experts, the
    clamped SwiGLU), in F32 and F16, from several prompts. (llama.cpp refuses llama files
    with partial rotary embeddings: check_arch.py's llama-partial covers those.)

The arch set runs llama.cpp without its CPU flash-attention kernel, whose softmax and
value sums are F16: in a random mixture of experts that rounding flips router choices that
are near ties (gpt-oss, layer 3 of 4: the second expert ahead by 1.8e-4 in float64, behind
by 9.4e-5 with F16 accumulation) and the greedy tokens part; the other path sums in F32.

Both decode N tokens greedily from the same prompt ids; prints, per model, the number
of equal tokens and the first position where they differ. Random weights give flat
distributions, where two tokens can tie to within llama.cpp's rounding (its KV cache is
F16): a difference in the arch set passes as a tie when the numpy reference
(llama_ref.py, float64) picks kivi.cpp's token there and puts llama.cpp's within
--tie (default 1e-3) of it; the comparison ends at the tie. With quantized weights
(stories set) each engine rounds the activations to 8 bits in its own kernels, which can
move logits by more than a tie (llama.cpp's result then depends on the CPU it runs on):
a difference there passes when the reference on the exactly dequantized weights puts the
two tokens within --tie-quantized (default 0.1) of each other (8-bit activations move
stories260K's logits from those of the dequantized F32 weights by 0.035 at the median and
0.13-0.18 at the 99th percentile, Q4_0 to Q8_0). Exit status 0 when all
agree, 1 when any differs, 77 (skipped) when node-llama-cpp is not installed.

    /usr/bin/python3 tests/reference/check_llamacpp.py [--node-dir DIR] [--set stories|arch|all]

DIR (default tests/reference, where scripts/setup-llamacpp-ref.sh installs it) holds
node_modules/node-llama-cpp 3.22.1."""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

SKIP = 77
ARCH_SHAPE = ["--layers", "4", "--dim", "256", "--heads", "8", "--kv-heads", "2", "--ffn", "512",
              "--vocab", "512", "--ctx", "1024"]
ARCH_CASES = [
    ("llama-bias", ["--arch", "llama", "--attn-bias"]),
    ("llama3-scaled", ["--arch", "llama", "--rope-theta", "500000", "--rope-scaling", "llama3",
                       "--rope-scaling-factor", "32"]),
    ("qwen2", ["--arch", "qwen2", "--rope-theta", "1000000"]),
    ("qwen3", ["--arch", "qwen3", "--head-dim", "64", "--rope-theta", "1000000", "--classifier", "separate"]),
    ("qwen3moe", ["--arch", "qwen3moe", "--head-dim", "64", "--rope-theta", "1000000", "--experts", "8",
                  "--experts-used", "2", "--classifier", "separate"]),
    # Gemma 3: layers 0 and 2 windowed (16 tokens) with RoPE base 10000, 1 and 3 global
    # with base 1e6 scaled by 1/8; Gemma 2 with soft caps small enough to bite.
    ("gemma3", ["--arch", "gemma3", "--head-dim", "64", "--rope-theta", "1000000", "--rope-scaling", "linear",
                "--sliding-window", "16", "--sliding-window-pattern", "2"]),
    ("gemma2", ["--arch", "gemma2", "--head-dim", "64", "--sliding-window", "16", "--attn-softcap", "1",
                "--final-softcap", "5"]),
    # Phi-3: Q, K, V in one matrix and the gate and up projections in one.
    ("phi3", ["--arch", "phi3", "--rope-theta", "250000", "--classifier", "separate"]),
    # LongRoPE: trained on 256 tokens, so both engines (contexts 1024 and 512) take the long
    # divisors and the attention factor; with factor 1 the original context is 1024 and both
    # take the short ones.
    ("phi3-longrope", ["--arch", "phi3", "--rope-scaling", "longrope", "--rope-scaling-factor", "4"]),
    ("phi3-shortrope", ["--arch", "phi3", "--rope-scaling", "longrope", "--rope-scaling-factor", "1"]),
    # Partial rotary embeddings as in Phi-4-mini (96 of 128): RoPE turns 24 of each head's 32
    # channels (NeoX pairs (i, i + 12)), with LongRoPE's 12 long factors and its attention
    # factor on the turned channels alone.
    # (No llama case: llama.cpp refuses llama files whose rope.dimension_count differs from
    # the head dimension, "invalid n_rot: 24, expected 32"; check_arch.py covers them.)
    ("phi3-partial", ["--arch", "phi3", "--rope-dims", "24", "--rope-scaling", "longrope",
                      "--rope-scaling-factor", "4"]),
    # gpt-oss: experts with biases and the clamped SwiGLU, sinks, Q/K/V/output biases,
    # YaRN (trained on 1024 / 32 tokens, so the ramp spans the pairs), windows of 16 tokens
    # in the even layers.
    ("gpt-oss", ["--arch", "gpt-oss", "--head-dim", "64", "--rope-theta", "150000", "--experts", "8",
                 "--experts-used", "2", "--rope-scaling", "yarn", "--sliding-window", "16",
                 "--classifier", "separate"]),
]
ARCH_TYPES = ["f32", "f16"]
PROMPTS = ["Once upon a time", "The little dog ran to the park.", "Lily saw a big red ball", "Tom and Sam"]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kivi", default=os.path.join(root, "build", "bin", "kivi"))
    ap.add_argument("--shared", default=os.path.join(root, "..", "shared"))
    ap.add_argument("--node-dir", default=here, help="directory with node_modules/node-llama-cpp")
    ap.add_argument("--set", default="all", choices=["stories", "arch", "all"])
    ap.add_argument("--cases", default="", help="comma-separated arch cases to run (default: all)")
    ap.add_argument("--types", default="f32,f16,bf16,q8_0,q4_0,q4_1,q5_0,q5_1,q4_k_m,q6_k,mxfp4",
                    help="weight types of the stories set")
    ap.add_argument("-n", type=int, default=100, help="tokens per prompt (stories; the arch set uses n / 2)")
    ap.add_argument("-p", "--prompt", default="Once upon a time", help="prompt of the stories set")
    ap.add_argument("--tie", type=float, default=1e-3, help="largest logit gap that counts as a tie (float weights)")
    ap.add_argument("--tie-quantized", type=float, default=0.1,
                    help="largest gap that counts as a tie with quantized weights, in the reference on their "
                         "exact dequantization")
    a = ap.parse_args()
    if not os.path.isfile(os.path.join(a.node_dir, "node_modules", "node-llama-cpp", "package.json")):
        print("SKIP: node-llama-cpp is not installed in %s (scripts/setup-llamacpp-ref.sh)" % a.node_dir)
        return SKIP
    script = os.path.join(here, "llamacpp_greedy.mjs")
    # The script runs from inside --node-dir so that node finds the package.
    mjs = os.path.join(a.node_dir, "llamacpp_greedy.mjs")
    if os.path.abspath(mjs) != os.path.abspath(script):
        shutil.copyfile(script, mjs)
    failed = False

    def compare(label, path, prompt, n, judge=False, flash=True):
        nonlocal failed
        out = subprocess.run([a.kivi, "generate", "-m", path, "-p", prompt, "-n", str(n), "--temp", "0",
                              "--json"], check=True, capture_output=True, text=True).stdout
        k = json.loads(out)
        ids = ",".join(str(i) for i in k["prompt_token_ids"])
        ref = subprocess.run(["node", mjs, path, str(n), ids] + ([] if flash else ["noflash"]), check=True,
                             capture_output=True, text=True,
                             cwd=a.node_dir).stdout.strip().splitlines()[-1]
        l = json.loads(ref)["tokens"]
        mine = k["token_ids"]
        if k.get("stop") == "eos" and len(mine) < len(l):
            # kivi stopped at an end-of-text token (BOS 1 or EOS 2 in these tokenizers; it is
            # not among the ids kivi prints); llama.cpp's
            # generator goes on: compare up to and including that token.
            eos = l[len(mine)]
            mine = mine + [eos] if eos in (1, 2) else mine
            l = l[:len(mine)]
        m = min(len(l), len(mine))
        first = next((i for i in range(m) if l[i] != mine[i]), None)
        if len(l) != len(mine) and first is None:
            first = m  # one stopped early (end of sequence) and the other did not
        same = sum(1 for i in range(m) if l[i] == mine[i])
        note = ""
        if judge and first is not None and first < m:
            sys.path.insert(0, here)
            import gguf_ref
            import llama_ref as ref
            # Quantized weights: the reference runs on their exact dequantization (F32). The
            # tensor types decide, since the reference also reads some quantized types (MXFP4).
            plain = path
            if set(gguf_ref.tensor_types(path).values()) - gguf_ref.FLOAT_TYPES:
                plain = path + ".f32.gguf"
                subprocess.run([a.kivi, "quantize", path, plain, "f32"], check=True, capture_output=True)
            z = ref.forward_logits(ref.load_model(plain), k["prompt_token_ids"] + mine[:first])[-1]
            gap = z[mine[first]] - z[l[first]]
            kivis = int(z.argmax()) == mine[first]
            if plain == path:
                # Float weights: the engines should part only at a near tie.
                ok = kivis and gap <= a.tie
                verdict = "a tie, kivi's choice" if ok else "NOT a tie"
            else:
                # Quantized weights: each engine rounds the activations to 8 bits in its
                # own kernels (llama.cpp's also depend on the CPU), which moves logits by
                # more than a float tie: a tie within --tie-quantized of the exact product.
                ok = abs(gap) <= a.tie_quantized
                verdict = "a tie within the activation rounding" if ok else "NOT a tie"
            note = "; reference: %s (kivi's token %d leads llama.cpp's %d by %.1e)" % (
                verdict, mine[first], l[first], gap)
            if ok:
                first = None
        print("%-28s %3d of %3d tokens equal, first difference at %s%s"
              % (label, same, max(len(l), len(mine)), first, note))
        failed |= first is not None

    with tempfile.TemporaryDirectory() as tmp:
        if a.set in ("stories", "all"):
            models = os.path.join(a.shared, "models")
            base = os.path.join(tmp, "s_f32.gguf")
            subprocess.run([a.kivi, "convert", os.path.join(models, "stories260K.bin"), "-t",
                            os.path.join(models, "tok512.bin"), "-o", base], check=True, capture_output=True)
            for t in a.types.split(","):
                path = base if t == "f32" else os.path.join(tmp, "s_%s.gguf" % t)
                if t != "f32":
                    subprocess.run([a.kivi, "quantize", base, path, t], check=True, capture_output=True)
                compare("stories260K " + t, path, a.prompt, a.n, judge=True)
        if a.set in ("arch", "all"):
            for name, opts in ARCH_CASES:
                if a.cases and name not in a.cases.split(","):
                    continue
                for t in ARCH_TYPES:
                    path = os.path.join(tmp, "%s_%s.gguf" % (name, t))
                    subprocess.run([a.kivi, "synth", *ARCH_SHAPE, *opts, "--outtype", t, "-o", path], check=True,
                                   capture_output=True)
                    for i, prompt in enumerate(PROMPTS):
                        compare("%s %s prompt %d" % (name, t, i), path, prompt, a.n // 2, judge=True,
                                flash=False)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
