// Tensor element types of GGUF files (ggml's type ids), as a table: block size, bytes
// per block and name. A quantized row of n values is n / block consecutive blocks; the
// block layouts are in quant/blocks.h.
//
// Weight types: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K,
// Q6_K, MXFP4. Q8_K (ggml's activation format for K-quant dot products) can also be read
// and dequantized, but is not accepted as a model weight. Every other ggml type (IQ*,
// TQ*, NVFP4, ...) is named in errors but cannot be read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kivi::quant {

enum class Type : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kBF16 = 30,
  kMXFP4 = 39,
};

inline constexpr int kBlock32 = 32;  // values per block of Q4_0 .. Q8_0 and MXFP4
inline constexpr int kBlockK = 256;  // values per super-block of the K-quants

struct TypeInfo {
  Type type;
  const char* name;  // ggml's spelling, upper case: "Q4_K"
  int block;         // values per block (1 for F32/F16/BF16)
  int block_bytes;   // bytes per block
  bool weight;       // accepted as a model weight
};

// The table entry of a ggml type id, or nullptr when this engine cannot read it.
const TypeInfo* find_type(uint32_t id);
// The entry of a type of the enum (always present).
const TypeInfo& info(Type t);

// ggml's name of any type id, readable or not ("IQ2_XXS", "TQ1_0"); "type 77" when
// the id is unknown to ggml too.
std::string type_name(uint32_t id);
inline std::string type_name(Type t) { return info(t).name; }

// "F32, F16, BF16, Q4_0, ..." : the weight types, for error messages.
const char* supported_weight_types();

// Parses a type name, case-insensitive ("q4_k", "BF16"); false if unknown or unreadable.
bool parse_type(const std::string& name, Type* out);

inline bool is_float(Type t) { return t == Type::kF32 || t == Type::kF16 || t == Type::kBF16; }
inline bool is_k_quant(Type t) { return info(t).block == kBlockK; }

// Bytes of a row of `n` values; n must be a multiple of the block size.
inline uint64_t row_bytes(Type t, uint64_t n) {
  const TypeInfo& i = info(t);
  return n / static_cast<uint64_t>(i.block) * static_cast<uint64_t>(i.block_bytes);
}
inline double bits_per_weight(Type t) {
  const TypeInfo& i = info(t);
  return 8.0 * i.block_bytes / i.block;
}

}  // namespace kivi::quant
