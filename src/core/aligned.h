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
// Buffers of at least this size are aligned to 2 MiB and offered to the kernel as
// transparent huge pages: long KV caches are streamed every step, and huge pages keep
// TLB misses and page-bounded hardware prefetching out of the way.
inline constexpr size_t kHugePage = size_t{2} << 20;
inline constexpr size_t kHugeThreshold = size_t{8} << 20;

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
    const size_t align = n * sizeof(T) >= kHugeThreshold ? kHugePage : kAlign;
    size_t bytes = (n * sizeof(T) + align - 1) / align * align;
    data_ = static_cast<T*>(std::aligned_alloc(align, bytes));
    if (!data_) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
    if (align == kHugePage) madvise(static_cast<void*>(data_), bytes, MADV_HUGEPAGE);
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
