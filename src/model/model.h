// A loaded model: configuration, weights (viewed in the mapped file) and tokenizer.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/aligned.h"
#include "io/gguf.h"
#include "io/llama2c.h"
#include "model/config.h"
#include "ops/ops.h"
#include "tokenizer/tokenizer.h"

namespace kivi::grammar {
class VocabTrie;
}

namespace kivi::model {

class TpComm;

struct LayerWeights {
  std::vector<float> attn_norm;  // [dim]
  // phi3: the file's fused attn_qkv [q_dim + 2 kv_dim, dim] and ffn_up [2 hidden, dim];
  // wq, wk, wv and w_gate, w_up view their rows (empty otherwise).
  ops::Matrix w_qkv, w_gate_up;
  ops::Matrix wq;                 // [n_heads * head_dim, dim]
  ops::Matrix wk;                 // [kv_dim, dim]
  ops::Matrix wv;                 // [kv_dim, dim]
  std::vector<float> bq, bk, bv;  // [q_dim], [kv_dim], [kv_dim] projection biases (attn_bias only)
  std::vector<float> q_norm, k_norm;  // [head_dim] per-head RMSNorm weights (qk_norm only)
  ops::Matrix wo;                     // [dim, n_heads * head_dim]
  std::vector<float> bo;              // [dim] output-projection bias (out_bias only)
  std::vector<float> sinks;           // [n_heads] sink logit of each query head (head_sinks)
  std::vector<float> attn_post_norm;  // [dim] after attention (post_norms only)
  std::vector<float> ffn_norm;        // [dim]
  std::vector<float> ffn_post_norm;   // [dim] after the FFN (post_norms only)
  ops::Matrix w_gate;                 // w1 [hidden, dim]
  ops::Matrix w_down;                 // w2 [dim, hidden]
  ops::Matrix w_up;                   // w3 [hidden, dim]
  // Mixture of experts (ModelConfig::n_experts > 0) instead of w_gate, w_down, w_up:
  ops::Matrix router;                  // ffn_gate_inp [n_experts, dim]
  std::vector<ops::Matrix> gate_exps;  // [n_experts] each [hidden, dim] (a slice of ffn_gate_exps)
  std::vector<ops::Matrix> up_exps;    // [n_experts] each [hidden, dim]
  std::vector<ops::Matrix> down_exps;  // [n_experts] each [dim, hidden]
  // Their biases (expert_bias only): router [n_experts], gate and up [n_experts][hidden],
  // down [n_experts][dim].
  std::vector<float> router_bias, gate_exps_bias, up_exps_bias, down_exps_bias;
};

struct Weights {
  ops::Matrix token_embd;  // [vocab, dim]
  std::vector<LayerWeights> layers;
  std::vector<float> output_norm;  // [dim]
  ops::Matrix output;              // [vocab, dim] (== token_embd when tied)
};

class Model {
 public:
  // Loads a llama2.c checkpoint (tokenizer from `tokenizer_path`) or a GGUF file
  // (tokenizer from its metadata unless `tokenizer_path` is given). Throws kivi::Error.
  static std::unique_ptr<Model> load(const std::string& path,
                                     const std::string& tokenizer_path = "");

  const ModelConfig& config() const { return cfg_; }
  ModelConfig& mutable_config() { return cfg_; }
  const Weights& weights() const { return w_; }
  const tok::Tokenizer& tokenizer() const { return *tok_; }
  bool has_tokenizer() const { return tok_ != nullptr; }
  // The tokenizer's vocabulary as a byte trie for grammars (grammar/token_mask.h), built
  // at the first call and shared by every sequence after it. `markup`: the trie that also
  // holds the markup tokens the vocabulary renders (grammars of harmony's tool calls).
  std::shared_ptr<const grammar::VocabTrie> vocab_trie(bool markup = false) const;
  const std::string& path() const { return path_; }
  const std::string& format() const { return format_; }  // "llama2.c" or "gguf"
  const io::GgufFile* gguf() const { return gguf_.get(); }
  const io::Llama2cCheckpoint* llama2c() const { return l2c_.get(); }
  size_t weight_bytes() const;
  // Moves the weights from the file's map into memory backed by 2 MiB pages, at the same
  // addresses (io::MappedFile::copy_to_memory). False when the memory cannot be had or
  // the model was not read from a file.
  bool copy_weights_to_memory();
  // Tensor parallelism (model/tensor_parallel.h): the collectives of this process's group,
  // or null for a whole model.
  TpComm* tp_comm() const { return tp_comm_; }

 private:
  friend void shard_tensor_parallel(Model& m, TpComm* comm);
  static std::unique_ptr<Model> load_llama2c(const std::string& path, const std::string& tok);
  static std::unique_ptr<Model> load_gguf(const std::string& path, const std::string& tok);
  static void reorder_partial_rotary(Model& m);

  ModelConfig cfg_;
  Weights w_;
  std::unique_ptr<tok::Tokenizer> tok_;
  std::unique_ptr<io::GgufFile> gguf_;
  std::unique_ptr<io::Llama2cCheckpoint> l2c_;
  std::string path_, format_;
  TpComm* tp_comm_ = nullptr;
  mutable std::once_flag trie_once_[2];
  mutable std::shared_ptr<const grammar::VocabTrie> trie_[2];  // plain, with markup
  std::vector<AlignedBuffer<uint8_t>> owned_;      // column slices copied out of the file
  std::vector<AlignedBuffer<uint8_t>> reordered_;  // Q and K rows of partial rotary heads
};

// The channel order a NeoX model with partial rotary embeddings (rope_dim r of head_dim D)
// runs its query and key heads in: new channel j holds the file's channel order[j].
std::vector<int> partial_rotary_order(int D, int r);

// The configuration a llama2.c header describes (RMS eps 1e-5 and RoPE theta 10000, the
// llama2.c values, are the defaults); not yet validated.
ModelConfig llama2c_config(const io::Llama2cCheckpoint& ck);

// Default model path: --model, then $KIVI_MODEL, then models/stories260K.bin, then
// ../shared/models/stories260K.bin. Returns "" if none exists.
std::string default_model_path(const std::string& cli_value);
// Default tokenizer for a llama2.c model: tok512.bin (or tokenizer.bin) beside it.
std::string default_tokenizer_path(const std::string& model_path);

}  // namespace kivi::model
