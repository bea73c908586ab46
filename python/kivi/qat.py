"""KIVI fake quantization for PyTorch: one batched forward that sees, at every position t,
exactly the keys and values a streaming kivi.cpp cache holds after token t is appended.

A KIVI cache stores a key group [gG, (g+1)G) from its G full-precision keys, and a value from
itself, so a token's quantized form never changes once stored; only *which* tokens are stored
grows with t (kivi.streaming). So the batched forward quantizes every complete key group and
every value once, and masks pick, per (query t, token j), the quantized or the exact entry:

    key_mask[t, j]   = j < keys_quantized_after(t + 1)
    value_mask[t, j] = j < values_quantized_after(t + 1)

The arithmetic follows kv/codec.h to the bit (float32, f16 parameters rounded outward), and
the tests compare it with the C++ cache at every step. Gradients are straight-through:
grad="ste" passes the output gradient to the input unchanged; grad="lsq" adds the gradient of
the quantization range (scale = (max - min) / L, as in LSQ, Esser et al. 2020), which reaches
each group's minimum and maximum. Either way the forward value is the exact one.
"""

import math
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from .streaming import check_config, keys_quantized_after, values_quantized_after

F16_MAX = 65504.0
GRAD_MODES = ("ste", "lsq")


@dataclass(frozen=True)
class KiviConfig:
    """A KIVI cache configuration (the CLI's --kv-cache kivi<bits> -G -R --key-flush --scale-dtype)."""
    key_bits: int = 2
    value_bits: int = 2
    group_size: int = 32
    residual: int = 32
    key_flush: str = "batch"
    scale_dtype: str = "f16"
    grad: str = "ste"

    def __post_init__(self):
        for b in (self.key_bits, self.value_bits):
            if b not in (2, 4, 8):
                raise ValueError("bits = %d, expected 2, 4 or 8" % b)
        check_config(self.group_size, self.residual, self.key_flush)
        if self.scale_dtype not in ("f16", "f32"):
            raise ValueError("scale_dtype = %r, expected 'f16' or 'f32'" % self.scale_dtype)
        if self.grad not in GRAD_MODES:
            raise ValueError("grad = %r, expected one of %s" % (self.grad, ", ".join(GRAD_MODES)))


# ---- f16 rounding toward +inf / -inf (core/f16.cpp), on float32 tensors --------------------

def _half_bits(h: torch.Tensor) -> torch.Tensor:
    return h.view(torch.int16).to(torch.int32) & 0xFFFF


def _half_from_bits(b: torch.Tensor) -> torch.Tensor:
    b = torch.where(b >= 0x8000, b - 0x10000, b)
    return b.to(torch.int16).view(torch.float16)


def _next_half_up(h: torch.Tensor) -> torch.Tensor:
    b = _half_bits(h)
    up = torch.where((b & 0x7FFF) == 0, torch.ones_like(b),
                     torch.where((b & 0x8000) != 0, b - 1, torch.where(b >= 0x7C00, b, b + 1)))
    return _half_from_bits(up)


def _next_half_down(h: torch.Tensor) -> torch.Tensor:
    b = _half_bits(h)
    down = torch.where((b & 0x7FFF) == 0, torch.full_like(b, 0x8001),
                       torch.where((b & 0x8000) != 0, torch.where(b >= 0xFC00, b, b + 1), b - 1))
    return _half_from_bits(down)


def round_f16_up(x: torch.Tensor) -> torch.Tensor:
    """The smallest float16 >= x (x float32), as float32."""
    h = x.to(torch.float16)  # round to nearest even
    return torch.where(h.float() < x, _next_half_up(h), h).float()


def round_f16_down(x: torch.Tensor) -> torch.Tensor:
    """The largest float16 <= x (x float32), as float32."""
    h = x.to(torch.float16)
    return torch.where(h.float() > x, _next_half_down(h), h).float()


# ---- the quantizer --------------------------------------------------------------------------

def kivi_params(mn: torch.Tensor, mx: torch.Tensor, bits: int, scale_dtype: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """Stored (scale, zero) of groups with minimum mn and maximum mx (float32), as kv::kivi_params."""
    levels = torch.full_like(mn, float((1 << bits) - 1))
    if scale_dtype == "f32":
        return (mx - mn) / levels, mn
    zero = round_f16_down(torch.clamp(mn, min=-F16_MAX))
    s = (mx.double() - zero.double()) / levels.double()
    sf = s.float()
    sf = torch.where(sf.double() < s, torch.nextafter(sf, torch.full_like(sf, math.inf)), sf)
    return torch.clamp(round_f16_up(sf), max=F16_MAX), zero


def _dequantized(x, scale, zero, bits):
    """code * scale + zero with code = clamp(rint((x - zero) / scale), 0, L); 0 where scale is 0."""
    live = scale > 0
    q = torch.round((x - zero) / torch.where(live, scale, torch.ones_like(scale)))
    q = torch.nan_to_num(q, nan=0.0).clamp(0, (1 << bits) - 1)
    q = torch.where(live, q, torch.zeros_like(q))
    return q * scale + zero, q


def _fake_quant_groups(x: torch.Tensor, dim: int, bits: int, scale_dtype: str, grad: str) -> torch.Tensor:
    """Fake-quantizes x with one (scale, zero) per slice along `dim` (the group axis)."""
    with torch.no_grad():
        xd = x.detach().float()
        mn = xd.amin(dim=dim, keepdim=True)
        mx = xd.amax(dim=dim, keepdim=True)
        scale, zero = kivi_params(mn, mx, bits, scale_dtype)
        exact, q = _dequantized(xd, scale, zero, bits)
    if not x.requires_grad:
        return exact
    if grad == "ste":
        surrogate = x
    else:
        # LSQ: d out / d scale = code - (x - zero) / scale, and scale = (max - min) / L.
        with torch.no_grad():
            live = scale > 0
            r = torch.where(live, q - (xd - zero) / torch.where(live, scale, torch.ones_like(scale)),
                            torch.zeros_like(xd))
        s = (x.amax(dim=dim, keepdim=True) - x.amin(dim=dim, keepdim=True)) / float((1 << bits) - 1)
        surrogate = x + s * r
    # The exact value forward, the surrogate's gradient backward (y - y.detach() is exactly 0).
    return exact + (surrogate - surrogate.detach())


def fake_quantize_keys(k: torch.Tensor, bits: int = 2, group_size: int = 32, scale_dtype: str = "f16",
                       grad: str = "ste") -> torch.Tensor:
    """Keys [..., T, D] with every complete group of group_size tokens quantized per channel, as
    the cache stores it (the tokens after the last complete group are returned unchanged)."""
    T, D = k.shape[-2], k.shape[-1]
    G = group_size
    n = T // G * G
    if n == 0:
        return k
    grouped = k[..., :n, :].reshape(k.shape[:-2] + (n // G, G, D))
    deq = _fake_quant_groups(grouped, -2, bits, scale_dtype, grad).reshape(k.shape[:-2] + (n, D))
    return deq if n == T else torch.cat([deq, k[..., n:, :]], dim=-2)


def fake_quantize_values(v: torch.Tensor, bits: int = 2, group_size: int = 32, scale_dtype: str = "f16",
                         grad: str = "ste") -> torch.Tensor:
    """Values [..., T, D], every token quantized in groups of min(group_size, D) channels."""
    T, D = v.shape[-2], v.shape[-1]
    gc = min(group_size, D)
    if D % gc:
        raise ValueError("the channel group min(G, head_dim) = %d does not divide head_dim %d" % (gc, D))
    grouped = v.reshape(v.shape[:-1] + (D // gc, gc))
    return _fake_quant_groups(grouped, -1, bits, scale_dtype, grad).reshape(v.shape)


def streaming_masks(n_tokens: int, cfg: KiviConfig, device=None) -> Tuple[torch.Tensor, torch.Tensor]:
    """(key_mask, value_mask), bool [T, T]: entry [t, j] is true where query t reads token j's
    quantized key (value), i.e. j < keys_quantized_after(t + 1) (values_quantized_after)."""
    steps = range(1, n_tokens + 1)
    nk = torch.tensor([keys_quantized_after(n, cfg.group_size, cfg.residual, cfg.key_flush) for n in steps],
                      device=device)
    nv = torch.tensor([values_quantized_after(n, cfg.residual) for n in steps], device=device)
    j = torch.arange(n_tokens, device=device)
    return j[None, :] < nk[:, None], j[None, :] < nv[:, None]


@dataclass
class StreamingKV:
    """Keys and values of a sequence, exact and fake-quantized, and which one each query reads."""
    k: torch.Tensor           # [..., T, D] exact (post-RoPE keys)
    v: torch.Tensor           # [..., T, D]
    k_quant: torch.Tensor     # [..., T, D] every complete key group quantized
    v_quant: torch.Tensor     # [..., T, D] every value quantized
    key_mask: torch.Tensor    # [T, T] bool
    value_mask: torch.Tensor  # [T, T] bool

    def at(self, t: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """What the streaming cache holds after token t is appended: keys and values [..., t+1, D]
        (the dequantized history, then the full-precision residual), from the masks."""
        km = self.key_mask[t, :t + 1, None]
        vm = self.value_mask[t, :t + 1, None]
        keys = torch.where(km, self.k_quant[..., :t + 1, :], self.k[..., :t + 1, :])
        values = torch.where(vm, self.v_quant[..., :t + 1, :], self.v[..., :t + 1, :])
        return keys, values


def fake_quantize_kv(k: torch.Tensor, v: torch.Tensor, cfg: KiviConfig) -> StreamingKV:
    """The streaming cache's view of keys and values [..., T, D] at every position, in one pass."""
    kq = fake_quantize_keys(k, cfg.key_bits, cfg.group_size, cfg.scale_dtype, cfg.grad)
    vq = fake_quantize_values(v, cfg.value_bits, cfg.group_size, cfg.scale_dtype, cfg.grad)
    km, vm = streaming_masks(k.shape[-2], cfg, device=k.device)
    return StreamingKV(k, v, kq, vq, km, vm)


def kivi_attention(q: torch.Tensor, skv: StreamingKV, causal: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Causal attention where query t reads the cache as it stands after token t.

    q [B, Hq, T, D]; skv tensors [B, Hk, T, D] with Hq a multiple of Hk (grouped-query heads:
    query head h reads KV head h // (Hq / Hk)). Returns [B, Hq, T, D].

    scores = where(key_mask, q . k_quant, q . k) / sqrt(D), softmax over j <= t, then
    out = p @ v_quant + (p * ~value_mask) @ (v - v_quant): the value term in the second form
    takes one elementwise pass over the [T, T] weights instead of two."""
    B, Hq, T, D = q.shape
    Hk = skv.k.shape[1]
    rep = Hq // Hk
    qg = (q * (1.0 / math.sqrt(D))).reshape(B, Hk, rep * T, D)  # the query heads of a KV head, stacked

    def scores(k):
        return (qg @ k.transpose(-1, -2)).view(B, Hk, rep, T, T)

    if skv.key_mask.any():
        s = torch.where(skv.key_mask, scores(skv.k_quant), scores(skv.k))
    else:
        s = scores(skv.k)
    if causal is None:
        causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    p = torch.softmax(s.masked_fill(~causal, float("-inf")), dim=-1).view(B, Hk, rep * T, T)
    if skv.value_mask.any():
        exact = (~skv.value_mask).to(p.dtype).repeat(rep, 1)  # [rep * T, T]
        out = p @ skv.v_quant + (p * exact) @ (skv.v - skv.v_quant)
    else:
        out = p @ skv.v
    return out.view(B, Hq, T, D)
