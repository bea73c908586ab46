// llama2.c checkpoints (the legacy format of karpathy/llama2.c run.c) and their
// tokenizer files.
//
// Checkpoint: 7 x int32 header {dim, hidden_dim, n_layers, n_heads, n_kv_heads,
// vocab_size, seq_len}; vocab_size < 0 means a separate classifier follows. Then
// fp32 arrays in this order (head_size = dim / n_heads, kv_dim = n_kv_heads * head_size):
//   token_embedding [vocab, dim]
//   rms_att [L, dim], wq [L, dim, dim], wk [L, kv_dim, dim], wv [L, kv_dim, dim],
//   wo [L, dim, dim], rms_ffn [L, dim], w1 [L, hidden, dim], w2 [L, dim, hidden],
//   w3 [L, hidden, dim], rms_final [dim],
//   freq_cis_real [seq_len, head_size/2], freq_cis_imag [seq_len, head_size/2] (unused),
//   wcls [vocab, dim] (only when vocab_size < 0)
// Matrices are row-major [out, in].
//
// Tokenizer: int32 max_token_length, then per token: f32 score, int32 length, bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/mapped_file.h"

namespace kivi::io {

struct Llama2cHeader {
  int32_t dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
};

struct Llama2cCheckpoint {
  Llama2cHeader header{};  // vocab_size made positive
  bool shared_classifier = true;
  const float* token_embd = nullptr;
  const float* rms_att = nullptr;
  const float* wq = nullptr;
  const float* wk = nullptr;
  const float* wv = nullptr;
  const float* wo = nullptr;
  const float* rms_ffn = nullptr;
  const float* w1 = nullptr;
  const float* w2 = nullptr;
  const float* w3 = nullptr;
  const float* rms_final = nullptr;
  const float* wcls = nullptr;      // == token_embd when shared
  std::unique_ptr<MappedFile> map;  // null when parsed from memory
};

// Reads and validates a checkpoint; throws kivi::Error naming the field.
std::unique_ptr<Llama2cCheckpoint> read_llama2c(const std::string& path);
// Same over an in-memory image (the fuzzer's entry point).
std::unique_ptr<Llama2cCheckpoint> parse_llama2c(const uint8_t* data, size_t size,
                                                 const std::string& name);

// Bytes a checkpoint with this header must have (header included).
uint64_t llama2c_expected_size(const Llama2cHeader& h, bool shared_classifier);

struct Llama2cVocab {
  int32_t max_token_length = 0;
  std::vector<std::string> pieces;
  std::vector<float> scores;
};

// Reads exactly `vocab_size` tokens; a file with fewer or more is an error that
// names both counts.
Llama2cVocab read_llama2c_tokenizer(const std::string& path, int vocab_size);
Llama2cVocab parse_llama2c_tokenizer(const uint8_t* data, size_t size, int vocab_size,
                                     const std::string& name);

}  // namespace kivi::io
