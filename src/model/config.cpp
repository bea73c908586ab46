#include "model/config.h"

#include <algorithm>
#include <cmath>

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
  if (key_length != 0) {
    range("head dimension (attention.key_length)", key_length, 2, 1024);
  } else if (dim % n_heads != 0) {
    fail("%s: n_heads = %d does not divide dim = %d", src.c_str(), n_heads, dim);
  }
  if (n_experts != 0 || n_experts_used != 0) {
    range("n_experts (expert_count)", n_experts, 1, 4096);
    range("n_experts_used (expert_used_count)", n_experts_used, 1, n_experts);
  }
  if (n_heads % n_kv_heads != 0) {
    fail("%s: n_kv_heads = %d does not divide n_heads = %d", src.c_str(), n_kv_heads, n_heads);
  }
  if (head_dim() % 2 != 0)
    fail("%s: head dimension %d is odd; RoPE needs it even", src.c_str(), head_dim());
  if (rope_dims != 0) {
    range("rope.dimension_count", rope_dims, 2, head_dim());
    if (rope_dims % 2 != 0)
      fail("%s: rope.dimension_count = %d is odd; RoPE rotates pairs", src.c_str(), rope_dims);
  }
  if (!(rope_theta > 0.0f)) fail("%s: rope.freq_base = %g, expected > 0", src.c_str(), rope_theta);
  if (!(norm_eps > 0.0f) || norm_eps > 1.0f)
    fail("%s: layer_norm_rms_epsilon = %g, expected in (0, 1]", src.c_str(), norm_eps);
  if (!(rope_freq_scale > 0.0f) || rope_freq_scale > 1.0f) {
    fail(
        "%s: RoPE frequency scale %g (1 / rope.scaling.factor) is out of range (valid: above 0, at "
        "most 1)",
        src.c_str(), rope_freq_scale);
  }
  range("attention.sliding_window", sliding_window, 0, kMaxContext);
  auto positive = [&](const char* field, float v, bool zero_ok) {
    if (!(v >= 0.0f) || !std::isfinite(v) || (!zero_ok && v == 0.0f))
      fail("%s: %s = %g, expected a finite value above 0", src.c_str(), field, v);
  };
  positive("attn_logit_softcapping", attn_softcap, true);
  positive("final_logit_softcapping", final_softcap, true);
  positive("attention scale", attn_scale, true);
  positive("rope.freq_base_swa", rope_theta_swa, true);
  if (yarn_orig_ctx != 0) {
    range("rope.scaling.original_context_length", yarn_orig_ctx, 1, kMaxContext);
    positive("rope.scaling.yarn_beta_fast", yarn_beta_fast, false);
    positive("rope.scaling.yarn_beta_slow", yarn_beta_slow, false);
  }
  if (sliding_window > 0 && static_cast<int>(swa_layers.size()) != n_layers) {
    fail("%s: attention.sliding_window_pattern has %zu elements, expected one per layer (%d)",
         src.c_str(), swa_layers.size(), n_layers);
  }
  if (!rope_freq_factors.empty()) {
    if (static_cast<int>(rope_freq_factors.size()) != rope_dim() / 2) {
      fail("%s: rope_freqs.weight has %zu elements, expected the rotated dims / 2 = %d",
           src.c_str(), rope_freq_factors.size(), rope_dim() / 2);
    }
    for (size_t i = 0; i < rope_freq_factors.size(); ++i) {
      const float f = rope_freq_factors[i];
      if (!(f > 0.0f) || !std::isfinite(f))
        fail("%s: rope_freqs.weight[%zu] = %g, expected a finite value above 0", src.c_str(), i, f);
    }
  }
}

void ModelConfig::set_swa_pattern(int n) {
  swa_layers.assign(std::max(n_layers, 0), 0);
  for (int l = 0; l < n_layers; ++l) swa_layers[l] = n == 0 || l % n < n - 1;
}

void ModelConfig::refit_swa_pattern() {
  if (static_cast<int>(swa_layers.size()) == n_layers) return;
  ModelConfig old = *this;
  old.n_layers = static_cast<int>(swa_layers.size());
  int period = -1;
  for (int n = 0; n <= old.n_layers && period < 0; ++n) {
    old.set_swa_pattern(n);
    if (old.swa_layers == swa_layers) period = n;
  }
  set_swa_pattern(std::max(period, 0));
}

std::vector<int> ModelConfig::layer_windows() const {
  if (sliding_window <= 0) return {};
  std::vector<int> w(n_layers);
  for (int l = 0; l < n_layers; ++l) w[l] = layer_window(l);
  return w;
}

const char* supported_architectures() {
  return "llama, qwen2, qwen3, qwen3moe, gemma2, gemma3, phi3, gpt-oss";
}

bool is_supported_architecture(const std::string& arch) {
  return arch == "llama" || arch == "qwen2" || arch == "qwen3" || arch == "qwen3moe" ||
         arch == "gemma2" || arch == "gemma3" || arch == "phi3" || arch == "gpt-oss";
}

void apply_arch_defaults(ModelConfig& c, const std::string& arch) {
  if (!is_supported_architecture(arch)) {
    fail("unsupported architecture '%s' (supported: %s)",
         arch.empty() ? "(missing general.architecture)" : arch.c_str(), supported_architectures());
  }
  c.arch = arch;
  const bool qwen = arch == "qwen2" || arch == "qwen3" || arch == "qwen3moe";
  const bool gemma = arch == "gemma2" || arch == "gemma3";
  const bool oss = arch == "gpt-oss";
  c.rope_style =
      qwen || gemma || arch == "phi3" || oss ? attn::RopeStyle::kNeox : attn::RopeStyle::kAdjacent;
  c.fused_projections = arch == "phi3";
  c.attn_bias = arch == "qwen2" || oss;
  c.out_bias = oss;
  c.head_sinks = oss;
  c.expert_bias = oss;
  c.qk_norm = arch == "qwen3" || arch == "qwen3moe" || arch == "gemma3";
  c.embed_scale = gemma;
  c.post_norms = gemma;
  c.ffn_act = gemma ? Activation::kGeluTanh : oss ? Activation::kSwigluOai : Activation::kSilu;
  c.rope_theta_swa = arch == "gemma3" ? 10000.0f : 0.0f;
  c.attn_softcap = arch == "gemma2" ? 50.0f : 0.0f;
  c.final_softcap = arch == "gemma2" ? 30.0f : 0.0f;
}

std::vector<float> llama3_rope_factors(int hd, float theta, float factor, float low, float high,
                                       float original_ctx) {
  if (!(factor >= 1.0f) || !(low > 0.0f) || !(high > low) || !(original_ctx > 0.0f)) {
    fail(
        "llama3 RoPE scaling: factor %g, low_freq_factor %g, high_freq_factor %g, original context "
        "%g (valid: factor "
        ">= 1, 0 < low < high, context > 0)",
        factor, low, high, original_ctx);
  }
  const double low_wavelen = original_ctx / low, high_wavelen = original_ctx / high;
  std::vector<float> out(hd / 2);
  for (int i = 0; i < hd / 2; ++i) {
    const double f = std::pow(static_cast<double>(theta), -2.0 * i / hd);
    const double wavelen = 2.0 * M_PI / f;
    double scaled;
    if (wavelen < high_wavelen) {
      scaled = f;
    } else if (wavelen > low_wavelen) {
      scaled = f / factor;
    } else {
      const double s = (original_ctx / wavelen - low) / (high - low);
      scaled = (1.0 - s) * f / factor + s * f;
    }
    out[i] = static_cast<float>(f / scaled);
  }
  return out;
}

double ModelConfig::n_params() const {
  const double d = dim, h = hidden_dim, kv = kv_dim(), v = vocab_size;
  const double qd = q_dim();
  const double ffn = n_experts > 0 ? n_experts * 3 * d * h + n_experts * d : 3 * d * h;
  double per_layer = 2 * d + d * qd * 2 + 2 * d * kv + ffn;
  if (attn_bias) per_layer += qd + 2 * kv;
  if (out_bias) per_layer += d;
  if (head_sinks) per_layer += n_heads;
  if (expert_bias) per_layer += n_experts * (1 + 2 * h + d);
  if (qk_norm) per_layer += 2 * head_dim();
  if (post_norms) per_layer += 2 * d;
  return v * d * (shared_classifier ? 1 : 2) + n_layers * per_layer + d;
}

}  // namespace kivi::model
