// int8 rows: staging of rows with a scale per group of channels (exact path), and the
// fast path's integer key scores for rows with one scale per row: the query rounded
// to int16 once per task, the codes widened to int16, vpmaddwd (AVX2) or vpdpwssd
// (AVX512-VNNI) products. Rows with one scale per row on the exact path are read in
// place by rows-inl.h.

// Per-target include guard (Highway's toggle).
#if defined(KIVI_ATTN_INT8_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KIVI_ATTN_INT8_INL_H_
#undef KIVI_ATTN_INT8_INL_H_
#else
#define KIVI_ATTN_INT8_INL_H_
#endif

#include <algorithm>
#include <cassert>

#include "attn/kernels-inl.h"  // kMaxFastInt8Heads and the kernels' declarations
#include "attn/prefetch.h"
#include "attn/vec-inl.h"
#include "attn/x86-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kivi::attn::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Staging: out[len][D] = the dequantized rows (codes at rows + i * stride), with one
// scale per row (row_scale[i]) or per group of Gc channels (group_scale, [len][D/Gc]
// with row stride gstride).
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

#ifdef KIVI_X86
// Fast path: the query rounded to int16 per head (relative rounding 2^-16 of its
// largest element), the codes widened to int16, the products summed in int32, and
// the sums scaled by the query's and the row's scales.

// Rounds x[0..D) to int16 (|q| <= 32767); returns the scale of the codes. D is a
// multiple of 8.
HWY_INLINE float QuantizeQuery16(const float* x, int D, int16_t* q) {
  assert(D % 8 == 0);
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
    _mm_storeu_si128(
        reinterpret_cast<__m128i*>(q + d),
        _mm_packs_epi32(_mm256_castsi256_si128(q32), _mm256_extracti128_si256(q32, 1)));
  }
  return m / 32767.0f;
}

#ifdef KIVI_X86_512
// The four-row loop of the 512-bit int8 key kernel: for rows t..t+3 it keeps 16
// accumulators acc[4 * row + head] over the rows' D channels, 32 at a time. load(row, c)
// widens 32 codes of a row to int16, qload(head, c) loads 32 channels of a head's query;
// finish(acc, t) reduces and stores. Returns the first row not covered (n rounded down
// to a multiple of 4).
template <int NH, bool kVnni, class PF, class Load, class QLoad, class Finish>
HWY_INLINE int FourRowDots512(int n, int D, PF& pf, const Load& load, const QLoad& qload,
                              const Finish& finish) {
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
        for (int hh = 0; hh < NH; ++hh)
          acc[4 * rr + hh] = DotI16<kVnni>(acc[4 * rr + hh], x[rr], qv[hh]);
      }
    }
    finish(acc, t);
  }
  return t;
}
#endif  // KIVI_X86_512

// int8 keys (one scale per row, rs[i]); the query q16 and its scale per head are
// prepared once per task.
template <int NH, bool kVnni>
HWY_INLINE void FastInt8Keys256(const int16_t* q16, const float* qsc, int D, const int8_t* rows,
                                size_t stride, int n, const float* rs, float* S, int ld,
                                Prefetcher& pf_ranges) {
  PrefetchCursor pf(pf_ranges);
  for (int t = 0; t < n; ++t) {
    pf.step(1);
    __m256i acc[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                      _mm256_setzero_si256()};
    const int8_t* row = rows + static_cast<size_t>(t) * stride;
    for (int c = 0; c < D; c += 16) {
      const __m256i x =
          _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + c)));
#pragma GCC unroll 4
      for (int hh = 0; hh < NH; ++hh) {
        acc[hh] = DotI16<kVnni>(
            acc[hh], x, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q16 + hh * D + c)));
      }
    }
    alignas(16) float out[4];
    _mm_store_ps(out,
                 _mm_mul_ps(_mm_mul_ps(SumsOf4(acc[0], acc[1], acc[2], acc[3]), _mm_loadu_ps(qsc)),
                            _mm_set1_ps(rs[t])));
    for (int hh = 0; hh < NH; ++hh) S[hh * ld + t] = out[hh];
  }
}

#ifdef KIVI_X86_512
// FastInt8Keys256 with 512-bit vectors, four rows at a time (D a multiple of 32): each
// row widens to int16 32 channels per instruction; Sum16 reduces the 16 sums at once.
template <int NH, bool kVnni, int kD>
HWY_INLINE void FastInt8Keys512(const int16_t* q16, const float* qsc, int D_, const int8_t* rows,
                                size_t stride, int n, const float* rs, float* S, int ld,
                                Prefetcher& pf) {
  const int D = kD > 0 ? kD : D_;
  float qs[4] = {0, 0, 0, 0};
  for (int hh = 0; hh < NH; ++hh) qs[hh] = qsc[hh];
  const __m512 qsc16 = PerHead16(qs);
  auto qload = [&](int hh, int c) {
    return _mm512_loadu_si512(q16 + static_cast<size_t>(hh) * D + c);
  };
  auto load = [&](int row, int c) {
    return _mm512_cvtepi8_epi16(_mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(rows + static_cast<size_t>(row) * stride + c)));
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
  if (t < n)
    FastInt8Keys256<NH, kVnni>(q16, qsc, D, rows + static_cast<size_t>(t) * stride, stride, n - t,
                               rs + t, S + t, ld, pf);
}
#endif

// The rep heads in passes of up to four over the rows.
template <bool kVnni>
HWY_INLINE void FastInt8KeysByHeads(const int16_t* q16, const float* qsc, int rep, int D,
                                    const int8_t* rows, size_t stride, int n, const float* rs,
                                    float* S, int ld, Prefetcher& pf) {
  for (int r = 0; r < rep; r += 4) {
    const int16_t* qr = q16 + static_cast<size_t>(r) * D;
    float* Sr = S + static_cast<size_t>(r) * ld;
#ifdef KIVI_X86_512
    if (D % 32 == 0) {
      switch (std::min(4, rep - r)) {
        case 1:
          FastInt8Keys512<1, kVnni, 0>(qr, qsc + r, D, rows, stride, n, rs, Sr, ld, pf);
          break;
        case 2:
          FastInt8Keys512<2, kVnni, 0>(qr, qsc + r, D, rows, stride, n, rs, Sr, ld, pf);
          break;
        case 3:
          FastInt8Keys512<3, kVnni, 0>(qr, qsc + r, D, rows, stride, n, rs, Sr, ld, pf);
          break;
        default:
          if (D == 128) {
            FastInt8Keys512<4, kVnni, 128>(qr, qsc + r, D, rows, stride, n, rs, Sr, ld, pf);
          } else {
            FastInt8Keys512<4, kVnni, 0>(qr, qsc + r, D, rows, stride, n, rs, Sr, ld, pf);
          }
          break;
      }
      continue;
    }
#endif
    switch (std::min(4, rep - r)) {
      case 1:
        FastInt8Keys256<1, kVnni>(qr, qsc + r, D, rows, stride, n, rs, Sr, ld, pf);
        break;
      case 2:
        FastInt8Keys256<2, kVnni>(qr, qsc + r, D, rows, stride, n, rs, Sr, ld, pf);
        break;
      case 3:
        FastInt8Keys256<3, kVnni>(qr, qsc + r, D, rows, stride, n, rs, Sr, ld, pf);
        break;
      default:
        FastInt8Keys256<4, kVnni>(qr, qsc + r, D, rows, stride, n, rs, Sr, ld, pf);
        break;
    }
  }
}

#ifdef KIVI_VNNI
KIVI_VNNI_ATTR HWY_NOINLINE void FastInt8KeysVnni(const int16_t* q16, const float* qsc, int rep,
                                                  int D, const int8_t* rows, size_t stride, int n,
                                                  const float* rs, float* S, int ld,
                                                  Prefetcher& pf) {
  FastInt8KeysByHeads<true>(q16, qsc, rep, D, rows, stride, n, rs, S, ld, pf);
}
#endif

bool FastInt8KeysOk(int D, int rep) { return D % 16 == 0 && rep <= kMaxFastInt8Heads; }

void PrepareInt8KeyQuery(const float* qn, int rep, int D, int16_t* q16, float* qsc) {
  assert(FastInt8KeysOk(D, rep));
  for (int r = 0; r < rep; ++r) {
    qsc[r] = QuantizeQuery16(qn + static_cast<size_t>(r) * D, D, q16 + static_cast<size_t>(r) * D);
  }
}

void FastInt8Keys(const int16_t* q16, const float* qsc, int rep, int D, const int8_t* rows,
                  size_t stride, int n, const float* rs, float* S, int ld, Prefetcher& pf) {
  assert(FastInt8KeysOk(D, rep));
#ifdef KIVI_VNNI
  if (HasVnni()) return FastInt8KeysVnni(q16, qsc, rep, D, rows, stride, n, rs, S, ld, pf);
#endif
  FastInt8KeysByHeads<false>(q16, qsc, rep, D, rows, stride, n, rs, S, ld, pf);
}
#endif  // KIVI_X86

}  // namespace kivi::attn::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
