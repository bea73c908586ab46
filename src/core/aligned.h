// Aligned, owned, fixed-size storage. Every buffer a session uses is one of these,
// allocated when the session is created and never resized on the per-token path.
#pragma once

#include <sys/mman.h>

#include <cstddef>
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

template <class T>
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t n, bool zero = true) { reset(n, zero); }
  ~AlignedBuffer() { std::free(data_); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  AlignedBuffer(AlignedBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept {
    if (this != &o) {
      std::free(data_);
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }

  void reset(size_t n, bool zero = true) {
    std::free(data_);
    data_ = nullptr;
    size_ = n;
    if (n == 0) return;
    const size_t align = n * sizeof(T) >= kHugePage ? kHugePage : kAlign;
    const size_t bytes = (n * sizeof(T) + kAlign - 1) / kAlign * kAlign;
    void* p = nullptr;
    if (posix_memalign(&p, align, bytes) != 0) throw std::bad_alloc();
    data_ = static_cast<T*>(p);
#ifdef MADV_HUGEPAGE
    if (align == kHugePage) madvise(p, bytes / kHugePage * kHugePage, MADV_HUGEPAGE);
#endif
    if (zero) std::memset(static_cast<void*>(data_), 0, bytes);
  }

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
  T* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace kivi
