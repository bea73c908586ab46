// Synthetic models: llama, qwen2 or qwen3 GGUF v3 files with seeded random weights at a
// real model's shape (`kivi synth`), so speed and memory can be measured at 1B-8B
// scale without the real weights, and each architecture's forward pass can be checked
// against independent references. The files use the key and tensor names that
// model/convert.h writes, plus `kivi.synthetic = true`, which makes the tools say that
// the text is meaningless.
//
// Weights: every matrix (token embedding, attention and FFN projections, classifier)
// is N(0, 0.02^2), like GPT-2's initialization; norm weights are 1, except the per-head
// Q/K norms (1 + N(0, 0.2^2)); Q/K/V biases are N(0, 0.5^2); rope_freqs.weight holds
// the configuration's RoPE divisors. With inputs
// normalized to RMS 1, a projection of width d then has outputs of standard deviation
// 0.02 sqrt(d) (0.9 at d = 2048, 1.3 at 4096, 1.8 at the FFN width 8192), so
// activations stay finite and moderate through every layer.
//
// Random numbers: element e of tensor t comes from block e / 4096, whose kivi::Rng is
// seeded with a hash of (seed, t, block); samples come from kivi::NormalTable (one
// 64-bit draw gives four normal samples by table lookup), so generating 1.2e9 values
// takes about a second. The file depends only on the shape, the seed and the output
// type: the same arguments give the same bytes. Quantized output types (q8_0, q4_k,
// q4_k_m, ...) quantize the F32 values with the rule of quant/mix.h, as `kivi quantize`
// would quantize the F32 file.
//
// Tokenizer ("llama", SentencePiece BPE with scores): <unk>, <s>, </s>, the 256 byte
// pieces <0x00>..<0xFF>, then pieces over the alphabet U+2581 (the SentencePiece
// space), a-z, A-Z, 0-9 and the other printable ASCII characters: the single
// characters, then for each length n = 2, 3, ... the pieces "U+2581 + (n-1 characters)"
// and "n characters", in alphabet order, until the vocabulary is full. Every piece's
// prefix one character shorter is an earlier piece, so every piece is reachable by
// merges; scores decrease with the id (shorter pieces merge first).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "model/config.h"
#include "tokenizer/tokenizer.h"

namespace kivi::io {
class GgufWriter;
class AtomicFile;
}  // namespace kivi::io

namespace kivi::model {

struct SynthSpec {
  ModelConfig config;  // shape, context length, RoPE theta, tied or separate classifier
  std::string label;   // preset name or shape description, for general.name
  std::string outtype =
      "f16";  // matrix storage, a quant/mix.h file type (norm vectors are always F32)
  uint64_t seed = 0;
  // Writes the tokenizer metadata instead of the generated SentencePiece vocabulary
  // (synth_tokenizer.h), and the bytes it takes.
  std::function<void(io::GgufWriter&)> write_tokenizer;
  uint64_t tokenizer_bytes = 0;
};

inline constexpr float kSynthWeightStd = 0.02f;
// Q/K/V biases (qwen2) and per-head norm weights (qwen3, around 1) are random too, large
// enough that a forward pass which ignored them would give visibly different logits.
inline constexpr float kSynthBiasStd = 0.5f;
inline constexpr float kSynthHeadNormStd = 0.2f;
// Sink logits (gpt-oss): of the order of the scores, so that a sink takes a visible share.
inline constexpr float kSynthSinkStd = 1.0f;
// Smallest vocabulary: <unk>, <s>, </s> and the 256 byte pieces.
inline constexpr int kSynthMinVocab = 259;

// Checks the shape; throws kivi::Error naming the option (--dim, --heads, ...) and its
// valid range.
void validate_synth_config(const ModelConfig& c);

// What writing and running the model needs, computed from the shape alone.
struct SynthNeeds {
  uint64_t file_bytes = 0;        // estimate of the GGUF size (tensor data exact, metadata bounded)
  uint64_t weight_bytes = 0;      // tensor data
  int kv_tokens = 0;              // tokens of the f32 cache counted below: min(ctx, 4096)
  uint64_t kv_bytes = 0;          // f32 KV cache for kv_tokens
  uint64_t activation_bytes = 0;  // a 64-token prefill chunk, RoPE table and logits
  uint64_t memory_bytes() const { return weight_bytes + kv_bytes + activation_bytes; }
};
SynthNeeds synth_needs(const SynthSpec& s);

// Throws kivi::Error when the model needs more memory than `available_memory` ("needs
// X of memory to run, only Y available") or the file is larger than `free_disk`.
// 0 means unknown and skips that check.
void check_synth_fits(const SynthNeeds& n, uint64_t available_memory, uint64_t free_disk,
                      const std::string& out);

// The tokenizer described above, with exactly `vocab_size` pieces (>= kSynthMinVocab +
// the controls), the last of them `controls` (control tokens).
tok::Tokenizer synthetic_tokenizer(int vocab_size, const std::vector<std::string>& controls = {});
// The control tokens an architecture's synthetic vocabulary carries (phi3: its turn markers).
std::vector<std::string> synthetic_controls(const ModelConfig& c);

// Elements [first, first + count) of the matrix with index `tensor` in
// llama_tensor_specs order, in F16 (or F32): exactly what the file holds, whatever the
// chunking. (Other output types quantize the F32 values.)
void synth_matrix_values(uint64_t seed, uint64_t tensor, uint64_t first, uint64_t count, bool f16,
                         void* dst);

// general.name of a synthetic file: "synthetic <label>, random weights".
std::string synthetic_name(const std::string& label);

struct SynthResult {
  uint64_t bytes = 0;
  int n_tensors = 0;
};

// Writes the file, streaming (the tensor data is generated in chunks as it is written,
// never held whole). `progress(bytes_written, total)` is optional. Throws kivi::Error.
SynthResult write_synthetic_gguf(const SynthSpec& s, const std::string& out,
                                 const std::function<void(uint64_t, uint64_t)>& progress = {});
// The same into an output the caller opened (and commits).
SynthResult write_synthetic_gguf(const SynthSpec& s, io::AtomicFile& out,
                                 const std::function<void(uint64_t, uint64_t)>& progress = {});

}  // namespace kivi::model
