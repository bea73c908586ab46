// Non-finite values (NaN, +-Inf) in a model: a damaged or hostile file can hold them in
// its weights, and they then spread through every later layer and into the logits, where
// sampling and perplexity would turn them into garbage text or a "nan" score.
//
// The forward passes check the residual stream after the token embedding and after every
// layer, and the logits (n x dim floats per layer, against the layer's ~12 dim^2 weight
// reads: far below 1% of a step), and stop at the first non-finite value with an error
// naming where it appeared. check_finite_weights scans every weight at load instead
// (`--check-weights`; it reads the whole file once).
#pragma once

#include <cstddef>

#include "model/model.h"

namespace kivi::model {

// Index of the first element of x[0, n) that is NaN or infinite, or n if there is none.
size_t first_nonfinite(const float* x, size_t n);

// Throws kivi::Error if some value in x[n_tokens, dim] is not finite. `stage` is -1 after
// the token embedding, l after layer l, n_layers for the logits (then dim is the vocabulary
// size); positions are pos0, pos0 + 1, ...; `tokens` are the tokens at those positions.
void check_finite_activations(const Model& m, const float* x, int n_tokens, int dim, int stage,
                              int pos0, const int* tokens);

// Scans every weight tensor (matrices in F32 or F16, norms) and throws kivi::Error naming
// the first one that holds a non-finite value, with its GGUF name (blk.L.attn_q.weight)
// and the element's index.
void check_finite_weights(const Model& m);

}  // namespace kivi::model
