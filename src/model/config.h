// Llama-family model hyperparameters, from a llama2.c header or GGUF metadata.
//
// Architectures (GGUF general.architecture) differ only in a few switches here:
//   llama  RoPE on adjacent pairs (2i, 2i+1), optional per-frequency divisors
//          (rope_freqs.weight: Llama 3.1/3.2 "llama3" scaling) or linear scaling;
//   qwen2  biases on the Q, K and V projections, NeoX RoPE (pairs (i, i + D/2));
//   qwen3  RMSNorm of every query and key head before RoPE, NeoX RoPE, a head
//          dimension that may differ from dim / n_heads (attention.key_length);
//   qwen3moe  qwen3 with a mixture of experts in place of every FFN; a llama file with
//          <arch>.expert_count (Mixtral) has one too (model/ffn.h);
//   gemma2 / gemma3  the embedding times sqrt(dim), RMSNorms after attention and after
//          the FFN as well as before, GeLU-gated FFN, NeoX RoPE, alternating sliding-window
//          and global layers; gemma2 caps attention scores and logits (cap * tanh(x / cap)),
//          gemma3 has qwen3's per-head Q/K norms and its own RoPE base in the windowed
//          layers. Their norm weights are stored as llama.cpp writes them (1 + w already);
//   phi3   (Phi-3, Phi-4) NeoX RoPE, Q, K and V in one matrix (attn_qkv) and the FFN's
//          gate and up in one (ffn_up, gate rows first);
//   gpt-oss  a mixture of experts with biases (router and experts) and OpenAI's clamped
//          SwiGLU, biases on Q, K, V and the output projection, a learned sink logit per
//          head in every softmax, alternating 128-token windows and global layers, YaRN
//          RoPE (NeoX pairs); the FFN's norm is stored as post_attention_norm.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "attn/attention.h"

namespace kivi::model {

// The longest context any command accepts (--ctx, a model's context_length, synth --ctx,
// bench-attn --ctx): 2^24 tokens. Memory checks refuse what does not fit long before.
inline constexpr int kMaxContext = 1 << 24;

// This process's part of a model split by tensor parallelism (model/tensor_parallel.h):
// query heads [head0, head0 + n_heads) of n_heads_total, KV heads from kv_head0, FFN
// channels [ffn0, ffn0 + hidden_dim) of hidden_total and classifier rows [vocab0, vocab1).
// size == 1: the whole model.
struct TpSlice {
  int rank = 0, size = 1;
  int head0 = 0, n_heads_total = 0;
  int kv_head0 = 0, n_kv_heads_total = 0;
  int ffn0 = 0, hidden_total = 0;
  int vocab0 = 0, vocab1 = 0;
  std::vector<int> vocab_counts;  // [size] classifier rows of each rank
};

// The FFN's gate: SwiGLU (silu(gate) * up), GeGLU with the tanh approximation of GeLU,
// or gpt-oss's clamped SwiGLU: g = min(gate, 7), u = clamp(up, -7, 7),
// g * sigmoid(1.702 g) * (u + 1).
enum class Activation { kSilu, kGeluTanh, kSwigluOai };

struct ModelConfig {
  std::string arch = "llama";
  std::string name;
  int dim = 0;         // embedding width
  int hidden_dim = 0;  // SwiGLU inner width
  int n_layers = 0;
  int n_heads = 0;     // query heads
  int n_kv_heads = 0;  // key/value heads (GQA when < n_heads, MQA when 1)
  int vocab_size = 0;
  int ctx = 0;  // trained context length
  float rope_theta = 10000.0f;
  float norm_eps = 1e-5f;
  bool shared_classifier = true;  // output projection tied to the token embedding
  bool alibi = false;             // ALiBi biases instead of RoPE (a run-time option)
  bool synthetic = false;         // random weights, for speed measurement only
  // Architecture features (set from `arch` by apply_arch_defaults, then from the file).
  int key_length = 0;  // head dimension when it is not dim / n_heads (0: dim / n_heads)
  // Channels of a head that RoPE rotates (rope.dimension_count; Phi-4-mini: 96 of 128):
  // pairs beyond rope_dim() / 2 pass unrotated. 0: the whole head.
  int rope_dims = 0;
  attn::RopeStyle rope_style = attn::RopeStyle::kAdjacent;
  float rope_freq_scale =
      1.0f;  // linear RoPE scaling: every angle times this (1 / rope.scaling.factor)
  std::vector<float>
      rope_freq_factors;  // [head_dim / 2] divisor of each pair's frequency, or empty
  // LongRoPE (Phi-3.5, Phi-3 128K): rope_freq_factors holds the short factors
  // (rope_factors_short), used up to rope_orig_ctx tokens of context; a longer context
  // uses rope_factors_long, as llama.cpp chooses by the context it runs with.
  // rope_attn_factor multiplies every cos and sin (rope.scaling.attn_factor).
  std::vector<float> rope_factors_long;
  int rope_orig_ctx = 0;
  float rope_attn_factor = 1.0f;
  // YaRN (rope.scaling.type "yarn"; gpt-oss): with yarn_orig_ctx > 0, pair i rotates by a
  // blend of the interpolated (rope_freq_scale) and the original frequency, ramping from
  // extrapolation in the fast pairs to interpolation in the slow ones between the pairs
  // that turn yarn_beta_fast and yarn_beta_slow times in yarn_orig_ctx tokens; cos and sin
  // are scaled by 1 + 0.1 ln(1 / rope_freq_scale), as llama.cpp computes them.
  int yarn_orig_ctx = 0;
  float yarn_beta_fast = 32.0f;
  float yarn_beta_slow = 1.0f;
  bool attn_bias = false;          // Q, K and V projections carry biases (qwen2)
  bool qk_norm = false;            // RMSNorm over each query and key head before RoPE (qwen3)
  bool fused_projections = false;  // attn_qkv and a gate-up ffn_up in the file (phi3)
  bool out_bias = false;           // the output projection carries a bias (gpt-oss)
  // A learned logit per query head that joins every softmax's denominator as a token
  // whose value is zero (gpt-oss's attention sinks; attn_sinks.weight).
  bool head_sinks = false;
  bool expert_bias = false;  // the router and every expert's projections carry biases
  // Mixture of experts (<arch>.expert_count, expert_used_count): every FFN is n_experts
  // SwiGLU experts of hidden_dim channels, of which a router picks n_experts_used per
  // token, weighted by the softmax of their router logits. 0: one dense FFN.
  int n_experts = 0;
  int n_experts_used = 0;
  // Gemma: the token embedding times sqrt(dim); RMSNorms after attention and after the
  // FFN (attn_post_norm, ffn_post_norm); the FFN's gate; the attention scale (0:
  // 1/sqrt(head_dim)); soft caps of the attention scores and of the logits (0: none).
  bool embed_scale = false;
  bool post_norms = false;
  Activation ffn_act = Activation::kSilu;
  float attn_scale = 0.0f;
  float attn_softcap = 0.0f;
  float final_softcap = 0.0f;
  // Sliding-window attention (<arch>.attention.sliding_window): a query at position p
  // attends the keys at p - sliding_window + 1 .. p in the layers swa_layers marks
  // ([n_layers], 1: windowed; all of them unless attention.sliding_window_pattern says
  // otherwise). 0: every layer attends the whole context.
  int sliding_window = 0;
  std::vector<uint8_t> swa_layers;
  // The sliding-window layers' own RoPE (<arch>.rope.freq_base_swa; gemma3: base 10000
  // unscaled while the global layers use rope_theta with the linear scaling). 0: the
  // windowed layers rotate as the global ones.
  float rope_theta_swa = 0.0f;
  float rope_freq_scale_swa = 1.0f;
  // Tensor parallelism: n_heads, n_kv_heads and hidden_dim above are this process's share.
  TpSlice tp;

  int head_dim() const { return key_length > 0 ? key_length : dim / n_heads; }
  int rope_dim() const { return rope_dims > 0 ? rope_dims : head_dim(); }
  // The frequency divisors at a context of ctx tokens (LongRoPE's long ones past
  // rope_orig_ctx), or null.
  const float* freq_factors(int ctx) const {
    if (!rope_factors_long.empty() && ctx > rope_orig_ctx) return rope_factors_long.data();
    return rope_freq_factors.empty() ? nullptr : rope_freq_factors.data();
  }
  float attention_scale() const {
    return attn_scale > 0.0f ? attn_scale : 1.0f / std::sqrt(static_cast<float>(head_dim()));
  }
  // Layer l rotates with the windowed layers' own RoPE (rope_theta_swa).
  bool local_rope(int l) const { return has_local_rope() && layer_window(l) > 0; }
  bool has_local_rope() const {
    return rope_theta_swa > 0.0f && sliding_window > 0 &&
           (rope_theta_swa != rope_theta || rope_freq_scale_swa != rope_freq_scale ||
            !rope_freq_factors.empty());
  }
  int q_dim() const { return n_heads * head_dim(); }
  int kv_dim() const { return n_kv_heads * head_dim(); }
  // Tokens layer l attends (its sliding window), or 0 for the whole context.
  int layer_window(int l) const {
    return sliding_window > 0 && l < static_cast<int>(swa_layers.size()) && swa_layers[l]
               ? sliding_window
               : 0;
  }
  // Marks the sliding-window layers for a pattern N (llama.cpp's convention: layer l
  // is windowed iff l % N < N - 1, so every N-th layer attends the whole context;
  // N = 1 windows no layer, N = 0 every layer).
  void set_swa_pattern(int n);
  // After n_layers changed: swa_layers follows the period its old flags had (every
  // layer windowed when they had none).
  void refit_swa_pattern();
  // [n_layers] layer_window(l) of every layer (kv::CacheConfig::layer_window), or empty
  // when no layer has a window.
  std::vector<int> layer_windows() const;
  // Throws kivi::Error naming the field and its valid range; `source` names the file.
  void validate(const std::string& source) const;
  // Weight count (for memory estimates).
  double n_params() const;
};

// The architectures kivi.cpp loads, for messages: "llama, qwen2, qwen3".
const char* supported_architectures();
bool is_supported_architecture(const std::string& arch);
// Sets arch and the switches it implies (RoPE style, biases, QK norm); throws
// kivi::Error naming the architecture and the supported list when unknown.
void apply_arch_defaults(ModelConfig& c, const std::string& arch);

// Llama 3.1 RoPE scaling ("rope_type": "llama3" in Hugging Face configs; Meta's
// reference apply_scaling): pair i of frequency f = theta^(-2i/D) and wavelength
// 2 pi / f keeps f when the wavelength is below original_ctx / high_freq_factor,
// becomes f / factor above original_ctx / low_freq_factor, and between them blends
// the two with weight s = (original_ctx / wavelength - low) / (high - low) on f.
// Returns the divisors f / f' ([head_dim / 2]), what llama.cpp stores as rope_freqs.weight.
std::vector<float> llama3_rope_factors(int head_dim, float theta, float factor,
                                       float low_freq_factor, float high_freq_factor,
                                       float original_ctx);

}  // namespace kivi::model
