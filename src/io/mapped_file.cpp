#include "io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace kivi::io {

void check_regular_file(const std::string& path, const char* what) {
  struct stat st;
  if (path.empty()) fail("no %s file given", what);
  if (stat(path.c_str(), &st) != 0) {
    fail("cannot open %s file '%s': %s", what, path.c_str(), std::strerror(errno));
  }
  if (S_ISDIR(st.st_mode)) fail("%s file '%s' is a directory, not a file", what, path.c_str());
  if (!S_ISREG(st.st_mode)) fail("%s file '%s' is not a regular file", what, path.c_str());
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  check_regular_file(path, "input");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open '%s': %s", path.c_str(), std::strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    fail("cannot stat '%s': %s", path.c_str(), std::strerror(e));
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ == 0) {
    ::close(fd);
    fail("'%s' is empty (0 bytes)", path.c_str());
  }
  void* p = mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  const int e = errno;
  if (p == MAP_FAILED) {
    ::close(fd);
    fail("cannot map '%s': %s", path.c_str(), std::strerror(e));
  }
  data_ = static_cast<const uint8_t*>(p);
  fd_ = fd;
}

MappedFile::~MappedFile() {
  if (data_) munmap(const_cast<uint8_t*>(data_), size_);
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace kivi::io
