// `kivi quantize`: a GGUF file rewritten with its weight matrices in another type
// (quant/mix.h decides each tensor's type). Metadata is copied verbatim except
// general.file_type (set to the new type's llama.cpp number), general.quantization_version
// (2, ggml's block layouts) and general.alignment (the writer's 32). Tensors the file
// type does not convert, and matrices already in their target type, are copied byte for
// byte; the others are dequantized exactly and quantized again. Output is streamed: no
// tensor is held whole beyond one chunk.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "quant/mix.h"

namespace kivi {
class ThreadPool;
}

namespace kivi::quant {

struct QuantizeFileResult {
  uint64_t bytes_in = 0, bytes_out = 0;  // tensor data
  uint64_t file_bytes = 0;               // the output file
  int n_tensors = 0, n_converted = 0;
  struct PerType {
    std::string type;
    int tensors = 0;
    uint64_t bytes = 0;
  };
  std::vector<PerType> per_type;  // the output's tensors per type
};

// The plan without writing anything (sizes, types), for disk checks and dry runs.
QuantizeFileResult plan_quantize_file(const std::string& in, const FileType& ft);

// Writes `out`; throws kivi::Error naming the tensor on unreadable types or non-finite
// values. `progress(bytes_written, total)` is optional.
QuantizeFileResult quantize_file(const std::string& in, const std::string& out, const FileType& ft,
                                 ThreadPool* pool,
                                 const std::function<void(uint64_t, uint64_t)>& progress = {});

}  // namespace kivi::quant
