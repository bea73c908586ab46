#include "model/presets.h"

#include <cmath>

#include "core/error.h"

namespace kivi::model {

static ModelConfig shape(int layers, int dim, int heads, int kv_heads, int ffn, int vocab, int ctx,
                         float theta, bool tied, const char* arch = "llama", int head_dim = 0,
                         float eps = 1e-5f) {
  ModelConfig c;
  apply_arch_defaults(c, arch);
  c.key_length = head_dim;
  c.norm_eps = eps;
  c.n_layers = layers;
  c.dim = dim;
  c.n_heads = heads;
  c.n_kv_heads = kv_heads;
  c.hidden_dim = ffn;
  c.vocab_size = vocab;
  c.ctx = ctx;
  c.rope_theta = theta;
  c.shared_classifier = tied;
  return c;
}

static ModelConfig experts(ModelConfig c, int n, int used) {
  c.n_experts = n;
  c.n_experts_used = used;
  return c;
}

// Gemma: windows of `window` tokens in every layer but each `pattern`-th, global layers'
// RoPE scaled linearly by 1 / factor.
static ModelConfig windows(ModelConfig c, int window, int pattern, float factor = 1.0f) {
  c.sliding_window = window;
  c.set_swa_pattern(pattern);
  c.rope_freq_scale = 1.0f / factor;
  return c;
}

void synthetic_long_rope(ModelConfig& c, float factor, int orig) {
  const int half = c.rope_dim() / 2;
  c.rope_freq_factors.clear();
  c.rope_factors_long.clear();
  for (int i = 0; i < half; ++i) {
    const double x = half > 1 ? static_cast<double>(i) / (half - 1) : 0.0;
    c.rope_freq_factors.push_back(static_cast<float>(1.0 + 0.25 * x));
    c.rope_factors_long.push_back(static_cast<float>(1.0 + (factor - 1.0) * x));
  }
  c.rope_orig_ctx = orig;
  c.rope_attn_factor =
      orig > 1 ? static_cast<float>(std::sqrt(1.0 + std::log(factor) / std::log(orig))) : 1.0f;
}

// Phi-4-mini: RoPE on `dims` channels, LongRoPE by `factor` over `orig` tokens.
static ModelConfig long_rope(ModelConfig c, int dims, float factor, int orig) {
  c.rope_dims = dims;
  synthetic_long_rope(c, factor, orig);
  return c;
}

// gpt-oss: 128-token windows in the even layers, YaRN by `factor` over `orig` tokens.
static ModelConfig oss(ModelConfig c, float factor, int orig) {
  c.sliding_window = 128;
  c.set_swa_pattern(2);
  c.rope_freq_scale = 1.0f / factor;
  c.yarn_orig_ctx = orig;
  return c;
}

const std::vector<Preset>& presets() {
  static const std::vector<Preset> p = {
      {"llama-3.2-1b",
       "Llama-3.2-1B shape: 16 layers, dim 2048, 32 heads, 8 KV heads, ffn 8192, vocab 128256, "
       "llama3 RoPE scaling (factor 32)",
       shape(16, 2048, 32, 8, 8192, 128256, 131072, 500000.0f, true),
       RopeScaling{32.0f, 1.0f, 4.0f, 8192.0f}},
      {"llama-2-7b",
       "Llama-2-7B shape: 32 layers, dim 4096, 32 heads, 32 KV heads, ffn 11008, vocab 32000",
       shape(32, 4096, 32, 32, 11008, 32000, 4096, 10000.0f, false), RopeScaling{}},
      {"llama-3-8b",
       "Llama-3-8B shape: 32 layers, dim 4096, 32 heads, 8 KV heads, ffn 14336, vocab 128256",
       shape(32, 4096, 32, 8, 14336, 128256, 8192, 500000.0f, false), RopeScaling{}},
      {"qwen2.5-0.5b",
       "Qwen2.5-0.5B shape (qwen2): 24 layers, dim 896, 14 heads, 2 KV heads, ffn 4864, vocab "
       "151936, Q/K/V biases",
       shape(24, 896, 14, 2, 4864, 151936, 32768, 1000000.0f, true, "qwen2", 0, 1e-6f),
       RopeScaling{}},
      {"qwen3-0.6b",
       "Qwen3-0.6B shape (qwen3): 28 layers, dim 1024, 16 heads of 128, 8 KV heads, ffn 3072, "
       "vocab 151936, QK norm",
       shape(28, 1024, 16, 8, 3072, 151936, 40960, 1000000.0f, true, "qwen3", 128, 1e-6f),
       RopeScaling{}},
      {"qwen3-30b-a3b",
       "Qwen3-30B-A3B shape (qwen3moe): 48 layers, dim 2048, 32 heads of 128, 4 KV heads, 128 "
       "experts of ffn 768 with 8 per token, vocab 151936, QK norm",
       experts(
           shape(48, 2048, 32, 4, 768, 151936, 40960, 1000000.0f, false, "qwen3moe", 128, 1e-6f),
           128, 8),
       RopeScaling{}},
      {"mixtral-8x7b",
       "Mixtral-8x7B shape (llama with experts): 32 layers, dim 4096, 32 heads, 8 KV heads, 8 "
       "experts of ffn 14336 with 2 per token, vocab 32000",
       experts(shape(32, 4096, 32, 8, 14336, 32000, 32768, 1000000.0f, false), 8, 2),
       RopeScaling{}},
      {"gemma-3-4b",
       "Gemma-3-4B shape (gemma3): 34 layers, dim 2560, 8 heads of 256, 4 KV heads, ffn 10240, "
       "vocab 262208, 5 of 6 layers windowed (1024), global RoPE 1e6 scaled by 1/8, QK norm",
       windows(shape(34, 2560, 8, 4, 10240, 262208, 131072, 1000000.0f, true, "gemma3", 256, 1e-6f),
               1024, 6, 8.0f),
       RopeScaling{}},
      {"gemma-3-12b",
       "Gemma-3-12B shape (gemma3): 48 layers, dim 3840, 16 heads of 256, 8 KV heads, ffn 15360, "
       "vocab 262208, 5 of 6 layers windowed (1024), global RoPE 1e6 scaled by 1/8, QK norm",
       windows(
           shape(48, 3840, 16, 8, 15360, 262208, 131072, 1000000.0f, true, "gemma3", 256, 1e-6f),
           1024, 6, 8.0f),
       RopeScaling{}},
      {"gemma-2-2b",
       "Gemma-2-2B shape (gemma2): 26 layers, dim 2304, 8 heads of 256, 4 KV heads, ffn 9216, "
       "vocab 256000, every other layer windowed (4096), attention and logit soft caps 50, 30",
       windows(shape(26, 2304, 8, 4, 9216, 256000, 8192, 10000.0f, true, "gemma2", 256, 1e-6f),
               4096, 2),
       RopeScaling{}},
      {"phi-3-mini",
       "Phi-3-mini-4k shape (phi3): 32 layers, dim 3072, 32 heads, 32 KV heads, ffn 8192, vocab "
       "32064, fused QKV and gate-up",
       shape(32, 3072, 32, 32, 8192, 32064, 4096, 10000.0f, false, "phi3"), RopeScaling{}},
      {"phi-4",
       "Phi-4 (14B) shape (phi3): 40 layers, dim 5120, 40 heads, 10 KV heads, ffn 17920, vocab "
       "100352, fused QKV and gate-up",
       shape(40, 5120, 40, 10, 17920, 100352, 16384, 250000.0f, false, "phi3"), RopeScaling{}},
      {"phi-4-mini",
       "Phi-4-mini shape (phi3): 32 layers, dim 3072, 24 heads of 128, 8 KV heads, ffn 8192, "
       "vocab 200064, RoPE on 96 of 128 channels, LongRoPE (factor 32 over 4096), fused QKV "
       "and gate-up",
       long_rope(shape(32, 3072, 24, 8, 8192, 200064, 131072, 10000.0f, true, "phi3"), 96, 32.0f,
                 4096),
       RopeScaling{}},
      {"gpt-oss-20b",
       "gpt-oss-20b shape (gpt-oss): 24 layers, dim 2880, 64 heads of 64, 8 KV heads, 32 experts "
       "of ffn 2880 with 4 per token, vocab 201088, even layers windowed (128), YaRN (factor 32 "
       "over 4096), attention sinks",
       oss(experts(shape(24, 2880, 64, 8, 2880, 201088, 131072, 150000.0f, false, "gpt-oss", 64),
                   32, 4),
           32.0f, 4096),
       RopeScaling{}},
      {"tiny",
       "small GQA shape that builds in seconds: 4 layers, dim 256, 8 heads, 2 KV heads, ffn 688, "
       "vocab 512",
       shape(4, 256, 8, 2, 688, 512, 4096, 10000.0f, true), RopeScaling{}},
  };
  return p;
}

const Preset& find_preset(const std::string& name) {
  for (const auto& p : presets()) {
    if (p.name == name) return p;
  }
  std::string names;
  for (const auto& p : presets()) names += (names.empty() ? "" : ", ") + p.name;
  fail("unknown preset '%s' (valid: %s)", name.c_str(), names.c_str());
}

}  // namespace kivi::model
