// Llama-family model hyperparameters, from a llama2.c header or GGUF metadata.
#pragma once

#include <string>

namespace kivi::model {

// The longest context any command accepts (--ctx, a model's context_length, synth --ctx,
// bench-attn --ctx): 2^24 tokens. Memory checks refuse what does not fit long before.
inline constexpr int kMaxContext = 1 << 24;

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

  int head_dim() const { return dim / n_heads; }
  int kv_dim() const { return n_kv_heads * head_dim(); }
  // Throws kivi::Error naming the field and its valid range; `source` names the file.
  void validate(const std::string& source) const;
  // Weight count (for memory estimates).
  double n_params() const;
};

}  // namespace kivi::model
