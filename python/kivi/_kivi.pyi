"""Type stubs of the compiled module kivi._kivi (pybind11)."""

from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union, overload

import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]
U8 = npt.NDArray[np.uint8]
Params = Union[npt.NDArray[np.float16], npt.NDArray[np.float32]]
ArrayLike = npt.ArrayLike


class Error(RuntimeError):
    """A kivi::Error from the engine (bad input, file, shape or option), with its message."""


# ---- codecs ---------------------------------------------------------------------------------

def quantize_keys(k: ArrayLike, bits: int = 2, group_size: int = 32,
                  scale_dtype: str = "f16") -> Tuple[U8, Params, Params]:
    """Keys [..., T, D] -> (codes [..., T/G, G*W] as the cache stores them, scales [..., T/G, D],
    zeros [..., T/G, D]); per channel over groups of G tokens; W = D * bits / 8."""


def dequantize_keys(codes: U8, scales: Params, zeros: Params, bits: int = 2, group_size: int = 32) -> F32:
    """(codes, scales, zeros) of quantize_keys -> keys float32 [..., T, D]."""


def quantize_values(v: ArrayLike, bits: int = 2, group_size: int = 32,
                    scale_dtype: str = "f16") -> Tuple[U8, Params, Params]:
    """Values [..., T, D] -> (codes [..., T, W], scales [..., T, D/Gc], zeros [..., T, D/Gc]);
    per token over groups of Gc = min(G, D) channels."""


def dequantize_values(codes: U8, scales: Params, zeros: Params, bits: int = 2, group_size: int = 32) -> F32:
    """(codes, scales, zeros) of quantize_values -> values float32 [..., T, D]."""


def quantize_tq(x: ArrayLike, format: str = "tq3", layer: int = 0, rotation_seed: int = 1802073705,
                scale_dtype: str = "f16") -> Tuple[U8, Params]:
    """Rows [..., H, T, D] -> (codes [..., H, T, row_bytes], scales [..., H, T]) in a rotated
    vector format (tq2, tq2.5, tq3, tq3.5, tq4), head h rotated as layer `layer`'s head h."""


def dequantize_tq(codes: U8, scales: Params, format: str = "tq3", head_dim: int = 128, layer: int = 0,
                  rotation_seed: int = 1802073705) -> F32:
    """(codes, scales) of quantize_tq -> rows float32 [..., H, T, D]."""


# ---- the streaming cache --------------------------------------------------------------------

class Cache:
    """The engine's streaming KIVI cache for [B, H, T, D] arrays (residual window R, key flush
    policy batch or group, f16 or f32 parameters); storage for max_tokens allocated up front."""

    def __init__(self, n_heads: int, head_dim: int, max_tokens: int, kv_cache: str = "kivi2",
                 kv_cache_k: Optional[str] = None, kv_cache_v: Optional[str] = None, group_size: int = 32,
                 residual: int = 128, key_flush: str = "batch", scale_dtype: str = "f16", batch: int = 1,
                 n_layers: int = 1) -> None: ...
    def add_tokens(self, k: ArrayLike, v: ArrayLike, layer: int = 0) -> None:
        """Appends T tokens [B, H, T, D] in order, applying the flush rules at every token."""
    @overload
    def get_full_cache(self, layer: int) -> Tuple[F32, F32]: ...
    @overload
    def get_full_cache(self, layer: None = None) -> List[Tuple[F32, F32]]: ...
    def stored(self, layer: int = 0) -> Dict[str, Any]:
        """key_codes, key_scales, key_zeros, value_quads, value_scales, value_zeros, key_residual,
        value_residual, keys_stored, values_stored, n_tokens."""
    def memory_stats(self) -> Dict[str, Any]:
        """bytes_used, bytes_reserved, f32_bytes, compression, bits_per_element_k/v, layers."""
    def n_tokens(self, layer: int = 0) -> int: ...
    def clear(self) -> None: ...
    @property
    def batch(self) -> int: ...
    @property
    def n_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def max_tokens(self) -> int: ...
    @property
    def n_layers(self) -> int: ...
    @property
    def group_size(self) -> int: ...
    @property
    def residual(self) -> int: ...
    @property
    def key_bits(self) -> int: ...
    @property
    def value_bits(self) -> int: ...
    @property
    def key_flush(self) -> str: ...
    @property
    def scale_dtype(self) -> str: ...


# ---- the engine -----------------------------------------------------------------------------

class Model:
    """A llama2.c checkpoint or GGUF model and its tokenizer."""

    def __init__(self, path: Optional[str] = None, tokenizer: Optional[str] = None) -> None: ...
    def session(self, *, kv_cache: str = "f32", kv_cache_k: Optional[str] = None,
                kv_cache_v: Optional[str] = None, int8_granularity: str = "head", group_size: int = 32,
                residual: int = 128, key_flush: str = "batch", key_rope: str = "post", kv_share: int = 1,
                kv_share_map: Optional[str] = None, scale_dtype: str = "f16", attn_precision: str = "exact",
                window: int = 0, context_overflow: str = "stop", sinks: int = 4, sparse: str = "off",
                sparse_block: int = 64, sparse_budget: int = 4096, sparse_sinks: int = 4,
                sparse_local: int = 256, sparse_dense_layers: int = 0, sparse_heads: str = "per",
                sparse_reselect: int = 1, sparse_reuse_layers: int = 1, sparse_preselect: int = 0,
                sparse_candidates: int = 16384, ctx: int = 0, threads: int = 0,
                threads_force: bool = False) -> "Session": ...
    def tokenize(self, text: str, bos: bool = True) -> List[int]: ...
    def detokenize(self, tokens: Sequence[int]) -> str: ...
    @property
    def path(self) -> str: ...
    @property
    def format(self) -> str: ...
    @property
    def config(self) -> Dict[str, Any]: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def ctx(self) -> int: ...
    @property
    def bos_id(self) -> int: ...
    @property
    def eos_id(self) -> int: ...


class Generator(Iterator[str]):
    """Text pieces (whole UTF-8 characters) of a generation; stop_reason is 'eos', 'stop', 'length',
    'context', or '' while running."""

    def __iter__(self) -> "Generator": ...
    def __next__(self) -> str: ...
    @property
    def token_ids(self) -> List[int]: ...
    @property
    def text(self) -> str: ...
    @property
    def stop_reason(self) -> str: ...
    @property
    def prompt_tokens(self) -> int: ...


class Session:
    """One sequence: a model, its KV cache and worker threads."""

    def __init__(self, model: Model, **options: Any) -> None:
        """The session options of Model.session (the CLI's, with underscores)."""
    def generate(self, prompt: str, max_tokens: int = 256, temperature: float = 0.8, top_k: int = 40,
                 top_p: float = 0.95, seed: int = 42, ignore_eos: bool = False,
                 stop: Optional[Sequence[str]] = None) -> Generator: ...
    def logits(self, tokens: Union[str, Sequence[int]], mode: str = "prefill") -> F32:
        """[n, vocab] after every position, from an empty cache ('prefill' or 'stream')."""
    def prefill(self, tokens: Union[str, Sequence[int]]) -> F32: ...
    def decode(self, token: int) -> F32: ...
    def reset(self) -> None: ...
    def memory_stats(self) -> Dict[str, int]: ...
    @property
    def pos(self) -> int: ...
    @property
    def ctx(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def kv_cache(self) -> str: ...


def perplexity(model: Union[Model, str, None] = None, *, file: Optional[str] = None, text: Optional[str] = None,
               mode: str = "streaming", save_logits: Optional[str] = None, kld_base: Optional[str] = None,
               **session_options: Any) -> Dict[str, Any]:
    """The fields of `kivi perplexity --json`: ppl, mean_nll, nll_stderr, tokens, mode, ctx, chunks,
    kv_cache, bits_per_element_k, bits_per_element_v, int8_clamped, seconds, tokens_per_second
    (and the kld_* fields, top1_agree, first_disagree with kld_base). session_options: those of
    Model.session."""
