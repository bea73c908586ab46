// GGUF v3 writer: metadata first, then tensors, each tensor's data aligned to
// general.alignment (32). Tensor data can come from memory or be generated in
// chunks by a callback, so multi-gigabyte files are written without holding them.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "io/gguf.h"

namespace kivi::io {

class AtomicFile;

class GgufWriter {
 public:
  void add_string(const std::string& key, const std::string& v);
  void add_u32(const std::string& key, uint32_t v);
  void add_i32(const std::string& key, int32_t v);
  void add_u64(const std::string& key, uint64_t v);
  void add_f32(const std::string& key, float v);
  void add_bool(const std::string& key, bool v);
  void add_string_array(const std::string& key, const std::vector<std::string>& v);
  void add_f32_array(const std::string& key, const std::vector<float>& v);
  void add_i32_array(const std::string& key, const std::vector<int32_t>& v);
  // Copies metadata entry `key` of `f` verbatim (any type, arrays included).
  void add_copy(const GgufFile& f, const std::string& key);

  // Fills `dst` with elements [first, first + count) of the tensor (in its own type;
  // first and count are multiples of the type's block size).
  using Generator = std::function<void(uint64_t first, uint64_t count, void* dst)>;

  // dims are GGUF order (dims[0] innermost, a multiple of the type's block size, else
  // kivi::Error). `data` must stay valid until write().
  void add_tensor(const std::string& name, std::vector<uint64_t> dims, GgmlType type,
                  const void* data);
  void add_tensor(const std::string& name, std::vector<uint64_t> dims, GgmlType type,
                  Generator gen);

  // Total file size write() will produce.
  uint64_t file_size() const;

  // Writes the file through a temporary file renamed into place when complete
  // (io/atomic_file.h); throws kivi::Error naming the path if it cannot be written.
  // `on_progress(bytes_written, total)` is called after each chunk if given.
  void write(const std::string& path,
             const std::function<void(uint64_t, uint64_t)>& on_progress = {}) const;
  // Writes the whole file into `out` (opened by the caller, who commits it).
  void write(AtomicFile& out,
             const std::function<void(uint64_t, uint64_t)>& on_progress = {}) const;

 private:
  struct Tensor {
    std::string name;
    std::vector<uint64_t> dims;
    GgmlType type;
    const void* data = nullptr;
    Generator gen;
    uint64_t n_bytes = 0;
  };
  uint64_t header_size() const;
  std::vector<uint8_t> kv_blob_;
  uint64_t n_kv_ = 0;
  std::vector<Tensor> tensors_;
};

}  // namespace kivi::io
