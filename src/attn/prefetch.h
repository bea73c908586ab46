// Software prefetching for an attention task: a fixed distance ahead of the kernels
// over the byte ranges the task reads (its K rows, then its V rows, block by block).
//
// The task lists its ranges in reading order and issues a lead of kPrefetchLead bytes
// when it starts; afterwards every row a kernel consumes issues one row's worth of
// lines further ahead, so the distance stays constant and the misses of the next rows
// overlap with the arithmetic on this one. Plain code (no SIMD): the same for every
// target.
#pragma once

#include <algorithm>
#include <cstddef>

#include <hwy/cache_control.h>
#include <hwy/base.h>

namespace kivi::attn {

inline constexpr size_t kPrefetchLead = 8192;

struct Prefetcher {
  struct Range {
    const char* p;    // next line to prefetch
    const char* end;  // end of the range
    size_t row_bytes;
  };
  static constexpr int kMaxRanges = 64;
  Range ranges[kMaxRanges];
  size_t n_ranges = 0;  // ranges added
  size_t next = 0;      // the range being issued
  size_t credit = 0;    // bytes consumed and not yet matched by prefetched lines

  // Appends a range of `bytes` bytes made of rows of `row_bytes` (beyond kMaxRanges,
  // ranges are not prefetched: correctness never depends on prefetching).
  void add(const void* ptr, size_t bytes, size_t row_bytes) {
    if (n_ranges == static_cast<size_t>(kMaxRanges) || bytes == 0) return;
    const char* c = static_cast<const char*>(ptr);
    ranges[n_ranges++] = Range{c, c + bytes, std::max<size_t>(1, row_bytes)};
  }
  // Issues the prefetches for `rows` consumed rows (defined after PrefetchCursor).
  void step(size_t rows);
  // Issues `bytes` of prefetches ahead of the first row (when a task starts).
  void lead(size_t bytes);
};

// A kernel's view of a Prefetcher whose position lives in locals (registers) for the
// kernel's loop: the cursor is read at construction and written back at destruction,
// so a step is a few register operations and its prefetches, with no load or store of
// the Prefetcher (a loop that loads and stores it per line makes f16 scores ~10%
// slower in cache). Prefetcher::step and lead, called between kernels, use a
// short-lived cursor. One cursor per Prefetcher at a time.
class PrefetchCursor {
 public:
  explicit PrefetchCursor(Prefetcher& pf) : pf_(pf), i_(pf.next), credit_(pf.credit) { Load(); }
  ~PrefetchCursor() {
    pf_.next = i_;
    pf_.credit = credit_;
    if (i_ < pf_.n_ranges) pf_.ranges[i_].p = p_;
  }
  PrefetchCursor(const PrefetchCursor&) = delete;
  PrefetchCursor& operator=(const PrefetchCursor&) = delete;

  // Issues the prefetches for `rows` consumed rows (of the range being issued).
  HWY_INLINE void step(size_t rows) { advance(rows * row_bytes_); }
  // One prefetch per whole line of credit: rows shorter than a line (2-bit codes) carry
  // the remainder over, so the distance ahead stays constant.
  HWY_INLINE void advance(size_t bytes) {
    if (row_bytes_ == 0) return;  // every range issued
    credit_ += bytes;
    const size_t k = credit_ / 64;
    if (k == 0) return;
    if (64 * k >= static_cast<size_t>(end_ - p_)) return Cross();
    for (size_t j = 0; j < k; ++j) hwy::Prefetch(p_ + 64 * j);
    p_ += 64 * k;
    credit_ -= 64 * k;
  }

 private:
  HWY_INLINE void Load() {
    if (i_ < pf_.n_ranges) {
      p_ = pf_.ranges[i_].p;
      end_ = pf_.ranges[i_].end;
      row_bytes_ = pf_.ranges[i_].row_bytes;
    } else {  // every range issued: nothing more to do
      p_ = end_ = nullptr;
      row_bytes_ = 0;
      credit_ = 0;
    }
  }
  // The credit reaches the end of the current range: finish it and go on to the next.
  HWY_INLINE void Cross() {
    while (credit_ >= 64 && row_bytes_ != 0) {
      const size_t left = static_cast<size_t>(end_ - p_ + 63) / 64;
      const size_t k = std::min(credit_ / 64, left);
      for (size_t j = 0; j < k; ++j) hwy::Prefetch(p_ + 64 * j);
      p_ += 64 * k;
      credit_ -= 64 * k;
      if (k == left) {
        ++i_;
        Load();
      }
    }
  }

  Prefetcher& pf_;
  size_t i_;       // the range being issued
  size_t credit_;  // as Prefetcher::credit
  const char* p_;
  const char* end_;
  size_t row_bytes_;
};

inline void Prefetcher::step(size_t rows) { PrefetchCursor(*this).step(rows); }
inline void Prefetcher::lead(size_t bytes) { PrefetchCursor(*this).advance(bytes); }

}  // namespace kivi::attn
