// Decode-attention kernels, compiled for every SIMD target (Highway foreach_target)
// and chosen at run time.
//
// One task is one KV head h and a range of tokens (at most one sequence chunk):
//   1. scores S[r][i] = q_r . k_i for the rep query heads of h  (K read in its format)
//   2. ALiBi bias, then the softmax-state update of (m, d, o)    (Milakov & Gimelshein 2018)
//   3. o_r += sum_i p_r[i] v_i                                  (V read in its format)
// K and V are each read in one sequential pass over the range, tile by tile (stored
// KIVI keys on AVX2/AVX3: group by group, before the tiles).
// f32/f16 rows are read in place, and so are int8 rows with one scale per row and, on
// AVX2/AVX3, KIVI keys (a group of tokens per pass, scores lane-wise) and 2- and 4-bit
// KIVI values (codes converted in registers). Other quantized rows are dequantized a
// tile at a time into an L1-resident staging buffer and consumed at once. Either way the
// bytes read from memory are the compressed ones, and no copy of the history is kept.
//
// KIVI codes pack p = 8/bits channels per byte: byte j of a row of W = D/p bytes holds
// channels j, j + W, ... (kv/codec.h), so shifting a vector of row bytes by bits * k and
// masking gives channels kW + j in order: no shuffles, and everything stays in channel
// order. Key groups interleave their rows in 32-bit words (kv/codec.h; the group
// kernels below).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <type_traits>
#include <utility>

#include "attn/kernels.h"
#include "core/f16.h"
#include "kv/codec.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attn/attention_kernels.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/cache_control.h>
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

#ifndef KIVI_ATTN_KERNELS_ONCE
#define KIVI_ATTN_KERNELS_ONCE
namespace kivi::attn {

// Tokens per tile: a tile's staged K and V rows (2 x 64 x D floats) stay in L1/L2.
inline constexpr int kTile = 64;

// Whether AVX3 runs its 512-bit exact-path kernels for scores (float/f16/int8 rows, KIVI
// keys) and for KIVI values (set_wide_exact_kernels; tests compare with the 256-bit ones).
inline std::atomic<bool> g_wide_scores{true};
inline std::atomic<bool> g_wide_kivi_values{true};


}  // namespace kivi::attn
#endif

HWY_BEFORE_NAMESPACE();
namespace kivi::attn::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// ---------------------------------------------------------------------------------
// Calling a kernel with the widest float tag whose lane count divides `multiple`.

// At most 256-bit vectors. On AVX3 the kernels with whole-head shapes (four heads, head
// size a multiple of 16) choose 512-bit tags themselves: DotRows and AccumRows below,
// the exact KIVI kernels (docs/KERNELS.md).
template <class F>
HWY_INLINE void WithTag(size_t multiple, const F& f) {
  const hn::CappedTag<float, 8> full;
  if (multiple % hn::Lanes(full) == 0) return f(full);
#if HWY_TARGET != HWY_SCALAR
  const hn::CappedTag<float, 8> c8;
  if (hn::Lanes(c8) < hn::Lanes(full) && multiple % hn::Lanes(c8) == 0) return f(c8);
  const hn::CappedTag<float, 4> c4;
  if (hn::Lanes(c4) < hn::Lanes(full) && multiple % hn::Lanes(c4) == 0) return f(c4);
#endif
  const hn::CappedTag<float, 1> c1;
  return f(c1);
}

template <class DF>
HWY_INLINE hn::Vec<DF> LoadRow(DF df, const float* HWY_RESTRICT p) {
  return hn::LoadU(df, p);
}
template <class DF>
HWY_INLINE hn::Vec<DF> LoadRow(DF df, const f16_t* HWY_RESTRICT p) {
  const hn::Rebind<hwy::float16_t, DF> dh;
  return hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p)));
}

template <class DF>
HWY_INLINE hn::Vec<DF> LoadRow(DF df, const int8_t* HWY_RESTRICT p) {
  const hn::Rebind<int32_t, DF> di;
  const hn::Rebind<int8_t, DF> d8;
  return hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(d8, p)));
}

// Sum of all lanes of v.
template <class DF>
HWY_INLINE float SumLanes(DF df, hn::Vec<DF> v) {
  return hn::GetLane(hn::SumOfLanes(df, v));
}

// ---------------------------------------------------------------------------------
// S[h * ld + i] = q_h . row_i   for NH heads and `len` rows (row i at rows + i*stride).

// Software prefetching runs a fixed distance ahead of the kernels over the byte ranges
// a task reads (its K rows, then its V rows, block by block). The task issues a lead of
// kPrefetchLead bytes when it starts; afterwards every row a kernel consumes issues one
// row's worth of lines further ahead, so the distance stays constant and the misses of
// the next rows overlap with the arithmetic on this one.
inline constexpr size_t kPrefetchLead = 8192;

struct Prefetcher {
  struct Range {
    const char* p;
    const char* end;
    size_t row_bytes;
  };
  static constexpr int kMaxRanges = 64;
  Range r[kMaxRanges];
  size_t n = 0, i = 0;  // ranges added; the range being issued
  size_t credit = 0;  // bytes consumed and not yet matched by prefetched lines
  void add(const void* ptr, size_t bytes, size_t row_bytes) {
    if (n == static_cast<size_t>(kMaxRanges) || bytes == 0) return;
    const char* c = static_cast<const char*>(ptr);
    r[n++] = Range{c, c + bytes, std::max<size_t>(1, row_bytes)};
  }
  // Issues the prefetches for `rows` consumed rows (defined after PrefetchCursor).
  void step(size_t rows);
  // Issues `bytes` of prefetches ahead of the first row (when a task starts).
  void lead(size_t bytes);
};

// A kernel's view of a Prefetcher whose position lives in locals (registers) for the
// kernel's loop: the Prefetcher's cursor is read at construction and written back at
// destruction, so a step is a few register operations and its prefetches, with no load
// or store of the cursor (an earlier per-line loop that loaded and stored it made f16
// scores ~10% slower in cache). Prefetcher::step and lead, called between kernels, use a
// short-lived cursor. One cursor per Prefetcher at a time.
class PrefetchCursor {
 public:
  explicit PrefetchCursor(Prefetcher& pf) : pf_(pf), i_(pf.i), credit_(pf.credit) { Load(); }
  ~PrefetchCursor() {
    pf_.i = i_;
    pf_.credit = credit_;
    if (i_ < pf_.n) pf_.r[i_].p = p_;
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
    if (i_ < pf_.n) {
      p_ = pf_.r[i_].p;
      end_ = pf_.r[i_].end;
      row_bytes_ = pf_.r[i_].row_bytes;
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
  size_t i_;
  size_t credit_;
  const char* p_;
  const char* end_;
  size_t row_bytes_;
};

inline void Prefetcher::step(size_t rows) { PrefetchCursor(*this).step(rows); }
inline void Prefetcher::lead(size_t bytes) { PrefetchCursor(*this).advance(bytes); }

#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// Lane i of the result is the sum of the lanes of v[i] (8 vectors of 8 floats).
template <class V>
HWY_INLINE __m256 SumEach8(const V* v) {
  const __m256 h01 = _mm256_hadd_ps(v[0].raw, v[1].raw), h23 = _mm256_hadd_ps(v[2].raw, v[3].raw);
  const __m256 h45 = _mm256_hadd_ps(v[4].raw, v[5].raw), h67 = _mm256_hadd_ps(v[6].raw, v[7].raw);
  const __m256 a = _mm256_hadd_ps(h01, h23), b = _mm256_hadd_ps(h45, h67);
  // a = [s0 s1 s2 s3 (low halves) | s0 s1 s2 s3 (high halves)], b likewise for 4..7
  return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}
#endif

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// The lane sums of 16 vectors of 16 32-bit lanes, added by add(x, y) (float or int32
// lanes, bit patterns in __m512): lane l of the result is the sum of v[4 (l % 4) + l / 4]
// (a 4 x 4 transposition). A tree of 128-bit-block and in-block shuffles: ~2.3
// instructions per sum. Fully unrolled: as loops, GCC kept t, u, w in memory.
template <class Add>
HWY_INLINE __m512 SumTree16(const __m512* v, const Add& add) {
  __m512 t[8], u[4], w[2];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    const __m512 x = v[2 * i], y = v[2 * i + 1];
    t[i] = add(_mm512_shuffle_f32x4(x, y, 0x44), _mm512_shuffle_f32x4(x, y, 0xEE));
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    const __m512 x = t[2 * i], y = t[2 * i + 1];
    u[i] = add(_mm512_shuffle_f32x4(x, y, 0x88), _mm512_shuffle_f32x4(x, y, 0xDD));
  }
#pragma GCC unroll 2
  for (int i = 0; i < 2; ++i) {
    const __m512 x = u[2 * i], y = u[2 * i + 1];
    w[i] = add(_mm512_shuffle_ps(x, y, 0x44), _mm512_shuffle_ps(x, y, 0xEE));
  }
  return add(_mm512_shuffle_ps(w[0], w[1], 0x88), _mm512_shuffle_ps(w[0], w[1], 0xDD));
}

// Lane i of the result is the sum of the lanes of v[i] (16 float vectors): the tree,
// then one permutation into order (a scalar loop here was turned into a scatter, which
// is slow on AMD cores).
HWY_INLINE __m512 SumEach16(const __m512* v) {
  const __m512 r = SumTree16(v, [](__m512 x, __m512 y) { return _mm512_add_ps(x, y); });
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(order, r);
}

// Lane sums of 16 int32 vectors, in the tree's order: lane l is the sum of
// v[4 (l % 4) + l / 4] (StoreScores4x4 takes them in that order).
HWY_INLINE __m512i Sum16(const __m512i* v) {
  __m512 f[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) f[i] = _mm512_castsi512_ps(v[i]);
  return _mm512_castps_si512(SumTree16(f, [](__m512 x, __m512 y) {
    return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(x), _mm512_castps_si512(y)));
  }));
}

// Lanes 4 h + r = v[h]: a per-head factor laid out like Sum16's result for acc[4 r + h].
HWY_INLINE __m512 PerHead16(const float* v) {
  return _mm512_setr_ps(v[0], v[0], v[0], v[0], v[1], v[1], v[1], v[1], v[2], v[2], v[2], v[2], v[3], v[3], v[3], v[3]);
}
// S[h * ld + t + r] = lanes 4 h + r of sums, for the NH heads in use: one 128-bit store
// per head, straight from the register (a 512-bit store read back by 128-bit loads
// stalled store forwarding).
template <int NH>
HWY_INLINE void StoreScores4x4(__m512 sums, float* S, int ld, int t) {
  const size_t l = static_cast<size_t>(ld);
  _mm_storeu_ps(S + t, _mm512_castps512_ps128(sums));
  if constexpr (NH > 1) _mm_storeu_ps(S + l + t, _mm512_extractf32x4_ps(sums, 1));
  if constexpr (NH > 2) _mm_storeu_ps(S + 2 * l + t, _mm512_extractf32x4_ps(sums, 2));
  if constexpr (NH > 3) _mm_storeu_ps(S + 3 * l + t, _mm512_extractf32x4_ps(sums, 3));
}
#endif

// Sums of `n` vectors (n = 8 or 16 on x86; any n elsewhere) into out[0..n).
// A tree of horizontal adds and shuffles costs ~1-3 instructions per sum instead of
// a full lane reduction per vector.
template <class DF>
HWY_INLINE void SumEach(DF df, const hn::Vec<DF>* v, int n, float* HWY_RESTRICT out) {
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if constexpr (hn::MaxLanes(DF()) == 8) {
    if (n % 8 == 0) {
      for (int blk = 0; blk < n; blk += 8, v += 8, out += 8) _mm256_storeu_ps(out, SumEach8(v));
      return;
    }
  }
#endif
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if constexpr (hn::MaxLanes(DF()) == 16) {
    if (n == 16) {
      __m512 raw[16];
      for (int i = 0; i < 16; ++i) raw[i] = v[i].raw;
      _mm512_storeu_ps(out, SumEach16(raw));
      return;
    }
  }
#endif
  for (int i = 0; i < n; ++i) out[i] = SumLanes(df, v[i]);
}

// S[h * ld + i] = q_h . row_i for NH heads and `len` rows, NT rows at a time.
template <int NH, int NT, class DF, class T>
HWY_INLINE void DotRowsN(DF df, const float* HWY_RESTRICT q, int D, const T* HWY_RESTRICT rows,
                         size_t stride, int len, float* HWY_RESTRICT S, int ld, Prefetcher& pf_ranges) {
  PrefetchCursor pf(pf_ranges);
  const size_t N = hn::Lanes(df);
  int i = 0;
  for (; i + NT <= len; i += NT) {
    pf.step(NT);
    hn::Vec<DF> acc[NH * NT];
    #pragma GCC unroll 16
    for (int k = 0; k < NH * NT; ++k) acc[k] = hn::Zero(df);
    for (size_t d = 0; d < static_cast<size_t>(D); d += N) {
      hn::Vec<DF> kv[NT];
      #pragma GCC unroll 16
      for (int t = 0; t < NT; ++t) kv[t] = LoadRow(df, rows + static_cast<size_t>(i + t) * stride + d);
      #pragma GCC unroll 16
      for (int h = 0; h < NH; ++h) {
        const auto qv = hn::LoadU(df, q + static_cast<size_t>(h) * D + d);
        #pragma GCC unroll 16
        for (int t = 0; t < NT; ++t) acc[h * NT + t] = hn::MulAdd(qv, kv[t], acc[h * NT + t]);
      }
    }
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
    if constexpr (NH == 4 && NT == 4 && hn::MaxLanes(DF()) == 16) {
      __m512 raw[16];
      #pragma GCC unroll 16
      for (int k = 0; k < 16; ++k) raw[k] = acc[k].raw;
      StoreScores4x4<4>(SumEach16(raw), S, ld, i);  // lane 4 h + t: head h, row i + t
      continue;
    }
#endif
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
    if constexpr (NH * NT == 8 && (NT == 2 || NT == 4) && hn::MaxLanes(DF()) == 8) {
      // Lanes h NT .. h NT + NT - 1 hold head h's rows: stored straight from the register
      // (an array store read back by narrower loads stalled store forwarding).
      const __m256 sums = SumEach8(acc);
      const __m128 lo = _mm256_castps256_ps128(sums), hi = _mm256_extractf128_ps(sums, 1);
      if constexpr (NT == 4) {
        _mm_storeu_ps(S + i, lo);
        _mm_storeu_ps(S + ld + i, hi);
      } else {
        _mm_storel_pi(reinterpret_cast<__m64*>(S + i), lo);
        _mm_storeh_pi(reinterpret_cast<__m64*>(S + ld + i), lo);
        _mm_storel_pi(reinterpret_cast<__m64*>(S + 2 * static_cast<size_t>(ld) + i), hi);
        _mm_storeh_pi(reinterpret_cast<__m64*>(S + 3 * static_cast<size_t>(ld) + i), hi);
      }
      continue;
    }
#endif
    float sums[NH * NT];
    SumEach(df, acc, NH * NT, sums);
    #pragma GCC unroll 16
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < NT; ++t) S[h * ld + i + t] = sums[h * NT + t];
  }
  for (; i < len; ++i) {
    const T* r0 = rows + static_cast<size_t>(i) * stride;
    for (int h = 0; h < NH; ++h) {
      auto acc = hn::Zero(df);
      for (size_t d = 0; d < static_cast<size_t>(D); d += N) {
        acc = hn::MulAdd(hn::LoadU(df, q + h * D + d), LoadRow(df, r0 + d), acc);
      }
      S[h * ld + i] = SumLanes(df, acc);
    }
  }
}

template <class T>
void DotRows(const float* q, int rep, int D, const T* rows, size_t stride, int len, float* S, int ld,
             Prefetcher& pf) {
#if HWY_TARGET == HWY_AVX3
  // 512-bit vectors, 4 heads x 4 rows (16 accumulators reduced by one shuffle tree):
  // half the FMAs, conversions and query loads of 256-bit vectors. On AMD Zen 5, with two
  // 512-bit FMAs per cycle, f16 scores took ~19% less time in cache.
  if (D % 16 == 0 && rep % 4 == 0 && g_wide_scores.load(std::memory_order_relaxed)) {
    const hn::CappedTag<float, 16> d16;
    for (int r = 0; r < rep; r += 4)
      DotRowsN<4, 4>(d16, q + static_cast<size_t>(r) * D, D, rows, stride, len, S + static_cast<size_t>(r) * ld, ld, pf);
    return;
  }
#endif
  WithTag(static_cast<size_t>(D), [&](auto df) {
    // 4 heads x 4 rows when there are 32 vector registers, 4 x 2 otherwise.
    constexpr int kNT = (HWY_TARGET == HWY_AVX3 || hn::MaxLanes(decltype(df)()) == 16) ? 4 : 2;
    for (int r = 0; r < rep; r += 4) {
      const float* qr = q + static_cast<size_t>(r) * D;
      float* Sr = S + static_cast<size_t>(r) * ld;
      switch (std::min(4, rep - r)) {
        case 1: DotRowsN<1, 8>(df, qr, D, rows, stride, len, Sr, ld, pf); break;
        case 2: DotRowsN<2, 4>(df, qr, D, rows, stride, len, Sr, ld, pf); break;
        case 3: DotRowsN<3, 2>(df, qr, D, rows, stride, len, Sr, ld, pf); break;
        default:
          if constexpr (kNT == 2) {
            // 16 vector registers: two passes of 2 heads x 4 rows load each query vector
            // once per 4 rows (4 heads x 2 rows is bound by the query loads). The second
            // pass reads the rows from L1 and leaves the prefetcher alone.
            Prefetcher none;
            DotRowsN<2, 4>(df, qr, D, rows, stride, len, Sr, ld, pf);
            DotRowsN<2, 4>(df, qr + 2 * static_cast<size_t>(D), D, rows, stride, len, Sr + 2 * static_cast<size_t>(ld), ld, none);
          } else {
            DotRowsN<4, kNT>(df, qr, D, rows, stride, len, Sr, ld, pf);
          }
          break;
      }
    }
  });
}

// ---------------------------------------------------------------------------------
// O_h[0..D) += sum_i P[h * ld + i] * row_i   for NH heads; O_h at O + h * ostride.
// NV vectors of channels per pass, so each broadcast weight feeds NV FMAs and NH * NV
// independent accumulators hide the FMA latency.

template <int NH, int NV, class DF, class T>
HWY_INLINE void AccumRowsN(DF df, const float* HWY_RESTRICT P, int ld, int D, const T* HWY_RESTRICT rows,
                           size_t stride, int len, float* HWY_RESTRICT O, size_t ostride, Prefetcher& pf) {
  const size_t N = hn::Lanes(df);
  size_t d = 0;
  for (; d + NV * N <= static_cast<size_t>(D); d += NV * N) {
    hn::Vec<DF> o[NH][NV];
    #pragma GCC unroll 16
    for (int h = 0; h < NH; ++h)
      #pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) o[h][v] = hn::LoadU(df, O + h * ostride + d + v * N);
    // The first pass over the rows issues their prefetches; the loop is compiled twice so
    // that the others carry no test for it.
    auto pass = [&](auto prefetch) {
      PrefetchCursor pfc(pf);
      const T* r = rows + d;
      const float* Pi = P;
      for (int i = 0; i < len; ++i, r += stride, ++Pi) {
        if constexpr (decltype(prefetch)::value) pfc.step(1);
        hn::Vec<DF> x[NV];
        #pragma GCC unroll 16
        for (int v = 0; v < NV; ++v) x[v] = LoadRow(df, r + v * N);
        #pragma GCC unroll 16
        for (int h = 0; h < NH; ++h) {
          const auto p = hn::Set(df, Pi[h * ld]);
          #pragma GCC unroll 16
          for (int v = 0; v < NV; ++v) o[h][v] = hn::MulAdd(p, x[v], o[h][v]);
        }
      }
    };
    if (d == 0) {
      pass(std::true_type());
    } else {
      pass(std::false_type());
    }
    #pragma GCC unroll 16
    for (int h = 0; h < NH; ++h)
      #pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) hn::StoreU(o[h][v], df, O + h * ostride + d + v * N);
  }
  for (; d < static_cast<size_t>(D); d += N) {  // leftover vectors, one at a time
    hn::Vec<DF> o[NH];
    for (int h = 0; h < NH; ++h) o[h] = hn::LoadU(df, O + h * ostride + d);
    for (int i = 0; i < len; ++i) {
      const auto x = LoadRow(df, rows + static_cast<size_t>(i) * stride + d);
      for (int h = 0; h < NH; ++h) o[h] = hn::MulAdd(hn::Set(df, P[h * ld + i]), x, o[h]);
    }
    for (int h = 0; h < NH; ++h) hn::StoreU(o[h], df, O + h * ostride + d);
  }
}

template <class T>
void AccumRows(const float* P, int ld, int rep, int D, const T* rows, size_t stride, int len, float* O,
               size_t ostride, Prefetcher& pf) {
#if HWY_TARGET == HWY_AVX3
  // 512-bit vectors for the weighted sum of values: 4 heads x 4 vectors x 16 lanes. The
  // FMA rate is the same as with 256 bits on Zen 4, but the f16 conversions, broadcasts and
  // loop overhead per product halve (f16 and int8 ~9% faster in cache there); Zen 5 runs
  // two 512-bit FMAs per cycle.
  if (D % 64 == 0 && rep % 4 == 0) {
    const hn::CappedTag<float, 16> d16;
    for (int r = 0; r < rep; r += 4)
      AccumRowsN<4, 4>(d16, P + static_cast<size_t>(r) * ld, ld, D, rows, stride, len, O + static_cast<size_t>(r) * ostride,
                       ostride, pf);
    return;
  }
#endif
  WithTag(static_cast<size_t>(D), [&](auto df) {
    // 4 vectors per pass with 32 vector registers (16 accumulators), 2 otherwise.
    constexpr int kNV = HWY_TARGET == HWY_AVX3 ? 4 : 2;
    for (int r = 0; r < rep; r += 4) {
      const float* Pr = P + static_cast<size_t>(r) * ld;
      float* Or = O + static_cast<size_t>(r) * ostride;
      switch (std::min(4, rep - r)) {
        case 1: AccumRowsN<1, 4>(df, Pr, ld, D, rows, stride, len, Or, ostride, pf); break;
        case 2: AccumRowsN<2, kNV>(df, Pr, ld, D, rows, stride, len, Or, ostride, pf); break;
        case 3: AccumRowsN<3, 2>(df, Pr, ld, D, rows, stride, len, Or, ostride, pf); break;
        default: AccumRowsN<4, kNV>(df, Pr, ld, D, rows, stride, len, Or, ostride, pf); break;
      }
    }
  });
}

// ---------------------------------------------------------------------------------
// Dequantization of a tile into f32 staging rows out[len][D].

// int8 rows: codes at rows + i*stride (int8), one scale per row (`per_row`), or per
// group of Gc channels (`per_group`, [len][D/Gc] with row stride gstride).
void DequantInt8(const int8_t* rows, size_t stride, int len, int D, const float* row_scale,
                 const float* group_scale, int Gc, size_t gstride, float* out) {
  const size_t need = group_scale ? static_cast<size_t>(std::min(Gc, D)) : static_cast<size_t>(D);
  WithTag(need, [&](auto df) {
    using DF = decltype(df);
    const hn::Rebind<int32_t, DF> di;
    const hn::Rebind<int8_t, DF> d8;
    const size_t N = hn::Lanes(df);
    if (N == 1 && need % 4 != 0) {  // odd shapes: plain loop
      for (int i = 0; i < len; ++i)
        for (int d = 0; d < D; ++d) {
          const float s = group_scale ? group_scale[i * gstride + d / Gc] : row_scale[i];
          out[static_cast<size_t>(i) * D + d] = rows[i * stride + d] * s;
        }
      return;
    }
    for (int i = 0; i < len; ++i) {
      const int8_t* r = rows + static_cast<size_t>(i) * stride;
      float* o = out + static_cast<size_t>(i) * D;
      for (size_t d = 0; d < static_cast<size_t>(D); d += N) {
        const float s = group_scale ? group_scale[i * gstride + d / Gc] : row_scale[i];
        const auto c = hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(d8, r + d)));
        hn::StoreU(hn::Mul(c, hn::Set(df, s)), df, o + d);
      }
    }
  });
}

// KIVI rows. Keys: per-channel scale/zero (D values, the same for all rows of a group).
template <class DF>
HWY_INLINE void DequantKiviRow(DF df, const uint8_t* HWY_RESTRICT row, int D, int bits,
                               const float* HWY_RESTRICT sp, const float* HWY_RESTRICT zp,
                               float* HWY_RESTRICT out) {
  const hn::Rebind<int32_t, DF> di;
  const hn::Rebind<uint8_t, DF> d8;
  const size_t N = hn::Lanes(df);
  const int p = 8 / bits;
  const int W = D / p;  // bytes per row; plane k holds channels kW .. kW + W - 1
  const auto mask = hn::Set(di, (1 << bits) - 1);
  for (size_t j = 0; j < static_cast<size_t>(W); j += N) {
    const auto x = hn::PromoteTo(di, hn::LoadU(d8, row + j));
    for (int k = 0; k < p; ++k) {
      const auto c = hn::ConvertTo(df, hn::And(hn::ShiftRightSame(x, bits * k), mask));
      const size_t pos = static_cast<size_t>(k) * W + j;
      hn::StoreU(hn::MulAdd(c, hn::LoadU(df, sp + pos), hn::LoadU(df, zp + pos)), df, out + pos);
    }
  }
}

// Keys: tokens [i0, i0 + len) of one key group of G interleaved rows (kv/codec.h) at
// `group`, params sp/zp [D]. Each row is gathered back into `row` (W bytes) first.
void DequantKiviKeys(const uint8_t* group, int G, int i0, int len, int D, int bits, const float* sp,
                     const float* zp, float* out) {
  const int W = D * bits / 8;
  alignas(64) uint8_t row[1024 + 64];  // W <= D <= 1024, plus a vector's overhang
  WithTag(static_cast<size_t>(W), [&](auto df) {
    for (int i = 0; i < len; ++i) {
      for (int j = 0; j < W; ++j) row[j] = group[kv::key_group_offset(i0 + i, j, W, G)];
      DequantKiviRow(df, row, D, bits, sp, zp, out + static_cast<size_t>(i) * D);
    }
  });
}

// Values, stored in quads of tokens interleaved by byte (see kv_cache.h): tokens
// [t, t + len) of one block, with `quad` pointing at the quad holding token t and t4 =
// t % 4. Per token i, scale/zero per group g of Gc channels at s[i*gstride + g].
// Channel kW + j lies in group (kW + j) / Gc, so a vector over lanes j.. shares one
// group when its width divides Gc.
void DequantKiviValues(const uint8_t* quad, int t4, int len, int D, int bits, int Gc, const float* s,
                       const float* z, size_t gstride, float* out) {
  const int p = 8 / bits;
  const int W = D / p;  // bytes of one token's packed row
  const int mask = (1 << bits) - 1;
  auto scalar_token = [&](int i) {  // token i of the range, element by element
    const int slot = t4 + i;
    const uint8_t* qd = quad + static_cast<size_t>(slot / 4) * 4 * W + slot % 4;
    float* o = out + static_cast<size_t>(i) * D;
    for (int k = 0, c = 0; k < p; ++k) {
      for (int j = 0; j < W; ++j, ++c) {  // channel c = kW + j is in byte j, bits [bits*k, bits*k + bits)
        const int g = c / Gc;
        o[c] = static_cast<float>((qd[4 * j] >> (bits * k)) & mask) * s[i * gstride + g] + z[i * gstride + g];
      }
    }
  };
  const int unit = std::gcd(Gc, W);
  if (unit < 4) {
    for (int i = 0; i < len; ++i) scalar_token(i);
    return;
  }
  WithTag(static_cast<size_t>(unit), [&](auto df) {
    using DF = decltype(df);
    const hn::Rebind<uint32_t, DF> du;
    const hn::Rebind<int32_t, DF> di;
    const size_t N = hn::Lanes(df);
    const auto mask = hn::Set(du, (1u << bits) - 1);
    int i = 0;
    // Partial quad at the start.
    for (; i < len && (t4 + i) % 4 != 0; ++i) scalar_token(i);
    // Whole quads: one 32-bit lane holds byte j of the four tokens.
    for (; i + 4 <= len; i += 4) {
      const uint8_t* qd = quad + static_cast<size_t>((t4 + i) / 4) * 4 * W;
      for (size_t j = 0; j < static_cast<size_t>(W); j += N) {
        const auto x = hn::LoadU(du, reinterpret_cast<const uint32_t*>(qd + 4 * j));
        for (int k = 0; k < p; ++k) {
          const size_t c0 = static_cast<size_t>(k) * W + j;  // first channel of these lanes
          const size_t g = c0 / Gc;
          for (int b = 0; b < 4; ++b) {
            const auto sv = hn::Set(df, s[(i + b) * gstride + g]), zv = hn::Set(df, z[(i + b) * gstride + g]);
            const auto c = hn::And(hn::ShiftRightSame(x, 8 * b + bits * k), mask);
            hn::StoreU(hn::MulAdd(hn::ConvertTo(df, hn::BitCast(di, c)), sv, zv), df,
                       out + static_cast<size_t>(i + b) * D + c0);
          }
        }
      }
    }
    for (; i < len; ++i) scalar_token(i);
  });
}

// ---------------------------------------------------------------------------------
// Exact path without staging for KIVI rows (AVX2/AVX3).

#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3
// Horizontal max and sum of 8 floats.
HWY_INLINE float HMax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}
HWY_INLINE float HSum(__m256 v) {
  __m128 m = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_add_ps(m, _mm_movehl_ps(m, m));
  m = _mm_add_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

// Exact KIVI values without staging (2- and 4-bit codes). 2-bit: per token and channel
// group the four values a code can take, s c + z, sit in a lookup table (the FMA
// DequantKiviValues uses) and vpermilps maps the shifted codes of a quad straight to
// dequantized values; 4-bit: the codes are masked, converted and scaled (s c + z) in
// registers. Either way the dequantized values meet the softmax weights as AccumRows
// would meet a staged tile: the same products, added in the same order, so the result
// is bit for bit that of dequantize-then-accumulate. Two planes (2-bit) or both planes
// (4-bit) per pass keep 2 x NH accumulators. Whole quads only (t4 = 0, n % 4 == 0);
// W % 8 == 0 and Gc % 8 == 0. lut (2-bit): n * NG * 8 floats.
template <int NH, int BITS>
HWY_INLINE void AccumKiviExactN(const float* P, int ld, int D, int Gc, const uint8_t* quad0, int n, const float* lut,
                                const float* s, const float* z, float* O, size_t ostride) {
  constexpr int p = 8 / BITS;
  const int W = D / p, NG = D / Gc;
  const __m256i mask = _mm256_set1_epi32((1 << BITS) - 1);
  for (int j = 0; j < W; j += 8) {
    for (int k = 0; k < p; k += 2) {
      const int c0 = k * W + j, c1 = c0 + W;  // channels of planes k and k + 1
      const int g0 = c0 / Gc, g1 = c1 / Gc;
      __m256 o0[NH], o1[NH];
#pragma GCC unroll 4
      for (int h = 0; h < NH; ++h) {
        o0[h] = _mm256_loadu_ps(O + h * ostride + c0);
        o1[h] = _mm256_loadu_ps(O + h * ostride + c1);
      }
      const uint8_t* src = quad0 + 4 * j;
      for (int t = 0; t < n; t += 4, src += 4 * W) {
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
#pragma GCC unroll 4
        for (int b = 0; b < 4; ++b) {
          const int sh = 8 * b + BITS * k;
          __m256 v0, v1;
          if constexpr (BITS == 2) {
            const float* lt = lut + static_cast<size_t>(t + b) * NG * 8;
            v0 = _mm256_permutevar_ps(_mm256_loadu_ps(lt + g0 * 8), sh == 0 ? x : _mm256_srli_epi32(x, sh));
            v1 = _mm256_permutevar_ps(_mm256_loadu_ps(lt + g1 * 8), _mm256_srli_epi32(x, sh + 2));
          } else {
            const float* st = s + static_cast<size_t>(t + b) * NG;
            const float* zt = z + static_cast<size_t>(t + b) * NG;
            const __m256 a0 = _mm256_cvtepi32_ps(_mm256_and_si256(sh == 0 ? x : _mm256_srli_epi32(x, sh), mask));
            const __m256 a1 = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(x, sh + BITS), mask));
            v0 = _mm256_fmadd_ps(a0, _mm256_broadcast_ss(st + g0), _mm256_broadcast_ss(zt + g0));
            v1 = _mm256_fmadd_ps(a1, _mm256_broadcast_ss(st + g1), _mm256_broadcast_ss(zt + g1));
          }
#pragma GCC unroll 4
          for (int h = 0; h < NH; ++h) {
            const __m256 pw = _mm256_broadcast_ss(P + static_cast<size_t>(h) * ld + t + b);
            o0[h] = _mm256_fmadd_ps(pw, v0, o0[h]);
            o1[h] = _mm256_fmadd_ps(pw, v1, o1[h]);
          }
        }
      }
#pragma GCC unroll 4
      for (int h = 0; h < NH; ++h) {
        _mm256_storeu_ps(O + h * ostride + c0, o0[h]);
        _mm256_storeu_ps(O + h * ostride + c1, o1[h]);
      }
    }
  }
}

#if HWY_TARGET == HWY_AVX3
// AccumKiviExactN with 512-bit vectors (16 channels per vector, W % 16 == 0, Gc % 16 ==
// 0) and every plane of a byte column in one pass (NH x 8/BITS accumulators, at most 16),
// so each code vector is loaded once. Per channel the products and their order are those
// of AccumKiviExactN: bit for bit the same result. The 2-bit table of a token and group
// (s c + z for c = 0..3) is broadcast to every 128-bit block, where vpermilps looks up.
template <int NH, int BITS>
HWY_INLINE void AccumKiviExact512N(const float* P, int ld, int D, int Gc, const uint8_t* quad0, int n,
                                   const float* lut, const float* s, const float* z, float* O, size_t ostride) {
  constexpr int p = 8 / BITS;
  const int W = D / p, NG = D / Gc;
  const __m512i mask = _mm512_set1_epi32((1 << BITS) - 1);
  for (int j = 0; j < W; j += 16) {
    int g[p];
    __m512 o[p][NH];
#pragma GCC unroll 4
    for (int k = 0; k < p; ++k) {
      g[k] = (k * W + j) / Gc;
#pragma GCC unroll 4
      for (int h = 0; h < NH; ++h) o[k][h] = _mm512_loadu_ps(O + h * ostride + k * W + j);
    }
    const uint8_t* src = quad0 + 4 * j;
    for (int t = 0; t < n; t += 4, src += 4 * W) {
      const __m512i x = _mm512_loadu_si512(src);
#pragma GCC unroll 4
      for (int b = 0; b < 4; ++b) {
        __m512 v[p];
#pragma GCC unroll 4
        for (int k = 0; k < p; ++k) {
          const int sh = 8 * b + BITS * k;
          const __m512i xs = sh == 0 ? x : _mm512_srli_epi32(x, static_cast<unsigned>(sh));
          if constexpr (BITS == 2) {
            const float* lt = lut + static_cast<size_t>(t + b) * NG * 8;
            v[k] = _mm512_permutevar_ps(_mm512_broadcast_f32x4(_mm_loadu_ps(lt + g[k] * 8)), xs);
          } else {
            const size_t pi = static_cast<size_t>(t + b) * NG + g[k];
            v[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(xs, mask)), _mm512_set1_ps(s[pi]),
                                   _mm512_set1_ps(z[pi]));
          }
        }
#pragma GCC unroll 4
        for (int h = 0; h < NH; ++h) {
          const __m512 pw = _mm512_set1_ps(P[static_cast<size_t>(h) * ld + t + b]);
#pragma GCC unroll 4
          for (int k = 0; k < p; ++k) o[k][h] = _mm512_fmadd_ps(pw, v[k], o[k][h]);
        }
      }
    }
#pragma GCC unroll 4
    for (int k = 0; k < p; ++k)
#pragma GCC unroll 4
      for (int h = 0; h < NH; ++h) _mm512_storeu_ps(O + h * ostride + k * W + j, o[k][h]);
  }
}
#endif

bool ExactKiviValuesOk(int D, int bits, int Gc, int t4, int n) {
  return (bits == 2 || bits == 4) && t4 == 0 && n % 4 == 0 && (D * bits / 8) % 8 == 0 && Gc % 8 == 0;
}

// vs, vz: [n][NG] (gstride == NG).
void AccumKiviExact(const float* P, int ld, int rep, int D, int bits, int Gc, const uint8_t* quad0, int n,
                    const float* s, const float* z, float* O, size_t ostride, float* lut) {
  const int NG = D / Gc;
  if (bits == 2) {
    // lut[8 e + j] = (j % 4) s[e] + z[e] for the n NG (token, group) entries e.
    const int ne = n * NG;
    int e = 0;
#if HWY_TARGET == HWY_AVX3
    // 16 entries per pair of loads; each store covers two entries.
    const __m512 c8 = _mm512_setr_ps(0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3);
    for (; e + 16 <= ne; e += 16) {
      const __m512 sv = _mm512_loadu_ps(s + e), zv = _mm512_loadu_ps(z + e);
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) {
        const __m512i idx = _mm512_setr_epi32(2 * k, 2 * k, 2 * k, 2 * k, 2 * k, 2 * k, 2 * k, 2 * k, 2 * k + 1, 2 * k + 1,
                                              2 * k + 1, 2 * k + 1, 2 * k + 1, 2 * k + 1, 2 * k + 1, 2 * k + 1);
        _mm512_storeu_ps(lut + static_cast<size_t>(e + 2 * k) * 8,
                         _mm512_fmadd_ps(c8, _mm512_permutexvar_ps(idx, sv), _mm512_permutexvar_ps(idx, zv)));
      }
    }
#endif
    const __m256 c4 = _mm256_setr_ps(0.0f, 1.0f, 2.0f, 3.0f, 0.0f, 1.0f, 2.0f, 3.0f);
    for (; e < ne; ++e) {
      _mm256_storeu_ps(lut + static_cast<size_t>(e) * 8, _mm256_fmadd_ps(c4, _mm256_set1_ps(s[e]), _mm256_set1_ps(z[e])));
    }
  }
  auto run = [&](auto bits_c) {
    constexpr int BITS = decltype(bits_c)::value;
#if HWY_TARGET == HWY_AVX3
    if ((D * BITS / 8) % 16 == 0 && Gc % 16 == 0 && rep % 4 == 0 && g_wide_kivi_values.load(std::memory_order_relaxed)) {
      for (int r = 0; r < rep; r += 4)
        AccumKiviExact512N<4, BITS>(P + static_cast<size_t>(r) * ld, ld, D, Gc, quad0, n, lut, s, z,
                                    O + static_cast<size_t>(r) * ostride, ostride);
      return;
    }
#endif
    for (int r = 0; r < rep; r += 4) {
      const float* Pr = P + static_cast<size_t>(r) * ld;
      float* Or = O + static_cast<size_t>(r) * ostride;
      switch (std::min(4, rep - r)) {
        case 1: AccumKiviExactN<1, BITS>(Pr, ld, D, Gc, quad0, n, lut, s, z, Or, ostride); break;
        case 2: AccumKiviExactN<2, BITS>(Pr, ld, D, Gc, quad0, n, lut, s, z, Or, ostride); break;
        case 3: AccumKiviExactN<3, BITS>(Pr, ld, D, Gc, quad0, n, lut, s, z, Or, ostride); break;
        default: AccumKiviExactN<4, BITS>(Pr, ld, D, Gc, quad0, n, lut, s, z, Or, ostride); break;
      }
    }
  };
  if (bits == 2) {
    run(std::integral_constant<int, 2>());
  } else {
    run(std::integral_constant<int, 4>());
  }
}

#endif

// ---------------------------------------------------------------------------------
// exp(x) for x <= 0 (scores minus their maximum), without the range handling a general
// exp needs: n = round(x log2 e), f = x - n ln 2 (ln 2 in two parts, so f is exact to
// a few ulp) in [-ln2/2, ln2/2], e^f by its degree-6 Taylor polynomial (remainder below
// |f|^7 / 7! = 1.2e-7 relative), and 2^n added to the exponent bits. x below -87.3
// (e^x under the smallest normal float), and -inf, give 0. Measured against a double
// exp by test_attn (ExpOfNonPositive): within 3 ulp. About 15 operations per vector
// against hwy::Exp's 40; the softmax was 8-13% of a call in cache before.
template <class DF>
HWY_INLINE hn::Vec<DF> ExpNonPositive(DF df, hn::Vec<DF> x) {
  const hn::RebindToSigned<DF> di;
  const auto n = hn::Round(hn::Mul(x, hn::Set(df, 1.44269504088896341f)));
  auto f = hn::NegMulAdd(n, hn::Set(df, 0.693145751953125f), x);  // ln 2 = 0.693145751953125 + 1.42860677e-6
  f = hn::NegMulAdd(n, hn::Set(df, 1.428606765330187e-6f), f);
  auto p = hn::MulAdd(f, hn::Set(df, 1.0f / 720), hn::Set(df, 1.0f / 120));
  p = hn::MulAdd(p, f, hn::Set(df, 1.0f / 24));
  p = hn::MulAdd(p, f, hn::Set(df, 1.0f / 6));
  p = hn::MulAdd(p, f, hn::Set(df, 0.5f));
  p = hn::MulAdd(p, f, hn::Set(df, 1.0f));
  p = hn::MulAdd(p, f, hn::Set(df, 1.0f));
  // Scale by 2^n (n >= -126 wherever the result is kept): add n to the exponent field.
  const auto e = hn::ShiftLeft<23>(hn::ConvertTo(di, hn::Max(n, hn::Set(df, -126.0f))));
  const auto r = hn::BitCast(df, hn::Add(hn::BitCast(di, p), e));
  return hn::IfThenZeroElse(hn::Lt(x, hn::Set(df, -87.3f)), r);
}

void ExpNonPositiveArray(const float* x, float* y, int n) {
  const hn::ScalableTag<float> df;
  const int N = static_cast<int>(hn::Lanes(df));
  int i = 0;
  for (; i + N <= n; i += N) hn::StoreU(ExpNonPositive(df, hn::LoadU(df, x + i)), df, y + i);
  if (i < n) {
    HWY_ALIGN float buf[hn::MaxLanes(df)];
    std::fill(buf, buf + N, 0.0f);
    std::copy(x + i, x + n, buf);
    hn::Store(ExpNonPositive(df, hn::Load(df, buf)), df, buf);
    std::copy(buf, buf + (n - i), y + i);
  }
}

// ---------------------------------------------------------------------------------
// Online softmax over one tile: S[h][0..len) -> exp(S - m_new); d, o rescaled.

void SoftmaxUpdate(float* S, int ld, int rep, int len, int D, float* out, int out_stride) {
  const hn::ScalableTag<float> df;
  const size_t N = hn::Lanes(df);
  for (int h = 0; h < rep; ++h) {
    float* s = S + static_cast<size_t>(h) * ld;
    float* o = out + static_cast<size_t>(h) * out_stride;
    float mx = o[D];
    {
      auto mv4 = hn::Set(df, mx);
      int i = 0;
      for (; i + static_cast<int>(N) <= len; i += static_cast<int>(N)) mv4 = hn::Max(mv4, hn::LoadU(df, s + i));
      mx = hn::GetLane(hn::MaxOfLanes(df, mv4));
      for (; i < len; ++i) mx = std::max(mx, s[i]);
    }
    const float corr = std::exp(o[D] - mx);  // 0 when the state is empty (m = -inf)
    const auto mv = hn::Set(df, mx);
    auto sum = hn::Zero(df);
    int i = 0;
    for (; i + static_cast<int>(N) <= len; i += static_cast<int>(N)) {
      const auto e = ExpNonPositive(df, hn::Sub(hn::LoadU(df, s + i), mv));
      hn::StoreU(e, df, s + i);
      sum = hn::Add(sum, e);
    }
    if (i < len) {  // the last len % N scores, padded with -inf (exp 0)
      HWY_ALIGN float buf[hn::MaxLanes(df)];
      std::fill(buf, buf + N, -std::numeric_limits<float>::infinity());
      std::copy(s + i, s + len, buf);
      const auto e = ExpNonPositive(df, hn::Sub(hn::Load(df, buf), mv));
      hn::Store(e, df, buf);
      std::copy(buf, buf + (len - i), s + i);
      sum = hn::Add(sum, e);
    }
    const float total = SumLanes(df, sum);
    if (corr != 1.0f) {
      const auto cv = hn::Set(df, corr);
      int d = 0;
      for (; d + static_cast<int>(N) <= D; d += static_cast<int>(N)) hn::StoreU(hn::Mul(hn::LoadU(df, o + d), cv), df, o + d);
      for (; d < D; ++d) o[d] *= corr;
    }
    o[D] = mx;
    o[D + 1] = o[D + 1] * corr + total;
  }
}

// ---------------------------------------------------------------------------------
// Fast path (--attn-precision fast): integer dot products on x86.
//
// Keys: the query, with the group's per-channel scales folded in (q . (s * c + z) =
// (q * s) . c + q . z, KIVI keys) or as is (int8 keys), is rounded to int16 per head
// and group (relative rounding 2^-16 of its largest element; int8 rounding, as in
// llama.cpp's q8 dot products, proved too coarse next to outlier channels), and
// multiplied with the codes widened to int16 by vpdpwssd (AVX512-VNNI) or vpmaddwd.
// Values: per tile, head and channel group the weights p * s are rounded to int16 and
// the weighted sum over tokens runs on the codes stored in quads (four tokens' codes of
// one channel in one 32-bit lane), widened to int16, again with vpdpwssd / vpmaddwd
// (8-bit weights with vpdpbusd were measured and rejected: docs/KERNELS.md).
// The rounding of the query and of the weights is the only approximation; its effect
// is measured in docs/KERNELS.md.

#undef KIVI_FAST_INT
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3
#define KIVI_FAST_INT 1

// AVX512-VNNI is used when the CPU has it (checked at run time). It is compiled into
// separate functions with their own target attribute (AVX3 plus avx512vnni): Highway's
// AVX3_DL target also enables AVX-VNNI, whose VEX encoding of the same instructions
// faults on CPUs (AMD Zen 4) that have only the EVEX form. Clang checks intrinsics
// against the function they are written in rather than where they are inlined, so clang
// builds use the AVX2 instruction sequence instead.
#undef KIVI_VNNI
#undef KIVI_VNNI_ATTR
#if HWY_TARGET == HWY_AVX3 && !defined(__clang__)
#define KIVI_VNNI 1
#define KIVI_VNNI_ATTR __attribute__((target(HWY_TARGET_STR ",avx512vnni")))
inline bool HasVnni() {
  static const bool has = __builtin_cpu_supports("avx512vnni");
  return has;
}
#else
inline bool HasVnni() { return false; }
#endif

// The four lane sums of a0..a3, as floats.
HWY_INLINE __m128 SumsOf4(__m256i a0, __m256i a1, __m256i a2, __m256i a3) {
  const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(a0, a1), _mm256_hadd_epi32(a2, a3));
  return _mm_cvtepi32_ps(_mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
}

// Rounds x[0..D) to int16 (|q| <= 32767); returns the scale of the codes. D is a
// multiple of 8.
HWY_INLINE float QuantizeQuery16(const float* x, int D, int16_t* q) {
  __m256 amax = _mm256_setzero_ps();
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int d = 0; d < D; d += 8) {
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + d)));
  }
  const float m = HMax(amax);
  if (m == 0.0f) {
    std::fill(q, q + D, int16_t{0});
    return 0.0f;
  }
  const __m256 inv = _mm256_set1_ps(32767.0f / m);
  for (int d = 0; d < D; d += 8) {
    const __m256i q32 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + d), inv));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + d),
                     _mm_packs_epi32(_mm256_castsi256_si128(q32), _mm256_extracti128_si256(q32, 1)));
  }
  return m / 32767.0f;
}

// acc += pairwise int16 products (vpdpwssd with VNNI, else vpmaddwd + vpaddd).
// vpdpwssd is issued by inline asm with the accumulator tied to its register ("+v"):
// with GCC's builtin (or intrinsic) the register allocator copied every accumulator
// before and after the instruction in the value loops (two vmovdqa per product). The
// {evex} prefix keeps the AVX512-VNNI encoding (the VEX one, AVX-VNNI, faults on CPUs
// without it, e.g. AMD Zen 4); the kVnni functions run only where HasVnni() holds.
template <bool kVnni>
HWY_INLINE __m256i DotI16(__m256i acc, __m256i a, __m256i b) {
#ifdef KIVI_VNNI
  if constexpr (kVnni) {
    asm("%{evex%} vpdpwssd {%2, %1, %0|%0, %1, %2}" : "+v"(acc) : "v"(a), "vm"(b));
    return acc;
  }
#endif
  return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
}



#if HWY_TARGET == HWY_AVX3
// 512-bit integer helpers (AVX3 only). DotI16x32: as DotI16, 32 products per vector.
template <bool kVnni>
HWY_INLINE __m512i DotI16x32(__m512i acc, __m512i a, __m512i b) {
#ifdef KIVI_VNNI
  if constexpr (kVnni) {
    asm("%{evex%} vpdpwssd {%2, %1, %0|%0, %1, %2}" : "+v"(acc) : "v"(a), "vm"(b));
    return acc;
  }
#endif
  return _mm512_add_epi32(acc, _mm512_madd_epi16(a, b));
}
// The four-row loop of the 512-bit int8 key kernel: for rows t..t+3 it keeps 16
// accumulators acc[4 * row + head] over the rows' D channels, 32 at a time. load(row, c)
// widens 32 codes of a row to int16, qload(head, c) loads 32 channels of a head's query;
// finish(acc, t) reduces and stores. Returns the first row not covered (n rounded down
// to a multiple of 4).
template <int NH, bool kVnni, class PF, class Load, class QLoad, class Finish>
HWY_INLINE int FourRowDots512(int n, int D, PF& pf, const Load& load, const QLoad& qload, const Finish& finish) {
  int t = 0;
  for (; t + 4 <= n; t += 4) {
    pf.step(4);
    __m512i acc[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int c = 0; c < D; c += 32) {
      __m512i x[4];
#pragma GCC unroll 4
      for (int rr = 0; rr < 4; ++rr) x[rr] = load(t + rr, c);
      __m512i qv[4];  // loaded once for the four rows (one 512-bit load per cycle)
#pragma GCC unroll 4
      for (int hh = 0; hh < NH; ++hh) qv[hh] = qload(hh, c);
#pragma GCC unroll 4
      for (int rr = 0; rr < 4; ++rr) {
#pragma GCC unroll 4
        for (int hh = 0; hh < NH; ++hh) acc[4 * rr + hh] = DotI16x32<kVnni>(acc[4 * rr + hh], x[rr], qv[hh]);
      }
    }
    finish(acc, t);
  }
  return t;
}

// QuantizeQuery16 for the KIVI keys of NH heads with 512-bit vectors (D a multiple of
// 32): rounds x_h * mul to int16 in q + h D, sets qsc[h] to the scale of the codes and
// bias[h] = x_h . zero. The heads share the loads of mul and zero, and their maxima and
// sums are independent chains.
template <int NH>
HWY_INLINE void QuantizeKeyQuery512(const float* x, const float* mul, const float* zero, int D, int16_t* q,
                                    float* qsc, float* bias) {
  __m512 amax[NH], b[NH];
#pragma GCC unroll 4
  for (int hh = 0; hh < NH; ++hh) amax[hh] = b[hh] = _mm512_setzero_ps();
  for (int d = 0; d < D; d += 16) {
    const __m512 mv = _mm512_loadu_ps(mul + d), zv = _mm512_loadu_ps(zero + d);
#pragma GCC unroll 4
    for (int hh = 0; hh < NH; ++hh) {
      const __m512 xv = _mm512_loadu_ps(x + static_cast<size_t>(hh) * D + d);
      amax[hh] = _mm512_max_ps(amax[hh], _mm512_abs_ps(_mm512_mul_ps(xv, mv)));
      b[hh] = _mm512_fmadd_ps(xv, zv, b[hh]);
    }
  }
  float inv[NH];
#pragma GCC unroll 4
  for (int hh = 0; hh < NH; ++hh) {
    bias[hh] = _mm512_reduce_add_ps(b[hh]);
    const float m = _mm512_reduce_max_ps(amax[hh]);
    qsc[hh] = m / 32767.0f;
    inv[hh] = m > 0.0f ? 32767.0f / m : 0.0f;  // all-zero products round to zero codes
  }
  for (int d = 0; d < D; d += 32) {
    const __m512 m0 = _mm512_loadu_ps(mul + d), m1 = _mm512_loadu_ps(mul + d + 16);
#pragma GCC unroll 4
    for (int hh = 0; hh < NH; ++hh) {
      const float* xh = x + static_cast<size_t>(hh) * D + d;
      const __m512 iv = _mm512_set1_ps(inv[hh]);
      const __m512i lo = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(xh), m0), iv));
      const __m512i hi = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(xh + 16), m1), iv));
      int16_t* qh = q + static_cast<size_t>(hh) * D + d;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(qh), _mm512_cvtsepi32_epi16(lo));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(qh + 16), _mm512_cvtsepi32_epi16(hi));
    }
  }
}

#endif  // HWY_AVX3

// int8 keys (one scale per row, rs[i]); the query q16 and its scale per head are
// prepared once per task.
template <int NH, bool kVnni>
HWY_INLINE void FastInt8KeysN(const int16_t* q16, const float* qsc, int D, const int8_t* rows, size_t stride, int n,
                              const float* rs, float* S, int ld, Prefetcher& pf_ranges) {
  PrefetchCursor pf(pf_ranges);
  for (int t = 0; t < n; ++t) {
    pf.step(1);
    __m256i acc[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
    const int8_t* row = rows + static_cast<size_t>(t) * stride;
    for (int c = 0; c < D; c += 16) {
      const __m256i x = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + c)));
#pragma GCC unroll 4
      for (int hh = 0; hh < NH; ++hh) {
        acc[hh] = DotI16<kVnni>(acc[hh], x, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q16 + hh * D + c)));
      }
    }
    alignas(16) float out[4];
    _mm_store_ps(out, _mm_mul_ps(_mm_mul_ps(SumsOf4(acc[0], acc[1], acc[2], acc[3]), _mm_loadu_ps(qsc)),
                                 _mm_set1_ps(rs[t])));
    for (int hh = 0; hh < NH; ++hh) S[hh * ld + t] = out[hh];
  }
}

#if HWY_TARGET == HWY_AVX3
// FastInt8KeysN with 512-bit vectors, four rows at a time (D a multiple of 32): each
// row widens to int16 32 channels per instruction; Sum16 reduces the 16 sums at once.
template <int NH, bool kVnni, int kD>
HWY_INLINE void FastInt8Keys512N(const int16_t* q16, const float* qsc, int D_, const int8_t* rows, size_t stride,
                                 int n, const float* rs, float* S, int ld, Prefetcher& pf) {
  const int D = kD > 0 ? kD : D_;
  float qs[4] = {0, 0, 0, 0};
  for (int hh = 0; hh < NH; ++hh) qs[hh] = qsc[hh];
  const __m512 qsc16 = PerHead16(qs);
  auto qload = [&](int hh, int c) { return _mm512_loadu_si512(q16 + static_cast<size_t>(hh) * D + c); };
  auto load = [&](int row, int c) {
    return _mm512_cvtepi8_epi16(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows + static_cast<size_t>(row) * stride + c)));
  };
  // Lanes 4 * head + row: times the head's query scale and the row's scale.
  int t;
  {
    PrefetchCursor pc(pf);  // released before the tail's own cursor
    t = FourRowDots512<NH, kVnni>(
        n, D, pc, load, qload, [&](const __m512i* acc, int t0) __attribute__((always_inline)) {
          StoreScores4x4<NH>(_mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(Sum16(acc)), qsc16),
                                           _mm512_broadcast_f32x4(_mm_loadu_ps(rs + t0))),
                             S, ld, t0);
        });
  }
  if (t < n) FastInt8KeysN<NH, kVnni>(q16, qsc, D, rows + static_cast<size_t>(t) * stride, stride, n - t, rs + t, S + t, ld, pf);
}
#endif

template <bool kVnni>
HWY_INLINE void FastInt8KeysT(const int16_t* q16, const float* qsc, int rep, int D, const int8_t* rows, size_t stride,
                              int n, const float* rs, float* S, int ld, Prefetcher& pf) {
  for (int r = 0; r < rep; r += 4) {
    const int16_t* qr = q16 + static_cast<size_t>(r) * D;
    float* Sr = S + static_cast<size_t>(r) * ld;
#if HWY_TARGET == HWY_AVX3
    if (D % 32 == 0) {
      switch (std::min(4, rep - r)) {
        case 1: FastInt8Keys512N<1, kVnni, 0>(qr, qsc + r, D, rows, stride, n, rs, Sr, ld, pf); break;
        case 2: FastInt8Keys512N<2, kVnni, 0>(qr, qsc + r, D, rows, stride, n, rs, Sr, ld, pf); break;
        case 3: FastInt8Keys512N<3, kVnni, 0>(qr, qsc + r, D, rows, stride, n, rs, Sr, ld, pf); break;
        default:
          if (D == 128) {
            FastInt8Keys512N<4, kVnni, 128>(qr, qsc + r, D, rows, stride, n, rs, Sr, ld, pf);
          } else {
            FastInt8Keys512N<4, kVnni, 0>(qr, qsc + r, D, rows, stride, n, rs, Sr, ld, pf);
          }
          break;
      }
      continue;
    }
#endif
    switch (std::min(4, rep - r)) {
      case 1: FastInt8KeysN<1, kVnni>(qr, qsc + r, D, rows, stride, n, rs, Sr, ld, pf); break;
      case 2: FastInt8KeysN<2, kVnni>(qr, qsc + r, D, rows, stride, n, rs, Sr, ld, pf); break;
      case 3: FastInt8KeysN<3, kVnni>(qr, qsc + r, D, rows, stride, n, rs, Sr, ld, pf); break;
      default: FastInt8KeysN<4, kVnni>(qr, qsc + r, D, rows, stride, n, rs, Sr, ld, pf); break;
    }
  }
}

#ifdef KIVI_VNNI
KIVI_VNNI_ATTR HWY_NOINLINE void FastInt8KeysVnni(const int16_t* q16, const float* qsc, int rep, int D,
                                                   const int8_t* rows, size_t stride, int n, const float* rs, float* S,
                                                   int ld, Prefetcher& pf) {
  FastInt8KeysT<true>(q16, qsc, rep, D, rows, stride, n, rs, S, ld, pf);
}
#endif

void FastInt8Keys(const int16_t* q16, const float* qsc, int rep, int D, const int8_t* rows, size_t stride, int n,
                  const float* rs, float* S, int ld, Prefetcher& pf) {
#ifdef KIVI_VNNI
  if (HasVnni()) return FastInt8KeysVnni(q16, qsc, rep, D, rows, stride, n, rs, S, ld, pf);
#endif
  FastInt8KeysT<false>(q16, qsc, rep, D, rows, stride, n, rs, S, ld, pf);
}

bool FastKiviValuesOk(int D, int bits, int Gc) {
  const int W = D * bits / 8;
  return Gc % 8 == 0 && W % 8 == 0 && D % 8 == 0;
}

// o += sum over tokens [t4, t4 + n) of the quads starting at `quad0` (per-token value
// params vs/vz [n][D/Gc]). Weights p * s are rounded to int16 per head, channel group
// and tile; a quad's four codes of one channel, widened to int16, pair with the four
// weights in vpdpwssd / vpmaddwd.
// Per-token parameters [n][NG] (vs, vz) transposed to [NG][stride] (vsT, vzT): 4 x 4
// blocks when NG is a multiple of 4, element by element otherwise.
HWY_INLINE void TransposeParams(const float* vs, const float* vz, int n, int NG, size_t stride, float* vsT,
                                float* vzT) {
  auto block4 = [&](const float* src, float* dst, int i, int g) {
    __m128 r0 = _mm_loadu_ps(src + static_cast<size_t>(i) * NG + g), r1 = _mm_loadu_ps(src + static_cast<size_t>(i + 1) * NG + g);
    __m128 r2 = _mm_loadu_ps(src + static_cast<size_t>(i + 2) * NG + g), r3 = _mm_loadu_ps(src + static_cast<size_t>(i + 3) * NG + g);
    _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
    _mm_storeu_ps(dst + static_cast<size_t>(g) * stride + i, r0);
    _mm_storeu_ps(dst + static_cast<size_t>(g + 1) * stride + i, r1);
    _mm_storeu_ps(dst + static_cast<size_t>(g + 2) * stride + i, r2);
    _mm_storeu_ps(dst + static_cast<size_t>(g + 3) * stride + i, r3);
  };
  int i = 0;
  if (NG % 4 == 0) {
    for (; i + 4 <= n; i += 4) {
      for (int g = 0; g < NG; g += 4) {
        block4(vs, vsT, i, g);
        block4(vz, vzT, i, g);
      }
    }
  }
  for (; i < n; ++i) {
    for (int g = 0; g < NG; ++g) {
      vsT[static_cast<size_t>(g) * stride + i] = vs[static_cast<size_t>(i) * NG + g];
      vzT[static_cast<size_t>(g) * stride + i] = vz[static_cast<size_t>(i) * NG + g];
    }
  }
}

// One head and channel group of the KIVI value weights: adds the zero points'
// contribution sum_t p_t z_t to the group's Gc channels og[0, Gc), stores the scale of
// the int16 weights (max_t p_t s_t / 32767) in *scale and returns the factor that rounds
// p_t s_t to them (0 when every weight is 0).
HWY_INLINE float ValueGroupScale(const float* Ph, const float* sg, const float* zg, int n, int Gc, float* og,
                                 float* scale) {
  __m256 vmax = _mm256_setzero_ps(), zacc = _mm256_setzero_ps();
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 pv = _mm256_loadu_ps(Ph + i);
    vmax = _mm256_max_ps(vmax, _mm256_mul_ps(pv, _mm256_loadu_ps(sg + i)));
    zacc = _mm256_fmadd_ps(pv, _mm256_loadu_ps(zg + i), zacc);
  }
  float wmax = HMax(vmax), zs = HSum(zacc);
  for (; i < n; ++i) {
    wmax = std::max(wmax, Ph[i] * sg[i]);
    zs += Ph[i] * zg[i];
  }
  const __m256 zsv = _mm256_set1_ps(zs);
  for (int c = 0; c < Gc; c += 8) _mm256_storeu_ps(og + c, _mm256_add_ps(_mm256_loadu_ps(og + c), zsv));
  *scale = wmax / 32767.0f;
  return wmax > 0.0f ? 32767.0f / wmax : 0.0f;
}

// Weights for FastKiviValues*: wq[(h * NG + g) * nq + q] holds the four int16 weights
// p * s of quad q's tokens for head h, channel group g; wsc[h * NG + g] their scale.
// The zero points' contribution, sum_t p_t z_{t,g}, is added to o here.
template <int NH>
HWY_INLINE void PrepareValueWeights(const float* P, int ld, int D, int Gc, int t4, int n, const float* vs,
                                    const float* vz, float* O, size_t ostride, uint64_t* wq, float* wsc) {
  const int NG = D / Gc;
  const int nq = (t4 + n + 3) / 4;
  // vs, vz are [n][NG]; vsT, vzT (scratch after the weight scales) hold them [NG][kTile].
  float* vsT = wsc + 4 * NG;
  float* vzT = vsT + static_cast<size_t>(NG) * kTile;
  TransposeParams(vs, vz, n, NG, kTile, vsT, vzT);
  for (int hh = 0; hh < NH; ++hh) {
    const float* Ph = P + static_cast<size_t>(hh) * ld;
    float* o = O + static_cast<size_t>(hh) * ostride;
    for (int g = 0; g < NG; ++g) {
      const float* sg = vsT + g * kTile;
      const float inv = ValueGroupScale(Ph, sg, vzT + g * kTile, n, Gc, o + g * Gc, &wsc[hh * NG + g]);
      int16_t* w = reinterpret_cast<int16_t*>(wq + (static_cast<size_t>(hh) * NG + g) * nq);
      // Slots [0, t4) and [t4 + n, 4 nq) of the quads are outside the range: weight 0.
      std::memset(w, 0, static_cast<size_t>(4 * nq) * sizeof(int16_t));
      const __m256 invv = _mm256_set1_ps(inv);
      int i = 0;
      for (; i + 8 <= n; i += 8) {
        const __m256i q32 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(Ph + i), _mm256_loadu_ps(sg + i)), invv));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(w + t4 + i),
                         _mm_packs_epi32(_mm256_castsi256_si128(q32), _mm256_extracti128_si256(q32, 1)));
      }
      for (; i < n; ++i) w[t4 + i] = static_cast<int16_t>(std::nearbyint(Ph[i] * sg[i] * inv));
    }
  }
}

template <int NH, int BITS, bool kVnni>
HWY_INLINE void FastKiviValuesN(const float* P, int ld, int D, int Gc, const uint8_t* quad0, int t4, int n,
                                const float* vs, const float* vz, float* O, size_t ostride, uint64_t* wq, float* wsc) {
  constexpr int p = 8 / BITS;
  const int W = D / p, NG = D / Gc;
  const int nq = (t4 + n + 3) / 4;
  PrepareValueWeights<NH>(P, ld, D, Gc, t4, n, vs, vz, O, ostride, wq, wsc);
  const __m256i mask = _mm256_set1_epi8(static_cast<char>((1 << BITS) - 1));
  const __m256i order = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
  for (int l = 0; l < W / 8; ++l) {  // 32 bytes of every quad: columns 8l .. 8l+7
#pragma GCC unroll 4
    for (int k = 0; k < p; ++k) {
      const int g = (k * W + 8 * l) / Gc;  // channels kW + 8l .. kW + 8l + 7
      __m256i lo[4], hi[4];
#pragma GCC unroll 4
      for (int hh = 0; hh < 4; ++hh) lo[hh] = hi[hh] = _mm256_setzero_si256();
      for (int q = 0; q < nq; ++q) {
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(quad0 + static_cast<size_t>(q) * 4 * W + 32 * l));
        const __m256i pl = BITS == 8 ? x : _mm256_and_si256(_mm256_srli_epi16(x, BITS * k), mask);
        // [channel c: token 0..3] as int16, channels 8l+0..3 and 8l+4..7
        const __m256i cl = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(pl));
        const __m256i ch = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(pl, 1));
#pragma GCC unroll 4
        for (int hh = 0; hh < NH; ++hh) {
          const __m256i w = _mm256_set1_epi64x(static_cast<long long>(wq[(static_cast<size_t>(hh) * NG + g) * nq + q]));
          lo[hh] = DotI16<kVnni>(lo[hh], cl, w);
          hi[hh] = DotI16<kVnni>(hi[hh], ch, w);
        }
      }
#pragma GCC unroll 4
      for (int hh = 0; hh < NH; ++hh) {
        // Pairs of lanes per channel: [c0 c1 c4 c5 | c2 c3 c6 c7] after the add, then in order.
        const __m256i sum = _mm256_permutevar8x32_epi32(_mm256_hadd_epi32(lo[hh], hi[hh]), order);
        float* o = O + static_cast<size_t>(hh) * ostride + static_cast<size_t>(k) * W + 8 * l;
        _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_set1_ps(wsc[hh * NG + g]), _mm256_loadu_ps(o)));
      }
    }
  }
}

// Weights for FastKiviValuesPairs: for head h, channel group g and quad q, the two
// 32-bit words wp[((h * NG + g) * nq + q) * 2 + {0, 1}] hold the int16 weight pairs
// (w0, w2) and (w1, w3) of the quad's tokens 0..3 (w = p * s rounded to int16 with the
// scale wsc[h * NG + g]). The zero points' contribution, sum_t p_t z_{t,g}, is added
// to o here. vs, vz are [n][NG]; tmp holds at least 2 * NG * (n + 8) floats.
template <int NH>
HWY_INLINE void PrepareValueWeightPairs(const float* P, int ld, int NG, int Gc, int t4, int n, const float* vs,
                                        const float* vz, float* O, size_t ostride, uint32_t* wp, float* wsc,
                                        float* tmp) {
  const int nq = (t4 + n + 3) / 4;
  const int np = (n + 7) / 8 * 8;  // padded row length of the transposed parameters
  float* vsT = tmp;                // [NG][np]
  float* vzT = tmp + static_cast<size_t>(NG) * np;
  TransposeParams(vs, vz, n, NG, static_cast<size_t>(np), vsT, vzT);
  alignas(32) int16_t w[4 * (kTile / 4 + 2) + 16];  // one (head, group): slots of all quads
  for (int hh = 0; hh < NH; ++hh) {
    const float* Ph = P + static_cast<size_t>(hh) * ld;
    float* o = O + static_cast<size_t>(hh) * ostride;
    for (int g = 0; g < NG; ++g) {
      const float* sg = vsT + static_cast<size_t>(g) * np;
      const float inv =
          ValueGroupScale(Ph, sg, vzT + static_cast<size_t>(g) * np, n, Gc, o + g * Gc, &wsc[hh * NG + g]);
      const __m256 invv = _mm256_set1_ps(inv);
      uint32_t* dst = wp + (static_cast<size_t>(hh) * NG + g) * nq * 2;
      int i = 0;
      if (t4 == 0) {
        // Eight tokens are two whole quads: rounded, packed and reordered in registers.
        for (; i + 8 <= n; i += 8) {
          const __m256i q32 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(Ph + i), _mm256_loadu_ps(sg + i)), invv));
          const __m128i w8 = _mm_packs_epi32(_mm256_castsi256_si128(q32), _mm256_extracti128_si256(q32, 1));
          _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i / 2), _mm_shufflehi_epi16(_mm_shufflelo_epi16(w8, 0xD8), 0xD8));
        }
      }
      // The rest (and ranges not starting a quad) slot by slot: slots [0, t4) and
      // [t4 + n, 4 nq) are outside the range, weight 0.
      if (i < n) {
        const int s0 = (t4 + i) / 4 * 4;  // first slot still to write, at a quad start
        for (int z = s0; z < 4 * nq; ++z) {
          const int tok = z - t4;
          w[z - s0] = tok < i || tok >= n ? int16_t{0} : static_cast<int16_t>(std::nearbyint(Ph[tok] * sg[tok] * inv));
        }
        for (int q = s0 / 4; q < nq; ++q) {
          const uint16_t* s = reinterpret_cast<const uint16_t*>(w + 4 * q - s0);
          dst[2 * q] = s[0] | (static_cast<uint32_t>(s[2]) << 16);
          dst[2 * q + 1] = s[1] | (static_cast<uint32_t>(s[3]) << 16);
        }
      }
    }
  }
}

// PrepareValueWeightPairs for four channel groups (NG = 4) and whole quads (t4 = 0,
// n % 8 == 0), without transposing the per-token parameters: a vector holds two tokens
// x four groups, so the maximum and the zero-point sum per group are lane-wise, and the
// int16 rounding of a quad (two vectors) packs to [t0 | t2] and [t1 | t3] per 128-bit
// half, which one byte shuffle turns into the weight pairs. Layout of the result:
// wp[(h * nq + q) * 8 + g] = (w0, w2) and wp[(h * nq + q) * 8 + 4 + g] = (w1, w3) of
// group g. tmp holds at least 4 n floats.
template <int NH>
HWY_INLINE void PrepareValueWeightPairsG4(const float* P, int ld, int Gc, int n, const float* vs, const float* vz,
                                          float* O, size_t ostride, uint32_t* wp, float* wsc, float* tmp) {
  const int nq = n / 4;
  // Lanes of eight weights spread to [p_{2j} x 4 | p_{2j+1} x 4], j = 0..3.
  const __m256i idx0 = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1), idx1 = _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3);
  const __m256i idx2 = _mm256_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5), idx3 = _mm256_setr_epi32(6, 6, 6, 6, 7, 7, 7, 7);
  const __m256i pairs = _mm256_setr_epi8(0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15,
                                         0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15);
  for (int hh = 0; hh < NH; ++hh) {
    const float* Ph = P + static_cast<size_t>(hh) * ld;
    // Four zero-point sums and two maxima in flight: the multiply-add latency would
    // otherwise bound this loop.
    __m256 mx0 = _mm256_setzero_ps(), mx1 = _mm256_setzero_ps();
    __m256 z0 = _mm256_setzero_ps(), z1 = _mm256_setzero_ps(), z2 = _mm256_setzero_ps(), z3 = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) {
      const __m256 p8 = _mm256_loadu_ps(Ph + i);
      const size_t o = static_cast<size_t>(i) * 4;
      const __m256 e0 = _mm256_permutevar8x32_ps(p8, idx0), e1 = _mm256_permutevar8x32_ps(p8, idx1);
      const __m256 w0 = _mm256_mul_ps(e0, _mm256_loadu_ps(vs + o)), w1 = _mm256_mul_ps(e1, _mm256_loadu_ps(vs + o + 8));
      _mm256_store_ps(tmp + o, w0);
      _mm256_store_ps(tmp + o + 8, w1);
      mx0 = _mm256_max_ps(mx0, w0);
      mx1 = _mm256_max_ps(mx1, w1);
      z0 = _mm256_fmadd_ps(e0, _mm256_loadu_ps(vz + o), z0);
      z1 = _mm256_fmadd_ps(e1, _mm256_loadu_ps(vz + o + 8), z1);
      const __m256 e2 = _mm256_permutevar8x32_ps(p8, idx2), e3 = _mm256_permutevar8x32_ps(p8, idx3);
      const __m256 w2 = _mm256_mul_ps(e2, _mm256_loadu_ps(vs + o + 16)), w3 = _mm256_mul_ps(e3, _mm256_loadu_ps(vs + o + 24));
      _mm256_store_ps(tmp + o + 16, w2);
      _mm256_store_ps(tmp + o + 24, w3);
      mx0 = _mm256_max_ps(mx0, w2);
      mx1 = _mm256_max_ps(mx1, w3);
      z2 = _mm256_fmadd_ps(e2, _mm256_loadu_ps(vz + o + 16), z2);
      z3 = _mm256_fmadd_ps(e3, _mm256_loadu_ps(vz + o + 24), z3);
    }
    const __m256 vmax = _mm256_max_ps(mx0, mx1);
    const __m256 zacc = _mm256_add_ps(_mm256_add_ps(z0, z1), _mm256_add_ps(z2, z3));
    const __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
    const __m128 z4 = _mm_add_ps(_mm256_castps256_ps128(zacc), _mm256_extractf128_ps(zacc, 1));
    _mm_storeu_ps(wsc + hh * 4, _mm_div_ps(m4, _mm_set1_ps(32767.0f)));
    const __m128 inv4 = _mm_and_ps(_mm_cmpgt_ps(m4, _mm_setzero_ps()), _mm_div_ps(_mm_set1_ps(32767.0f), m4));
    const __m256 inv = _mm256_set_m128(inv4, inv4);
    alignas(16) float zs[4];
    _mm_store_ps(zs, z4);
    float* o = O + static_cast<size_t>(hh) * ostride;
    for (int g = 0; g < 4; ++g) {
      const __m256 zv = _mm256_set1_ps(zs[g]);
      for (int c = g * Gc; c < (g + 1) * Gc; c += 8) _mm256_storeu_ps(o + c, _mm256_add_ps(_mm256_loadu_ps(o + c), zv));
    }
    uint32_t* dst = wp + static_cast<size_t>(hh) * nq * 8;
    for (int q = 0; q < nq; ++q) {
      const __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_load_ps(tmp + 16 * q), inv));      // t0 | t1
      const __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_load_ps(tmp + 16 * q + 8), inv));  // t2 | t3
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 8 * q), _mm256_shuffle_epi8(_mm256_packs_epi32(a, b), pairs));
    }
  }
}

// PrepareValueWeightPairsG4 for two channel groups (NG = 2, head_dim 64 with Gc = 32),
// whole quads and n % 8 == 0: a vector holds one quad's four tokens x two groups, in
// the order of vs and vz, so the maximum and the zero-point sum per group are again
// lane-wise (even lanes group 0, odd lanes group 1). Two quads round to int16 together;
// one 64-bit lane permutation puts each quad's eight weights in its own 128-bit half
// as [t0 t1 t2 t3] x [g0 g1], and the byte shuffle of G4 forms the pairs. Layout:
// wp[(h * nq + q) * 4 + g] = (w0, w2) and wp[(h * nq + q) * 4 + 2 + g] = (w1, w3) of
// group g. tmp holds at least 2 n floats.
template <int NH>
HWY_INLINE void PrepareValueWeightPairsG2(const float* P, int ld, int Gc, int n, const float* vs, const float* vz,
                                          float* O, size_t ostride, uint32_t* wp, float* wsc, float* tmp) {
  const int nq = n / 4;
  // Lanes of eight weights spread to [p_{4j} p_{4j} p_{4j+1} p_{4j+1} ... p_{4j+3}], j = 0, 1.
  const __m256i idx0 = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3), idx1 = _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7);
  const __m256i pairs = _mm256_setr_epi8(0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15,
                                         0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15);
  for (int hh = 0; hh < NH; ++hh) {
    const float* Ph = P + static_cast<size_t>(hh) * ld;
    __m256 mx0 = _mm256_setzero_ps(), mx1 = _mm256_setzero_ps();
    __m256 z0 = _mm256_setzero_ps(), z1 = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) {
      const __m256 p8 = _mm256_loadu_ps(Ph + i);
      const size_t o = static_cast<size_t>(i) * 2;
      const __m256 e0 = _mm256_permutevar8x32_ps(p8, idx0), e1 = _mm256_permutevar8x32_ps(p8, idx1);
      const __m256 w0 = _mm256_mul_ps(e0, _mm256_loadu_ps(vs + o)), w1 = _mm256_mul_ps(e1, _mm256_loadu_ps(vs + o + 8));
      _mm256_store_ps(tmp + o, w0);
      _mm256_store_ps(tmp + o + 8, w1);
      mx0 = _mm256_max_ps(mx0, w0);
      mx1 = _mm256_max_ps(mx1, w1);
      z0 = _mm256_fmadd_ps(e0, _mm256_loadu_ps(vz + o), z0);
      z1 = _mm256_fmadd_ps(e1, _mm256_loadu_ps(vz + o + 8), z1);
    }
    // Lanes 2j + g -> group g.
    const __m256 vmax = _mm256_max_ps(mx0, mx1);
    const __m256 zacc = _mm256_add_ps(z0, z1);
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
    __m128 z4 = _mm_add_ps(_mm256_castps256_ps128(zacc), _mm256_extractf128_ps(zacc, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));  // [g0 g1 . .]
    z4 = _mm_add_ps(z4, _mm_movehl_ps(z4, z4));
    const __m128 m2 = _mm_movelh_ps(m4, m4);     // [g0 g1 g0 g1]
    alignas(16) float sc[4], zs[4];
    _mm_store_ps(sc, _mm_div_ps(m2, _mm_set1_ps(32767.0f)));
    _mm_store_ps(zs, z4);
    wsc[hh * 2] = sc[0];
    wsc[hh * 2 + 1] = sc[1];
    const __m128 inv4 = _mm_and_ps(_mm_cmpgt_ps(m2, _mm_setzero_ps()), _mm_div_ps(_mm_set1_ps(32767.0f), m2));
    const __m256 inv = _mm256_set_m128(inv4, inv4);
    float* o = O + static_cast<size_t>(hh) * ostride;
    for (int g = 0; g < 2; ++g) {
      const __m256 zv = _mm256_set1_ps(zs[g]);
      for (int c = g * Gc; c < (g + 1) * Gc; c += 8) _mm256_storeu_ps(o + c, _mm256_add_ps(_mm256_loadu_ps(o + c), zv));
    }
    uint32_t* dst = wp + static_cast<size_t>(hh) * nq * 4;
    for (int q = 0; q < nq; q += 2) {
      const __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_load_ps(tmp + 8 * q), inv));      // quad q
      const __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_load_ps(tmp + 8 * q + 8), inv));  // quad q + 1
      // packs: [q t0 t1 | q+1 t0 t1 | q t2 t3 | q+1 t2 t3] (64-bit lanes) -> [q | q+1]
      const __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 4 * q), _mm256_shuffle_epi8(w, pairs));
    }
  }
}

// KIVI values with 256-bit vectors, up to four heads in one pass over the codes. A
// quad's 32-bit lane holds one channel's codes of tokens 0..3 (kv/codec.h); as two
// int16 lanes, masking keeps tokens 0 and 2, shifting by 8 first keeps tokens 1 and 3.
// vpmaddwd with the weight pairs (w0, w2) and (w1, w3) then yields each channel's sum
// over the quad in its own 32-bit lane, in channel order: no widening, no reduction.
template <int NH, int BITS>
HWY_INLINE void FastKiviValuesPairsN(const float* P, int ld, int D, int Gc, const uint8_t* quad0, int t4, int n,
                                     const float* vs, const float* vz, float* O, size_t ostride, uint32_t* wp,
                                     float* wsc, float* tmp) {
  constexpr int p = 8 / BITS;
  const int W = D / p, NG = D / Gc;
  const int nq = (t4 + n + 3) / 4;
  // Word offsets in wp: between quads, groups and heads, and from (w0, w2) to (w1, w3).
  size_t qs = 2, gs = static_cast<size_t>(nq) * 2, hs = static_cast<size_t>(NG) * nq * 2, w13o = 1;
  if (NG == 4 && t4 == 0 && n % 8 == 0) {
    PrepareValueWeightPairsG4<NH>(P, ld, Gc, n, vs, vz, O, ostride, wp, wsc, tmp);
    qs = 8, gs = 1, hs = static_cast<size_t>(nq) * 8, w13o = 4;
  } else if (NG == 2 && t4 == 0 && n % 8 == 0) {
    PrepareValueWeightPairsG2<NH>(P, ld, Gc, n, vs, vz, O, ostride, wp, wsc, tmp);
    qs = 4, gs = 1, hs = static_cast<size_t>(nq) * 4, w13o = 2;
  } else {
    PrepareValueWeightPairs<NH>(P, ld, NG, Gc, t4, n, vs, vz, O, ostride, wp, wsc, tmp);
  }
  const __m256i mask = _mm256_set1_epi16((1 << BITS) - 1);
  for (int l = 0; l < W / 8; ++l) {  // bytes 8l .. 8l+7 of every token: 32 bytes of every quad
#pragma GCC unroll 4
    for (int k = 0; k < p; ++k) {
      const int c0 = k * W + 8 * l;  // channels c0 .. c0+7, one group
      const int g = c0 / Gc;
      __m256i acc[NH];
#pragma GCC unroll 4
      for (int hh = 0; hh < NH; ++hh) acc[hh] = _mm256_setzero_si256();
      const uint32_t* wq = wp + g * gs;
      const uint8_t* src = quad0 + 32 * l;
      for (int q = 0; q < nq; ++q, src += 4 * W, wq += qs) {
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
        const __m256i a = _mm256_and_si256(_mm256_srli_epi16(x, BITS * k), mask);      // tokens 0, 2
        const __m256i b = _mm256_and_si256(_mm256_srli_epi16(x, BITS * k + 8), mask);  // tokens 1, 3
#pragma GCC unroll 4
        for (int hh = 0; hh < NH; ++hh) {
          const __m256i w02 = _mm256_set1_epi32(static_cast<int>(wq[hh * hs]));
          const __m256i w13 = _mm256_set1_epi32(static_cast<int>(wq[hh * hs + w13o]));
          acc[hh] = _mm256_add_epi32(acc[hh], _mm256_add_epi32(_mm256_madd_epi16(a, w02), _mm256_madd_epi16(b, w13)));
        }
      }
#pragma GCC unroll 4
      for (int hh = 0; hh < NH; ++hh) {
        float* o = O + static_cast<size_t>(hh) * ostride + c0;
        _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[hh]), _mm256_set1_ps(wsc[hh * NG + g]), _mm256_loadu_ps(o)));
      }
    }
  }
}

#if HWY_TARGET == HWY_AVX3
// PrepareValueWeights for NG = 4 or 2 channel groups (D = NG Gc; head_dim 128 or 64 at
// G = 32) with 512-bit vectors. One vector holds 16 / NG tokens x NG groups, so no
// transposition of the per-token parameters is needed: with four groups a quad's 4
// tokens, lane 4 g + b for token b; with two a pair of quads' 8 tokens, lane 8 d + 4 g + b
// for token 4 d + b. n must cover whole vectors (t4 = 0, n % (16 / NG) == 0). Layout of
// the result: wq[h * hs + NG q + g] with hs = n NG / 4 (the 16 lanes of vector i, rounded
// to int16, are uint64s 4i .. 4i + 3). wtmp: scratch of n NG / 16 * NH * 16 floats.
template <int NH, int NG>
HWY_NOINLINE void PrepareValueWeightsWide(const float* P, int ld, int Gc, int n, const float* vs, const float* vz,
                                          float* O, size_t ostride, uint64_t* wq, float* wsc, float* wtmp) {
  static_assert(NG == 4 || NG == 2, "four or two channel groups");
  constexpr int kTok = 16 / NG;  // tokens per vector
  // Lane l takes vs[tr[l]] (token-major input [token][group]).
  const __m512i tr = NG == 4 ? _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15)
                             : _mm512_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
  const int nv = n / kTok;
  const size_t hs = static_cast<size_t>(n) * NG / 4;
  __m512 vmax[4], zacc[4];
#pragma GCC unroll 4
  for (int hh = 0; hh < 4; ++hh) vmax[hh] = zacc[hh] = _mm512_setzero_ps();
  for (int i = 0; i < nv; ++i) {
    const __m512 sv = _mm512_permutexvar_ps(tr, _mm512_loadu_ps(vs + 16 * i));
    const __m512 zv = _mm512_permutexvar_ps(tr, _mm512_loadu_ps(vz + 16 * i));
#pragma GCC unroll 4
    for (int hh = 0; hh < NH; ++hh) {
      const float* Ph = P + static_cast<size_t>(hh) * ld + kTok * i;
      __m512 pv;  // the weights p of each lane's token
      if constexpr (NG == 4) {
        pv = _mm512_broadcast_f32x4(_mm_loadu_ps(Ph));
      } else {  // [P0-3 | P0-3 | P4-7 | P4-7]
        const __m512 p8 = _mm512_broadcast_f32x8(_mm256_loadu_ps(Ph));
        pv = _mm512_shuffle_f32x4(p8, p8, _MM_SHUFFLE(1, 1, 0, 0));
      }
      const __m512 w = _mm512_mul_ps(pv, sv);
      _mm512_storeu_ps(wtmp + (static_cast<size_t>(i) * NH + hh) * 16, w);
      vmax[hh] = _mm512_max_ps(vmax[hh], w);
      zacc[hh] = _mm512_fmadd_ps(pv, zv, zacc[hh]);
    }
  }
#pragma GCC unroll 4
  for (int hh = 0; hh < NH; ++hh) {
    // Reduce over each group's lanes (its 128-bit block; with two groups, blocks g and
    // g + 2): every lane gets its group's value.
    __m512 m = _mm512_max_ps(vmax[hh], _mm512_permute_ps(vmax[hh], 0xB1));
    m = _mm512_max_ps(m, _mm512_permute_ps(m, 0x4E));
    __m512 z = _mm512_add_ps(zacc[hh], _mm512_permute_ps(zacc[hh], 0xB1));
    z = _mm512_add_ps(z, _mm512_permute_ps(z, 0x4E));
    if constexpr (NG == 2) {
      m = _mm512_max_ps(m, _mm512_shuffle_f32x4(m, m, _MM_SHUFFLE(1, 0, 3, 2)));
      z = _mm512_add_ps(z, _mm512_shuffle_f32x4(z, z, _MM_SHUFFLE(1, 0, 3, 2)));
    }
    alignas(64) float mg[16], zg[16];
    _mm512_store_ps(mg, m);
    _mm512_store_ps(zg, z);
    float* o = O + static_cast<size_t>(hh) * ostride;
    for (int g = 0; g < NG; ++g) {
      wsc[hh * NG + g] = mg[4 * g] / 32767.0f;
      // Zero points: sum_t p_t z_{t,g} lands on every channel of group g.
      const __m512 zsv = _mm512_set1_ps(zg[4 * g]);
      for (int c = g * Gc; c < (g + 1) * Gc; c += 16) _mm512_storeu_ps(o + c, _mm512_add_ps(_mm512_loadu_ps(o + c), zsv));
    }
    const __mmask16 pos = _mm512_cmp_ps_mask(m, _mm512_setzero_ps(), _CMP_GT_OQ);
    const __m512 inv = _mm512_maskz_div_ps(pos, _mm512_set1_ps(32767.0f), m);
    for (int i = 0; i < nv; ++i) {
      const __m512 w = _mm512_loadu_ps(wtmp + (static_cast<size_t>(i) * NH + hh) * 16);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(wq + hh * hs + 4 * static_cast<size_t>(i)),
                          _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(w, inv))));
    }
  }
}
#endif  // HWY_AVX3

#if HWY_TARGET == HWY_AVX3
// One 64-byte column (16 channel bytes of four tokens) of FastKiviValues512N, code plane
// K: over the nq quads, head h's weights are w[h * hs + q * qs]; the sums of the 16
// channels, times the head's weight scale wsc[h * NG], are added to o + h * ostride.
// Out of line, with a pointer loop, so that its accumulators, pointers and counter stay
// in registers (inlined into the value kernel, GCC kept the loop counter on the stack).
template <int NH, int BITS, bool kVnni, int K>
HWY_NOINLINE void ValueColumn512K(const uint8_t* src, size_t qbytes, int nq, const uint64_t* w, size_t hs, size_t qs,
                                  const float* wsc, int NG, float* o, size_t ostride) {
  const __m512i mask = _mm512_set1_epi8(static_cast<char>((1 << BITS) - 1));
  __m512i lo[4], hi[4];
#pragma GCC unroll 4
  for (int hh = 0; hh < 4; ++hh) lo[hh] = hi[hh] = _mm512_setzero_si512();
  const uint8_t* const end = src + static_cast<size_t>(nq) * qbytes;
  for (; src != end; src += qbytes, w += qs) {
    const __m512i x = _mm512_loadu_si512(src);
    const __m512i pl = BITS == 8 ? x : _mm512_and_si512(K == 0 ? x : _mm512_srli_epi16(x, BITS * K), mask);
    const __m512i cl = _mm512_cvtepu8_epi16(_mm512_castsi512_si256(pl));
    const __m512i ch = _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(pl, 1));
#pragma GCC unroll 4
    for (int hh = 0; hh < NH; ++hh) {
      const __m512i wv = _mm512_set1_epi64(static_cast<long long>(w[hh * hs]));
      lo[hh] = DotI16x32<kVnni>(lo[hh], cl, wv);
      hi[hh] = DotI16x32<kVnni>(hi[hh], ch, wv);
    }
  }
  // Lane pairs (2c, 2c + 1) hold channel c's two token-pair sums; these pick them from
  // [lo | hi] so that even + odd is channels 0..15 in order.
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
#pragma GCC unroll 4
  for (int hh = 0; hh < NH; ++hh) {
    const __m512i sum = _mm512_add_epi32(_mm512_permutex2var_epi32(lo[hh], even, hi[hh]),
                                         _mm512_permutex2var_epi32(lo[hh], odd, hi[hh]));
    float* oh = o + static_cast<size_t>(hh) * ostride;
    _mm512_storeu_ps(oh, _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_set1_ps(wsc[hh * NG]), _mm512_loadu_ps(oh)));
  }
}
template <int NH, int BITS, bool kVnni>
HWY_INLINE void ValueColumn512(int k, const uint8_t* src, size_t qbytes, int nq, const uint64_t* w, size_t hs,
                               size_t qs, const float* wsc, int NG, float* o, size_t ostride) {
  switch (k) {
    case 0: return ValueColumn512K<NH, BITS, kVnni, 0>(src, qbytes, nq, w, hs, qs, wsc, NG, o, ostride);
    case 1: return ValueColumn512K<NH, BITS, kVnni, 1>(src, qbytes, nq, w, hs, qs, wsc, NG, o, ostride);
    case 2: return ValueColumn512K<NH, BITS, kVnni, 2>(src, qbytes, nq, w, hs, qs, wsc, NG, o, ostride);
    default: return ValueColumn512K<NH, BITS, kVnni, 3>(src, qbytes, nq, w, hs, qs, wsc, NG, o, ostride);
  }
}

// FastKiviValuesN with 512-bit vectors: 64 bytes of a quad (16 channel bytes of four
// tokens) per load; each vpdpwssd covers 8 channels x 4 tokens. Needs W % 16 == 0 and
// Gc % 16 == 0 (the 16 channels of a load share one group).
template <int NH, int BITS, bool kVnni, int kD>
HWY_INLINE void FastKiviValues512N(const float* P, int ld, int D_, int Gc, const uint8_t* quad0, int t4, int n,
                                   const float* vs, const float* vz, float* O, size_t ostride, uint64_t* wq,
                                   float* wsc, float* wtmp) {
  constexpr int p = 8 / BITS;
  const int D = kD > 0 ? kD : D_;
  const int W = D / p, NG = D / Gc;
  const int nq = (t4 + n + 3) / 4;
  // Weight of head h, group g, quad q: wq[h * hs + g * gs + q * qs].
  size_t hs, gs, qs;
  if ((NG == 4 || NG == 2) && t4 == 0 && n % (16 / NG) == 0) {
    if (NG == 4) {
      PrepareValueWeightsWide<NH, 4>(P, ld, Gc, n, vs, vz, O, ostride, wq, wsc, wtmp);
    } else {
      PrepareValueWeightsWide<NH, 2>(P, ld, Gc, n, vs, vz, O, ostride, wq, wsc, wtmp);
    }
    hs = static_cast<size_t>(n) * NG / 4, gs = 1, qs = static_cast<size_t>(NG);
  } else {
    PrepareValueWeights<NH>(P, ld, D, Gc, t4, n, vs, vz, O, ostride, wq, wsc);
    hs = static_cast<size_t>(NG) * nq, gs = nq, qs = 1;
  }
  for (int l = 0; l < W / 16; ++l) {  // 64 bytes of every quad: channel bytes 16l .. 16l + 15
#pragma GCC unroll 8
    for (int k = 0; k < p; ++k) {
      const int g = (k * W + 16 * l) / Gc;
      ValueColumn512<NH, BITS, kVnni>(k, quad0 + 64 * l, static_cast<size_t>(4 * W), nq, wq + g * gs, hs, qs,
                                     wsc + g, NG, O + static_cast<size_t>(k) * W + 16 * l, ostride);
    }
  }
}
#endif  // HWY_AVX3

template <int BITS, bool kVnni>
HWY_INLINE void FastKiviValuesB(const float* P, int ld, int rep, int D, int Gc, const uint8_t* quad0, int t4, int n,
                                const float* vs, const float* vz, float* O, size_t ostride, uint64_t* wq, float* wsc,
                                float* wtmp) {
  // Up to four heads per pass over the codes: 512-bit kernels on AVX3 (the 256-bit
  // FastKiviValuesN where a load would span two channel groups), FastKiviValuesPairsN on
  // AVX2 (FastKiviValuesOk guarantees its W % 8 == 0 and Gc % 8 == 0).
  for (int r = 0; r < rep; r += 4) {
    const float* Pr = P + static_cast<size_t>(r) * ld;
    float* Or = O + static_cast<size_t>(r) * ostride;
#if HWY_TARGET == HWY_AVX3
    if ((D * BITS / 8) % 16 == 0 && Gc % 16 == 0) {
      switch (std::min(4, rep - r)) {
        case 1: FastKiviValues512N<1, BITS, kVnni, 0>(Pr, ld, D, Gc, quad0, t4, n, vs, vz, Or, ostride, wq, wsc, wtmp); break;
        case 2: FastKiviValues512N<2, BITS, kVnni, 0>(Pr, ld, D, Gc, quad0, t4, n, vs, vz, Or, ostride, wq, wsc, wtmp); break;
        case 3: FastKiviValues512N<3, BITS, kVnni, 0>(Pr, ld, D, Gc, quad0, t4, n, vs, vz, Or, ostride, wq, wsc, wtmp); break;
        default:
          if (D == 128) {
            FastKiviValues512N<4, BITS, kVnni, 128>(Pr, ld, D, Gc, quad0, t4, n, vs, vz, Or, ostride, wq, wsc, wtmp);
          } else {
            FastKiviValues512N<4, BITS, kVnni, 0>(Pr, ld, D, Gc, quad0, t4, n, vs, vz, Or, ostride, wq, wsc, wtmp);
          }
          break;
      }
      continue;
    }
    switch (std::min(4, rep - r)) {
      case 1: FastKiviValuesN<1, BITS, kVnni>(Pr, ld, D, Gc, quad0, t4, n, vs, vz, Or, ostride, wq, wsc); break;
      case 2: FastKiviValuesN<2, BITS, kVnni>(Pr, ld, D, Gc, quad0, t4, n, vs, vz, Or, ostride, wq, wsc); break;
      case 3: FastKiviValuesN<3, BITS, kVnni>(Pr, ld, D, Gc, quad0, t4, n, vs, vz, Or, ostride, wq, wsc); break;
      default: FastKiviValuesN<4, BITS, kVnni>(Pr, ld, D, Gc, quad0, t4, n, vs, vz, Or, ostride, wq, wsc); break;
    }
#else
    uint32_t* wp = reinterpret_cast<uint32_t*>(wq);
    switch (std::min(4, rep - r)) {
      case 1: FastKiviValuesPairsN<1, BITS>(Pr, ld, D, Gc, quad0, t4, n, vs, vz, Or, ostride, wp, wsc, wtmp); break;
      case 2: FastKiviValuesPairsN<2, BITS>(Pr, ld, D, Gc, quad0, t4, n, vs, vz, Or, ostride, wp, wsc, wtmp); break;
      case 3: FastKiviValuesPairsN<3, BITS>(Pr, ld, D, Gc, quad0, t4, n, vs, vz, Or, ostride, wp, wsc, wtmp); break;
      default: FastKiviValuesPairsN<4, BITS>(Pr, ld, D, Gc, quad0, t4, n, vs, vz, Or, ostride, wp, wsc, wtmp); break;
    }
#endif
  }
}

template <bool kVnni>
HWY_INLINE void FastKiviValuesT(const float* P, int ld, int rep, int D, int bits, int Gc, const uint8_t* quad0, int t4,
                                int n, const float* vs, const float* vz, float* O, size_t ostride, uint64_t* wq,
                                float* wsc, float* wtmp) {
  switch (bits) {
    case 2: return FastKiviValuesB<2, kVnni>(P, ld, rep, D, Gc, quad0, t4, n, vs, vz, O, ostride, wq, wsc, wtmp);
    case 4: return FastKiviValuesB<4, kVnni>(P, ld, rep, D, Gc, quad0, t4, n, vs, vz, O, ostride, wq, wsc, wtmp);
    default: return FastKiviValuesB<8, kVnni>(P, ld, rep, D, Gc, quad0, t4, n, vs, vz, O, ostride, wq, wsc, wtmp);
  }
}

#ifdef KIVI_VNNI
KIVI_VNNI_ATTR HWY_NOINLINE void FastKiviValuesVnni(const float* P, int ld, int rep, int D, int bits, int Gc,
                                                     const uint8_t* quad0, int t4, int n, const float* vs,
                                                     const float* vz, float* O, size_t ostride, uint64_t* wq,
                                                     float* wsc, float* wtmp) {
  FastKiviValuesT<true>(P, ld, rep, D, bits, Gc, quad0, t4, n, vs, vz, O, ostride, wq, wsc, wtmp);
}
#endif

void FastKiviValues(const float* P, int ld, int rep, int D, int bits, int Gc, const uint8_t* quad0, int t4, int n,
                    const float* vs, const float* vz, float* O, size_t ostride, uint64_t* wq, float* wsc, float* wtmp) {
#ifdef KIVI_VNNI
  if (HasVnni()) return FastKiviValuesVnni(P, ld, rep, D, bits, Gc, quad0, t4, n, vs, vz, O, ostride, wq, wsc, wtmp);
#endif
  FastKiviValuesT<false>(P, ld, rep, D, bits, Gc, quad0, t4, n, vs, vz, O, ostride, wq, wsc, wtmp);
}

#else
#define KIVI_FAST_INT 0
#endif  // x86 targets

// Quantization parameters [index, index + count) of a stream (scales, or zero points)
// as floats.
void LoadParams(const kv::StreamView& st, size_t index, int count, float* out, bool zeros = false) {
  const uint8_t* base = zeros ? st.zeros : st.scales;
  if (st.param_type == kv::ParamType::kF32) {
    std::memcpy(out, reinterpret_cast<const float*>(base) + index, static_cast<size_t>(count) * sizeof(float));
    return;
  }
  const f16_t* p = reinterpret_cast<const f16_t*>(base) + index;
  int i = 0;
  // Full vectors, then (on targets wider than 8 lanes) one of 8, then one at a time.
  auto convert = [&](auto df) {
    const hn::Rebind<hwy::float16_t, decltype(df)> dh;
    const int N = static_cast<int>(hn::Lanes(df));
    for (; i + N <= count; i += N) {
      hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p + i))), df, out + i);
    }
  };
  convert(hn::ScalableTag<float>());
  convert(hn::CappedTag<float, 8>());
  for (; i < count; ++i) out[i] = f16_to_f32(p[i]);
}

#if KIVI_FAST_INT
// ---------------------------------------------------------------------------------
// KIVI keys, a whole group at a time (AVX2/AVX3, exact and fast paths).
//
// The rows of a key group are interleaved in 32-bit words (kv/codec.h): word c of the
// group's G tokens is contiguous, so one vector holds word c of N consecutive tokens.
// The word keeps row bytes 4c, 4c + 2, 4c + 1, 4c + 3 at its byte positions 0..3, so
// shifting it right by s and masking leaves in each lane the code at bit s: row byte
// 4c + kKeyWordOrder[s / 8], plane (s % 8) / BITS, i.e. channel
//   4c + kKeyWordOrder[s / 8] + W (s % 8) / BITS              (W = D * BITS / 8).
// Scores then accumulate lane-wise, N tokens per vector, one channel at a time against
// that channel's query broadcast, with no reduction across lanes:
//   S[h][t] = sum_ch (q_h s_ch) c_t,ch + q_h . z                 (q . (s c + z))
// Exact path: q s in float, codes mapped to floats (2-bit by vpermilps, which reads the
// low two bits of each lane; 4-bit on AVX3 by vpermps, which reads the low four).
// Fast path: q s rounded to int16 per head and group; the mask keeps one code in each
// 16-bit half of a lane, the channels 4c + r + W p and 4c + r + 1 + W p (r = 0 or 2)
// that meet the int16 query pair at int32 index (4c + r + W p) / 2, so one vpdpwssd
// (or vpmaddwd + vpaddd) does two channels of N tokens.

// Channel of the code at bit s of word c, minus 4c.
template <int BITS>
HWY_INLINE constexpr int WordChannel(int s, int W) {
  return kv::kKeyWordOrder[s / 8] + W * ((s % 8) / BITS);
}

// Calls f(std::integral_constant<int, i>) for i = 0 .. N-1 (shift counts must be
// compile-time constants).
template <class F, int... Is>
HWY_INLINE void UnrollSeq(const F& f, std::integer_sequence<int, Is...>) {
  (f(std::integral_constant<int, Is>()), ...);
}
template <int N, class F>
HWY_INLINE void Unroll(const F& f) {
  UnrollSeq(f, std::make_integer_sequence<int, N>());
}

// 256-bit vectors: 8 tokens per vector.
struct KeyVec256 {
  using F = __m256;
  using I = __m256i;
  static constexpr int N = 8;
  static HWY_INLINE I Load(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  template <int S>
  static HWY_INLINE I Srl(I v) {
    if constexpr (S == 0) {
      return v;
    } else {
      return _mm256_srli_epi32(v, S);
    }
  }
  static HWY_INLINE I And(I a, I b) { return _mm256_and_si256(a, b); }
  static HWY_INLINE I AddI(I a, I b) { return _mm256_add_epi32(a, b); }
  static HWY_INLINE I SetI(int32_t x) { return _mm256_set1_epi32(x); }
  static HWY_INLINE I ZeroI() { return _mm256_setzero_si256(); }
  static HWY_INLINE F Zero() { return _mm256_setzero_ps(); }
  static HWY_INLINE F Set(float x) { return _mm256_set1_ps(x); }
  static HWY_INLINE F Bcast(const float* p) { return _mm256_broadcast_ss(p); }
  static HWY_INLINE F Fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static HWY_INLINE F Add(F a, F b) { return _mm256_add_ps(a, b); }
  static HWY_INLINE F Cvt(I v) { return _mm256_cvtepi32_ps(v); }
  static HWY_INLINE void Store(float* p, F v) { _mm256_storeu_ps(p, v); }
  // Codes of BITS bits at bit S of each lane, as floats.
  template <int BITS, int S>
  static HWY_INLINE F Code(I x, F lut) {
    const I v = Srl<S>(x);
    if constexpr (BITS == 2) {
      return _mm256_permutevar_ps(lut, v);
    } else if constexpr (S + BITS == 32) {
      return Cvt(v);
    } else {
      return Cvt(And(v, SetI((1 << BITS) - 1)));
    }
  }
  // The code-to-float table of Code (2-bit: {0, 1, 2, 3} in each 128-bit block).
  template <int BITS>
  static HWY_INLINE F Lut() {
    return _mm256_setr_ps(0.0f, 1.0f, 2.0f, 3.0f, 0.0f, 1.0f, 2.0f, 3.0f);
  }
  template <bool kVnni>
  static HWY_INLINE I Dot(I acc, I a, const int32_t* b) {
    return DotI16<kVnni>(acc, a, _mm256_set1_epi32(*b));
  }
};

#if HWY_TARGET == HWY_AVX3
// 512-bit vectors: 16 tokens per vector.
struct KeyVec512 {
  using F = __m512;
  using I = __m512i;
  static constexpr int N = 16;
  static HWY_INLINE I Load(const uint8_t* p) { return _mm512_loadu_si512(p); }
  template <int S>
  static HWY_INLINE I Srl(I v) {
    if constexpr (S == 0) {
      return v;
    } else {
      return _mm512_srli_epi32(v, S);
    }
  }
  static HWY_INLINE I And(I a, I b) { return _mm512_and_si512(a, b); }
  static HWY_INLINE I AddI(I a, I b) { return _mm512_add_epi32(a, b); }
  static HWY_INLINE I SetI(int32_t x) { return _mm512_set1_epi32(x); }
  static HWY_INLINE I ZeroI() { return _mm512_setzero_si512(); }
  static HWY_INLINE F Zero() { return _mm512_setzero_ps(); }
  static HWY_INLINE F Set(float x) { return _mm512_set1_ps(x); }
  static HWY_INLINE F Bcast(const float* p) { return _mm512_set1_ps(*p); }
  static HWY_INLINE F Fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static HWY_INLINE F Add(F a, F b) { return _mm512_add_ps(a, b); }
  static HWY_INLINE F Cvt(I v) { return _mm512_cvtepi32_ps(v); }
  static HWY_INLINE void Store(float* p, F v) { _mm512_storeu_ps(p, v); }
  template <int BITS, int S>
  static HWY_INLINE F Code(I x, F lut) {
    const I v = Srl<S>(x);
    if constexpr (BITS == 2) {
      return _mm512_permutevar_ps(lut, v);  // low 2 bits, within each 128-bit block
    } else if constexpr (BITS == 4) {
      return _mm512_permutexvar_ps(v, lut);  // low 4 bits
    } else if constexpr (S + BITS == 32) {
      return Cvt(v);
    } else {
      return Cvt(And(v, SetI((1 << BITS) - 1)));
    }
  }
  // 2-bit: {0, 1, 2, 3} in each 128-bit block (vpermilps); 4-bit: {0 .. 15} (vpermps).
  template <int BITS>
  static HWY_INLINE F Lut() {
    if constexpr (BITS == 2) return _mm512_broadcast_f32x4(_mm_setr_ps(0.0f, 1.0f, 2.0f, 3.0f));
    return _mm512_setr_ps(0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f, 8.0f, 9.0f, 10.0f, 11.0f, 12.0f, 13.0f,
                          14.0f, 15.0f);
  }
  template <bool kVnni>
  static HWY_INLINE I Dot(I acc, I a, const int32_t* b) {
#ifdef KIVI_VNNI
    if constexpr (kVnni) {  // the int16 pair broadcast from memory ({1to16})
      asm("%{evex%} vpdpwssd {%2%{1to16%}, %1, %0|%0, %1, %2%{1to16%}}" : "+v"(acc) : "v"(a), "m"(*b));
      return acc;
    }
#endif
    return _mm512_add_epi32(acc, _mm512_madd_epi16(a, _mm512_set1_epi32(*b)));
  }
};
#endif

// Scores of one key group for NH (1-4) heads, S[h * ld + i] for the group's tokens i in
// [0, G), G a multiple of 2N:
//   exact: qs_h . c_i + bias[h],          qs: [NH][D] floats, q_h * s;
//   fast:  qsc[h] (q16_h . c_i) + bias[h], qs: [NH][D] int16 (q s rounded per head), read
//          as int32 channel pairs.
// The columns are spread over NS sets of accumulators so that eight sums are in flight
// whatever NH.
template <class V, int NH, int BITS, int kW, bool kFast, bool kVnni>
HWY_INLINE void KiviGroupScores(const uint8_t* HWY_RESTRICT cg, int G, int W_, const void* HWY_RESTRICT qs,
                                const float* qsc, const float* bias, float* HWY_RESTRICT S, int ld,
                                PrefetchCursor* pf) {
  using F = typename V::F;
  using I = typename V::I;
  using Acc = std::conditional_t<kFast, I, F>;
  // Exact: every code of a word, one channel each. Fast: pairs of codes (one per 16-bit
  // half): word bytes 0 and 2 (pair k < 8 / BITS) or 1 and 3, plane k % (8 / BITS).
  constexpr int N = V::N, NS = NH >= 3 ? 1 : 4 / NH, KS = kFast ? 16 / BITS : 32 / BITS;
  const int W = kW > 0 ? kW : W_;
  const int D = W * 8 / BITS, NC = W / 4;
  const F lut = V::template Lut<BITS>();
  const I mask = V::SetI(((1 << BITS) - 1) * 0x00010001);
  for (int v = 0; v < G; v += 2 * N) {
    if (pf) pf->step(2 * N);
    Acc acc[NS][NH][2];
#pragma GCC unroll 4
    for (int s = 0; s < NS; ++s) {
#pragma GCC unroll 4
      for (int h = 0; h < NH; ++h) {
        if constexpr (kFast) {
          acc[s][h][0] = acc[s][h][1] = V::ZeroI();
        } else {
          acc[s][h][0] = acc[s][h][1] = V::Zero();
        }
      }
    }
    auto column = [&](int c, Acc(&a)[NH][2]) __attribute__((always_inline)) {
      const uint8_t* p = cg + (static_cast<size_t>(c) * G + v) * 4;
      const I x0 = V::Load(p), x1 = V::Load(p + 4 * N);
      Unroll<KS>([&](auto k) __attribute__((always_inline)) {
        constexpr int kk = decltype(k)::value;
        if constexpr (kFast) {
          constexpr int s = 8 * (kk / (8 / BITS)) + BITS * (kk % (8 / BITS));
          const I c0 = V::And(V::template Srl<s>(x0), mask), c1 = V::And(V::template Srl<s>(x1), mask);
          // The pair of channels 4c + WordChannel, + 1: int32 index 2c + WordChannel / 2.
          const int32_t* q = static_cast<const int32_t*>(qs) + 2 * c + WordChannel<BITS>(s, W) / 2;
#pragma GCC unroll 4
          for (int h = 0; h < NH; ++h) {
            a[h][0] = V::template Dot<kVnni>(a[h][0], c0, q + static_cast<size_t>(h) * D / 2);
            a[h][1] = V::template Dot<kVnni>(a[h][1], c1, q + static_cast<size_t>(h) * D / 2);
          }
        } else {
          constexpr int s = BITS * kk;
          const F c0 = V::template Code<BITS, s>(x0, lut), c1 = V::template Code<BITS, s>(x1, lut);
          const float* q = static_cast<const float*>(qs) + 4 * c + WordChannel<BITS>(s, W);
#pragma GCC unroll 4
          for (int h = 0; h < NH; ++h) {
            const F qv = V::Bcast(q + static_cast<size_t>(h) * D);
            a[h][0] = V::Fma(c0, qv, a[h][0]);
            a[h][1] = V::Fma(c1, qv, a[h][1]);
          }
        }
      });
    };
    int c = 0;
    for (; c + NS <= NC; c += NS) {
#pragma GCC unroll 4
      for (int s = 0; s < NS; ++s) column(c + s, acc[s]);
    }
    for (; c < NC; ++c) column(c, acc[0]);
#pragma GCC unroll 4
    for (int h = 0; h < NH; ++h) {
      Acc r[2] = {acc[0][h][0], acc[0][h][1]};
#pragma GCC unroll 2
      for (int u = 0; u < 2; ++u) {
#pragma GCC unroll 4
        for (int s = 1; s < NS; ++s) {
          if constexpr (kFast) {
            r[u] = V::AddI(r[u], acc[s][h][u]);
          } else {
            r[u] = V::Add(r[u], acc[s][h][u]);
          }
        }
        float* out = S + static_cast<size_t>(h) * ld + v + u * N;
        if constexpr (kFast) {
          V::Store(out, V::Fma(V::Cvt(r[u]), V::Set(qsc[h]), V::Set(bias[h])));
        } else {
          V::Store(out, V::Add(r[u], V::Set(bias[h])));
        }
      }
    }
  }
}

// The query of NH heads for the exact group kernel: qs[h][ch] = q_h[ch] s[ch] and
// bias[h] = q_h . z (D a multiple of 8).
template <int NH>
HWY_INLINE void PrepareExactKeyQuery(const float* q, int D, const float* sp, const float* zp, float* qs, float* bias) {
#pragma GCC unroll 4
  for (int h = 0; h < NH; ++h) {
    const float* qh = q + static_cast<size_t>(h) * D;
    float* o = qs + static_cast<size_t>(h) * D;
    __m256 b0 = _mm256_setzero_ps(), b1 = _mm256_setzero_ps();
    int d = 0;
    for (; d + 16 <= D; d += 16) {
      const __m256 x0 = _mm256_loadu_ps(qh + d), x1 = _mm256_loadu_ps(qh + d + 8);
      _mm256_storeu_ps(o + d, _mm256_mul_ps(x0, _mm256_loadu_ps(sp + d)));
      _mm256_storeu_ps(o + d + 8, _mm256_mul_ps(x1, _mm256_loadu_ps(sp + d + 8)));
      b0 = _mm256_fmadd_ps(x0, _mm256_loadu_ps(zp + d), b0);
      b1 = _mm256_fmadd_ps(x1, _mm256_loadu_ps(zp + d + 8), b1);
    }
    if (d < D) {
      const __m256 x0 = _mm256_loadu_ps(qh + d);
      _mm256_storeu_ps(o + d, _mm256_mul_ps(x0, _mm256_loadu_ps(sp + d)));
      b0 = _mm256_fmadd_ps(x0, _mm256_loadu_ps(zp + d), b0);
    }
    bias[h] = HSum(_mm256_add_ps(b0, b1));
  }
}

// Whether the group kernels read KIVI keys of head size D, `bits` and group size G,
// taking `step` tokens (two vectors) at a time: whole 32-bit words per row and a multiple
// of 8 channels (the query preparation).
bool KiviKeyGroupsOk(int D, int bits, int G, int step) {
  return (bits == 2 || bits == 4 || bits == 8) && (D * bits / 8) % 4 == 0 && D % 8 == 0 && G % step == 0;
}
// The fast (int16) group kernel: 2- and 4-bit codes, no int32 overflow
// (D (2^bits - 1) 32767 < 2^31), and on AVX3 512-bit vectors (wide). Other group shapes
// take the exact kernel.
bool FastKiviKeyGroupsOk(int D, int bits, bool wide) {
  return (bits == 2 || bits == 4) && D * ((1 << bits) - 1) <= 65535 && (wide || HWY_TARGET != HWY_AVX3);
}

// One task's KIVI key scores over tokens [t0, t1) (all stored), group by group.
struct KeyGroupArgs {
  const kv::StreamView* K;
  int h, t0, t1;     // column 0 of S is token t0
  const float* qn;   // [rep][D], scaled
  int rep;
  float* S;          // [rep][ld]
  int ld;
  float* sp;         // [D] scales, [D] zeros
  float* zp;
  float* qs;         // [4][D] (exact) / int16 [4][D] (fast)
  float* tmp;        // [4][G]: a partial group's scores
  bool wide;         // 512-bit vectors (AVX3)
};

// The fast group kernel's query on 256-bit vectors (D a multiple of 8): q_h s rounded to
// int16 in natural channel order into q16 [NH][D], the scale of the codes per head in
// qsc, and bias[h] = q_h . z. Every head's maximum and bias come first (four bias sums
// and two maxima in flight), then the rounding, so no head waits on its own reduction.
template <int NH>
HWY_INLINE void QuantizeKeyQuery256(const float* qp, int D, const float* sp, const float* zp, int16_t* q16, float* qsc,
                                    float* bias) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  float inv_h[4];
  for (int hh = 0; hh < NH; ++hh) {
    const float* x = qp + static_cast<size_t>(hh) * D;
    __m256 m0 = _mm256_setzero_ps(), m1 = _mm256_setzero_ps();
    __m256 b0 = _mm256_setzero_ps(), b1 = _mm256_setzero_ps(), b2 = _mm256_setzero_ps(), b3 = _mm256_setzero_ps();
    for (int d = 0; d + 32 <= D; d += 32) {
      const __m256 x0 = _mm256_loadu_ps(x + d), x1 = _mm256_loadu_ps(x + d + 8);
      const __m256 x2 = _mm256_loadu_ps(x + d + 16), x3 = _mm256_loadu_ps(x + d + 24);
      const __m256 v0 = _mm256_mul_ps(x0, _mm256_loadu_ps(sp + d)), v1 = _mm256_mul_ps(x1, _mm256_loadu_ps(sp + d + 8));
      const __m256 v2 = _mm256_mul_ps(x2, _mm256_loadu_ps(sp + d + 16)), v3 = _mm256_mul_ps(x3, _mm256_loadu_ps(sp + d + 24));
      m0 = _mm256_max_ps(m0, _mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v2)));
      m1 = _mm256_max_ps(m1, _mm256_max_ps(_mm256_andnot_ps(sign, v1), _mm256_andnot_ps(sign, v3)));
      b0 = _mm256_fmadd_ps(x0, _mm256_loadu_ps(zp + d), b0);
      b1 = _mm256_fmadd_ps(x1, _mm256_loadu_ps(zp + d + 8), b1);
      b2 = _mm256_fmadd_ps(x2, _mm256_loadu_ps(zp + d + 16), b2);
      b3 = _mm256_fmadd_ps(x3, _mm256_loadu_ps(zp + d + 24), b3);
    }
    for (int d = D / 32 * 32; d < D; d += 8) {
      const __m256 x0 = _mm256_loadu_ps(x + d);
      m0 = _mm256_max_ps(m0, _mm256_andnot_ps(sign, _mm256_mul_ps(x0, _mm256_loadu_ps(sp + d))));
      b0 = _mm256_fmadd_ps(x0, _mm256_loadu_ps(zp + d), b0);
    }
    bias[hh] = HSum(_mm256_add_ps(_mm256_add_ps(b0, b1), _mm256_add_ps(b2, b3)));
    const float m = HMax(_mm256_max_ps(m0, m1));
    qsc[hh] = m / 32767.0f;
    inv_h[hh] = m > 0.0f ? 32767.0f / m : 0.0f;  // all-zero products round to zero codes
  }
  for (int hh = 0; hh < NH; ++hh) {
    const float* x = qp + static_cast<size_t>(hh) * D;
    int16_t* q = q16 + static_cast<size_t>(hh) * D;
    const __m256 inv = _mm256_set1_ps(inv_h[hh]);
    int d = 0;
    for (; d + 16 <= D; d += 16) {
      const __m256i lo =
          _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + d), _mm256_loadu_ps(sp + d)), inv));
      const __m256i hi =
          _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + d + 8), _mm256_loadu_ps(sp + d + 8)), inv));
      // packs works per 128-bit half: (lo 0-3, hi 0-3 | lo 4-7, hi 4-7); qwords 0, 2, 1, 3 restore the order.
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + d), _mm256_permute4x64_epi64(_mm256_packs_epi32(lo, hi), 0xD8));
    }
    if (d < D) {
      const __m256i v =
          _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + d), _mm256_loadu_ps(sp + d)), inv));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + d),
                       _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)));
    }
  }
}

template <class V, int NH, int BITS, bool kFast, bool kVnni, int kW>
HWY_INLINE void KiviKeyQuad(const uint8_t* cg, int G, int W, const float* q, const float* sp, const float* zp,
                            float* qs, float* S, int ld, PrefetchCursor* pf) {
  const int D = W * 8 / BITS;
  float bias[4] = {0, 0, 0, 0};
  if constexpr (kFast) {
    float qsc[4] = {0, 0, 0, 0};
    int16_t* q16 = reinterpret_cast<int16_t*>(qs);
#if HWY_TARGET == HWY_AVX3
    if (D % 32 == 0) {
      QuantizeKeyQuery512<NH>(q, sp, zp, D, q16, qsc, bias);
    } else {
      QuantizeKeyQuery256<NH>(q, D, sp, zp, q16, qsc, bias);
    }
#else
    QuantizeKeyQuery256<NH>(q, D, sp, zp, q16, qsc, bias);
#endif
    KiviGroupScores<V, NH, BITS, kW, true, kVnni>(cg, G, W, q16, qsc, bias, S, ld, pf);
  } else {
    PrepareExactKeyQuery<NH>(q, D, sp, zp, qs, bias);
    KiviGroupScores<V, NH, BITS, kW, false, false>(cg, G, W, qs, nullptr, bias, S, ld, pf);
  }
}

template <class V, int BITS, bool kFast, bool kVnni>
HWY_INLINE void KiviKeyGroupsB(const KeyGroupArgs& k, Prefetcher& pf_ranges) {
  const kv::StreamView& K = *k.K;
  const int D = K.head_dim, G = K.group, W = D * BITS / 8;
  const size_t ps = kv::param_size(K.param_type);
  PrefetchCursor pf(pf_ranges);
  for (int g0 = k.t0; g0 < k.t1;) {
    const int gs = g0 / G * G, g1 = std::min(k.t1, gs + G);
    const size_t pi = K.group_params(gs, k.h);
    LoadParams(K, pi, D, k.sp);
    LoadParams(K, pi, D, k.zp, true);
    if (gs + 2 * G < k.t1) {  // the parameters of the group after next
      const size_t pn = K.group_params(gs + 2 * G, k.h);
      for (size_t b = 0; b < D * ps; b += 64) {
        hwy::Prefetch(K.scales + pn * ps + b);
        hwy::Prefetch(K.zeros + pn * ps + b);
      }
    }
    const uint8_t* cg = K.group_codes(gs, k.h);
    const bool whole = g0 == gs && g1 == gs + G;
    for (int r = 0; r < k.rep; r += 4) {
      const float* q = k.qn + static_cast<size_t>(r) * D;
      float* dst = whole ? k.S + static_cast<size_t>(r) * k.ld + (gs - k.t0) : k.tmp;
      const int ldd = whole ? k.ld : G;
      PrefetchCursor* pc = r == 0 ? &pf : nullptr;  // the group's bytes are stepped once
      const int nh = std::min(4, k.rep - r);
      switch (nh) {
        case 1: KiviKeyQuad<V, 1, BITS, kFast, kVnni, 0>(cg, G, W, q, k.sp, k.zp, k.qs, dst, ldd, pc); break;
        case 2: KiviKeyQuad<V, 2, BITS, kFast, kVnni, 0>(cg, G, W, q, k.sp, k.zp, k.qs, dst, ldd, pc); break;
        case 3: KiviKeyQuad<V, 3, BITS, kFast, kVnni, 0>(cg, G, W, q, k.sp, k.zp, k.qs, dst, ldd, pc); break;
        default:
          // The most common head size gets a kernel with the row size fixed at compile time.
          if (D == 128) {
            KiviKeyQuad<V, 4, BITS, kFast, kVnni, 128 * BITS / 8>(cg, G, W, q, k.sp, k.zp, k.qs, dst, ldd, pc);
          } else {
            KiviKeyQuad<V, 4, BITS, kFast, kVnni, 0>(cg, G, W, q, k.sp, k.zp, k.qs, dst, ldd, pc);
          }
          break;
      }
      if (!whole) {
        for (int h = 0; h < nh; ++h) {
          std::copy(k.tmp + static_cast<size_t>(h) * G + (g0 - gs), k.tmp + static_cast<size_t>(h) * G + (g1 - gs),
                    k.S + static_cast<size_t>(r + h) * k.ld + (g0 - k.t0));
        }
      }
    }
    g0 = g1;
  }
}

// By code size on vectors V. The fast kernels exist only for the shapes
// FastKiviKeyGroupsOk admits (KiviKeyGroups routes every other shape to the exact ones),
// so that the VNNI and non-VNNI fast variants do not carry copies of the exact kernels.
template <class V, bool kFast, bool kVnni>
HWY_INLINE void KiviKeyGroupsV(const KeyGroupArgs& k, Prefetcher& pf) {
  switch (kv::format_bits(k.K->fmt.format)) {
    case 2: return KiviKeyGroupsB<V, 2, kFast, kVnni>(k, pf);
    case 4: return KiviKeyGroupsB<V, 4, kFast, kVnni>(k, pf);
    default:
      if constexpr (kFast) {
        HWY_ABORT("fast KIVI key groups: %d-bit codes (FastKiviKeyGroupsOk)", kv::format_bits(k.K->fmt.format));
      } else {
        return KiviKeyGroupsB<V, 8, false, false>(k, pf);
      }
  }
}

template <bool kFast, bool kVnni>
HWY_INLINE void KiviKeyGroupsT(const KeyGroupArgs& k, Prefetcher& pf) {
#if HWY_TARGET == HWY_AVX3
  if (k.wide) return KiviKeyGroupsV<KeyVec512, kFast, kVnni>(k, pf);
  if constexpr (kFast) {
    HWY_ABORT("fast KIVI key groups on AVX3 need 512-bit vectors (FastKiviKeyGroupsOk)");
  } else {
    return KiviKeyGroupsV<KeyVec256, false, false>(k, pf);
  }
#else
  return KiviKeyGroupsV<KeyVec256, kFast, kVnni>(k, pf);
#endif
}

#ifdef KIVI_VNNI
KIVI_VNNI_ATTR HWY_NOINLINE void KiviKeyGroupsVnni(const KeyGroupArgs& k, Prefetcher& pf) {
  KiviKeyGroupsT<true, true>(k, pf);
}
#endif

// Scores of the stored KIVI keys of a task: the fast kernel where `fast` is asked for and
// FastKiviKeyGroupsOk admits the shape, the exact one otherwise.
void KiviKeyGroups(const KeyGroupArgs& k, bool fast, Prefetcher& pf) {
  if (fast && FastKiviKeyGroupsOk(k.K->head_dim, kv::format_bits(k.K->fmt.format), k.wide)) {
#ifdef KIVI_VNNI
    if (HasVnni()) return KiviKeyGroupsVnni(k, pf);
#endif
    return KiviKeyGroupsT<true, false>(k, pf);
  }
  KiviKeyGroupsT<false, false>(k, pf);
}
#endif  // KIVI_FAST_INT

// ---------------------------------------------------------------------------------
// One task.

void AttendTask(const TaskArgs& a) {
  const kv::LayerView& kvv = *a.kv;
  const kv::StreamView& K = kvv.k;
  const kv::StreamView& V = kvv.v;
  const int D = K.head_dim, rep = a.rep, h = a.h;
  [[maybe_unused]] const bool k_kivi = kv::is_kivi(K.fmt.format), v_kivi = kv::is_kivi(V.fmt.format);
  const int kbits = kv::format_bits(K.fmt.format), vbits = kv::format_bits(V.fmt.format);

  // Scratch: qn [rep][D], S [rep][ld], kbuf/vbuf [kTile][D],
  // key params sp/zp [D], value params vs/vz [kTile][D/Gc], row scales [kTile].
  float* qn = a.scratch;
  const int ld = a.ld;  // scores of the whole range: S [rep][ld]
  float* S = qn + static_cast<size_t>(rep) * D;
  float* kbuf = S + static_cast<size_t>(rep) * ld;
  float* vbuf = kbuf + static_cast<size_t>(kTile) * D;
  float* sp = vbuf + static_cast<size_t>(kTile) * D;
  float* zp = sp + D;
  float* vs = zp + D;
  float* vz = vs + static_cast<size_t>(kTile) * D;
  float* rs = vz + static_cast<size_t>(kTile) * D;

  {
    // The scaled query, [rep][D] (contiguous in both).
    const hn::ScalableTag<float> df;
    const int N = static_cast<int>(hn::Lanes(df)), n = rep * D;
    const auto sv = hn::Set(df, a.scale);
    int i = 0;
    for (; i + N <= n; i += N) hn::StoreU(hn::Mul(hn::LoadU(df, a.q + i), sv), df, qn + i);
    for (; i < n; ++i) qn[i] = a.q[i] * a.scale;
  }
  for (int r = 0; r < rep; ++r) {
    float* o = a.out + static_cast<size_t>(r) * a.out_stride;
    std::fill(o, o + D, 0.0f);
    o[D] = -std::numeric_limits<float>::infinity();
    o[D + 1] = 0.0f;
  }

  const int B = K.block;
#if KIVI_FAST_INT
  const bool fast = a.precision == Precision::kFast;
  // Fast-path scratch (bytes), carved from the staging buffers it does not use.
  int16_t* q8 = reinterpret_cast<int16_t*>(kbuf);                         // [4][D] or [rep][D]
  uint64_t* wq = reinterpret_cast<uint64_t*>(vbuf);                      // [4][D/Gc][quads] x 4 int16
  float* wsc = vbuf + static_cast<size_t>(kTile) * D / 2;                // [4][D/Gc]
  // int8 keys: the query rounded once per task.
  float q8sc[64 + 4];
  const bool fast_int8_k = fast && K.fmt.format == kv::Format::kInt8 &&
                           K.fmt.granularity != kv::Int8Granularity::kGroup && D % 16 == 0 && rep <= 64;
  if (fast_int8_k) {
    for (int r = 0; r < rep; ++r) {
      q8sc[r] = QuantizeQuery16(qn + static_cast<size_t>(r) * D, D, q8 + static_cast<size_t>(r) * D);
    }
  }
  const bool fast_kivi_v = fast && v_kivi && FastKiviValuesOk(D, vbits, V.group);
  // KIVI keys a group at a time (512-bit vectors on AVX3 when the group holds whole pairs
  // of them); scratch: the query [4][D] and a partial group's scores [4][G] in kbuf.
  const bool wide_k = HWY_TARGET == HWY_AVX3 && K.group % 32 == 0 && (fast || g_wide_scores.load(std::memory_order_relaxed));
  const bool group_kivi_k =
      k_kivi && KiviKeyGroupsOk(D, kbits, K.group, wide_k ? 32 : 16) && 4 * (D + K.group) <= kTile * D;
#else
  constexpr bool group_kivi_k = false;
#endif

  // The byte ranges this task reads, in order: K codes then V codes, block by block,
  // with the residual rows at the end of each.
  Prefetcher pf;
  auto add_stream = [&](const kv::StreamView& st) {
    for (int t = a.t0; t < a.t1;) {
      if (t < st.n_stored) {
        const int e = std::min({a.t1, st.n_stored, (t / B + 1) * B});
        if (st.per_channel) {  // KIVI keys: whole groups (stored groups are always whole)
          const int G = st.group, gs = t / G * G, ge = (e + G - 1) / G * G;
          pf.add(st.group_codes(t, h), static_cast<size_t>(ge - gs) * st.code_row_bytes, st.code_row_bytes);
          t = e;
          continue;
        }
        const uint8_t* p = st.quad ? st.quad_row(t, h) : st.row(t, h);
        const size_t bytes = st.quad ? static_cast<size_t>((e - t / 4 * 4 + 3) / 4) * 4 * st.code_row_bytes
                                     : static_cast<size_t>(e - t) * st.token_stride;
        pf.add(p, bytes, st.quad ? st.code_row_bytes : st.token_stride);
        t = e;
      } else {
        const int e = std::min(a.t1, (t / st.ring_capacity + 1) * st.ring_capacity);
        pf.add(st.residual_row(t, h), static_cast<size_t>(e - t) * D * sizeof(float), static_cast<size_t>(D) * sizeof(float));
        t = e;
      }
    }
  };
  add_stream(K);
  add_stream(V);
  pf.lead(kPrefetchLead);
  // The quantization parameters of a tile live in their own arrays: fetched a tile ahead.
  auto prefetch_params = [&](const kv::StreamView& st, int t, int end) {
    if (t >= end || t >= st.n_stored) return;
    if (st.head_block_params == 0 && st.fmt.granularity != kv::Int8Granularity::kToken) return;
    const int n = std::min({end - t, kTile, (t / B + 1) * B - t});
    const size_t ps = kv::param_size(st.param_type);
    size_t first = 0, count = 0;
    if (st.per_channel) {  // KIVI keys: [B/G][D] per head and block
      first = st.group_params(t, h);
      count = static_cast<size_t>((n + st.group - 1) / st.group + 1) * D;
    } else if (kv::is_kivi(st.fmt.format) || st.fmt.granularity == kv::Int8Granularity::kGroup) {
      first = st.param_base(t, h) + static_cast<size_t>(t % B) * (D / st.group);
      count = static_cast<size_t>(n) * (D / st.group);
    } else if (st.fmt.granularity == kv::Int8Granularity::kHead) {
      first = st.param_base(t, h) + static_cast<size_t>(t % B);
      count = static_cast<size_t>(n);
    } else {
      first = st.token_param_index(t);
      count = static_cast<size_t>(n);
    }
    for (size_t b = 0; b < count * ps; b += 64) {
      hwy::Prefetch(st.scales + first * ps + b);
      if (st.zeros) hwy::Prefetch(st.zeros + first * ps + b);
    }
  };
#if KIVI_FAST_INT
  if (group_kivi_k && K.n_stored > a.t0) {  // the stored keys, group by group
    KeyGroupArgs ka{&K, h, a.t0, std::min(a.t1, K.n_stored), qn, rep, S, ld, sp, zp, kbuf,
                    kbuf + static_cast<size_t>(4) * D, wide_k};
    KiviKeyGroups(ka, fast, pf);
  }
#endif
  if (!group_kivi_k) prefetch_params(K, a.t0, a.t1);
  for (int t0 = a.t0; t0 < a.t1;) {
    const int t1 = std::min({a.t1, t0 + kTile, (t0 / B + 1) * B});
    if (t1 < a.t1) {
      if (!group_kivi_k) prefetch_params(K, t1, a.t1);
    } else {
      prefetch_params(V, a.t0, a.t1);  // the value pass starts next
    }

    // 1. Scores (stored KIVI keys done above by the group kernels).
    const int ke = std::max(t0, std::min(t1, K.n_stored));  // [t0, ke) stored, [ke, t1) residual
    if (ke > t0 && !group_kivi_k) {
      const int n = ke - t0;
      switch (K.fmt.format) {
        case kv::Format::kF32:
          DotRows(qn, rep, D, reinterpret_cast<const float*>(K.row(t0, h)), K.token_stride / 4, n, S + (t0 - a.t0), ld, pf);
          break;
        case kv::Format::kF16:
          DotRows(qn, rep, D, reinterpret_cast<const f16_t*>(K.row(t0, h)), K.token_stride / 2, n, S + (t0 - a.t0), ld, pf);
          break;
        case kv::Format::kInt8: {
          const int Gc = K.group;
          const bool grp = K.fmt.granularity == kv::Int8Granularity::kGroup;
          const size_t base = K.param_base(t0, h), slot = static_cast<size_t>(t0 % B);
          switch (K.fmt.granularity) {
            case kv::Int8Granularity::kTensor: std::fill(rs, rs + n, K.tensor_scale); break;
            case kv::Int8Granularity::kToken: LoadParams(K, K.token_param_index(t0), n, rs); break;
            case kv::Int8Granularity::kHead: LoadParams(K, base + slot, n, rs); break;
            case kv::Int8Granularity::kGroup: LoadParams(K, base + slot * (D / Gc), n * (D / Gc), vs); break;
          }
#if KIVI_FAST_INT
          if (fast_int8_k) {
            FastInt8Keys(q8, q8sc, rep, D, reinterpret_cast<const int8_t*>(K.row(t0, h)), K.token_stride, n, rs,
                         S + (t0 - a.t0), ld, pf);
            break;
          }
#endif
          if (!grp) {
            // One scale per row: the codes are converted inside the dot products and the
            // scores scaled afterwards, so nothing is staged.
            float* St = S + (t0 - a.t0);
            DotRows(qn, rep, D, reinterpret_cast<const int8_t*>(K.row(t0, h)), K.token_stride, n, St, ld, pf);
            for (int r = 0; r < rep; ++r)
              for (int i = 0; i < n; ++i) St[static_cast<size_t>(r) * ld + i] *= rs[i];
            break;
          }
          DequantInt8(reinterpret_cast<const int8_t*>(K.row(t0, h)), K.token_stride, n, D, rs, vs, Gc, D / Gc, kbuf);
          DotRows(qn, rep, D, kbuf, static_cast<size_t>(D), n, S + (t0 - a.t0), ld, pf);
          break;
        }
        default: {  // KIVI keys (other targets and shapes): dequantized into kbuf
          const int G = K.group;
          for (int g0 = t0; g0 < ke;) {
            const int g1 = std::min(ke, (g0 / G + 1) * G);
            const size_t pi = K.group_params(g0, h);
            LoadParams(K, pi, D, sp);
            LoadParams(K, pi, D, zp, true);
            DequantKiviKeys(K.group_codes(g0, h), G, g0 % G, g1 - g0, D, kbits, sp, zp,
                            kbuf + static_cast<size_t>(g0 - t0) * D);
            g0 = g1;
          }
          DotRows(qn, rep, D, kbuf, static_cast<size_t>(D), n, S + (t0 - a.t0), ld, pf);
          break;
        }
      }
    }
    for (int r0 = ke; r0 < t1;) {  // residual keys, natural order; the ring may wrap
      const int cap = K.ring_capacity;
      const int r1 = std::min(t1, (r0 / cap + 1) * cap);
      DotRows(qn, rep, D, K.residual_row(r0, h), static_cast<size_t>(D), r1 - r0, S + (r0 - a.t0), ld, pf);
      r0 = r1;
    }

    t0 = t1;
  }

  // 2. ALiBi and the softmax update over the whole range.
  const int total = a.t1 - a.t0;
  if (a.slopes) {
    for (int r = 0; r < rep; ++r)
      for (int i = 0; i < total; ++i) S[r * ld + i] += a.slopes[r] * static_cast<float>(a.t0 + i - a.q_pos);
  }
  SoftmaxUpdate(S, ld, rep, total, D, a.out, a.out_stride);

  // 3. Values.
  for (int t0 = a.t0; t0 < a.t1;) {
    const int t1 = std::min({a.t1, t0 + kTile, (t0 / B + 1) * B});
    prefetch_params(V, t1, a.t1);
    const int ve = std::max(t0, std::min(t1, V.n_stored));
    if (ve > t0) {
      const int n = ve - t0;
      switch (V.fmt.format) {
        case kv::Format::kF32:
          AccumRows(S + (t0 - a.t0), ld, rep, D, reinterpret_cast<const float*>(V.row(t0, h)), V.token_stride / 4, n, a.out,
                    a.out_stride, pf);
          break;
        case kv::Format::kF16:
          AccumRows(S + (t0 - a.t0), ld, rep, D, reinterpret_cast<const f16_t*>(V.row(t0, h)), V.token_stride / 2, n, a.out,
                    a.out_stride, pf);
          break;
        case kv::Format::kInt8: {
          const int Gc = V.group;
          const bool grp = V.fmt.granularity == kv::Int8Granularity::kGroup;
          const size_t base = V.param_base(t0, h), slot = static_cast<size_t>(t0 % B);
          switch (V.fmt.granularity) {
            case kv::Int8Granularity::kTensor: std::fill(rs, rs + n, V.tensor_scale); break;
            case kv::Int8Granularity::kToken: LoadParams(V, V.token_param_index(t0), n, rs); break;
            case kv::Int8Granularity::kHead: LoadParams(V, base + slot, n, rs); break;
            case kv::Int8Granularity::kGroup: LoadParams(V, base + slot * (D / Gc), n * (D / Gc), vs); break;
          }
          if (!grp && rep <= D) {  // (the weights fit in the value staging buffer)
            // One scale per row: folded into the weights (p * s), and the codes are
            // converted inside the accumulation, so nothing is staged.
            float* pw = vbuf;  // [rep][kTile]
            for (int r = 0; r < rep; ++r) {
              const float* Pr = S + static_cast<size_t>(r) * ld + (t0 - a.t0);
              for (int i = 0; i < n; ++i) pw[r * kTile + i] = Pr[i] * rs[i];
            }
            AccumRows(pw, kTile, rep, D, reinterpret_cast<const int8_t*>(V.row(t0, h)), V.token_stride, n, a.out,
                      a.out_stride, pf);
            break;
          }
          DequantInt8(reinterpret_cast<const int8_t*>(V.row(t0, h)), V.token_stride, n, D, rs, vs, Gc, D / Gc, vbuf);
          AccumRows(S + (t0 - a.t0), ld, rep, D, vbuf, static_cast<size_t>(D), n, a.out, a.out_stride, pf);
          break;
        }
        default: {  // KIVI values: per-token params per group of Gc channels
          const int Gc = V.group, NG = D / Gc;
          const size_t pi = V.param_base(t0, h) + static_cast<size_t>(t0 % B) * NG;
          LoadParams(V, pi, n * NG, vs);
          LoadParams(V, pi, n * NG, vz, true);
#if KIVI_FAST_INT
          if (fast_kivi_v) {
            pf.step(static_cast<size_t>(n));
            FastKiviValues(S + (t0 - a.t0), ld, rep, D, vbits, Gc, V.quad_row(t0, h), t0 % 4, n, vs, vz, a.out,
                           a.out_stride, wq, wsc, kbuf);
            break;
          }
#endif
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3
          if (ExactKiviValuesOk(D, vbits, Gc, t0 % 4, n) && static_cast<size_t>(n) * NG * 8 <= static_cast<size_t>(kTile) * D) {
            pf.step(static_cast<size_t>(n));
            AccumKiviExact(S + (t0 - a.t0), ld, rep, D, vbits, Gc, V.quad_row(t0, h), n, vs, vz, a.out, a.out_stride,
                           kbuf);
            break;
          }
#endif
          DequantKiviValues(V.quad_row(t0, h), t0 % 4, n, D, vbits, Gc, vs, vz, static_cast<size_t>(NG), vbuf);
          AccumRows(S + (t0 - a.t0), ld, rep, D, vbuf, static_cast<size_t>(D), n, a.out, a.out_stride, pf);
          break;
        }
      }
    }
    for (int r0 = ve; r0 < t1;) {  // residual values
      const int cap = V.ring_capacity;
      const int r1 = std::min(t1, (r0 / cap + 1) * cap);
      const float* rows = V.residual_row(r0, h);
      AccumRows(S + (r0 - a.t0), ld, rep, D, rows, static_cast<size_t>(D), r1 - r0, a.out, a.out_stride, pf);
      r0 = r1;
    }
    t0 = t1;
  }

}

}  // namespace kivi::attn::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kivi::attn {

HWY_EXPORT(AttendTask);
HWY_EXPORT(ExpNonPositiveArray);

size_t kernel_scratch_floats(int rep, int D, int block) {
  return 2 * static_cast<size_t>(rep) * D + static_cast<size_t>(rep) * chunk_tokens(block) +
         2 * static_cast<size_t>(kTile) * D +
         2 * static_cast<size_t>(D) + 2 * static_cast<size_t>(kTile) * D + kTile + 64;
}

void attend_range(const TaskArgs& a) { HWY_DYNAMIC_DISPATCH(AttendTask)(a); }

void exp_nonpositive(const float* x, float* y, int n) { HWY_DYNAMIC_DISPATCH(ExpNonPositiveArray)(x, y, n); }

void set_wide_exact_kernels(bool scores, bool kivi_values) {
  g_wide_scores.store(scores, std::memory_order_relaxed);
  g_wide_kivi_values.store(kivi_values, std::memory_order_relaxed);
}

}  // namespace kivi::attn
#endif  // HWY_ONCE
