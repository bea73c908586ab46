// GGUF (v2 and v3) reader over a memory map. Every length, count and offset in the
// file is checked against the file size before use, and the tensors' data ranges must lie
// inside the file without overlapping, so a truncated or hostile file gives a kivi::Error
// naming the field, never a crash or garbage weights.
//
// Layout (GGUF spec, ggml/docs/gguf.md):
//   u32 magic "GGUF", u32 version, u64 n_tensors, u64 n_kv
//   n_kv x { string key, u32 type, value }
//   n_tensors x { string name, u32 n_dims, u64 dims[n_dims], u32 ggml_type, u64 offset }
//   padding to general.alignment (default 32), then the tensor data section.
// Strings are u64 length + bytes (no terminator). dims[0] is the innermost
// (fastest-varying) dimension: a row-major matrix [rows, cols] has dims {cols, rows}.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/mapped_file.h"
#include "quant/types.h"

namespace kivi::io {

enum class GgufType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};
const char* gguf_type_name(GgufType t);

// ggml tensor types (ids, block sizes and layouts in quant/types.h).
using GgmlType = quant::Type;
// ggml's name of any type id ("Q4_K", "IQ2_XXS"), readable here or not.
std::string ggml_type_name(uint32_t t);

inline constexpr uint32_t kGgufMagic = 0x46554747u;  // "GGUF" little-endian
inline constexpr uint32_t kGgufDefaultAlignment = 32;

// One metadata value. Scalars are widened; strings are copied; arrays keep a view
// into the mapped file and are decoded on request.
struct GgufValue {
  GgufType type = GgufType::kU8;
  uint64_t u = 0;                      // unsigned integers and bool
  int64_t i = 0;                       // signed integers
  double f = 0;                        // floats
  std::string s;                       // strings
  GgufType elem_type = GgufType::kU8;  // arrays
  uint64_t count = 0;                  // arrays
  const uint8_t* elems = nullptr;      // arrays of fixed-size elements; string arrays too
  size_t elems_bytes = 0;
};

// A tensor of a type in quant/types.h has its byte size computed from type and shape
// (dims[0] must be a multiple of the block size), its data checked to lie inside the
// file and not to overlap the next tensor's. A tensor of any other type is listed with
// data == nullptr and n_bytes == 0; loading it is an error naming its type.
struct GgufTensor {
  std::string name;
  std::vector<uint64_t> dims;  // dims[0] innermost
  uint32_t type = 0;           // ggml type id
  uint64_t offset = 0;         // relative to the data section
  const uint8_t* data = nullptr;
  uint64_t n_elements = 0;
  uint64_t n_bytes = 0;
  // The type's table entry, or nullptr if this engine cannot read the type.
  const quant::TypeInfo* type_info() const { return quant::find_type(type); }
};

class GgufFile {
 public:
  // Parses the header, metadata and tensor table of `path`; throws kivi::Error.
  explicit GgufFile(const std::string& path);
  // Parses an in-memory image (used by the fuzzer); `name` appears in errors.
  GgufFile(const uint8_t* data, size_t size, const std::string& name);

  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  const std::string& path() const { return name_; }
  size_t file_size() const { return size_; }

  const std::vector<std::string>& keys() const { return key_order_; }
  bool has(const std::string& key) const { return kv_.count(key) != 0; }
  const GgufValue* find(const std::string& key) const;

  // Typed getters; throw kivi::Error naming the key if missing or of the wrong type.
  std::string get_string(const std::string& key) const;
  uint64_t get_uint(const std::string& key) const;  // any unsigned or non-negative signed
  double get_float(const std::string& key) const;   // f32/f64 (and integers)
  bool get_bool(const std::string& key) const;
  std::optional<uint64_t> get_uint_opt(const std::string& key) const;
  std::optional<double> get_float_opt(const std::string& key) const;
  std::optional<std::string> get_string_opt(const std::string& key) const;
  std::optional<bool> get_bool_opt(const std::string& key) const;
  std::vector<std::string> get_string_array(const std::string& key) const;
  std::vector<float> get_f32_array(const std::string& key) const;
  std::vector<int32_t> get_i32_array(const std::string& key) const;
  uint64_t array_size(const std::string& key) const;

  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  // The file's map; null when parsed from memory.
  MappedFile* mapped() const { return map_.get(); }
  const GgufTensor* find_tensor(const std::string& name) const;

  // A short rendering of a value for `kivi info`.
  std::string describe(const std::string& key) const;

 private:
  void parse();
  std::unique_ptr<MappedFile> map_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string name_;
  uint32_t version_ = 0;
  uint32_t alignment_ = kGgufDefaultAlignment;
  std::map<std::string, GgufValue> kv_;
  std::vector<std::string> key_order_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

// True if the file starts with the GGUF magic.
bool is_gguf_file(const std::string& path);

}  // namespace kivi::io
