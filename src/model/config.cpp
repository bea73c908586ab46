#include "model/config.h"

#include "core/error.h"

namespace kivi::model {

void ModelConfig::validate(const std::string& src) const {
  auto range = [&](const char* field, long long v, long long lo, long long hi) {
    if (v < lo || v > hi)
      fail("%s: %s = %lld, expected %lld to %lld", src.c_str(), field, v, lo, hi);
  };
  range("dim (embedding_length)", dim, 1, 65536);
  range("hidden_dim (feed_forward_length)", hidden_dim, 1, 1 << 20);
  range("n_layers (block_count)", n_layers, 1, 1024);
  range("n_heads (attention.head_count)", n_heads, 1, 4096);
  range("n_kv_heads (attention.head_count_kv)", n_kv_heads, 1, n_heads);
  range("vocab_size", vocab_size, 1, 1 << 22);
  range("context_length", ctx, 1, kMaxContext);
  if (dim % n_heads != 0)
    fail("%s: n_heads = %d does not divide dim = %d", src.c_str(), n_heads, dim);
  if (n_heads % n_kv_heads != 0) {
    fail("%s: n_kv_heads = %d does not divide n_heads = %d", src.c_str(), n_kv_heads, n_heads);
  }
  if (head_dim() % 2 != 0)
    fail("%s: head dimension %d is odd; RoPE needs it even", src.c_str(), head_dim());
  if (!(rope_theta > 0.0f)) fail("%s: rope.freq_base = %g, expected > 0", src.c_str(), rope_theta);
  if (!(norm_eps > 0.0f) || norm_eps > 1.0f)
    fail("%s: layer_norm_rms_epsilon = %g, expected in (0, 1]", src.c_str(), norm_eps);
}

double ModelConfig::n_params() const {
  const double d = dim, h = hidden_dim, kv = kv_dim(), v = vocab_size;
  double per_layer = 2 * d + d * d * 2 + 2 * d * kv + 3 * d * h;
  return v * d * (shared_classifier ? 1 : 2) + n_layers * per_layer + d;
}

}  // namespace kivi::model
