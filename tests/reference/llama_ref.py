#!/usr/bin/python3
"""Independent numpy reference for Llama inference with a fake-quantized KV cache.

Follows the llama2.c model math and tokenizer, with
KIVI-style KV cache quantization (and the rotated tq formats: a seeded Hadamard rotation
per layer and KV head, Lloyd-Max codes per coordinate, one scale per token and head; and
the same rotation applied, with --kv-rotate hadamard, to int8 keys and values and KIVI
values before they are quantized) simulated as it is deployed when streaming.
GGUF models (F32/F16/BF16 weights, and MXFP4 experts, gguf_ref.py) of the architectures
llama, qwen2, qwen3, qwen3moe, gemma2, gemma3, phi3 and gpt-oss follow the published
model definitions (Hugging Face transformers' modeling_llama, modeling_qwen2,
modeling_qwen3, modeling_qwen3_moe, modeling_gemma2, modeling_gemma3, modeling_phi3,
modeling_gpt_oss), with llama.cpp's choices where the two differ (noted below):
  * qwen2: q_proj, k_proj and v_proj have biases; RoPE by rotate_half, i.e. channel
    i of a head pairs with channel i + D/2 (llama.cpp's NEOX mode).
  * qwen3: no biases; q_norm and k_norm are RMSNorms over head_dim applied to each
    head after the projection and before RoPE; rotate_half RoPE; head_dim may differ
    from hidden_size / num_attention_heads.
  * llama: GGUF stores Q and K permuted so that RoPE rotates adjacent pairs (2i, 2i+1),
    as llama2.c does. Llama 3.1 scaling ("rope_type": "llama3") is
    _compute_llama3_parameters: see llama3_inv_freq.
  * gpt-oss (llama.cpp's openai-moe): Q/K/V and output biases; rotate_half RoPE with
    YaRN (yarn_inv_freq: llama.cpp floors and ceils the correction range, which
    transformers skips for gpt-oss's "truncate": false; cos and sin times
    1 + 0.1 ln factor); score scale 1/sqrt(head_dim); one learned sink logit per head in
    each softmax's denominator; even layers windowed (attention.sliding_window, pattern
    2); post_attention_norm is the FFN's pre-norm; a router with a bias, the softmax of
    the top experts_used logits weighting experts whose gate, up and down projections
    have biases, and the clamped SwiGLU min(g, 7) sigmoid(1.702 min(g, 7)) (clamp(u, -7,
    7) + 1) (glu, moe_ffn).
Every architecture honours <arch>.rope.dimension_count (n_rot, llama.cpp's n_dims of
ggml_rope_ext; transformers' partial_rotary_factor): when it is less than the head
dimension (Phi-4-mini: 96 of 128) RoPE turns only the first n_rot channels of each query
and key head, with frequencies base^(-2i/n_rot), NeoX pairs (i, i + n_rot/2) or adjacent
pairs (2i, 2i+1) within them, and the other channels pass unchanged (LongRoPE's attention
factor and YaRN's magnitude scale only the turned ones); rope_freqs.weight and LongRoPE's
factors then have n_rot/2 entries. (llama.cpp itself refuses n_rot != head_dim for
llama, and asserts it in its qwen2, qwen3 and qwen3moe graphs.)
Everything is computed in float64 except where a storage format is emulated.

Library:
    load_model(path) -> Model
    load_tokenizer(path, vocab_size) -> Tokenizer
    Tokenizer.encode(text, bos) / Tokenizer.decode(prev, id) / Tokenizer.decode_all(ids)
    forward_logits(model, tokens) -> [n, vocab] float64 (full precision)
    generate_greedy(model, tok, prompt, steps) -> (ids, text)
    perplexity(model, tokens, ctx, kv_spec) -> dict(ppl, mean_nll, nll_stderr, tokens)
    KVSpec(k_format, v_format, int8_granularity, group_size, residual, key_flush, scale_dtype,
           key_rope, mode, rotation_seed, layers, kv_rotate)
    parse_layer_rules(map), layer_formats(map, n_layers)   (per-layer formats)
    lloyd_max(d, bits), rotation_matrix(d, seed), rotation_seed(base, layer, head),
    tq_quantize_rows(X, fmt, seed, scale_dtype)   (tq building blocks)
    kv_rotated(fmt, is_key, spec), head_rotations(hs, n_kv, spec, layer)   (--kv-rotate)

CLI:
    llama_ref.py ppl [--kv-cache F] [--kv-cache-k F --kv-cache-v F] [--group-size G]
                     [--residual R] [--key-flush batch|group] [--scale-dtype f16|f32]
                     [--int8-granularity token|head|group|tensor] [--mode streaming|batched]
                     [--key-rope post|pre] [--kv-rotation-seed N] [--kv-rotate none|hadamard]
                     [--ctx N] [--json] [--kv-cache-layers MAP]
                     (MAP e.g. "0:kivi4;*:kivi2", "0-1:kivi4/tq3;*:kivi2/tq2")
                     (formats: f32 f16 int8 kivi2 kivi4 kivi8 tq2 tq2.5 tq3 tq3.5 tq4)
    llama_ref.py generate -p TEXT -n N
    llama_ref.py logits -p TEXT          (JSON [positions][vocab], BOS prepended)
"""

import argparse
import heapq
import json
import math
import os
import struct
import sys
import time
from dataclasses import dataclass

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
SHARED = os.path.normpath(os.path.join(REPO_ROOT, "..", "shared"))
DEFAULT_MODEL = os.path.join(SHARED, "models", "stories260K.bin")
DEFAULT_TOKENIZER = os.path.join(SHARED, "models", "tok512.bin")
DEFAULT_TEXT = os.path.join(SHARED, "data", "tinytales.txt")


def add_path_args(ap, text=True):
    """--shared DIR (holding models/ and data/; default <repo>/../shared) and explicit
    --model/--tokenizer[/--text] overrides; resolve them with resolve_paths()."""
    ap.add_argument("--shared", default=None,
                    help="shared directory with models/ and data/ (default: %s)" % SHARED)
    ap.add_argument("--model", default=None, help="llama2.c checkpoint (default: SHARED/models/stories260K.bin)")
    ap.add_argument("--tokenizer", default=None, help="llama2.c tokenizer (default: SHARED/models/tok512.bin)")
    if text:
        ap.add_argument("--text", default=None, help="text file (default: SHARED/data/tinytales.txt)")


def resolve_paths(a):
    shared = a.shared or SHARED
    a.model = a.model or os.path.join(shared, "models", "stories260K.bin")
    a.tokenizer = a.tokenizer or os.path.join(shared, "models", "tok512.bin")
    if hasattr(a, "text"):
        a.text = a.text or os.path.join(shared, "data", "tinytales.txt")
    return a

BOS = 1
EOS = 2
RMS_EPS = 1e-5
ROPE_THETA = 10000.0


# ----------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------

@dataclass
class Model:
    dim: int
    hidden_dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    seq_len: int
    tok_emb: np.ndarray    # [vocab, dim]
    rms_att: np.ndarray    # [L, dim]
    wq: np.ndarray         # [L, dim, dim]
    wk: np.ndarray         # [L, kv_dim, dim]
    wv: np.ndarray         # [L, kv_dim, dim]
    wo: np.ndarray         # [L, dim, dim]
    rms_ffn: np.ndarray    # [L, dim]
    w1: np.ndarray         # [L, hidden, dim]
    w2: np.ndarray         # [L, dim, hidden]
    w3: np.ndarray         # [L, hidden, dim]
    rms_final: np.ndarray  # [dim]
    wcls: np.ndarray       # [vocab, dim]
    # Architecture features (defaults: llama2.c's Llama).
    arch: str = "llama"
    head_dim: int = 0            # 0: dim // n_heads
    rope_theta: float = ROPE_THETA
    rms_eps: float = RMS_EPS
    rope_neox: bool = False      # rotate_half pairs (i, i + n_rot/2) instead of (2i, 2i+1)
    inv_freq: np.ndarray = None  # [n_rot/2] RoPE inverse frequencies; None: theta^(-2i/hs)
    rope_dims: int = 0           # n_rot: RoPE turns channels 0..n_rot-1 of each head (0: all)
    rope_mistake: str = None     # for checks only: a wrong partial RoPE (see rope)
    bq: np.ndarray = None        # [L, n_heads*hs] (qwen2)
    bk: np.ndarray = None        # [L, kv_dim]
    bv: np.ndarray = None        # [L, kv_dim]
    q_norm: np.ndarray = None    # [L, hs] (qwen3)
    k_norm: np.ndarray = None    # [L, hs]
    windows: tuple = None        # [L] sliding window of each layer (0: full), or None
    # Mixture of experts (qwen3moe, Mixtral-style llama): w1, w2, w3 are then
    # [L, E, hidden, dim] / [L, E, dim, hidden] / [L, E, hidden, dim], router [L, E, dim].
    router: np.ndarray = None
    experts_used: int = 0
    # Gemma (transformers' modeling_gemma2 / modeling_gemma3): embeddings times
    # sqrt(hidden_size), post_attention_layernorm and post_feedforward_layernorm on each
    # sublayer's output, gelu_pytorch_tanh gating, score scale query_pre_attn_scalar^-0.5,
    # soft caps (gemma2), and the sliding layers' own RoPE (gemma3: rope_local_base_freq,
    # unscaled). GGUF holds the norms' 1 + weight, so rmsnorm multiplies by them as stored.
    post_att: np.ndarray = None    # [L, dim]
    post_ffn: np.ndarray = None    # [L, dim]
    embed_scale: bool = False
    gelu: bool = False
    attn_scale: float = None       # None: 1/sqrt(head_size)
    attn_softcap: float = 0.0
    final_softcap: float = 0.0
    inv_freq_local: np.ndarray = None  # [n_rot/2] of the sliding layers, or None: inv_freq
    rope_mscale: float = 1.0       # LongRoPE, YaRN: cos and sin times this
    inv_freq_short: np.ndarray = None  # LongRoPE: the short factors' frequencies (for checks)
    # gpt-oss (transformers' modeling_gpt_oss; llama.cpp's openai-moe): an attention output
    # bias, one sink logit per query head joining each softmax's denominator, a router
    # bias, biases on every expert's three projections and the clamped SwiGLU
    # (alpha, limit) of swiglu_oai; YaRN RoPE (yarn_inv_freq) with its parameters in yarn.
    bo: np.ndarray = None          # [L, dim]
    sinks: np.ndarray = None       # [L, n_heads]
    router_b: np.ndarray = None    # [L, E]
    b1: np.ndarray = None          # [L, E, hidden] gate bias
    b2: np.ndarray = None          # [L, E, dim]    down bias
    b3: np.ndarray = None          # [L, E, hidden] up bias
    swiglu_oai: tuple = None       # (alpha, limit) or None: silu(gate) * up
    yarn: dict = None              # factor, original_ctx, low, high, beta_fast, beta_slow (for checks)

    @property
    def head_size(self):
        return self.head_dim or self.dim // self.n_heads

    @property
    def n_rot(self):
        return self.rope_dims or self.head_size

    @property
    def kv_dim(self):
        return self.n_kv_heads * self.head_size


def llama3_inv_freq(hs, theta, factor, low_freq_factor, high_freq_factor, original_ctx):
    """Llama 3.1 RoPE scaling (transformers' _compute_llama3_parameters; Meta's
    apply_scaling): wavelengths below original_ctx / high_freq_factor keep their
    frequency, those above original_ctx / low_freq_factor are divided by factor, and
    the band between interpolates smoothly."""
    inv = 1.0 / theta ** (np.arange(0, hs, 2, dtype=np.float64) / hs)
    low_wavelen = original_ctx / low_freq_factor
    high_wavelen = original_ctx / high_freq_factor
    wavelen = 2 * math.pi / inv
    out = np.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (original_ctx / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * out / factor + smooth * out
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, smoothed, out)


def yarn_corr_dims(hs, base, original_ctx, beta_fast=32.0, beta_slow=1.0, truncate=True):
    """YaRN's correction range as llama.cpp computes it (ggml_rope_yarn_corr_dims): the
    pair index at which a frequency turns beta times over the original context,
    corr(beta) = hs * ln(original_ctx / (2 pi beta)) / (2 ln base); low = max(0,
    floor(corr(beta_fast))), high = min(hs - 1, ceil(corr(beta_slow))). (transformers
    floors and ceils likewise unless rope_scaling has "truncate": false, which
    gpt-oss's config.json sets; llama.cpp always truncates. truncate=False: no floor
    and ceil.)"""
    def corr(beta):
        return hs * math.log(original_ctx / (beta * 2 * math.pi)) / (2 * math.log(base))
    lo, hi = corr(beta_fast), corr(beta_slow)
    if truncate:
        lo, hi = math.floor(lo), math.ceil(hi)
    return max(0.0, float(lo)), min(hs - 1.0, float(hi))


def yarn_inv_freq(hs, base, factor, original_ctx, beta_fast=32.0, beta_slow=1.0, ramp=True, truncate=True):
    """YaRN RoPE frequencies (ggml's rope_yarn with ext_factor 1, as llama.cpp runs
    rope.scaling.type yarn; transformers' _compute_yarn_parameters): pair i keeps its
    frequency base^(-2i/hs) (extrapolation) below the correction range, takes it divided
    by factor (interpolation) above it, and mixes the two linearly across it:
    r = 1 - clamp((i - low) / max(0.001, high - low), 0, 1), frequency
    interp * (1 - r) + extrap * r. ramp=False: interpolation everywhere; truncate: see
    yarn_corr_dims. Returns
    (inv_freq [hs/2], mscale, (low, high)); mscale = 1 + 0.1 ln(factor) multiplies cos and
    sin (llama.cpp: attn_factor get_mscale(factor) / (1 + 0.1 ln factor) = 1, times
    rope_yarn's own 1 + 0.1 ln(1 / freq_scale))."""
    extrap = 1.0 / base ** (np.arange(0, hs, 2, dtype=np.float64) / hs)
    interp = extrap / factor
    low, high = yarn_corr_dims(hs, base, original_ctx, beta_fast, beta_slow, truncate)
    i = np.arange(hs // 2, dtype=np.float64)
    r = 1.0 - np.clip((i - low) / max(0.001, high - low), 0.0, 1.0)
    if not ramp:
        r = np.zeros_like(r)
    mscale = 1.0 + 0.1 * math.log(factor) if factor > 1.0 else 1.0
    return interp * (1.0 - r) + extrap * r, mscale, (low, high)


def load_gguf_model(path):
    """A llama, qwen2, qwen3, qwen3moe, gemma2, gemma3, phi3 or gpt-oss GGUF with
    F32/F16/BF16 weights (or MXFP4 ones, dequantized by gguf_ref). RoPE divisors in
    rope_freqs.weight are applied as llama.cpp applies them (frequency / divisor);
    callers that want to check them against llama3_inv_freq can read model.inv_freq."""
    import gguf_ref
    meta, t = gguf_ref.read_gguf(path)
    arch = meta["general.architecture"]
    if arch not in ("llama", "qwen2", "qwen3", "qwen3moe", "gemma2", "gemma3", "phi3", "gpt-oss"):
        raise ValueError("%s: architecture %s is not in the reference" % (path, arch))
    A = arch + "."
    dim = int(meta[A + "embedding_length"])
    n_heads = int(meta[A + "attention.head_count"])
    n_kv = int(meta.get(A + "attention.head_count_kv", n_heads))
    hs = int(meta.get(A + "attention.key_length", dim // n_heads))
    L = int(meta[A + "block_count"])
    theta = float(meta.get(A + "rope.freq_base", ROPE_THETA))
    # Partial rotary embeddings (llama.cpp's n_rot, ggml_rope_ext's n_dims; transformers'
    # partial_rotary_factor, Phi-4-mini 96 of 128): RoPE turns the first n_rot channels of
    # each head with frequencies base^(-2i/n_rot), pairs within those channels, and the
    # rest pass unchanged. Every frequency vector below has n_rot/2 entries, as have
    # rope_freqs.weight and LongRoPE's factors; YaRN's correction range is in pairs of n_rot.
    n_rot = int(meta.get(A + "rope.dimension_count", hs))
    if n_rot % 2 or not 2 <= n_rot <= hs:
        raise ValueError("%s: rope.dimension_count %d is not even and within the head (%d)" % (path, n_rot, hs))

    def plain_inv(base):
        return 1.0 / base ** (np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)

    def stack(name):
        return np.stack([t["blk.%d.%s" % (l, name)] for l in range(L)])

    def opt_stack(name):
        return stack(name) if "blk.0.%s" % name in t else None

    tok_emb = t["token_embd.weight"]
    if arch == "phi3":
        # transformers' Phi3: qkv_proj's rows are q, k, v; gate_up_proj's are gate, then up
        # (chunk(2)). The file's phi3.attention.sliding_window is not applied (as llama.cpp).
        qd, kvd = n_heads * hs, n_kv * hs
        for l in range(L):
            p = "blk.%d." % l
            if p + "attn_qkv.weight" in t:
                w = t.pop(p + "attn_qkv.weight")
                t[p + "attn_q.weight"], t[p + "attn_k.weight"], t[p + "attn_v.weight"] = (
                    w[:qd], w[qd:qd + kvd], w[qd + kvd:])
            up = t.pop(p + "ffn_up.weight")
            t[p + "ffn_gate.weight"], t[p + "ffn_up.weight"] = up[:up.shape[0] // 2], up[up.shape[0] // 2:]
        meta = {k: v for k, v in meta.items() if not k.startswith(A + "attention.sliding_window")}
    for name in ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"):
        if name in t and t[name].shape != (n_rot // 2,):
            raise ValueError("%s: %s has shape %s, expected (%d,) (rope.dimension_count %d / 2)"
                             % (path, name, t[name].shape, n_rot // 2, n_rot))
    base_inv = plain_inv(theta)
    inv = base_inv
    if "rope_freqs.weight" in t:
        inv = inv / t["rope_freqs.weight"]
    # LongRoPE (transformers' Phi3 with rope_scaling type longrope): the long factors when
    # the context run with (here the file's) exceeds the original one, cos and sin times
    # the attention factor.
    mscale, inv_short = 1.0, None
    if "rope_factors_long.weight" in t:
        orig = int(meta.get(A + "rope.scaling.original_context_length", meta[A + "context_length"]))
        inv_short = base_inv / t["rope_factors_short.weight"]
        inv = base_inv / t["rope_factors_long.weight"] if int(meta[A + "context_length"]) > orig else inv_short
        mscale = float(meta.get(A + "rope.scaling.attn_factor", 1.0))
    linear = 1.0
    if meta.get(A + "rope.scaling.type") == "linear":  # positions divided by the factor
        linear = float(meta[A + "rope.scaling.factor"])
        inv = inv / linear
    # YaRN (gpt-oss): llama.cpp's original context defaults to the training context, its
    # beta_fast and beta_slow to 32 and 1 (gpt-oss reads no keys for them), and
    # rope.scaling.attn_factor, when present, multiplies the cos/sin scale.
    yarn = None
    yarn_args = None
    if meta.get(A + "rope.scaling.type") == "yarn":
        factor = float(meta.get(A + "rope.scaling.factor", 1.0)) or 1.0
        orig = float(meta.get(A + "rope.scaling.original_context_length", meta[A + "context_length"]))
        yarn_args = (factor, orig, 32.0, 1.0)
        inv, ymscale, (lo, hi) = yarn_inv_freq(n_rot, theta, *yarn_args)
        if "rope_freqs.weight" in t:  # ggml divides each pair's angle before the mix (linear in it)
            inv = inv / t["rope_freqs.weight"]
        mscale = ymscale * float(meta.get(A + "rope.scaling.attn_factor", 1.0))
        yarn = dict(factor=factor, original_ctx=orig, beta_fast=32.0, beta_slow=1.0, low=lo, high=hi)
    gemma = arch in ("gemma2", "gemma3")
    # Sliding-window attention (llama.cpp's keys): window W; the pattern a period N
    # (layer l windowed iff l % N < N - 1) or one flag per layer; none: every layer.
    windows = None
    if A + "attention.sliding_window" in meta or arch == "gemma2":
        # transformers: Gemma 2 slides on even layers (window 4096 by default), Gemma 3
        # on all but every sixth ((l + 1) % 6 != 0).
        w = int(meta.get(A + "attention.sliding_window", 4096))
        pat = meta.get(A + "attention.sliding_window_pattern")
        if pat is None and gemma:
            pat = 2 if arch == "gemma2" else 6
        if pat is None and arch == "gpt-oss":  # llama.cpp: load_swa_pattern(ml, 2), even layers
            pat = 2
        if pat is None:
            flags = [True] * L
        elif isinstance(pat, (list, tuple, np.ndarray)):
            flags = [bool(f) for f in pat]
        else:
            flags = [l % int(pat) < int(pat) - 1 for l in range(L)]
        windows = tuple(w if f else 0 for f in flags)
    moe = A + "expert_count" in meta and int(meta[A + "expert_count"]) > 0
    ffn = "_exps" if moe else ""
    hidden = int(meta.get(A + "expert_feed_forward_length", meta[A + "feed_forward_length"]) if moe
                 else meta[A + "feed_forward_length"])
    inv_local = None
    if arch == "gemma3":
        inv_local = plain_inv(float(meta.get(A + "rope.freq_base_swa", 10000.0)))
    elif arch == "gemma2" and A + "rope.freq_base_swa" in meta:
        inv_local = plain_inv(float(meta[A + "rope.freq_base_swa"])) / linear
    elif arch == "gpt-oss" and A + "rope.freq_base_swa" in meta:
        # llama.cpp: the windowed layers' own base with the same scaling (and YaRN range)
        base_swa = float(meta[A + "rope.freq_base_swa"])
        inv_local = (yarn_inv_freq(n_rot, base_swa, *yarn_args)[0] if yarn_args else
                     plain_inv(base_swa) / linear)
    # query_pre_attn_scalar: hidden_size / heads for the 27B models (46 and 62 layers),
    # else head_dim.
    attn_scale = None
    if gemma and L == (46 if arch == "gemma2" else 62):
        attn_scale = (dim // n_heads) ** -0.5
    # gpt-oss: post_attention_norm is the FFN's pre-norm (transformers'
    # post_attention_layernorm), not a norm of the attention output as in Gemma.
    oss = arch == "gpt-oss"
    if oss:
        rms_ffn, post_att = stack("post_attention_norm.weight"), None
    else:
        rms_ffn, post_att = stack("ffn_norm.weight"), opt_stack("post_attention_norm.weight")
    return Model(dim=dim, hidden_dim=hidden, n_layers=L, n_heads=n_heads,
                 n_kv_heads=n_kv, vocab_size=tok_emb.shape[0], seq_len=int(meta[A + "context_length"]),
                 tok_emb=tok_emb, rms_att=stack("attn_norm.weight"), wq=stack("attn_q.weight"),
                 wk=stack("attn_k.weight"), wv=stack("attn_v.weight"), wo=stack("attn_output.weight"),
                 rms_ffn=rms_ffn, w1=stack("ffn_gate%s.weight" % ffn),
                 w2=stack("ffn_down%s.weight" % ffn), w3=stack("ffn_up%s.weight" % ffn),
                 rms_final=t["output_norm.weight"],
                 router=stack("ffn_gate_inp.weight") if moe else None,
                 experts_used=int(meta[A + "expert_used_count"]) if moe else 0,
                 wcls=t.get("output.weight", tok_emb), arch=arch, head_dim=hs, rope_theta=theta,
                 rope_dims=n_rot,
                 rms_eps=float(meta.get(A + "attention.layer_norm_rms_epsilon", RMS_EPS)),
                 rope_neox=arch in ("qwen2", "qwen3", "qwen3moe", "gemma2", "gemma3", "phi3", "gpt-oss"),
                 inv_freq=inv, post_att=post_att,
                 post_ffn=opt_stack("post_ffw_norm.weight"), embed_scale=gemma, gelu=gemma,
                 attn_scale=attn_scale,
                 attn_softcap=float(meta.get(A + "attn_logit_softcapping", 50.0)) if arch == "gemma2" else 0.0,
                 final_softcap=float(meta.get(A + "final_logit_softcapping",
                                              30.0 if arch == "gemma2" else 0.0)) if gemma else 0.0,
                 inv_freq_local=inv_local, rope_mscale=mscale, inv_freq_short=inv_short,
                 bq=opt_stack("attn_q.bias"), bk=opt_stack("attn_k.bias"), bv=opt_stack("attn_v.bias"),
                 q_norm=opt_stack("attn_q_norm.weight"), k_norm=opt_stack("attn_k_norm.weight"),
                 windows=windows, bo=opt_stack("attn_output.bias"), sinks=opt_stack("attn_sinks.weight"),
                 router_b=opt_stack("ffn_gate_inp.bias") if moe else None,
                 b1=opt_stack("ffn_gate%s.bias" % ffn), b2=opt_stack("ffn_down%s.bias" % ffn),
                 b3=opt_stack("ffn_up%s.bias" % ffn), swiglu_oai=(1.702, 7.0) if oss else None, yarn=yarn)


def load_model(path):
    """Read a llama2.c checkpoint or a GGUF file; all weights are converted to float64."""
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:4] == b"GGUF":
        return load_gguf_model(path)
    dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = struct.unpack_from("<7i", raw, 0)
    shared = vocab > 0
    vocab = abs(vocab)
    hs = dim // n_heads
    kv_dim = n_kv * hs
    data = np.frombuffer(raw, dtype="<f4", offset=28)
    off = 0

    def take(*shape):
        nonlocal off
        n = int(np.prod(shape))
        if off + n > data.size:
            raise ValueError("checkpoint %s is truncated" % path)
        a = data[off:off + n].astype(np.float64).reshape(shape)
        off += n
        return a

    tok_emb = take(vocab, dim)
    rms_att = take(n_layers, dim)
    wq = take(n_layers, dim, dim)
    wk = take(n_layers, kv_dim, dim)
    wv = take(n_layers, kv_dim, dim)
    wo = take(n_layers, dim, dim)
    rms_ffn = take(n_layers, dim)
    w1 = take(n_layers, hidden, dim)
    w2 = take(n_layers, dim, hidden)
    w3 = take(n_layers, hidden, dim)
    rms_final = take(dim)
    take(seq_len, hs // 2)  # freq_cis_real (unused: RoPE is recomputed)
    take(seq_len, hs // 2)  # freq_cis_imag (unused)
    wcls = tok_emb if shared else take(vocab, dim)
    return Model(dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len, tok_emb, rms_att,
                 wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final, wcls)


# ----------------------------------------------------------------------------
# Tokenizer
# ----------------------------------------------------------------------------

class Tokenizer:
    def __init__(self, pieces, scores):
        self.pieces = pieces            # list of bytes
        self.scores = scores            # list of float
        self.lookup = {}
        for i, p in enumerate(pieces):
            self.lookup.setdefault(p, i)  # duplicate piece strings: lowest id wins

    @property
    def vocab_size(self):
        return len(self.pieces)

    def _byte_token(self, b):
        return self.lookup[b"<0x%02X>" % b]

    def encode(self, text, bos):
        """SentencePiece-style BPE driven by merge scores (llama2.c semantics)."""
        ids = [BOS] if bos else []
        if not text:
            return ids
        # Initial sequence: dummy prefix " ", then one token per UTF-8 character,
        # or one byte-fallback token per byte when the character is not a piece.
        seq = [self.lookup[b" "]]
        for ch in text:
            b = ch.encode("utf-8", errors="surrogatepass")
            tid = self.lookup.get(b)
            if tid is not None:
                seq.append(tid)
            else:
                seq.extend(self._byte_token(x) for x in b)

        # Merge loop. Semantics: repeatedly merge the adjacent pair whose merged piece
        # has the highest score, ties going to the leftmost pair. Implemented with a
        # doubly linked list over the initial positions and a heap keyed by
        # (-score, left node index); since nodes keep their relative order, the
        # smallest left index among equal scores is the leftmost pair. Stale heap
        # entries are detected by re-checking the two nodes' current tokens.
        n = len(seq)
        tokens = list(seq)
        alive = [True] * n
        nxt = list(range(1, n + 1))
        prv = list(range(-1, n - 1))
        heap = []

        def push(i):
            j = nxt[i]
            if j >= n:
                return
            m = self.lookup.get(self.pieces[tokens[i]] + self.pieces[tokens[j]])
            if m is not None:
                heapq.heappush(heap, (-self.scores[m], i, tokens[i], j, tokens[j], m))

        for i in range(n - 1):
            push(i)
        while heap:
            _, i, ti, j, tj, m = heapq.heappop(heap)
            if not (alive[i] and alive[j] and nxt[i] == j and tokens[i] == ti and tokens[j] == tj):
                continue
            tokens[i] = m
            alive[j] = False
            nxt[i] = nxt[j]
            if nxt[j] < n:
                prv[nxt[j]] = i
            if prv[i] >= 0:
                push(prv[i])
            push(i)
        i = 0
        while i < n:
            ids.append(tokens[i])
            i = nxt[i]
        return ids

    def decode(self, prev, tid):
        """Bytes of one token: drop a leading space after BOS (or at the start);
        "<0xNN>" pieces are raw bytes."""
        p = self.pieces[tid]
        if (prev is None or prev == BOS) and p.startswith(b" "):
            p = p[1:]
        if len(p) == 6 and p.startswith(b"<0x") and p.endswith(b">"):
            try:
                return bytes([int(p[3:5], 16)])
            except ValueError:
                pass
        return p

    def decode_all(self, ids):
        """Concatenate decode(prev, id) over ids; a leading BOS is consumed as prev."""
        out = []
        prev = None
        for t in ids:
            if t == BOS and prev is None:
                prev = BOS
                continue
            out.append(self.decode(prev, t))
            prev = t
        return b"".join(out).decode("utf-8", errors="replace")


def load_tokenizer(path, vocab_size):
    with open(path, "rb") as f:
        raw = f.read()
    off = 4  # int32 max_token_length (unused)
    pieces, scores = [], []
    for _ in range(vocab_size):
        score, ln = struct.unpack_from("<fi", raw, off)
        off += 8
        pieces.append(raw[off:off + ln])
        off += ln
        scores.append(float(score))
    return Tokenizer(pieces, scores)


# ----------------------------------------------------------------------------
# Directed rounding helpers (parameter storage emulation)
# ----------------------------------------------------------------------------

def f16_down(x):
    """Round float64 values to float16 toward -inf; returns float64."""
    x = np.asarray(x, dtype=np.float64)
    h = x.astype(np.float16)
    bad = h.astype(np.float64) > x
    h = np.where(bad, np.nextafter(h, np.float16(-np.inf)), h)
    return h.astype(np.float64)


def f16_up(x):
    """Round float64 values to float16 toward +inf; returns float64."""
    x = np.asarray(x, dtype=np.float64)
    h = x.astype(np.float16)
    bad = h.astype(np.float64) < x
    h = np.where(bad, np.nextafter(h, np.float16(np.inf)), h)
    return h.astype(np.float64)


def f32_up(x):
    """Round float64 values to float32 toward +inf; returns float64."""
    x = np.asarray(x, dtype=np.float64)
    f = x.astype(np.float32)
    bad = f.astype(np.float64) < x
    f = np.where(bad, np.nextafter(f, np.float32(np.inf)), f)
    return f.astype(np.float64)


# ----------------------------------------------------------------------------
# KV cache formats (fake quantization)
# ----------------------------------------------------------------------------

TQ_FORMATS = ("tq2", "tq2.5", "tq3", "tq3.5", "tq4")
FORMATS = ("f32", "f16", "int8", "kivi2", "kivi4", "kivi8") + TQ_FORMATS
GRANULARITIES = ("token", "head", "group", "tensor")
ROTATIONS = ("none", "hadamard")     # --kv-rotate
DEFAULT_ROTATION_SEED = 0x6b697669   # 1802073705, the engine's --kv-rotation-seed default


def parse_layer_rules(text):
    """A per-layer format map (the engine's --kv-cache-layers MAP) -> its rules, checked as
    far as they can be without the model: [(layers, key format, value format)], layers a
    sorted tuple of layer numbers or None for '*'.

    MAP is rules separated by ';', each LAYERS:FORMAT. LAYERS is '*' (every layer that no
    other rule names) or a comma-separated list of layer numbers and ranges A-B (A <= B,
    both included); FORMAT is one format for keys and values or KEY/VALUE. Spaces around
    the parts and empty rules are ignored. A layer may be named once, and '*' may appear
    in one rule."""
    rules, named, star = [], set(), False
    for rule in (r.strip() for r in text.split(";")):
        if not rule:
            continue
        if rule.count(":") != 1:
            raise ValueError("layer rule %r is not LAYERS:FORMAT" % rule)
        lhs, rhs = (x.strip() for x in rule.split(":"))
        fmts = [f.strip() for f in rhs.split("/")]
        if len(fmts) > 2:
            raise ValueError("format %r in layer rule %r is not FORMAT or KEY/VALUE" % (rhs, rule))
        for f in fmts:
            if f not in FORMATS:
                raise ValueError("unknown KV format %r in layer rule %r" % (f, rule))
        kf, vf = fmts[0], fmts[-1]
        if lhs == "*":
            if star:
                raise ValueError("'*' appears in two layer rules")
            star = True
            rules.append((None, kf, vf))
            continue
        layers = []
        for item in (x.strip() for x in lhs.split(",")):
            a, dash, b = item.partition("-")
            if not (a.strip().isdecimal() and (not dash or b.strip().isdecimal())):
                raise ValueError("%r in layer rule %r is not a layer or a range A-B" % (item, rule))
            lo, hi = int(a), int(b) if dash else int(a)
            if lo > hi:
                raise ValueError("range %r in layer rule %r runs backwards" % (item, rule))
            for l in range(lo, hi + 1):
                if l in named:
                    raise ValueError("layer %d is named by two layer rules" % l)
                named.add(l)
                layers.append(l)
        rules.append((tuple(sorted(layers)), kf, vf))
    if not rules:
        raise ValueError("the layer map %r has no rules" % text)
    return rules


def layer_formats(text, n_layers):
    """[(key format, value format)] for layers 0..n_layers-1 from a per-layer format map
    (see parse_layer_rules): a named layer takes its rule's formats, every other layer
    those of the '*' rule. Every layer must be covered, and no rule may name a layer the
    model does not have."""
    out = [None] * n_layers
    rest = None
    for layers, kf, vf in parse_layer_rules(text):
        if layers is None:
            rest = (kf, vf)
            continue
        for l in layers:
            if l >= n_layers:
                raise ValueError("the layer map names layer %d, but the model has %d layers"
                                 % (l, n_layers))
            out[l] = (kf, vf)
    for l in range(n_layers):
        if out[l] is None:
            if rest is None:
                raise ValueError("layer %d has no format in the layer map (name it, or add "
                                 "'*:FORMAT' for the rest)" % l)
            out[l] = rest
    return out


# ---- tq: rotated vector quantization (a Hadamard rotation per layer and KV head, one
# Lloyd-Max codebook per coordinate, one scale per token and head). Written from the
# format's specification; everything in Python ints (64-bit masked) and float64.

MASK64 = (1 << 64) - 1
GOLDEN64 = 0x9E3779B97F4A7C15


def splitmix64(z):
    """splitmix64 finalizer of z + golden gamma, mod 2^64."""
    z = (z + GOLDEN64) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


class Rng:
    """The engine's kivi::Rng (xoshiro256** seeded by splitmix64): state word k is
    splitmix64(seed + k * golden gamma), k = 0..3."""

    def __init__(self, seed):
        self.s = [splitmix64((seed + k * GOLDEN64) & MASK64) for k in range(4)]

    @staticmethod
    def _rotl(x, k):
        return ((x << k) | (x >> (64 - k))) & MASK64

    def next_u64(self):
        s = self.s
        result = (self._rotl((s[1] * 5) & MASK64, 7) * 9) & MASK64
        t = (s[1] << 17) & MASK64
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = self._rotl(s[3], 45)
        return result


def rotation_seed(base_seed, layer, kv_head):
    """Seed of the rotation of one (layer, KV head)."""
    return splitmix64((base_seed ^ splitmix64(((layer << 32) | kv_head) & MASK64)) & MASK64)


def hadamard_blocks(d):
    """Binary decomposition of d into distinct powers of two, largest first (96 -> [64, 32])."""
    return [1 << b for b in range(d.bit_length() - 1, -1, -1) if d >> b & 1]


def rotation_signs(d, seed):
    """[d] +-1: coordinate i is -1 where bit i % 64 of the (i // 64)-th next_u64() is 1."""
    rng = Rng(seed)
    words = [rng.next_u64() for _ in range((d + 63) // 64)]
    return np.array([-1.0 if words[i // 64] >> (i % 64) & 1 else 1.0 for i in range(d)])


_ROT_CACHE = {}


def rotation_matrix(d, seed):
    """R = blockdiag(H_n1 D_1, H_n2 D_2, ...) [d, d] in float64: y = R @ x. H_n is
    Sylvester's orthonormal Hadamard matrix, H[i][j] = (-1)^popcount(i & j) / sqrt(n)."""
    key = (d, seed)
    if key not in _ROT_CACHE:
        sg = rotation_signs(d, seed)
        R = np.zeros((d, d))
        o = 0
        for n in hadamard_blocks(d):
            i = np.arange(n)
            par = np.array([bin(v).count("1") & 1 for v in (i[:, None] & i[None, :]).ravel()])
            H = np.where(par.reshape(n, n) == 1, -1.0, 1.0) / math.sqrt(n)
            R[o:o + n, o:o + n] = H * sg[None, o:o + n]
            o += n
        _ROT_CACHE[key] = R
    return _ROT_CACHE[key]


def _cos_power_integral(m, theta):
    """I_m(theta) = integral_0^theta cos(t)^m dt (m >= 0), by the stable recursion
    I_k = cos^(k-1) sin / k + (k-1)/k I_(k-2) from I_0 = theta or I_1 = sin(theta)."""
    theta = np.asarray(theta, dtype=np.float64)
    c, s = np.cos(theta), np.sin(theta)
    I, k = (theta.copy(), 0) if m % 2 == 0 else (s.copy(), 1)
    while k < m:
        k += 2
        I = c ** (k - 1) * s / k + (k - 1) / k * I
    return I


def _cell_moments(d, t):
    """For cell edges t (ascending, in [-1, 1]) of the density f_d(x) = c_d (1-x^2)^((d-3)/2):
    per cell (probability, first moment, second moment). With x = sin(theta),
    f_d(x) dx = c_d cos(theta)^(d-2) dtheta, so all three are closed forms in theta."""
    m = d - 2
    th = np.arcsin(np.clip(t, -1.0, 1.0))
    norm = 2.0 * float(_cos_power_integral(m, math.pi / 2))
    F = _cos_power_integral(m, th)
    P = np.diff(F) / norm
    M1 = -np.diff(np.cos(th) ** (m + 1)) / (m + 1) / norm     # sin cos^m = -(cos^(m+1))'/(m+1)
    M2 = np.diff(F - _cos_power_integral(m + 2, th)) / norm   # sin^2 cos^m = cos^m - cos^(m+2)
    return P, M1, M2


_LLOYD_CACHE = {}


def lloyd_max(d, bits):
    """The b-bit Lloyd-Max quantizer of one coordinate of a uniform random unit vector in
    R^d (d >= 2): (centroids [2^b] ascending, mean squared error per coordinate).
    Lloyd's iteration (thresholds at midpoints, centroids the cell means) from a uniform
    start until the centroids move by < 1e-15 or rounding noise takes over."""
    key = (d, bits)
    if key in _LLOYD_CACHE:
        return _LLOYD_CACHE[key]
    if d < 2 or bits < 1:
        raise ValueError("lloyd_max: need d >= 2 and bits >= 1 (d=%d, bits=%d)" % (d, bits))
    K = 1 << bits
    a = min(2.5 / math.sqrt(d), 0.9)
    c = np.linspace(-a, a, K)
    prev = np.inf
    for _ in range(100000):
        t = np.concatenate([[-1.0], (c[1:] + c[:-1]) / 2, [1.0]])
        P, M1, _ = _cell_moments(d, t)
        cn = M1 / P
        cn = (cn - cn[::-1]) / 2            # the optimum is symmetric
        dc = float(np.abs(cn - c).max())
        c = cn
        if dc < 1e-15 or (dc < 1e-13 and dc >= prev):
            break
        prev = dc
    t = np.concatenate([[-1.0], (c[1:] + c[:-1]) / 2, [1.0]])
    P, M1, M2 = _cell_moments(d, t)
    mse = float(np.sum(M2 - 2 * c * M1 + c * c * P))
    _LLOYD_CACHE[key] = (c, mse)
    return c, mse


def tq_bits(fmt, d):
    """[d] bits per coordinate: b everywhere for tqb; tqb.5: b + 1 for the first d // 4."""
    b = int(fmt[2])
    bits = np.full(d, b, dtype=np.int64)
    if fmt.endswith(".5"):
        bits[:d // 4] = b + 1
    return bits


def tq_codebook(fmt, d):
    """[d, Kmax] centroids per coordinate (padded with +inf beyond a coordinate's 2^b_i)."""
    bits = tq_bits(fmt, d)
    Kmax = 1 << int(bits.max())
    C = np.full((d, Kmax), np.inf)
    for b in set(bits.tolist()):
        C[bits == b, :1 << b] = lloyd_max(d, b)[0]
    return C


def tq_quantize_rows(X, fmt, seed, scale_dtype):
    """X [N, d] rows of one (layer, KV head) -> [N, d] as read back: y = R x,
    code_i = nearest centroid of y_i / |y|, s = |x|^2 / <y, c> (f16 round-to-nearest-even
    or f32), x' = s R^T c."""
    N, d = X.shape
    R = rotation_matrix(d, seed)
    C = tq_codebook(fmt, d)
    Y = X @ R.T
    nrm = np.sqrt((X * X).sum(axis=1))
    U = Y / np.where(nrm > 0, nrm, 1.0)[:, None]
    code = np.abs(U[:, :, None] - C[None]).argmin(axis=2)          # [N, d]
    c = C[np.arange(d)[None, :], code]                              # chosen centroids
    yc = (Y * c).sum(axis=1)
    s = np.where(nrm > 0, nrm * nrm / np.where(yc != 0, yc, 1.0), 0.0)
    s = s.astype(np.float16) if scale_dtype == "f16" else s.astype(np.float32)
    s = s.astype(np.float64)
    return s[:, None] * (c @ R)      # R^T c as rows


@dataclass
class KVSpec:
    k_format: str = "f32"
    v_format: str = "f32"
    int8_granularity: str = "head"
    group_size: int = 32          # G
    residual: int = 128           # R (kivi formats only)
    key_flush: str = "batch"      # "batch" | "group"
    scale_dtype: str = "f16"      # "f16" | "f32"
    key_rope: str = "post"        # "post": keys quantized after RoPE; "pre": before it
    # How each chunk is fed: "streaming" (one token at a time) or "batched" (the whole
    # chunk appended at once). Only int8 "tensor" differs: its scale comes from the first
    # append batch (BOS alone when streaming, the whole chunk when batched).
    mode: str = "streaming"
    rotation_seed: int = DEFAULT_ROTATION_SEED   # tq, kv_rotate: base seed of the per-(layer, head) rotations
    # Per-layer formats (the engine's --kv-cache-layers MAP, see parse_layer_rules); when
    # set, they replace k_format and v_format in every layer. The other settings stay
    # common to all layers.
    layers: str = ""
    # "hadamard": int8 keys and values and KIVI values are stored rotated by the tq rotation
    # of their (layer, KV head) (see kv_rotated); "none": unrotated. tq formats always rotate.
    kv_rotate: str = "none"

    def formats(self, n_layers):
        """[(key format, value format)] of layers 0..n_layers-1."""
        if self.layers:
            return layer_formats(self.layers, n_layers)
        return [(self.k_format, self.v_format)] * n_layers

    def formats_used(self):
        """(key formats, value formats): the sets of formats some layer may use (with a
        layer map, those of every rule, '*' included even where it covers no layer)."""
        if self.layers:
            rules = parse_layer_rules(self.layers)
            return {r[1] for r in rules}, {r[2] for r in rules}
        return {self.k_format}, {self.v_format}

    def all_f32(self):
        """True when no layer quantizes anything."""
        ks, vs = self.formats_used()
        return ks | vs == {"f32"}

    def validate(self):
        ks, vs = self.formats_used()   # parses the layer map, if any
        for f in (self.k_format, self.v_format):
            if f not in FORMATS:
                raise ValueError("unknown KV format %r" % f)
        if self.int8_granularity not in GRANULARITIES:
            raise ValueError("unknown int8 granularity %r" % self.int8_granularity)
        if self.key_flush not in ("batch", "group"):
            raise ValueError("unknown key flush policy %r" % self.key_flush)
        if self.scale_dtype not in ("f16", "f32"):
            raise ValueError("unknown scale dtype %r" % self.scale_dtype)
        if self.key_rope not in ("post", "pre"):
            raise ValueError("unknown key RoPE position %r" % self.key_rope)
        if self.mode not in ("streaming", "batched"):
            raise ValueError("unknown mode %r" % self.mode)
        if self.group_size <= 0 or self.residual < 0:
            raise ValueError("need G > 0 and R >= 0 (G=%d, R=%d)" % (self.group_size, self.residual))
        # R % G == 0 only where a KIVI format uses key groups (as the engine's CacheConfig);
        # tq formats quantize token by token.
        if any(f.startswith("kivi") for f in ks | vs) and self.residual % self.group_size:
            raise ValueError("need R %% G == 0 with a KIVI format (G=%d, R=%d)"
                             % (self.group_size, self.residual))
        if not 0 <= self.rotation_seed <= MASK64:
            raise ValueError("rotation seed %r is not a 64-bit unsigned integer" % self.rotation_seed)
        if self.kv_rotate not in ROTATIONS:
            raise ValueError("unknown KV rotation %r" % self.kv_rotate)

    def rotates_any(self):
        """True when kv_rotate rotates some stream of some layer (an int8 key or value or
        a KIVI value format is used)."""
        ks, vs = self.formats_used()
        return any(kv_rotated(f, True, self) for f in ks) or any(kv_rotated(f, False, self) for f in vs)

    def label(self):
        def fmt(f):
            if f == "int8":
                g = self.int8_granularity
                return "int8/" + g + ("%d" % self.group_size if g == "group" else "")
            return f
        if self.layers:
            def span(layers):   # (0, 1, 2, 4) -> "0-2,4"
                runs = []
                for l in layers:
                    if runs and runs[-1][1] == l - 1:
                        runs[-1][1] = l
                    else:
                        runs.append([l, l])
                return ",".join("%d" % a if a == b else "%d-%d" % (a, b) for a, b in runs)

            def rule(r):
                return "%s:%s" % ("*" if r[0] is None else span(r[0]),
                                  r[1] if r[1] == r[2] else r[1] + "/" + r[2])
            rules = parse_layer_rules(self.layers)
            s = "layers " + ";".join(rule(r) for r in rules)
            if any("int8" in r[1:] for r in rules):
                s += " " + fmt("int8")
        else:
            kf, vf = fmt(self.k_format), fmt(self.v_format)
            s = kf if kf == vf else "K %s V %s" % (kf, vf)
        ks, vs = self.formats_used()
        kivi = any("kivi" in f for f in ks | vs)
        tq = any(f in TQ_FORMATS for f in ks | vs)
        if kivi:
            s += " G%d R%d %s" % (self.group_size, self.residual, self.key_flush)
        elif tq:
            s += " R%d" % self.residual
        if self.rotates_any():
            s += " rotated"
        if (tq or self.rotates_any()) and self.rotation_seed != DEFAULT_ROTATION_SEED:
            s += " seed%d" % self.rotation_seed
        if not (ks | vs) <= {"f32", "f16"}:
            s += " s%s" % self.scale_dtype
        if self.key_rope == "pre":
            s += " keys-pre-RoPE"
        return s


def _int8_sym(x, absmax, scale_dtype):
    """Symmetric int8 fake quantization of x with the given (broadcastable) absmax."""
    scale = (absmax.astype(np.float32) / np.float32(127.0)).astype(np.float64)
    if scale_dtype == "f16":
        scale = f16_up(scale)
    safe = np.where(scale > 0, scale, 1.0)
    q = np.where(scale > 0, np.clip(np.rint(x / safe), -127, 127), 0.0)
    return q * scale


def _asym(x, mn, mx, bits, scale_dtype):
    """Asymmetric min/max fake quantization to `bits` bits (KIVI)."""
    L = float(2 ** bits - 1)
    if scale_dtype == "f32":
        mn32 = mn.astype(np.float32)
        mx32 = mx.astype(np.float32)
        scale = ((mx32 - mn32) / np.float32(L)).astype(np.float64)
        zero = mn32.astype(np.float64)
    else:
        # zero rounded down to f16 so that every value is >= zero; the scale is
        # computed from that zero and rounded up (f32 then f16) so max maps to <= L.
        zero = f16_down(mn)
        scale = f16_up(f32_up((mx - zero) / L))
    safe = np.where(scale > 0, scale, 1.0)
    q = np.where(scale > 0, np.clip(np.rint((x - zero) / safe), 0, L), 0.0)
    return q * scale + zero


def kv_rotated(fmt, is_key, spec):
    """True when spec.kv_rotate rotates this stream before it is quantized: int8 keys and
    values (every granularity) and KIVI values. KIVI keys are quantized per channel across
    tokens, and a rotation would mix the channels the format keeps apart; f32 and f16 rows
    are not quantized; tq formats rotate on their own whatever kv_rotate says."""
    if spec.kv_rotate == "none":
        return False
    return fmt == "int8" or (fmt.startswith("kivi") and not is_key)


def head_rotations(hs, nkv, spec, layer):
    """[nkv, hs, hs]: the tq rotation R of each KV head of `layer` (the same seeds:
    rotation_seed(spec.rotation_seed, layer, head))."""
    return np.stack([rotation_matrix(hs, rotation_seed(spec.rotation_seed, layer, h))
                     for h in range(nkv)])


def fake_quantize(X, fmt, is_key, spec, layer=0):
    """X: [T, n_kv, hs] full-precision keys (after RoPE, or before it with key_rope "pre")
    or values of layer `layer` (it seeds the tq rotations and those of kv_rotate) for one
    chunk (position 0 = BOS).

    Returns (Xq, nq):
      Xq[j] = the value token j has once it is stored quantized (never changes later);
              tokens that never get quantized within the chunk keep X[j].
      nq[t] = number of oldest tokens that are stored quantized when the query at
              position t attends (n = t + 1 tokens appended, then the flush rules).
              The quantized tokens always form a prefix [0, nq[t]).

    With kv_rotate "hadamard" (see kv_rotated) each row x of head h is stored as the
    format stores y = R_h x: its scales (and KIVI zeros) are those of the rotated row, the
    int8 tensor scale is calibrated on the rotated rows of the first append batch; the row
    reads back as R_h^T Q(y). Rows in the residual window are not quantized and stay
    unrotated, so nq is the format's own.
    """
    if kv_rotated(fmt, is_key, spec):
        Rs = head_rotations(X.shape[2], X.shape[1], spec, layer)
        Y = np.einsum("thj,hij->thi", X, Rs)            # y = R x per head
        Yq, nq = _fake_quantize_rows(Y, fmt, is_key, spec, layer)
        return np.einsum("thi,hij->thj", Yq, Rs), nq    # R^T y per head
    return _fake_quantize_rows(X, fmt, is_key, spec, layer)


def _fake_quantize_rows(X, fmt, is_key, spec, layer):
    """fake_quantize without kv_rotate: X as the format stores it."""
    T, nkv, hs = X.shape
    n = np.arange(1, T + 1)
    G = spec.group_size
    Gc = min(G, hs)
    if fmt == "f32":
        return X, n
    if fmt == "f16":
        # rounded once at append (round to nearest even)
        return X.astype(np.float16).astype(np.float64), n
    if fmt == "int8":
        gran = spec.int8_granularity
        a = np.abs(X)
        if gran == "token":
            amax = a.max(axis=(1, 2), keepdims=True)
            return _int8_sym(X, amax, spec.scale_dtype), n
        if gran == "head":
            amax = a.max(axis=2, keepdims=True)
            return _int8_sym(X, amax, spec.scale_dtype), n
        if gran == "group":
            assert hs % Gc == 0
            Xg = X.reshape(T, nkv, hs // Gc, Gc)
            amax = np.abs(Xg).max(axis=3, keepdims=True)
            return _int8_sym(Xg, amax, spec.scale_dtype).reshape(T, nkv, hs), n
        if gran == "tensor":
            # One scale per layer and per K/V, fixed from the first append batch of
            # the chunk; when streaming that batch is only the BOS token (position 0).
            first = X[:1] if spec.mode == "streaming" else X
            amax = np.abs(first).max()
            return _int8_sym(X, np.array(amax), spec.scale_dtype), n
        raise ValueError(gran)
    if fmt.startswith("kivi"):
        bits = int(fmt[4:])
        R = spec.residual
        if is_key:
            # Keys: per channel over groups of G consecutive tokens of the chunk.
            Xq = X.copy()
            for g in range(T // G):
                blk = X[g * G:(g + 1) * G]
                mn = blk.min(axis=0, keepdims=True)
                mx = blk.max(axis=0, keepdims=True)
                Xq[g * G:(g + 1) * G] = _asym(blk, mn, mx, bits, spec.scale_dtype)
            if spec.key_flush == "batch":
                r = max(R, G)
                nq = (n // r) * r
            else:  # "group"
                t0 = max(R + 1, G)
                nq = np.where(n < t0, 0, ((n - t0) // G + 1) * G)
            assert np.all(nq % G == 0) and np.all(nq <= n)
            return Xq, nq
        # Values: per token over groups of Gc channels within each kv head.
        assert hs % Gc == 0
        Xg = X.reshape(T, nkv, hs // Gc, Gc)
        mn = Xg.min(axis=3, keepdims=True)
        mx = Xg.max(axis=3, keepdims=True)
        Xq = _asym(Xg, mn, mx, bits, spec.scale_dtype).reshape(T, nkv, hs)
        nq = np.maximum(0, n - R)
        return Xq, nq
    if fmt in TQ_FORMATS:
        # Keys and values alike: each token's row of each head is quantized on its own,
        # with the rotation of (layer, head); the last R tokens stay exact.
        if hs < 4:
            raise ValueError("format %s needs head_dim >= 4 (head_dim = %d)" % (fmt, hs))
        Xq = np.empty_like(X)
        for h in range(nkv):
            seed = rotation_seed(spec.rotation_seed, layer, h)
            Xq[:, h] = tq_quantize_rows(X[:, h], fmt, seed, spec.scale_dtype)
        return Xq, np.maximum(0, n - spec.residual)
    raise ValueError("unknown format %r" % fmt)


# ----------------------------------------------------------------------------
# Forward pass
# ----------------------------------------------------------------------------

def rmsnorm(x, w, eps=RMS_EPS):
    return w * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def rope(x, positions, inv_freq=None, neox=False, mscale=1.0, mistake=None):
    """x: [T, heads, hs]; rotates pairs (2i, 2i+1) (or with neox, rotate_half's
    (i, i + n_rot/2)) by pos * inv_freq[i] (default 10000^(-2i/hs)); mscale multiplies cos
    and sin (LongRoPE's scaling_factor in transformers' Phi3).

    Partial rotary embeddings: n_rot = 2 len(inv_freq) may be less than hs; then only
    channels 0..n_rot-1 turn (pairs within them, as ggml_rope_ext with n_dims = n_rot and
    transformers' q_rot = q[..., :rotary_dim]) and channels n_rot..hs-1 pass unchanged,
    not multiplied by mscale. mistake (checks only, plausible engine errors):
    "pairs_half_head": NeoX pairs (i, i + hs/2) for i < n_rot/2 instead; "scale_pass":
    the passing channels multiplied by mscale too."""
    hs = x.shape[-1]
    if inv_freq is None:
        inv_freq = 1.0 / ROPE_THETA ** (np.arange(0, hs, 2, dtype=np.float64) / hs)
    half = len(inv_freq)
    n_rot = 2 * half
    if n_rot > hs:
        raise ValueError("%d RoPE frequencies for a head of %d channels" % (half, hs))
    ang = positions[:, None].astype(np.float64) * inv_freq[None, :]   # [T, n_rot/2]
    c = mscale * np.cos(ang)[:, None, :]
    s = mscale * np.sin(ang)[:, None, :]
    out = x.copy()
    if mistake == "scale_pass":
        out[..., n_rot:] *= mscale
    elif mistake not in (None, "pairs_half_head"):
        raise ValueError(mistake)
    if neox:
        # transformers' apply_rotary_pos_emb: x * cos + rotate_half(x) * sin, with
        # cos/sin repeated over both halves and rotate_half(x) = (-x2, x1).
        off = hs // 2 if mistake == "pairs_half_head" else half
        x0 = x[..., :half]
        x1 = x[..., off:off + half]
        out[..., :half] = x0 * c - x1 * s
        out[..., off:off + half] = x1 * c + x0 * s
        return out
    x0 = x[..., 0:n_rot:2]
    x1 = x[..., 1:n_rot:2]
    out[..., 0:n_rot:2] = x0 * c - x1 * s
    out[..., 1:n_rot:2] = x0 * s + x1 * c
    return out


ATTN_BLOCK = 64  # queries per block (only keys 0..end of block are computed)


def attention(q, k, v, kq=None, nk=None, vq=None, nv=None, window=0, scale=None, softcap=0.0, sinks=None):
    """Causal GQA attention. q [T, nh, hs]; k, v [T, nkv, hs]; returns [T, nh*hs].
    window > 0: the query at position t sees only keys s with t - s < window.
    scale: the score scale (default 1/sqrt(hs)); softcap > 0: scaled scores s become
    softcap * tanh(s / softcap) (transformers' Gemma2 attn_logit_softcapping).
    sinks [nh] (gpt-oss): query head h's softmax gets one more logit, sinks[h], that
    takes probability but has no value (transformers' GptOss eager_attention_forward
    concatenates it to the scaled scores and drops its column after the softmax;
    llama.cpp's soft_max with sinks adds exp(sink - max) to the sum).

    Optional streaming view of a quantized cache: the query at position t sees key s
    as kq[s] if s < nk[t] else k[s], and value s as vq[s] if s < nv[t] else v[s].
    Query head h uses kv head h // (nh // nkv)."""
    T, nh, hs = q.shape
    nkv = k.shape[1]
    grp = nh // nkv
    inv = 1.0 / math.sqrt(hs) if scale is None else scale
    # layouts: queries [nkv, T, grp, hs]; keys/values [nkv, T, hs]
    qh = np.ascontiguousarray(q.reshape(T, nkv, grp, hs).transpose(1, 0, 2, 3))
    kt = np.ascontiguousarray(k.transpose(1, 2, 0))        # [nkv, hs, T]
    vh = np.ascontiguousarray(v.transpose(1, 0, 2))        # [nkv, T, hs]
    if kq is not None:
        kqt = np.ascontiguousarray(kq.transpose(1, 2, 0))
        dvh = np.ascontiguousarray(vq.transpose(1, 0, 2)) - vh   # quantized minus exact
    out = np.empty((nkv, T, grp, hs))
    pos = np.arange(T)
    for t0 in range(0, T, ATTN_BLOCK):
        t1 = min(T, t0 + ATTN_BLOCK)
        B = t1 - t0
        qb = qh[:, t0:t1].reshape(nkv, B * grp, hs)      # rows: (query t, head-in-group g)
        s = (qb @ kt[:, :, :t1]).reshape(nkv, B, grp, t1)
        tq = pos[t0:t1, None]                              # query positions [B, 1]
        ts = pos[None, :t1]                                # key positions   [1, t1]
        if kq is not None:
            sq = (qb @ kqt[:, :, :t1]).reshape(nkv, B, grp, t1)
            kmask = (ts < nk[t0:t1, None])[None, :, None, :]   # key s quantized at t
            np.copyto(s, sq, where=kmask)
        s *= inv
        if softcap > 0:
            s = softcap * np.tanh(s / softcap)
        np.copyto(s, -np.inf, where=(ts > tq)[None, :, None, :])   # causal
        if window > 0:
            np.copyto(s, -np.inf, where=(tq - ts >= window)[None, :, None, :])   # sliding window
        mx = s.max(axis=-1, keepdims=True)
        if sinks is not None:
            sk = sinks.reshape(nkv, 1, grp, 1)                 # query head h = kv * grp + g
            mx = np.maximum(mx, sk)
        s -= mx
        np.exp(s, out=s)
        den = s.sum(axis=-1, keepdims=True)
        if sinks is not None:
            den = den + np.exp(sk - mx)
        s /= den
        p = s.reshape(nkv, B * grp, t1)
        o = p @ vh[:, :t1]
        if vq is not None:
            # sum_s p*(vq if quantized else v) = p @ v + (p masked to quantized s) @ (vq - v)
            vmask = (ts < nv[t0:t1, None])[None, :, None, :]
            pq = np.where(vmask, s, 0.0).reshape(nkv, B * grp, t1)
            o += pq @ dvh[:, :t1]
        out[:, t0:t1] = o.reshape(nkv, B, grp, hs)
    return out.transpose(1, 0, 2, 3).reshape(T, nh * hs)   # concat heads in order h


def forward_chunk(model, tokens, kv_spec=None, kv_noise=None):
    """Logits [T, vocab] for tokens evaluated from an empty cache at positions 0..T-1.

    With kv_spec, each query position t attends to the keys/values as stored in the
    cache right after token t is appended (streaming): the first nq[t] tokens in
    their quantized form, the rest in full precision.

    kv_noise = (eps, numpy Generator) multiplies the keys and values handed to the
    cache by (1 + eps * N(0, 1)) - a sensitivity probe (float32-level perturbations
    can flip quantization codes), not part of the model."""
    m = model
    T = len(tokens)
    hs = m.head_size
    nh, nkv = m.n_heads, m.n_kv_heads
    grp = nh // nkv
    pos = np.arange(T)
    quant = kv_spec is not None and not kv_spec.all_f32()
    if quant:
        fmts = kv_spec.formats(m.n_layers)   # (key, value) format of each layer
    norm_eps = m.rms_eps

    x = m.tok_emb[np.asarray(tokens)].copy()        # [T, dim]
    if m.embed_scale:
        x *= math.sqrt(m.dim)
    for l in range(m.n_layers):
        window = m.windows[l] if m.windows else 0
        inv_freq = m.inv_freq_local if window and m.inv_freq_local is not None else m.inv_freq
        if inv_freq is None:
            inv_freq = 1.0 / m.rope_theta ** (np.arange(0, m.n_rot, 2, dtype=np.float64) / m.n_rot)

        def rot(x, positions):
            return rope(x, positions, inv_freq, m.rope_neox, m.rope_mscale, m.rope_mistake)

        sinks = m.sinks[l] if m.sinks is not None else None
        xb = rmsnorm(x, m.rms_att[l], norm_eps)
        q = xb @ m.wq[l].T
        k = xb @ m.wk[l].T
        v = xb @ m.wv[l].T
        if m.bq is not None:  # qwen2: Linear(bias=True)
            q, k, v = q + m.bq[l], k + m.bk[l], v + m.bv[l]
        q = q.reshape(T, nh, hs)
        k = k.reshape(T, nkv, hs)
        v = v.reshape(T, nkv, hs)
        if m.q_norm is not None:  # qwen3: RMSNorm(head_dim) per head, before RoPE
            q = rmsnorm(q, m.q_norm[l], norm_eps)
            k = rmsnorm(k, m.k_norm[l], norm_eps)
        q = rot(q, pos)
        # Keys before RoPE: the cache quantizes them unrotated; attention sees them rotated.
        pre = kv_spec is not None and kv_spec.key_rope == "pre"
        if not pre:
            k = rot(k, pos)
        if kv_noise is not None:
            eps, gen = kv_noise
            k = k * (1.0 + eps * gen.standard_normal(k.shape))
            v = v * (1.0 + eps * gen.standard_normal(v.shape))
        if quant:
            kq, nk = fake_quantize(k, fmts[l][0], True, kv_spec, layer=l)
            vq, nv = fake_quantize(v, fmts[l][1], False, kv_spec, layer=l)
            if pre:
                k, kq = rot(k, pos), rot(kq, pos)
            o = attention(q, k, v, kq, nk, vq, nv, window=window, scale=m.attn_scale,
                          softcap=m.attn_softcap, sinks=sinks)
        else:
            if pre:
                k = rot(k, pos)
            o = attention(q, k, v, window=window, scale=m.attn_scale, softcap=m.attn_softcap, sinks=sinks)
        o = o @ m.wo[l].T
        if m.bo is not None:  # gpt-oss: o_proj has a bias
            o = o + m.bo[l]
        if m.post_att is not None:
            o = rmsnorm(o, m.post_att[l], norm_eps)
        x = x + o
        xb = rmsnorm(x, m.rms_ffn[l], norm_eps)
        if m.router is None:
            h1 = xb @ m.w1[l].T
            h3 = xb @ m.w3[l].T
            if m.b1 is not None:
                h1 = h1 + m.b1[l]
            if m.b3 is not None:
                h3 = h3 + m.b3[l]
            f = glu(m, h1, h3) @ m.w2[l].T
            if m.b2 is not None:
                f = f + m.b2[l]
        else:
            f = moe_ffn(m, l, xb)
        if m.post_ffn is not None:
            f = rmsnorm(f, m.post_ffn[l], norm_eps)
        x = x + f
    logits = rmsnorm(x, m.rms_final, norm_eps) @ m.wcls.T
    if m.final_softcap > 0:
        logits = m.final_softcap * np.tanh(logits / m.final_softcap)
    return logits


def glu(m, gate, up):
    """The gated activation: gelu_pytorch_tanh(gate) * up (Gemma), gpt-oss's clamped
    SwiGLU (transformers' GptOssExperts; ggml's swiglu_oai): gate = min(gate, limit),
    up = clamp(up, -limit, limit), gate * sigmoid(alpha * gate) * (up + 1), or else
    SwiGLU silu(gate) * up."""
    if m.gelu:
        return 0.5 * gate * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (gate + 0.044715 * gate ** 3))) * up
    if m.swiglu_oai is not None:
        alpha, limit = m.swiglu_oai
        gate = np.minimum(gate, limit)
        up = np.clip(up, -limit, limit)
        return gate / (1.0 + np.exp(-alpha * gate)) * (up + 1.0)
    return gate / (1.0 + np.exp(-gate)) * up


def moe_ffn(m, l, xb):
    """A mixture of experts as transformers' Qwen3MoeSparseMoeBlock computes it: the
    router's softmax over every expert, the top experts_used probabilities (ties: the
    lower expert), renormalized to sum 1, weighting each chosen expert's SwiGLU.
    gpt-oss (GptOssTopKRouter) adds a bias to the router logits and takes the softmax
    of the top experts_used logits alone: the same experts and the same weights, since
    renormalized top probabilities are exp(l_j) / sum over the chosen exp(l_k). Its
    experts have biases on the gate, up and down projections (b1, b3, b2)."""
    logits = xb @ m.router[l].T                      # [T, E]
    if m.router_b is not None:
        logits = logits + m.router_b[l]
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    out = np.zeros_like(xb)
    for i in range(xb.shape[0]):
        top = np.argsort(-p[i], kind="stable")[:m.experts_used]
        w = p[i, top] / p[i, top].sum()
        for e, we in zip(top, w):
            h1 = m.w1[l][e] @ xb[i]
            h3 = m.w3[l][e] @ xb[i]
            if m.b1 is not None:
                h1 = h1 + m.b1[l][e]
            if m.b3 is not None:
                h3 = h3 + m.b3[l][e]
            y = m.w2[l][e] @ glu(m, h1, h3)
            if m.b2 is not None:
                y = y + m.b2[l][e]
            out[i] += we * y
    return out


def forward_logits(model, tokens):
    """Full-precision logits [n, vocab] (float64) of every position."""
    if len(tokens) > model.seq_len:
        raise ValueError("%d tokens exceed seq_len %d" % (len(tokens), model.seq_len))
    return forward_chunk(model, tokens, None)


def generate_greedy(model, tok, prompt, steps):
    """Greedy decoding: returns (generated ids, full text including the prompt).
    Stops after `steps` tokens, at BOS/EOS, or at seq_len."""
    ids = tok.encode(prompt, bos=True)
    gen = []
    while len(gen) < steps and len(ids) < model.seq_len:
        nxt = int(np.argmax(forward_chunk(model, ids, None)[-1]))
        if nxt in (BOS, EOS):
            break
        ids.append(nxt)
        gen.append(nxt)
    return gen, tok.decode_all(ids)


def log_softmax(z):
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def token_nlls(model, tokens, ctx=None, kv_spec=None, kv_noise=None):
    """Per-token NLLs: chunks of ctx-1 tokens, each evaluated as [BOS] + chunk from an
    empty cache; token i of a chunk is scored with the logits of the position before it."""
    ctx = ctx or model.seq_len
    if ctx < 2 or ctx > model.seq_len:
        raise ValueError("ctx must be in [2, %d]" % model.seq_len)
    if kv_spec is not None:
        kv_spec.validate()
    nll = []
    step = ctx - 1
    for c0 in range(0, len(tokens), step):
        chunk = list(tokens[c0:c0 + step])
        lp = log_softmax(forward_chunk(model, [BOS] + chunk, kv_spec, kv_noise))
        nll.append(-lp[np.arange(len(chunk)), np.asarray(chunk)])
    return np.concatenate(nll) if nll else np.zeros(0)


def perplexity(model, tokens, ctx=None, kv_spec=None, kv_noise=None):
    """{"ppl", "mean_nll", "nll_stderr", "tokens"}; see token_nlls for the convention.
    kv_noise=(eps, seed) perturbs keys/values (see forward_chunk)."""
    if kv_noise is not None:
        kv_noise = (kv_noise[0], np.random.default_rng(kv_noise[1]))
    nll = token_nlls(model, tokens, ctx, kv_spec, kv_noise)
    n = int(nll.size)
    mean = float(nll.mean())
    stderr = float(nll.std(ddof=1) / math.sqrt(n)) if n > 1 else 0.0
    return {"ppl": math.exp(mean), "mean_nll": mean, "nll_stderr": stderr, "tokens": n}


def read_text(path):
    with open(path, "rb") as f:
        return f.read().decode("utf-8")


# ----------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------

def add_kv_args(ap):
    ap.add_argument("--kv-cache", default="f32", choices=FORMATS, help="format of K and V")
    ap.add_argument("--kv-cache-k", choices=FORMATS, help="format of K (overrides --kv-cache)")
    ap.add_argument("--kv-cache-v", choices=FORMATS, help="format of V (overrides --kv-cache)")
    ap.add_argument("--kv-cache-layers", default="", metavar="MAP",
                    help="per-layer formats, e.g. '0-1:kivi4/kivi2;*:kivi2' (overrides the three above)")
    ap.add_argument("--int8-granularity", default="head", choices=GRANULARITIES)
    ap.add_argument("--group-size", type=int, default=32)
    ap.add_argument("--residual", type=int, default=128)
    ap.add_argument("--key-flush", default="batch", choices=("batch", "group"))
    ap.add_argument("--scale-dtype", default="f16", choices=("f16", "f32"))
    ap.add_argument("--key-rope", default="post", choices=("post", "pre"))
    ap.add_argument("--kv-rotation-seed", type=int, default=DEFAULT_ROTATION_SEED,
                    help="tq formats and --kv-rotate: base seed of the per-(layer, head) rotations")
    ap.add_argument("--kv-rotate", default="none", choices=ROTATIONS,
                    help="hadamard: rotate int8 keys and values and KIVI values before quantizing")
    ap.add_argument("--mode", default="streaming", choices=("streaming", "batched"),
                    help="feeding of each chunk (only int8 tensor scales depend on it)")


def spec_from_args(a):
    return KVSpec(k_format=a.kv_cache_k or a.kv_cache, v_format=a.kv_cache_v or a.kv_cache,
                  int8_granularity=a.int8_granularity, group_size=a.group_size,
                  residual=a.residual, key_flush=a.key_flush, scale_dtype=a.scale_dtype,
                  key_rope=a.key_rope, mode=a.mode, rotation_seed=a.kv_rotation_seed,
                  layers=a.kv_cache_layers, kv_rotate=a.kv_rotate)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_path_args(ap)
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("ppl", help="perplexity of a text with a fake-quantized KV cache")
    p.add_argument("--ctx", type=int, default=None)
    p.add_argument("--json", action="store_true")
    add_kv_args(p)

    g = sub.add_parser("generate", help="greedy generation")
    g.add_argument("-p", "--prompt", required=True)
    g.add_argument("-n", "--steps", type=int, default=56)

    lg = sub.add_parser("logits", help="full-precision logits of every position as JSON")
    lg.add_argument("-p", "--prompt", required=True)

    for sp in (p, g, lg):  # allow the path options after the command as well
        for opt in ("--shared", "--model", "--tokenizer", "--text"):
            sp.add_argument(opt, default=argparse.SUPPRESS)

    a = resolve_paths(ap.parse_args(argv))
    model = load_model(a.model)
    tok = load_tokenizer(a.tokenizer, model.vocab_size)

    if a.cmd == "ppl":
        spec = spec_from_args(a)
        spec.validate()
        t0 = time.time()
        tokens = tok.encode(read_text(a.text), bos=False)
        r = perplexity(model, tokens, a.ctx, spec)
        if a.json:
            print(json.dumps(r))
        else:
            print("config      %s" % spec.label())
            print("tokens      %d" % r["tokens"])
            print("ppl         %.6f" % r["ppl"])
            print("mean_nll    %.8f +- %.8f" % (r["mean_nll"], r["nll_stderr"]))
            print("time        %.2f s" % (time.time() - t0))
    elif a.cmd == "generate":
        gen, text = generate_greedy(model, tok, a.prompt, a.steps)
        print(text)
        print("[%d tokens generated]" % len(gen), file=sys.stderr)
    elif a.cmd == "logits":
        ids = tok.encode(a.prompt, bos=True)
        print(json.dumps(forward_logits(model, ids).tolist()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
