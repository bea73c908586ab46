#!/usr/bin/python3
"""Each architecture's forward pass against the numpy reference (llama_ref.py, written
from the published model definitions), on small synthetic models with random weights.

For every case of CASES (llama, qwen2, qwen3, qwen3moe, gemma2, gemma3, phi3, gpt-oss)
this writes a 2-layer F32 model with `kivi synth` (random Q/K/V biases for qwen2 and for a
llama that has them, random per-head Q/K norm weights for qwen3, llama3 RoPE divisors in
rope_freqs.weight for the scaled llama; for gpt-oss random biases everywhere and sinks
N(0, 1), and in one file (PATCH) the experts' gate and up biases scaled by 12 so that the
SwiGLU's clamps at 7 bite; partial rotary embeddings, rope.dimension_count 24 of a 32-channel
head as Phi-4-mini's 96 of 128, in phi3-partial (NeoX pairs), phi3-partial-longrope and
llama-partial (adjacent pairs)), runs
    KIVI logits -m MODEL -p PROMPT --mode MODE --json     (plus --key-rope pre)
and checks:
  * max |engine logit - reference logit| <= --tol (default 1e-5; measured at most 3e-7,
    1.2e-7 for gpt-oss) at every position,
    for the engine's prefill, stream and no-cache modes and for keys cached before RoPE;
  * each feature matters: the reference with the feature switched off (no biases, no
    QK norm, adjacent instead of NeoX pairs, unscaled RoPE, no sliding window, one expert
    instead of two; for gpt-oss no sinks, no output, router or expert biases, plain
    SwiGLU or no clamps, YaRN without its ramp (every pair interpolated), without its
    cos/sin factor, or with transformers' untruncated correction range; for partial
    rotary embeddings the whole head turned with frequencies base^(-2i/D), the first
    n_rot channels turned with those frequencies of a whole head instead of
    base^(-2i/n_rot), NeoX pairs (i, i + D/2) instead of (i, i + n_rot/2), or LongRoPE's
    attention factor on the channels that pass as well) differs from the
    engine by more than 10 x --tol (measured: 4e-4 for gemma2's attention soft cap,
    6e-4 for llama3 scaling, 9e-4 for YaRN's truncation, 1.2e-3 for the attention factor
    on the passing channels, 1.7e-3 to 6.7e-3 for the other RoPE scalings and the
    partial-RoPE mistakes, 5e-3 to 1.7 for the rest), so an engine that ignored the
    feature would fail;
  * a sliding-window model (window 24 in layer 0 of 2, far shorter than the prompt)
    agrees too: the windowed layer's cache evicts whole blocks as the prompt streams;
  * the scaled llama's rope_freqs.weight equals the divisors that transformers'
    llama3 formula gives (llama_ref.llama3_inv_freq), to 1e-6 relative.
Exit status 0 when everything agrees, 1 otherwise.
"""

import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_ref  # noqa: E402
import llama_ref as ref  # noqa: E402

SHAPE = ["--layers", "2", "--dim", "64", "--heads", "4", "--kv-heads", "2", "--ffn", "128",
         "--vocab", "300", "--ctx", "512", "--outtype", "f32"]
LLAMA3 = dict(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0, original_ctx=8192.0)

# (name, synth options, features: what to switch off in the reference to show it matters)
CASES = [
    ("llama", ["--arch", "llama", "--classifier", "separate"], []),
    ("llama-bias", ["--arch", "llama", "--attn-bias"], ["bias"]),
    ("llama3-scaled", ["--arch", "llama", "--rope-theta", "500000", "--rope-scaling", "llama3", "--rope-scaling-factor", "32"], ["rope_scaling"]),
    ("qwen2", ["--arch", "qwen2", "--rope-theta", "1000000"], ["bias", "neox"]),
    ("qwen3", ["--arch", "qwen3", "--head-dim", "32", "--rope-theta", "1000000", "--classifier", "separate"],
     ["qk_norm", "neox"]),
    # A mixture of 4 experts, 2 per token (Qwen3-MoE's router: softmax, top 2, renormalized).
    ("qwen3moe", ["--arch", "qwen3moe", "--head-dim", "32", "--rope-theta", "1000000", "--experts", "4",
                  "--experts-used", "2", "--classifier", "separate"], ["qk_norm", "top1"]),
    # Sliding-window attention in layer 0 of 2 (pattern 2), a window far shorter than the
    # prompt: the windowed layer's cache evicts blocks in the stream and prefill runs.
    ("llama-swa", ["--arch", "llama", "--sliding-window", "24", "--sliding-window-pattern", "2"], ["swa"]),
    # Gemma 3: layer 0 windowed with its own RoPE base (10000), layer 1 global with base 1e6
    # scaled linearly by 1/8; QK norms, post-norms, GeGLU, the embedding times sqrt(dim).
    ("gemma3", ["--arch", "gemma3", "--head-dim", "32", "--rope-theta", "1000000", "--rope-scaling", "linear",
                "--sliding-window", "24", "--sliding-window-pattern", "2"],
     ["qk_norm", "post_norms", "gelu", "embed_scale", "local_rope", "rope_scaling", "swa"]),
    # Gemma 2: soft caps of the attention scores and the logits, layer 0 windowed.
    # Caps small enough to bite in a random model.
    ("gemma2", ["--arch", "gemma2", "--head-dim", "32", "--sliding-window", "24", "--attn-softcap", "0.3",
                "--final-softcap", "2"],
     ["attn_softcap", "final_softcap", "post_norms", "swa"]),
    # Phi-3: fused QKV and gate-up matrices (the split is what the comparison checks).
    ("phi3", ["--arch", "phi3", "--rope-theta", "250000", "--classifier", "separate"], ["neox"]),
    # LongRoPE: trained on 128 of the 512 positions, so the long divisors and the attention
    # factor apply.
    ("phi3-longrope", ["--arch", "phi3", "--rope-scaling", "longrope", "--rope-scaling-factor", "4"],
     ["long_factors", "rope_mscale"]),
    # Partial rotary embeddings (rope.dimension_count < head dim; Phi-4-mini turns 96 of
    # 128 channels): 24 of 32 here. RoPE turns channels 0..23 with frequencies
    # base^(-2i/24), NeoX pairs (i, i + 12); channels 24..31 pass unchanged.
    ("phi3-partial", ["--arch", "phi3", "--head-dim", "32", "--rope-dims", "24", "--rope-theta", "250000",
                      "--classifier", "separate"],
     ["partial_rope", "n_rot_freqs", "n_rot_pairs"]),
    # With LongRoPE (12 long and short factors, trained on 128 of 512 positions): the
    # attention factor scales the turned channels alone.
    ("phi3-partial-longrope", ["--arch", "phi3", "--head-dim", "32", "--rope-dims", "24", "--rope-scaling",
                               "longrope", "--rope-scaling-factor", "4"],
     ["partial_rope", "n_rot_pairs", "long_factors", "rope_mscale", "unscaled_pass"]),
    # Adjacent pairs (2i, 2i+1) for i < 12 in a llama head of 32 channels, with llama3
    # scaling: rope_freqs.weight holds 12 divisors.
    ("llama-partial", ["--arch", "llama", "--head-dim", "32", "--rope-dims", "24", "--rope-theta", "500000",
                       "--rope-scaling", "llama3", "--rope-scaling-factor", "32", "--classifier", "separate"],
     ["partial_rope", "n_rot_freqs", "rope_scaling"]),
    # gpt-oss: Q/K/V and output biases, a sink logit per head, YaRN (factor 32 over 512
    # positions: original context 16, so the ramp spans pairs 0 to 3 and the rest are
    # interpolated), layer 0 windowed (pattern 2), 8 experts (2 per token) with biases,
    # a router bias and the clamped SwiGLU.
    ("gpt-oss", ["--arch", "gpt-oss", "--head-dim", "64", "--rope-theta", "150000", "--experts", "8",
                 "--experts-used", "2", "--rope-scaling", "yarn", "--sliding-window", "24", "--classifier",
                 "separate"],
     ["bias", "out_bias", "sinks", "yarn_ramp", "yarn_truncate", "rope_mscale", "oai_swiglu", "expert_bias",
      "router_bias", "swa"]),
    # YaRN as in the released models (factor 32 over 4096 trained positions: pairs 8 to 18):
    # factor 4 over 8192, original context 2048, the ramp spans pairs 6 to 16.
    ("gpt-oss-yarn", ["--arch", "gpt-oss", "--head-dim", "64", "--rope-theta", "150000", "--experts", "4",
                      "--experts-used", "2", "--rope-scaling", "yarn", "--rope-scaling-factor", "4", "--ctx",
                      "8192", "--sliding-window", "24"],
     ["yarn_ramp", "rope_mscale"]),
    # The SwiGLU's clamps (gate <= 7, |up| <= 7) do not bite with synth's biases (N(0, 0.5^2)):
    # this file has its experts' gate and up biases scaled by PATCH (to N(0, 6^2)).
    ("gpt-oss-clamp", ["--arch", "gpt-oss", "--head-dim", "64", "--rope-theta", "150000", "--experts", "4",
                       "--experts-used", "2", "--rope-scaling", "yarn", "--sliding-window", "24"],
     ["clamp", "oai_swiglu"]),
]
# Tensors (name after "blk.N.") scaled in place in a case's F32 file after synth wrote it.
PATCH = {"gpt-oss-clamp": {"ffn_gate_exps.bias": 12.0, "ffn_up_exps.bias": 12.0}}
RUNS = [("prefill", []), ("stream", []), ("no-cache", []), ("prefill", ["--key-rope", "pre"]),
        ("stream", ["--key-rope", "pre"])]


def without(model, feature):
    """The reference model with one architecture feature switched off."""
    if feature == "bias":
        return dataclasses.replace(model, bq=None, bk=None, bv=None)
    if feature == "qk_norm":
        return dataclasses.replace(model, q_norm=None, k_norm=None)
    if feature == "neox":
        return dataclasses.replace(model, rope_neox=False)
    if feature in ("partial_rope", "n_rot_freqs"):
        # partial_rope: rope.dimension_count ignored, every channel turned with frequencies
        # base^(-2i/hs) (the file's divisors, LongRoPE's or rope_freqs', on the first
        # n_rot/2 pairs); n_rot_freqs: the first n_rot channels turned, but with the
        # frequencies base^(-2i/hs) of a whole head.
        hs, n_rot = model.head_size, model.n_rot
        div = (1.0 / model.rope_theta ** (np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)) / model.inv_freq
        inv = 1.0 / model.rope_theta ** (np.arange(0, hs, 2, dtype=np.float64) / hs)
        if feature == "partial_rope":
            return dataclasses.replace(model, rope_dims=hs, inv_freq=inv / np.concatenate(
                [div, np.ones(hs // 2 - n_rot // 2)]))
        return dataclasses.replace(model, inv_freq=inv[:n_rot // 2] / div)
    if feature == "n_rot_pairs":  # NeoX pairs (i, i + hs/2) instead of (i, i + n_rot/2)
        return dataclasses.replace(model, rope_mistake="pairs_half_head")
    if feature == "unscaled_pass":  # LongRoPE's attention factor on the channels that do not turn too
        return dataclasses.replace(model, rope_mistake="scale_pass")
    if feature == "swa":
        return dataclasses.replace(model, windows=None)
    if feature == "top1":  # a mixture of experts that followed its first choice alone
        return dataclasses.replace(model, experts_used=1)
    if feature == "long_factors":  # the short divisors instead
        return dataclasses.replace(model, inv_freq=model.inv_freq_short)
    if feature == "rope_mscale":
        return dataclasses.replace(model, rope_mscale=1.0)
    if feature == "post_norms":
        return dataclasses.replace(model, post_att=None, post_ffn=None)
    if feature == "gelu":  # SwiGLU instead
        return dataclasses.replace(model, gelu=False)
    if feature == "embed_scale":
        return dataclasses.replace(model, embed_scale=False)
    if feature == "local_rope":
        return dataclasses.replace(model, inv_freq_local=None)
    if feature == "attn_softcap":
        return dataclasses.replace(model, attn_softcap=0.0)
    if feature == "final_softcap":
        return dataclasses.replace(model, final_softcap=0.0)
    if feature == "out_bias":
        return dataclasses.replace(model, bo=None)
    if feature == "sinks":
        return dataclasses.replace(model, sinks=None)
    if feature == "router_bias":
        return dataclasses.replace(model, router_b=None)
    if feature == "expert_bias":  # gate, up and down
        return dataclasses.replace(model, b1=None, b2=None, b3=None)
    if feature == "oai_swiglu":  # plain SwiGLU silu(gate) * up instead
        return dataclasses.replace(model, swiglu_oai=None)
    if feature == "clamp":  # gpt-oss's SwiGLU without its clamps
        return dataclasses.replace(model, swiglu_oai=(model.swiglu_oai[0], math.inf))
    if feature in ("yarn_ramp", "yarn_truncate"):
        # yarn_ramp: every pair interpolated (divided by the factor), as linear scaling;
        # yarn_truncate: the correction range not floored and ceiled (transformers with
        # gpt-oss's "truncate": false; llama.cpp truncates)
        y = model.yarn
        inv = ref.yarn_inv_freq(model.n_rot, model.rope_theta, y["factor"], y["original_ctx"],
                                y["beta_fast"], y["beta_slow"], ramp=feature != "yarn_ramp",
                                truncate=feature != "yarn_truncate")[0]
        return dataclasses.replace(model, inv_freq=inv)
    if feature == "rope_scaling" and model.arch == "gemma3":  # the global layers unscaled
        hs = model.n_rot
        return dataclasses.replace(
            model, inv_freq=1.0 / model.rope_theta ** (np.arange(0, hs, 2, dtype=np.float64) / hs))
    if feature == "rope_scaling":
        hs = model.n_rot
        return dataclasses.replace(
            model, inv_freq=1.0 / model.rope_theta ** (np.arange(0, hs, 2, dtype=np.float64) / hs))
    raise ValueError(feature)


def scale_tensors(path, factors):
    """Multiply the F32 tensors blk.N.<name> of a GGUF file by factors[name], in place."""
    buf, _, infos, base = gguf_ref._read_header(path)
    with open(path, "r+b") as f:
        for name, dims, ttype, offset in infos:
            key = name.split(".", 2)[2] if name.startswith("blk.") else name
            if key in factors:
                if ttype != gguf_ref.GGML_F32:
                    raise ValueError("%s: %s is not F32" % (path, name))
                a = np.frombuffer(buf, dtype="<f4", count=int(np.prod(dims)), offset=base + offset)
                f.seek(base + offset)
                f.write((a * np.float32(factors[key])).astype("<f4").tobytes())


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kivi", default=os.path.join(root, "build", "bin", "kivi"))
    ap.add_argument("--shared", default=os.path.join(root, "..", "shared"))
    ap.add_argument("--chars", type=int, default=480, help="prompt length in characters (default 480)")
    ap.add_argument("--tol", type=float, default=1e-5)
    ap.add_argument("--cases", default="", help="comma-separated cases to run (default: all): "
                    + ",".join(c[0] for c in CASES))
    a = ap.parse_args()
    cases = [c for c in CASES if not a.cases or c[0] in a.cases.split(",")]
    unknown = set(a.cases.split(",")) - {c[0] for c in CASES} if a.cases else set()
    if unknown:
        ap.error("unknown cases: " + ", ".join(sorted(unknown)))
    prompt = ref.read_text(os.path.join(a.shared, "data", "tinytales.txt"))[:a.chars]
    failures = []
    print("%-21s %-25s %6s %12s %5s" % ("model", "engine run", "tokens", "max|diff|", "worst"))
    with tempfile.TemporaryDirectory() as tmp:
        for name, opts, features in cases:
            path = os.path.join(tmp, name + ".gguf")
            subprocess.run([a.kivi, "synth", *SHAPE, *opts, "-o", path], check=True, capture_output=True)
            if name in PATCH:
                scale_tensors(path, PATCH[name])
            model = ref.load_model(path)
            if model.n_rot < model.head_size:
                print("%-21s partial RoPE: channels 0..%d of %d turn (%s pairs), %d pass"
                      % (name, model.n_rot - 1, model.head_size,
                         "NeoX (i, i + %d)" % (model.n_rot // 2) if model.rope_neox else "adjacent",
                         model.head_size - model.n_rot))
            if model.yarn:
                y = model.yarn
                print("%-21s YaRN factor %g, original context %g: ramp over pairs %g to %g of %d, cos/sin times %.4f"
                      % (name, y["factor"], y["original_ctx"], y["low"], y["high"], model.n_rot // 2,
                         model.rope_mscale))
            if "rope_scaling" in features and model.arch == "llama":
                hs = model.n_rot
                base = 1.0 / model.rope_theta ** (np.arange(0, hs, 2, dtype=np.float64) / hs)
                want = ref.llama3_inv_freq(hs, model.rope_theta, **LLAMA3)
                rel = float(np.max(np.abs(model.inv_freq - want) / want))
                print("%-21s rope_freqs.weight vs llama3 formula: max relative difference %.1e (%d of %d pairs scaled)"
                      % (name, rel, int(np.sum(np.abs(base / want - 1) > 1e-9)), hs // 2))
                if not rel <= 1e-6:
                    failures.append("%s: rope_freqs.weight differs from the llama3 formula by %.1e" % (name, rel))
                model = dataclasses.replace(model, inv_freq=want)
            want = None
            for mode, extra in RUNS:
                cmd = [a.kivi, "logits", "-m", path, "-p", prompt, "--mode", mode, "--json", *extra]
                r = subprocess.run(cmd, capture_output=True, text=True)
                label = mode + (" " + " ".join(extra) if extra else "")
                if r.returncode != 0:
                    failures.append("%s %s: engine failed: %s" % (name, label, r.stderr.strip()))
                    print("%-21s %-25s ERROR" % (name, label))
                    continue
                out = json.loads(r.stdout)
                ids = [int(t) for t in out["tokens"]]
                if want is None:
                    want = ref.forward_logits(model, ids)
                got = np.asarray(out["logits"], dtype=np.float64)
                if got.shape != want.shape:
                    failures.append("%s %s: logits shape %s, expected %s" % (name, label, got.shape, want.shape))
                    continue
                per_pos = np.abs(got - want).max(axis=1)
                worst = int(per_pos.argmax())
                ok = bool(per_pos[worst] <= a.tol)
                print("%-21s %-25s %6d %12.3e %5d%s" % (name, label, len(ids), per_pos[worst], worst,
                                                          "" if ok else "  FAIL"))
                if not ok:
                    failures.append("%s %s: max |diff| %.3e at position %d exceeds %.1e"
                                    % (name, label, per_pos[worst], worst, a.tol))
                if mode == "prefill" and not extra:
                    for f in features:
                        off = ref.forward_logits(without(model, f), ids)
                        effect = float(np.abs(got - off).max())
                        print("%-21s %-25s %6s %12.3e  (engine vs reference without it)" % (name, "without " + f, "",
                                                                                            effect))
                        if not effect > 10 * a.tol:
                            failures.append("%s: switching off %s changes the logits by only %.1e" % (name, f, effect))
    if failures:
        print("\nFAILED (%d):" % len(failures))
        for f in failures:
            print("  " + f)
        return 1
    print("OK: every architecture's logits within %.1e of the reference; every feature matters" % a.tol)
    return 0


if __name__ == "__main__":
    sys.exit(main())
