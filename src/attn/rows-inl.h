// Row formats (f32, f16, and int8 with one scale per row): scores S = q K^T and the
// weighted sum of values O += P V, reading each row in place and converting its
// elements inside the products. Several query heads share each row load (GQA).

// Per-target include guard (Highway's toggle).
#if defined(KIVI_ATTN_ROWS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KIVI_ATTN_ROWS_INL_H_
#undef KIVI_ATTN_ROWS_INL_H_
#else
#define KIVI_ATTN_ROWS_INL_H_
#endif

#include <algorithm>
#include <type_traits>

#include "attn/prefetch.h"
#include "attn/task.h"
#include "attn/vec-inl.h"
#include "attn/x86-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kivi::attn::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Sums of `n` vectors (n = 8 or 16 on x86; any n elsewhere) into out[0..n).
// A tree of horizontal adds and shuffles costs ~1-3 instructions per sum instead of
// a full lane reduction per vector.
template <class DF>
HWY_INLINE void SumEach(DF df, const hn::Vec<DF>* v, int n, float* HWY_RESTRICT out) {
#ifdef KIVI_X86
  if constexpr (hn::MaxLanes(DF()) == 8) {
    if (n % 8 == 0) {
      for (int blk = 0; blk < n; blk += 8, v += 8, out += 8) _mm256_storeu_ps(out, SumEach8(v));
      return;
    }
  }
#endif
#ifdef KIVI_X86_512
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
                         size_t stride, int len, float* HWY_RESTRICT S, int ld,
                         Prefetcher& pf_ranges) {
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
      for (int t = 0; t < NT; ++t)
        kv[t] = LoadRow(df, rows + static_cast<size_t>(i + t) * stride + d);
#pragma GCC unroll 16
      for (int h = 0; h < NH; ++h) {
        const auto qv = hn::LoadU(df, q + static_cast<size_t>(h) * D + d);
#pragma GCC unroll 16
        for (int t = 0; t < NT; ++t) acc[h * NT + t] = hn::MulAdd(qv, kv[t], acc[h * NT + t]);
      }
    }
#ifdef KIVI_X86_512
    if constexpr (NH == 4 && NT == 4 && hn::MaxLanes(DF()) == 16) {
      __m512 raw[16];
#pragma GCC unroll 16
      for (int k = 0; k < 16; ++k) raw[k] = acc[k].raw;
      StoreScores4x4<4>(SumEach16(raw), S, ld, i);  // lane 4 h + t: head h, row i + t
      continue;
    }
#endif
#ifdef KIVI_X86
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
void DotRows(const float* q, int rep, int D, const T* rows, size_t stride, int len, float* S,
             int ld, Prefetcher& pf) {
#ifdef KIVI_X86_512
  // 512-bit vectors, 4 heads x 4 rows (16 accumulators reduced by one shuffle tree):
  // half the FMAs, conversions and query loads of 256-bit vectors. On AMD Zen 5, with two
  // 512-bit FMAs per cycle, f16 scores take ~19% less time in cache than with 256 bits.
  if (D % 16 == 0 && rep % 4 == 0 && g_switches.wide_scores.load(std::memory_order_relaxed)) {
    const hn::CappedTag<float, 16> d16;
    for (int r = 0; r < rep; r += 4)
      DotRowsN<4, 4>(d16, q + static_cast<size_t>(r) * D, D, rows, stride, len,
                     S + static_cast<size_t>(r) * ld, ld, pf);
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
        case 1:
          DotRowsN<1, 8>(df, qr, D, rows, stride, len, Sr, ld, pf);
          break;
        case 2:
          DotRowsN<2, 4>(df, qr, D, rows, stride, len, Sr, ld, pf);
          break;
        case 3:
          DotRowsN<3, 2>(df, qr, D, rows, stride, len, Sr, ld, pf);
          break;
        default:
          if constexpr (kNT == 2) {
            // 16 vector registers: two passes of 2 heads x 4 rows load each query vector
            // once per 4 rows (4 heads x 2 rows is bound by the query loads). The second
            // pass reads the rows from L1 and leaves the prefetcher alone.
            Prefetcher none;
            DotRowsN<2, 4>(df, qr, D, rows, stride, len, Sr, ld, pf);
            DotRowsN<2, 4>(df, qr + 2 * static_cast<size_t>(D), D, rows, stride, len,
                           Sr + 2 * static_cast<size_t>(ld), ld, none);
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
HWY_INLINE void AccumRowsN(DF df, const float* HWY_RESTRICT P, int ld, int D,
                           const T* HWY_RESTRICT rows, size_t stride, int len,
                           float* HWY_RESTRICT O, size_t ostride, Prefetcher& pf) {
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
void AccumRows(const float* P, int ld, int rep, int D, const T* rows, size_t stride, int len,
               float* O, size_t ostride, Prefetcher& pf) {
#ifdef KIVI_X86_512
  // 512-bit vectors for the weighted sum of values: 4 heads x 4 vectors x 16 lanes. The
  // FMA rate is the same as with 256 bits on Zen 4, but the f16 conversions, broadcasts and
  // loop overhead per product halve (f16 and int8 ~9% faster in cache there than with 256 bits);
  // Zen 5 runs two 512-bit FMAs per cycle.
  if (D % 64 == 0 && rep % 4 == 0) {
    const hn::CappedTag<float, 16> d16;
    for (int r = 0; r < rep; r += 4)
      AccumRowsN<4, 4>(d16, P + static_cast<size_t>(r) * ld, ld, D, rows, stride, len,
                       O + static_cast<size_t>(r) * ostride, ostride, pf);
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
        case 1:
          AccumRowsN<1, 4>(df, Pr, ld, D, rows, stride, len, Or, ostride, pf);
          break;
        case 2:
          AccumRowsN<2, kNV>(df, Pr, ld, D, rows, stride, len, Or, ostride, pf);
          break;
        case 3:
          AccumRowsN<3, 2>(df, Pr, ld, D, rows, stride, len, Or, ostride, pf);
          break;
        default:
          AccumRowsN<4, kNV>(df, Pr, ld, D, rows, stride, len, Or, ostride, pf);
          break;
      }
    }
  });
}

// Staging: out[len][D] = the rows as floats.
template <class T>
void StageRows(const T* rows, size_t stride, int len, int D, float* out) {
  WithTag(static_cast<size_t>(D), [&](auto df) {
    const size_t N = hn::Lanes(df);
    for (int i = 0; i < len; ++i) {
      const T* r = rows + static_cast<size_t>(i) * stride;
      float* o = out + static_cast<size_t>(i) * D;
      for (size_t d = 0; d < static_cast<size_t>(D); d += N)
        hn::StoreU(LoadRow(df, r + d), df, o + d);
    }
  });
}

}  // namespace kivi::attn::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
