"""kivi.cpp from Python.

Import from a build tree with:  PYTHONPATH=build/python /usr/bin/python3 -c "import kivi"

- Codecs (KIVI, arXiv 2402.02750) on numpy arrays [B, H, T, D], returning the bytes the C++
  cache stores: quantize_keys, dequantize_keys, quantize_values, dequantize_values; byte
  layouts in kivi.layout. The rotated vector formats (tq2 ... tq4): quantize_tq, dequantize_tq.
- The streaming cache: kivi.Cache (add_tokens, get_full_cache, stored, memory_stats).
- The engine: kivi.Model(path).session(kv_cache="kivi2", ...), Session.generate / logits,
  kivi.perplexity (the fields of `kivi perplexity --json`).
- PyTorch (optional, imported on demand): kivi.qat (fake quantization that reproduces the
  streaming cache in one batched forward) and kivi.llama (the llama2.c model).

Errors from the C++ side raise kivi.Error (a RuntimeError) with the engine's message.
"""

from ._kivi import (Cache, Error, Generator, Model, Session, dequantize_keys, dequantize_tq, dequantize_values,
                    perplexity, quantize_keys, quantize_tq, quantize_values)
from .layout import (key_group_interleave, key_group_rows, pack_codes, unpack_codes, value_quad_rows,
                     value_quads)
from .streaming import keys_quantized_after, values_quantized_after

__all__ = [
    "Cache", "Error", "Generator", "Model", "Session", "perplexity",
    "quantize_keys", "dequantize_keys", "quantize_values", "dequantize_values", "quantize_tq", "dequantize_tq",
    "key_group_rows", "key_group_interleave", "value_quads", "value_quad_rows", "pack_codes", "unpack_codes",
    "keys_quantized_after", "values_quantized_after",
]
