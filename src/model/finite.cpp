#include "model/finite.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "core/error.h"
#include "model/convert.h"

namespace kivi::model {

namespace {

// All-ones exponent: Inf or NaN. Branch-free over a block, so the scan vectorizes.
constexpr size_t kBlock = 256;

bool f32_block_finite(const float* x, size_t n) {
  uint32_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, x + i, 4);
    bad |= static_cast<uint32_t>((u & 0x7f800000u) == 0x7f800000u);
  }
  return bad == 0;
}

size_t first_nonfinite_f16(const f16_t* x, size_t n) {
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t e = std::min(n, b + kBlock);
    uint32_t bad = 0;
    for (size_t i = b; i < e; ++i) bad |= static_cast<uint32_t>((x[i] & 0x7c00u) == 0x7c00u);
    if (bad == 0) continue;
    for (size_t i = b; i < e; ++i) {
      if ((x[i] & 0x7c00u) == 0x7c00u) return i;
    }
  }
  return n;
}

const char* kind(float v) { return std::isnan(v) ? "NaN" : v > 0 ? "+Inf" : "-Inf"; }

}  // namespace

size_t first_nonfinite(const float* x, size_t n) {
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t e = std::min(n, b + kBlock);
    if (f32_block_finite(x + b, e - b)) continue;
    for (size_t i = b; i < e; ++i) {
      if (!std::isfinite(x[i])) return i;
    }
  }
  return n;
}

void check_finite_activations(const Model& m, const float* x, int n_tokens, int dim, int stage,
                              int pos0, const int* tokens) {
  const size_t total = static_cast<size_t>(n_tokens) * dim;
  const size_t i = first_nonfinite(x, total);
  if (i == total) return;
  const int t = static_cast<int>(i / dim), pos = pos0 + t;
  const int L = m.config().n_layers;
  const std::string hint =
      "; the model's weights are probably damaged ('--check-weights' scans them all)";
  if (stage < 0) {
    fail("%s: the token embedding of token %d is not finite (%s at element %zu, position %d)%s",
         m.path().c_str(), tokens ? tokens[t] : -1, kind(x[i]), i % dim, pos, hint.c_str());
  }
  if (stage < L) {
    fail(
        "%s: the hidden state is not finite after layer %d of %d (%s at element %zu, position %d; "
        "the layers "
        "before it were finite)%s",
        m.path().c_str(), stage, L, kind(x[i]), i % dim, pos, hint.c_str());
  }
  fail(
      "%s: the logits are not finite (%s at token id %zu, position %d) although every layer's "
      "output was: the "
      "output norm or the classifier holds non-finite weights%s",
      m.path().c_str(), kind(x[i]), i % dim, pos, hint.c_str());
}

void check_finite_weights(const Model& m) {
  const ModelConfig& c = m.config();
  const Weights& w = m.weights();
  for (const TensorSpec& s : llama_tensor_specs(c)) {
    const LayerWeights* L = s.layer >= 0 ? &w.layers[s.layer] : nullptr;
    const ops::Matrix* mat = nullptr;
    const std::vector<float>* vec = nullptr;
    ops::Matrix all;  // a 3-D expert tensor as one matrix of every expert's rows
    auto experts = [&](const std::vector<ops::Matrix>& e) {
      all = e.front();
      all.rows *= static_cast<int64_t>(e.size());
      return &all;
    };
    switch (s.role) {
      case TensorRole::kTokenEmbd:
        mat = &w.token_embd;
        break;
      case TensorRole::kAttnNorm:
        vec = &L->attn_norm;
        break;
      case TensorRole::kAttnQ:
        mat = &L->wq;
        break;
      case TensorRole::kAttnK:
        mat = &L->wk;
        break;
      case TensorRole::kAttnV:
        mat = &L->wv;
        break;
      case TensorRole::kAttnOutput:
        mat = &L->wo;
        break;
      case TensorRole::kFfnNorm:
        vec = &L->ffn_norm;
        break;
      case TensorRole::kFfnGate:
        mat = &L->w_gate;
        break;
      case TensorRole::kFfnDown:
        mat = &L->w_down;
        break;
      case TensorRole::kFfnUp:
        mat = L->w_gate_up.data ? &L->w_gate_up : &L->w_up;
        break;
      case TensorRole::kOutputNorm:
        vec = &w.output_norm;
        break;
      case TensorRole::kOutput:
        mat = &w.output;
        break;
      case TensorRole::kAttnQBias:
        vec = &L->bq;
        break;
      case TensorRole::kAttnKBias:
        vec = &L->bk;
        break;
      case TensorRole::kAttnVBias:
        vec = &L->bv;
        break;
      case TensorRole::kAttnQNorm:
        vec = &L->q_norm;
        break;
      case TensorRole::kAttnKNorm:
        vec = &L->k_norm;
        break;
      case TensorRole::kRopeFreqs:
        vec = &c.rope_freq_factors;  // also checked by ModelConfig::validate
        break;
      case TensorRole::kFfnGateInp:
        mat = &L->router;
        break;
      case TensorRole::kFfnGateExps:
        mat = experts(L->gate_exps);
        break;
      case TensorRole::kFfnDownExps:
        mat = experts(L->down_exps);
        break;
      case TensorRole::kFfnUpExps:
        mat = experts(L->up_exps);
        break;
      case TensorRole::kAttnPostNorm:
        vec = &L->attn_post_norm;
        break;
      case TensorRole::kFfnPostNorm:
        vec = &L->ffn_post_norm;
        break;
      case TensorRole::kAttnQkv:
        mat = &L->w_qkv;
        break;
      case TensorRole::kRopeLong:
        vec = &c.rope_factors_long;  // also checked by the loader
        break;
      case TensorRole::kRopeShort:
        vec = &c.rope_freq_factors;
        break;
      case TensorRole::kAttnOutBias:
        vec = &L->bo;
        break;
      case TensorRole::kAttnSinks:
        vec = &L->sinks;
        break;
      case TensorRole::kFfnGateInpBias:
        vec = &L->router_bias;
        break;
      case TensorRole::kFfnGateExpsBias:
        vec = &L->gate_exps_bias;
        break;
      case TensorRole::kFfnDownExpsBias:
        vec = &L->down_exps_bias;
        break;
      case TensorRole::kFfnUpExpsBias:
        vec = &L->up_exps_bias;
        break;
    }
    size_t n = 0, bad = 0;
    float v = 0.0f;
    if (vec) {
      n = vec->size();
      bad = first_nonfinite(vec->data(), n);
      if (bad < n) v = (*vec)[bad];
    } else if (mat) {
      n = static_cast<size_t>(mat->rows) * static_cast<size_t>(mat->cols);
      if (mat->dtype == ops::DType::kF32) {
        bad = first_nonfinite(mat->f32(), n);
        if (bad < n) v = mat->f32()[bad];
      } else {
        bad = first_nonfinite_f16(mat->f16(), n);
        if (bad < n) v = f16_to_f32(mat->f16()[bad]);
      }
    }
    if (bad < n) {
      fail("%s: weight tensor %s holds a non-finite value (%s at element %zu of %zu)",
           m.path().c_str(), s.name.c_str(), kind(v), bad, n);
    }
  }
}

}  // namespace kivi::model
