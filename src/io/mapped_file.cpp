#include "io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "core/aligned.h"
#include "core/error.h"
#include "core/sysinfo.h"

namespace kivi::io {
namespace {

// Memory left to the rest of the system beyond a copy of the weights.
constexpr uint64_t kCopyMargin = uint64_t{256} << 20;

size_t page_round(size_t n) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return (n + page - 1) / page * page;
}

}  // namespace

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
  // Map at a 2 MiB boundary (reserve a little more, then map over the aligned part), so
  // that a copy put in its place can use 2 MiB pages from the first byte.
  void* p = MAP_FAILED;
  if (void* at = map_aligned(page_round(size_), kHugePage, PROT_NONE)) {
    p = mmap(at, size_, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0);
    const int e = errno;
    if (p == MAP_FAILED) {
      munmap(at, page_round(size_));
      errno = e;
    }
  }
  if (p == MAP_FAILED) p = mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  const int e = errno;
  if (p == MAP_FAILED) {
    ::close(fd);
    fail("cannot map '%s': %s", path.c_str(), std::strerror(e));
  }
  data_ = static_cast<const uint8_t*>(p);
  fd_ = fd;
}

bool MappedFile::copy_to_memory() {
  if (copied_) return true;
  const size_t len = page_round(size_);
  // The copy is new memory (the file's page cache it replaces is reclaimable, so counted as
  // available): refuse it rather than meet the kernel's out-of-memory killer halfway.
  const uint64_t avail = sys::available_memory_bytes();
  if (avail != 0 && avail < len + kCopyMargin) return false;
  void* tmp = map_aligned(len, kHugePage, PROT_READ | PROT_WRITE);
  if (!tmp) return false;
#ifdef MADV_HUGEPAGE
  madvise(tmp, len, MADV_HUGEPAGE);
#endif
  std::memcpy(tmp, data_, size_);
  mprotect(tmp, len, PROT_READ);  // read-only like the map; a failure leaves it writable
  // Move the copy over the file's map: same addresses, so pointers into it stay valid.
  uint8_t* at = const_cast<uint8_t*>(data_);
  void* q = mremap(tmp, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, at);
  if (q == MAP_FAILED) {
    // The kernel may have unmapped the destination before failing: map the file there
    // again so that every pointer into it stays valid.
    void* again = mmap(at, size_, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd_, 0);
    munmap(tmp, len);
    if (again == MAP_FAILED) fail("cannot map '%s' again: %s", path_.c_str(), std::strerror(errno));
    return false;
  }
  copied_ = true;
  return true;
}

MappedFile::~MappedFile() {
  if (data_) munmap(const_cast<uint8_t*>(data_), size_);
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace kivi::io
