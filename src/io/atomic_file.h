// Writing output files without ever destroying a file the user has.
//
// AtomicFile writes through a temporary file in the target's folder (".NAME.tmp-XXXXXX")
// and renames it over the target only when commit() has flushed and synced it, so the
// target is either its old self or the complete new file: an error, an exception or a
// crash never leaves a truncated file under the final name. A temporary file that is not
// committed is removed (by abort() or the destructor). A target that is a symlink is
// replaced at the file it points to; an existing target keeps its permission bits. A
// target that exists and is not a regular file (/dev/null, a pipe) is written in place.
//
// check_output_is_not_input refuses an output that is one of the command's inputs: the
// same file (st_dev and st_ino), whatever the name it is given by (a relative or absolute
// path, a hard link or a symlink). Renaming over a model that is still being read would
// not corrupt the read, but it would still replace the user's model with the output.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace kivi::io {

class AtomicFile {
 public:
  // Creates the temporary file beside `path` (which may or may not exist). Throws
  // kivi::Error naming `path` when its folder cannot be written or `path` is a directory.
  explicit AtomicFile(const std::string& path);
  ~AtomicFile();  // removes the temporary file unless committed
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // Appends bytes (buffered). Throws kivi::Error naming the path on a failed write.
  void write(const void* data, size_t n);
  // Flushes, syncs and renames the temporary file over the target. Throws on failure
  // (the temporary file is then removed and the target left as it was).
  void commit();
  // Removes the temporary file; the target is left as it was. Never throws.
  void abort() noexcept;

  const std::string& path() const { return path_; }  // as given (for messages)
  const std::string& temp_path() const { return temp_; }
  size_t bytes_written() const { return written_; }

 private:
  void flush_buffer();
  std::string path_, target_, temp_;
  int fd_ = -1;
  bool done_ = false;
  std::vector<char> buf_;
  size_t used_ = 0, written_ = 0;
};

// Throws kivi::Error if `output` exists and is the same file as one of `inputs` (inputs
// that are empty or do not exist are skipped). `option` names the output in the message,
// e.g. "-o" or "--save-logits".
void check_output_is_not_input(const std::string& output, const std::vector<std::string>& inputs,
                               const char* option);
// Throws kivi::Error if the folder `output` would be written into does not exist or is not
// a folder, so a long computation does not end in a failed write.
void check_output_folder(const std::string& output, const char* option);

}  // namespace kivi::io
