// GGUF reader: parse, then touch everything a model loader would read.
#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "io/gguf.h"
#include "quant/dequant.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    kivi::io::GgufFile f(data, size, "fuzz.gguf");
    for (const auto& k : f.keys()) {
      const auto* v = f.find(k);
      (void)f.describe(k);
      if (v->type == kivi::io::GgufType::kArray) {
        try {
          if (v->elem_type == kivi::io::GgufType::kString) (void)f.get_string_array(k);
          if (v->elem_type == kivi::io::GgufType::kF32) (void)f.get_f32_array(k);
          if (v->elem_type == kivi::io::GgufType::kI32) (void)f.get_i32_array(k);
        } catch (const kivi::Error&) {
        }
      }
    }
    uint64_t sum = 0;
    for (const auto& t : f.tensors()) {
      if (t.data && t.n_bytes) sum += t.data[0] + t.data[t.n_bytes - 1];
      // Decode the first and last rows of every readable type (block layouts, scales).
      const kivi::quant::TypeInfo* ti = t.type_info();
      if (!t.data || !ti || t.dims[0] > 4096) continue;
      const uint64_t rows = t.n_elements / t.dims[0];
      const uint64_t row_bytes = kivi::quant::row_bytes(ti->type, t.dims[0]);
      float row[4096];
      kivi::quant::dequantize_row(ti->type, t.data, row, static_cast<int64_t>(t.dims[0]));
      kivi::quant::dequantize_row(ti->type, t.data + (rows - 1) * row_bytes, row,
                                  static_cast<int64_t>(t.dims[0]));
      sum += static_cast<uint64_t>(row[0] != row[0]);
    }
    (void)sum;
  } catch (const kivi::Error&) {
  }
  return 0;
}
