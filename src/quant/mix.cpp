#include "quant/mix.h"

#include <cctype>
#include <cstdlib>

#include "core/error.h"

namespace kivi::quant {

namespace {

// llama.cpp's ftype numbers (llama.h): plain K types use the _S variant's number,
// the closest llama.cpp has to a file of one type; mxfp4 uses MXFP4_MOE's.
const FileType kFileTypes[] = {
    {"f32", Type::kF32, false, 0},      {"f16", Type::kF16, false, 1},
    {"bf16", Type::kBF16, false, 32},   {"q8_0", Type::kQ8_0, false, 7},
    {"q4_0", Type::kQ4_0, false, 2},    {"q4_1", Type::kQ4_1, false, 3},
    {"q5_0", Type::kQ5_0, false, 8},    {"q5_1", Type::kQ5_1, false, 9},
    {"q2_k", Type::kQ2_K, false, 10},   {"q3_k", Type::kQ3_K, false, 11},
    {"q4_k", Type::kQ4_K, false, 14},   {"q5_k", Type::kQ5_K, false, 16},
    {"q6_k", Type::kQ6_K, false, 18},   {"q4_k_m", Type::kQ4_K, true, 15},
    {"mxfp4", Type::kMXFP4, false, 38}, {"mxfp4_moe", Type::kMXFP4, false, 38, true},
};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The layer of "blk.N.*", or -1.
int layer_of(const std::string& name) {
  if (name.rfind("blk.", 0) != 0) return -1;
  char* end = nullptr;
  const long v = std::strtol(name.c_str() + 4, &end, 10);
  return end && *end == '.' && v >= 0 && v < (1 << 20) ? static_cast<int>(v) : -1;
}

}  // namespace

std::string file_type_names() {
  std::string s;
  for (const auto& f : kFileTypes) s += (s.empty() ? "" : ", ") + std::string(f.name);
  return s;
}

const FileType& parse_file_type(const std::string& name) {
  std::string low;
  for (char c : name) low += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const auto& f : kFileTypes) {
    if (low == f.name) return f;
  }
  fail("unknown type '%s' (valid: %s)", name.c_str(), file_type_names().c_str());
}

bool use_more_bits(int layer, int n_layers) {
  return layer < n_layers / 8 || layer >= 7 * n_layers / 8 || (layer - n_layers / 8) % 3 == 2;
}

bool is_converted(const TensorDesc& t) {
  // The experts' router stays F32 (as llama.cpp keeps it): it picks the experts.
  return t.n_dims >= 2 && ends_with(t.name, "weight") &&
         t.name.find("_norm.weight") == std::string::npos &&
         !ends_with(t.name, "ffn_gate_inp.weight");
}

Type tensor_type(const FileType& ft, const TensorDesc& t, int n_layers, bool tied_output) {
  Type type = ft.base;
  // MXFP4_MOE: the experts' 3-D tensors MXFP4, every other matrix Q8_0 (gpt-oss's files).
  if (ft.moe_mix) type = t.n_dims >= 3 ? Type::kMXFP4 : Type::kQ8_0;
  if (ft.k_m_mix) {
    const int layer = layer_of(t.name);
    if (t.name == "output.weight" || (tied_output && t.name == "token_embd.weight")) {
      type = Type::kQ6_K;
    } else if ((ends_with(t.name, ".attn_v.weight") || ends_with(t.name, ".ffn_down.weight") ||
                ends_with(t.name, ".ffn_down_exps.weight")) &&
               layer >= 0 && use_more_bits(layer, n_layers)) {
      type = Type::kQ6_K;
    }
  }
  const auto fits = [&](Type x) { return t.row_len % static_cast<uint64_t>(info(x).block) == 0; };
  if (!fits(type)) {
    switch (type) {
      case Type::kQ4_K:
        type = Type::kQ5_0;
        break;
      case Type::kQ5_K:
        type = Type::kQ5_1;
        break;
      case Type::kQ6_K:
        type = Type::kQ8_0;
        break;
      case Type::kQ2_K:
      case Type::kQ3_K:
        type = Type::kQ4_0;
        break;
      default:
        break;
    }
    if (!fits(type)) type = Type::kF16;
  }
  return type;
}

}  // namespace kivi::quant
