// Writing llama-architecture GGUF v3 files with the GGUF spec's and llama.cpp's key and
// tensor names: llama2.c checkpoint + tokenizer -> GGUF, and the pieces `kivi synth`
// shares (metadata, tokenizer metadata, the tensor list in file order). Weights keep
// their layout: llama2.c's rotary pairs (2i, 2i+1) are the layout GGUF's llama
// architecture expects.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/config.h"

namespace kivi::io {
class GgufWriter;
}
namespace kivi::tok {
class Tokenizer;
}

namespace kivi::model {

struct ConvertResult {
  uint64_t bytes = 0;
  int n_tensors = 0;
};

// `f16` stores matrices as F16 (norms stay F32). Refuses an `out` that is `in` or the
// tokenizer, and writes through a temporary file (io/atomic_file.h). Throws kivi::Error.
ConvertResult convert_llama2c_to_gguf(const std::string& in, const std::string& tokenizer,
                                      const std::string& out, bool f16,
                                      const std::string& name = "",
                                      const std::function<void(uint64_t, uint64_t)>& progress = {});

// general.* and <arch>.* keys for shape `c` (general.file_type 1 when `f16`, else 0),
// with llama.cpp's key names; RoPE divisors go in the rope_freqs.weight tensor instead.
void add_llama_metadata(io::GgufWriter& w, const ModelConfig& c, const std::string& name, bool f16);
// The same with general.file_type = `file_type` (llama.cpp's numbering, quant/mix.h).
void add_llama_metadata(io::GgufWriter& w, const ModelConfig& c, const std::string& name,
                        int file_type);
// tokenizer.ggml.* keys of a SentencePiece ("llama") tokenizer.
void add_tokenizer_metadata(io::GgufWriter& w, const tok::Tokenizer& tk);

// One tensor of a llama GGUF file.
enum class TensorRole : uint8_t {
  kTokenEmbd,
  kAttnNorm,
  kAttnQ,
  kAttnK,
  kAttnV,
  kAttnOutput,
  kFfnNorm,
  kFfnGate,
  kFfnDown,
  kFfnUp,
  kOutputNorm,
  kOutput,
  kAttnQBias,
  kAttnKBias,
  kAttnVBias,  // qwen2 (and llama files that have them)
  kAttnQNorm,
  kAttnKNorm,    // qwen3
  kRopeFreqs,    // RoPE frequency divisors (Llama 3.1 scaling)
  kFfnGateInp,   // the experts' router (mixture of experts)
  kFfnGateExps,  // the experts' gate, down and up projections, one 3-D tensor each
  kFfnDownExps,
  kFfnUpExps,
  kAttnPostNorm,  // Gemma's norms after attention and after the FFN
  kFfnPostNorm,
  kAttnQkv,   // phi3's fused Q, K and V (its ffn_up, kFfnUp, holds the gate rows too)
  kRopeLong,  // LongRoPE's long and short frequency divisors
  kRopeShort,
  kAttnOutBias,      // gpt-oss: the output projection's bias,
  kAttnSinks,        // each head's sink logit,
  kFfnGateInpBias,   // the router's bias
  kFfnGateExpsBias,  // and the experts' biases ([experts][width], F32)
  kFfnDownExpsBias,
  kFfnUpExpsBias,
};
struct TensorSpec {
  std::string name;  // "blk.3.attn_q.weight"
  TensorRole role;
  int layer;             // -1 for token_embd, output_norm, output
  uint64_t rows;         // matrices: [rows, cols] row-major (GGUF dims {cols, rows})
  uint64_t cols;         // 0 for norm vectors of `rows` elements
  uint64_t experts = 0;  // > 0: a 3-D tensor of that many [rows, cols] matrices
  bool f32 = false;      // a matrix of biases, stored F32 whatever the file type
  bool is_vector() const { return cols == 0; }
  uint64_t matrices() const { return experts > 0 ? experts : 1; }
};
// Every tensor of shape `c` in file order: token_embd, then per layer attn_norm, attn_q,
// (attn_q.bias), attn_k, (attn_k.bias), attn_v, (attn_v.bias), (attn_q_norm,
// attn_k_norm), attn_output, ffn_norm, ffn_gate, ffn_down, ffn_up (a mixture of experts:
// ffn_gate_inp, ffn_gate_exps, ffn_down_exps, ffn_up_exps), then output_norm,
// (untied classifier only) output and (with RoPE divisors) rope_freqs.
std::vector<TensorSpec> llama_tensor_specs(const ModelConfig& c);

}  // namespace kivi::model
