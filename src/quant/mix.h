// File types (what `kivi quantize` and `kivi synth --outtype` write) and the rule
// that gives each tensor its type.
//
// A plain type (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k,
// q6_k, mxfp4) stores every weight matrix in that type, like llama.cpp's
// `llama-quantize --pure`. q4_k_m is llama.cpp's Q4_K_M mix (its llama_tensor_get_type, for models
// without experts), which stores most matrices as Q4_K and these as Q6_K:
//   - output.weight, or token_embd.weight when the classifier is tied to it;
//   - attn_v.weight and ffn_down.weight of layer i when use_more_bits(i, n_layers):
//     i < n/8, or i >= 7n/8, or (i - n/8) % 3 == 2.
// mxfp4_moe is llama.cpp's MXFP4_MOE (gpt-oss's own files): the experts' 3-D tensors in
// MXFP4, every other matrix in Q8_0.
// A matrix whose rows are not whole blocks of its type falls back as llama.cpp does:
// Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, Q2_K/Q3_K -> Q4_0 (llama.cpp uses IQ4_NL,
// which this engine does not write), then F16 if the rows are still not whole blocks.
// Only matrices are converted: tensors with one dimension, names ending in
// "_norm.weight" and names not ending in "weight" keep their type and bytes.
#pragma once

#include <string>
#include <vector>

#include "quant/types.h"

namespace kivi::quant {

struct FileType {
  const char* name;      // "q4_k_m"
  Type base;             // the type of most matrices
  bool k_m_mix;          // Q6_K for the tensors listed above
  int llama_ftype;       // general.file_type as llama.cpp numbers it
  bool moe_mix = false;  // experts (3-D tensors) MXFP4, other matrices Q8_0 (mxfp4_moe)
};

// The known file types, for help texts: "f32, f16, bf16, q8_0, ...".
std::string file_type_names();
// The file type named `name` (case-insensitive); kivi::Error listing the valid names
// if unknown.
const FileType& parse_file_type(const std::string& name);

// What the rule needs to know about a tensor.
struct TensorDesc {
  std::string name;  // "blk.3.ffn_down.weight"
  int n_dims = 2;
  uint64_t row_len = 0;  // dims[0]
};

// Whether the tensor is a matrix the file type converts.
bool is_converted(const TensorDesc& t);

// The type of a converted tensor in a file of type `ft` for a model of `n_layers`
// layers; `tied_output`: the model has no output.weight.
Type tensor_type(const FileType& ft, const TensorDesc& t, int n_layers, bool tied_output);

// llama.cpp's use_more_bits(i, n).
bool use_more_bits(int layer, int n_layers);

}  // namespace kivi::quant
