// A read-only memory map of a whole file. Model weights are used straight from the
// map; nothing is copied unless asked (copy_to_memory). The file stays open while mapped,
// so that parts of it can be mapped again elsewhere (a saved KV cache's blocks into a
// cache's buffers). The map starts on a 2 MiB boundary.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kivi::io {

class MappedFile {
 public:
  // Throws kivi::Error naming the path for a missing file, a directory, an empty or
  // unreadable file.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  // Replaces the map's pages, at the same addresses, with a private copy in anonymous
  // memory that the kernel may back with 2 MiB pages (the file's page-cache pages are 4
  // KiB: a TLB miss and a stop of the hardware prefetcher every 4 KiB of a stream). Costs a
  // copy of the file and, while copying, its size again in memory. Returns false, with
  // the map unchanged, when that memory cannot be had (less available than the file and
  // 256 MiB). Idempotent.
  bool copy_to_memory();
  bool copied() const { return copied_; }

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  int fd() const { return fd_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  int fd_ = -1;
  bool copied_ = false;
};

// Throws a kivi::Error if `path` is not a readable regular file; used before
// a reader starts so the message is the same for every format.
void check_regular_file(const std::string& path, const char* what);

}  // namespace kivi::io
