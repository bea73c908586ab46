#include "quant/types.h"

#include <cctype>

#include "quant/blocks.h"

namespace kivi::quant {

namespace {

// Sizes come from the block structs, so the table and the layouts cannot disagree.
constexpr TypeInfo kTypes[] = {
    {Type::kF32, "F32", 1, 4, true},
    {Type::kF16, "F16", 1, 2, true},
    {Type::kBF16, "BF16", 1, 2, true},
    {Type::kQ4_0, "Q4_0", kBlock32, sizeof(BlockQ4_0), true},
    {Type::kQ4_1, "Q4_1", kBlock32, sizeof(BlockQ4_1), true},
    {Type::kQ5_0, "Q5_0", kBlock32, sizeof(BlockQ5_0), true},
    {Type::kQ5_1, "Q5_1", kBlock32, sizeof(BlockQ5_1), true},
    {Type::kQ8_0, "Q8_0", kBlock32, sizeof(BlockQ8_0), true},
    {Type::kQ2_K, "Q2_K", kBlockK, sizeof(BlockQ2_K), true},
    {Type::kQ3_K, "Q3_K", kBlockK, sizeof(BlockQ3_K), true},
    {Type::kQ4_K, "Q4_K", kBlockK, sizeof(BlockQ4_K), true},
    {Type::kQ5_K, "Q5_K", kBlockK, sizeof(BlockQ5_K), true},
    {Type::kQ6_K, "Q6_K", kBlockK, sizeof(BlockQ6_K), true},
    {Type::kQ8_K, "Q8_K", kBlockK, sizeof(BlockQ8_K), false},
    {Type::kMXFP4, "MXFP4", kBlock32, sizeof(BlockMXFP4), true},
};

// ggml's names for every id it has defined (ggml.h); empty where an id was retired.
const char* const kGgmlNames[] = {
    "F32",   "F16",        "Q4_0",       "Q4_1",       "Q4_2",     "Q4_3",     "Q5_0",
    "Q5_1",  "Q8_0",       "Q8_1",       "Q2_K",       "Q3_K",     "Q4_K",     "Q5_K",
    "Q6_K",  "Q8_K",       "IQ2_XXS",    "IQ2_XS",     "IQ3_XXS",  "IQ1_S",    "IQ4_NL",
    "IQ3_S", "IQ2_S",      "IQ4_XS",     "I8",         "I16",      "I32",      "I64",
    "F64",   "IQ1_M",      "BF16",       "Q4_0_4_4",   "Q4_0_4_8", "Q4_0_8_8", "TQ1_0",
    "TQ2_0", "IQ4_NL_4_4", "IQ4_NL_4_8", "IQ4_NL_8_8", "MXFP4",    "NVFP4",    "Q1_0",
    "Q2_0",
};

}  // namespace

const TypeInfo* find_type(uint32_t id) {
  for (const TypeInfo& t : kTypes) {
    if (static_cast<uint32_t>(t.type) == id) return &t;
  }
  return nullptr;
}

const TypeInfo& info(Type t) {
  const TypeInfo* i = find_type(static_cast<uint32_t>(t));
  return i ? *i : kTypes[0];  // every enumerator is in the table
}

std::string type_name(uint32_t id) {
  if (id < sizeof(kGgmlNames) / sizeof(kGgmlNames[0])) return kGgmlNames[id];
  return "type " + std::to_string(id);
}

const char* supported_weight_types() {
  return "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, MXFP4";
}

bool parse_type(const std::string& name, Type* out) {
  std::string up;
  for (char c : name) up += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (const TypeInfo& t : kTypes) {
    if (up == t.name) {
      *out = t.type;
      return true;
    }
  }
  return false;
}

}  // namespace kivi::quant
