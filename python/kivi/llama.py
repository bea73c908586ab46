"""The llama2.c model in PyTorch, reading and writing llama2.c checkpoints (.bin), with an
optional KIVI fake-quantized KV cache (kivi.qat) so that training sees what deployment sees.

The math follows llama2.c's run.c, as the engine does: RMSNorm (eps 1e-5), RoPE on channel
pairs (2i, 2i+1) with theta 10000, grouped-query attention, SwiGLU feed-forward, classifier
tied to the embedding unless the header's vocab_size is negative.

Checkpoint: 7 x int32 {dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len},
then float32 arrays: token_embedding [vocab, dim]; rms_att [L, dim]; wq [L, dim, dim];
wk, wv [L, kv_dim, dim]; wo [L, dim, dim]; rms_ffn [L, dim]; w1 [L, hidden, dim];
w2 [L, dim, hidden]; w3 [L, hidden, dim]; rms_final [dim]; freq_cis_real and freq_cis_imag
[seq_len, head_size / 2] (unused by the math, kept as read); wcls [vocab, dim] if not tied.
GGUF: `kivi convert model.bin -t tok.bin -o model.gguf` converts a written checkpoint.
"""

import math
import struct
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from .qat import KiviConfig, fake_quantize_kv, kivi_attention, StreamingKV


@dataclass
class LlamaConfig:
    dim: int
    hidden_dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    seq_len: int
    shared_classifier: bool = True
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_table(seq_len: int, head_dim: int, theta: float):
    """cos, sin [seq_len, head_dim / 2] (angles in double, as the engine computes them)."""
    i = torch.arange(0, head_dim, 2, dtype=torch.float64)
    freq = 1.0 / theta ** (i / head_dim)
    ang = torch.arange(seq_len, dtype=torch.float64)[:, None] * freq[None, :]
    return torch.cos(ang).float(), torch.sin(ang).float()


def apply_rope(x, cos, sin):
    """x [B, H, T, D]: pairs (2i, 2i+1) rotated by position."""
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)


class Attention(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.c = c
        self.wq = nn.Linear(c.dim, c.dim, bias=False)
        self.wk = nn.Linear(c.dim, c.kv_dim, bias=False)
        self.wv = nn.Linear(c.dim, c.kv_dim, bias=False)
        self.wo = nn.Linear(c.dim, c.dim, bias=False)

    def forward(self, x, cos, sin, causal, kivi: Optional[KiviConfig]):
        B, T, _ = x.shape
        c = self.c
        q = self.wq(x).view(B, T, c.n_heads, c.head_dim).transpose(1, 2)      # [B, H, T, hd]
        k = self.wk(x).view(B, T, c.n_kv_heads, c.head_dim).transpose(1, 2)   # [B, Hk, T, hd]
        v = self.wv(x).view(B, T, c.n_kv_heads, c.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if kivi is not None:
            skv = fake_quantize_kv(k, v, kivi)
        else:
            none = torch.zeros(T, T, dtype=torch.bool, device=x.device)
            skv = StreamingKV(k, v, k, v, none, none)
        out = kivi_attention(q, skv, causal)
        return self.wo(out.transpose(1, 2).reshape(B, T, c.dim))


class FeedForward(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.w1 = nn.Linear(c.dim, c.hidden_dim, bias=False)
        self.w2 = nn.Linear(c.hidden_dim, c.dim, bias=False)
        self.w3 = nn.Linear(c.dim, c.hidden_dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.attention_norm = RMSNorm(c.dim, c.norm_eps)
        self.attention = Attention(c)
        self.ffn_norm = RMSNorm(c.dim, c.norm_eps)
        self.feed_forward = FeedForward(c)

    def forward(self, x, cos, sin, causal, kivi):
        x = x + self.attention(self.attention_norm(x), cos, sin, causal, kivi)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.config = c
        self.tok_embeddings = nn.Embedding(c.vocab_size, c.dim)
        self.layers = nn.ModuleList(Block(c) for _ in range(c.n_layers))
        self.norm = RMSNorm(c.dim, c.norm_eps)
        self.output = nn.Linear(c.dim, c.vocab_size, bias=False)
        if c.shared_classifier:
            self.output.weight = self.tok_embeddings.weight
        cos, sin = rope_table(c.seq_len, c.head_dim, c.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        # The checkpoint's freq_cis arrays, written back unchanged.
        self.freq_cis = np.zeros((2, c.seq_len, c.head_dim // 2), dtype=np.float32)

    def forward(self, tokens: torch.Tensor, kivi: Optional[KiviConfig] = None) -> torch.Tensor:
        """Logits [B, T, vocab] of tokens [B, T] at positions 0 .. T-1, each position attending to
        the positions before it through a KV cache that is exact (kivi None) or fake-quantized
        exactly as a streaming kivi.cpp cache holds it at that step."""
        B, T = tokens.shape
        if T > self.config.seq_len:
            raise ValueError("%d tokens are more than the model's context of %d" % (T, self.config.seq_len))
        x = self.tok_embeddings(tokens)
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        causal = torch.ones(T, T, dtype=torch.bool, device=tokens.device).tril()
        for layer in self.layers:
            x = layer(x, cos, sin, causal, kivi)
        return self.output(self.norm(x))

    # ---- llama2.c checkpoints ---------------------------------------------------------------

    @classmethod
    def from_llama2c(cls, path: str) -> "Llama":
        with open(path, "rb") as f:
            data = f.read()
        if len(data) < 28:
            raise ValueError("%s: %d bytes, shorter than the 28-byte llama2.c header" % (path, len(data)))
        dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = struct.unpack("<7i", data[:28])
        shared = vocab > 0
        vocab = abs(vocab)
        for name, v in (("dim", dim), ("hidden_dim", hidden), ("n_layers", n_layers), ("n_heads", n_heads),
                        ("n_kv_heads", n_kv), ("vocab_size", vocab), ("seq_len", seq_len)):
            if v <= 0:
                raise ValueError("%s: llama2.c header field '%s' = %d, expected > 0" % (path, name, v))
        if dim % n_heads or n_heads % n_kv:
            raise ValueError("%s: dim %d, n_heads %d, n_kv_heads %d do not divide" % (path, dim, n_heads, n_kv))
        c = LlamaConfig(dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len, shared)
        m = cls(c)
        shapes = m._file_shapes()
        need = 28 + 4 * sum(int(np.prod(s)) for _, s in shapes)
        if len(data) != need:
            raise ValueError("%s: %d bytes, but its header implies %d" % (path, len(data), need))
        arrays = {}
        off = 28
        for name, shape in shapes:
            n = int(np.prod(shape))
            arrays[name] = np.frombuffer(data, dtype="<f4", count=n, offset=off).reshape(shape)
            off += 4 * n
        m._load_arrays(arrays)
        return m

    def save_llama2c(self, path: str) -> None:
        c = self.config
        vocab = c.vocab_size if c.shared_classifier else -c.vocab_size
        arrays = self._arrays()
        with open(path, "wb") as f:
            f.write(struct.pack("<7i", c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, vocab, c.seq_len))
            for name, shape in self._file_shapes():
                a = np.ascontiguousarray(arrays[name], dtype="<f4")
                assert a.shape == tuple(shape), (name, a.shape, shape)
                f.write(a.tobytes())

    def _file_shapes(self):
        c = self.config
        L, d, kv, h, hs = c.n_layers, c.dim, c.kv_dim, c.hidden_dim, c.head_dim
        shapes = [("token_embedding", (c.vocab_size, d)), ("rms_att", (L, d)), ("wq", (L, d, d)),
                  ("wk", (L, kv, d)), ("wv", (L, kv, d)), ("wo", (L, d, d)), ("rms_ffn", (L, d)),
                  ("w1", (L, h, d)), ("w2", (L, d, h)), ("w3", (L, h, d)), ("rms_final", (d,)),
                  ("freq_cis_real", (c.seq_len, hs // 2)), ("freq_cis_imag", (c.seq_len, hs // 2))]
        if not c.shared_classifier:
            shapes.append(("wcls", (c.vocab_size, d)))
        return shapes

    def _per_layer(self):
        return {
            "rms_att": lambda b: b.attention_norm.weight, "wq": lambda b: b.attention.wq.weight,
            "wk": lambda b: b.attention.wk.weight, "wv": lambda b: b.attention.wv.weight,
            "wo": lambda b: b.attention.wo.weight, "rms_ffn": lambda b: b.ffn_norm.weight,
            "w1": lambda b: b.feed_forward.w1.weight, "w2": lambda b: b.feed_forward.w2.weight,
            "w3": lambda b: b.feed_forward.w3.weight,
        }

    @torch.no_grad()
    def _load_arrays(self, a):
        self.tok_embeddings.weight.copy_(torch.from_numpy(a["token_embedding"].copy()))
        for name, get in self._per_layer().items():
            for i, b in enumerate(self.layers):
                get(b).copy_(torch.from_numpy(a[name][i].copy()))
        self.norm.weight.copy_(torch.from_numpy(a["rms_final"].copy()))
        if not self.config.shared_classifier:
            self.output.weight.copy_(torch.from_numpy(a["wcls"].copy()))
        self.freq_cis = np.stack([a["freq_cis_real"], a["freq_cis_imag"]]).astype(np.float32)

    @torch.no_grad()
    def _arrays(self):
        a = {"token_embedding": self.tok_embeddings.weight.detach().cpu().numpy()}
        for name, get in self._per_layer().items():
            a[name] = np.stack([get(b).detach().cpu().numpy() for b in self.layers])
        a["rms_final"] = self.norm.weight.detach().cpu().numpy()
        a["freq_cis_real"], a["freq_cis_imag"] = self.freq_cis[0], self.freq_cis[1]
        if not self.config.shared_classifier:
            a["wcls"] = self.output.weight.detach().cpu().numpy()
        return a
