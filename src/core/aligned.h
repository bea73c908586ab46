// Aligned, owned, fixed-size storage. Every buffer a session uses is one of these,
// allocated when the session is created and never resized on the per-token path.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

namespace kivi {

inline constexpr size_t kAlign = 64;  // a cache line; also the widest SIMD vector
// Buffers of at least one huge page are aligned to 2 MiB and their whole 2 MiB pages are
// offered to the kernel as transparent huge pages: long KV caches are streamed every
// step, and huge pages keep TLB misses and page-bounded hardware prefetching out of the
// way (the weights' matrix products sweep the TLB between two layers' attention). The
// size is not rounded up: a tail shorter than 2 MiB stays on small pages, so no memory
// is wasted.
inline constexpr size_t kHugePage = size_t{2} << 20;
// Buffers of at least kMappedMin bytes are anonymous memory maps of their own, aligned to
// a page (4096 bytes) or more: a page-aligned piece of them can then be replaced by a
// private map of a file (map_file), which is how a saved KV cache is loaded without
// copying its blocks. Such a buffer starts zeroed even when `zero` is false, and commits
// memory only as its pages are first written (zeroing it is free). Smaller buffers come
// from the heap.
inline constexpr size_t kPageBytes = 4096;
inline constexpr size_t kMappedMin = size_t{64} << 10;

// An anonymous private map of `bytes` (a whole number of pages) that starts at a multiple
// of `align` (a power of two): more is reserved, then the slack is given back. nullptr
// when the system refuses. Unmap it with munmap(p, bytes).
inline void* map_aligned(size_t bytes, size_t align, int prot) {
  const size_t slack = align > kPageBytes ? align : 0;
  void* m = mmap(nullptr, bytes + slack, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  const uintptr_t a = reinterpret_cast<uintptr_t>(m);
  const uintptr_t start = (a + align - 1) / align * align;
  if (start > a) munmap(m, start - a);
  const uintptr_t end = start + bytes;
  if (a + bytes + slack > end) munmap(reinterpret_cast<void*>(end), a + bytes + slack - end);
  return reinterpret_cast<void*>(start);
}

template <class T>
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t n, bool zero = true) { reset(n, zero); }
  ~AlignedBuffer() { release(); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  AlignedBuffer(AlignedBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)),
        size_(std::exchange(o.size_, 0)),
        map_(std::exchange(o.map_, nullptr)),
        map_bytes_(std::exchange(o.map_bytes_, 0)) {}
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
      map_ = std::exchange(o.map_, nullptr);
      map_bytes_ = std::exchange(o.map_bytes_, 0);
    }
    return *this;
  }

  void reset(size_t n, bool zero = true) {
    release();
    size_ = n;
    if (n == 0) return;
    const size_t align = n * sizeof(T) >= kHugePage ? kHugePage : kAlign;
    const size_t bytes = (n * sizeof(T) + kAlign - 1) / kAlign * kAlign;
    void* p = nullptr;
    if (bytes >= kMappedMin) {
      const size_t pages = (bytes + kPageBytes - 1) / kPageBytes * kPageBytes;
      map_ = map_aligned(pages, align, PROT_READ | PROT_WRITE);
      if (!map_) {
        size_ = 0;
        throw std::bad_alloc();
      }
      map_bytes_ = pages;
      p = map_;
    } else if (posix_memalign(&p, align, bytes) != 0) {
      size_ = 0;
      throw std::bad_alloc();
    }
    data_ = static_cast<T*>(p);
#ifdef MADV_HUGEPAGE
    if (align == kHugePage) madvise(p, bytes / kHugePage * kHugePage, MADV_HUGEPAGE);
#endif
    // A fresh map is zero already: clearing it would only commit its memory.
    if (zero && !map_) std::memset(static_cast<void*>(data_), 0, bytes);
  }

  // Replaces bytes [offset, offset + bytes) of the buffer by a private, copy-on-write map
  // of the same number of bytes of the open file `fd` from `file_offset`: reading them
  // reads the file's pages (shared with the page cache and other processes), writing one
  // copies that page. Returns false, with the buffer unchanged, unless the buffer is a
  // map of its own, offset, file_offset and bytes are whole pages inside it and `fd` is a
  // regular file open for reading that holds all of them (a page past its end would fault
  // when read). Should the system still fail to map (out of memory or of maps), the range
  // holds fresh zeroed memory and false is returned: the caller then copies.
  bool map_file(size_t offset, int fd, uint64_t file_offset, size_t bytes) {
    if (!map_ || bytes == 0 || offset % kPageBytes || file_offset % kPageBytes ||
        bytes % kPageBytes || offset > map_bytes_ || bytes > map_bytes_ - offset)
      return false;
    static const long page = sysconf_page();
    if (page <= 0 || kPageBytes % static_cast<size_t>(page) != 0) return false;
    struct stat st;
    const int flags = fd < 0 ? -1 : fcntl(fd, F_GETFL);
    if (flags < 0 || (flags & O_ACCMODE) == O_WRONLY || fstat(fd, &st) != 0 ||
        !S_ISREG(st.st_mode) || st.st_size < 0 || file_offset > static_cast<uint64_t>(st.st_size) ||
        bytes > static_cast<uint64_t>(st.st_size) - file_offset)
      return false;
    char* at = static_cast<char*>(map_) + offset;
    void* m = mmap(at, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, fd,
                   static_cast<off_t>(file_offset));
    if (m == MAP_FAILED) {
      // A failed MAP_FIXED may have unmapped the range: put fresh memory back. Without
      // it the buffer would have a hole, so that is fatal.
      if (mmap(at, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) ==
          MAP_FAILED)
        throw std::bad_alloc();
      return false;
    }
    return true;
  }
  bool mapped() const { return map_ != nullptr; }

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  size_t bytes() const { return size_ * sizeof(T); }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }
  T* begin() { return data_; }
  T* end() { return data_ + size_; }
  const T* begin() const { return data_; }
  const T* end() const { return data_ + size_; }

 private:
  static long sysconf_page();
  void release() {
    if (map_) {
      munmap(map_, map_bytes_);
    } else {
      std::free(data_);
    }
    data_ = nullptr;
    map_ = nullptr;
    size_ = 0;
    map_bytes_ = 0;
  }

  T* data_ = nullptr;
  size_t size_ = 0;
  void* map_ = nullptr;  // the buffer's own map (data_), or null for heap memory
  size_t map_bytes_ = 0;
};

template <class T>
long AlignedBuffer<T>::sysconf_page() {
  return ::sysconf(_SC_PAGESIZE);
}

}  // namespace kivi
