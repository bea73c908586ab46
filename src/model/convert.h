// llama2.c checkpoint + tokenizer -> GGUF v3, with the GGUF spec's and llama.cpp's key
// and tensor names. Weights keep their layout: llama2.c's rotary pairs (2i, 2i+1) are
// the layout GGUF's llama architecture expects.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace kivi::model {

struct ConvertResult {
  uint64_t bytes = 0;
  int n_tensors = 0;
};

// `f16` stores matrices as F16 (norms stay F32). Throws kivi::Error.
ConvertResult convert_llama2c_to_gguf(const std::string& in, const std::string& tokenizer,
                                      const std::string& out, bool f16, const std::string& name = "",
                                      const std::function<void(uint64_t, uint64_t)>& progress = {});

}  // namespace kivi::model
