// KIVI keys: scores q . k over the stored key groups (keys quantized per channel,
// a scale and zero point per channel and group of G tokens; kv/codec.h).
//
// AVX2 and AVX3 read a whole group at a time, exact and fast paths in one kernel
// (KiviGroupScores). Other targets and shapes stage the dequantized rows of a tile
// (DequantKiviKeys) for the float row kernels.
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

// Per-target include guard (Highway's toggle).
#if defined(KIVI_ATTN_KIVI_KEYS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KIVI_ATTN_KIVI_KEYS_INL_H_
#undef KIVI_ATTN_KIVI_KEYS_INL_H_
#else
#define KIVI_ATTN_KIVI_KEYS_INL_H_
#endif

#include <algorithm>
#include <cassert>
#include <cstring>
#include <type_traits>
#include <utility>

#include "attn/kernels-inl.h"
#include "attn/params-inl.h"
#include "attn/prefetch.h"
#include "attn/vec-inl.h"
#include "attn/x86-inl.h"
#include "kv/codec.h"

HWY_BEFORE_NAMESPACE();
namespace kivi::attn::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// ---------------------------------------------------------------------------------
// Staging (every target): the dequantized rows of part of a group.

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
  alignas(64) uint8_t row[1024 + 64];  // W <= 1024 bytes, plus a vector's overhang
  assert(W <= 1024);
  WithTag(static_cast<size_t>(W), [&](auto df) {
    for (int i = 0; i < len; ++i) {
      if (W % 4 == 0) {
        // Word c of the token holds row bytes 4c, 4c + 2, 4c + 1, 4c + 3: swap the middle two.
        static_assert(kv::kKeyWordOrder[1] == 2 && kv::kKeyWordOrder[2] == 1, "word order");
        for (int c = 0; c < W / 4; ++c) {
          uint32_t w;
          std::memcpy(&w, group + (static_cast<size_t>(c) * G + i0 + i) * 4, 4);
          w = (w & 0xFF0000FFu) | ((w >> 8) & 0x0000FF00u) | ((w << 8) & 0x00FF0000u);
          std::memcpy(row + 4 * c, &w, 4);
        }
      } else {
        for (int j = 0; j < W; ++j) row[j] = group[kv::key_group_offset(i0 + i, j, W, G)];
      }
      DequantKiviRow(df, row, D, bits, sp, zp, out + static_cast<size_t>(i) * D);
    }
  });
}

#ifdef KIVI_X86
// ---------------------------------------------------------------------------------
// Group kernels (AVX2, AVX3).

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

// Vectors of N 32-bit lanes, one token per lane (N = 8 on AVX2, 16 on AVX3). The
// generic operations go through Highway; the code-to-float lookups and the int16
// products are raw intrinsics: vpermilps and vpermps read only the low bits of each
// index lane, so shifted codes need no mask, and Highway 1.0 has neither such a lookup
// nor an int16 pairwise multiply-add (nor the VNNI form).
template <size_t kLanes>
struct KeyVec {
  using DF = hn::FixedTag<float, kLanes>;
  using DU = hn::FixedTag<uint32_t, kLanes>;  // codes: logical shifts
  using DI = hn::FixedTag<int32_t, kLanes>;   // int32 sums of the fast path
  using F = hn::Vec<DF>;
  using I = hn::Vec<DU>;
  static constexpr int N = static_cast<int>(kLanes);

  static HWY_INLINE I Load(const uint8_t* p) {
    return hn::LoadU(DU(), reinterpret_cast<const uint32_t*>(p));
  }
  template <int S>
  static HWY_INLINE I Srl(I v) {
    if constexpr (S == 0) {
      return v;
    } else {
      return hn::ShiftRight<S>(v);
    }
  }
  static HWY_INLINE I And(I a, I b) { return hn::And(a, b); }
  static HWY_INLINE I AddI(I a, I b) { return hn::Add(a, b); }
  static HWY_INLINE I SetI(int32_t x) { return hn::Set(DU(), static_cast<uint32_t>(x)); }
  static HWY_INLINE I ZeroI() { return hn::Zero(DU()); }
  static HWY_INLINE F Zero() { return hn::Zero(DF()); }
  static HWY_INLINE F Set(float x) { return hn::Set(DF(), x); }
  static HWY_INLINE F Bcast(const float* p) { return hn::Set(DF(), *p); }
  static HWY_INLINE F Fma(F a, F b, F c) { return hn::MulAdd(a, b, c); }
  static HWY_INLINE F Add(F a, F b) { return hn::Add(a, b); }
  static HWY_INLINE F Cvt(I v) {
    return hn::ConvertTo(DF(), hn::BitCast(DI(), v));
  }  // as signed int32
  static HWY_INLINE void Store(float* p, F v) { hn::StoreU(v, DF(), p); }

  // Codes of BITS bits at bit S of each lane, as floats: 2-bit by vpermilps (the low two
  // bits, within each 128-bit block), 4-bit on AVX3 by vpermps (the low four).
  template <int BITS, int S>
  static HWY_INLINE F Code(I x, F lut) {
    const I v = Srl<S>(x);
    if constexpr (BITS == 2) {
      if constexpr (kLanes == 8) {
        return F{_mm256_permutevar_ps(lut.raw, v.raw)};
      } else {
#ifdef KIVI_X86_512
        return F{_mm512_permutevar_ps(lut.raw, v.raw)};
#endif
      }
    } else if constexpr (BITS == 4 && kLanes == 16) {
#ifdef KIVI_X86_512
      return F{_mm512_permutexvar_ps(v.raw, lut.raw)};
#endif
    } else if constexpr (S + BITS == 32) {
      return Cvt(v);
    } else {
      return Cvt(And(v, SetI((1 << BITS) - 1)));
    }
  }
  // The table Code looks up: 2-bit {0, 1, 2, 3} in each 128-bit block; 4-bit (AVX3)
  // {0, ..., 15}.
  template <int BITS>
  static HWY_INLINE F Lut() {
    if constexpr (kLanes == 8) {
      return F{_mm256_setr_ps(0.0f, 1.0f, 2.0f, 3.0f, 0.0f, 1.0f, 2.0f, 3.0f)};
    } else {
#ifdef KIVI_X86_512
      if constexpr (BITS == 2)
        return F{_mm512_broadcast_f32x4(_mm_setr_ps(0.0f, 1.0f, 2.0f, 3.0f))};
      return F{_mm512_setr_ps(0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f, 8.0f, 9.0f, 10.0f,
                              11.0f, 12.0f, 13.0f, 14.0f, 15.0f)};
#endif
    }
  }
  // acc += the pairwise int16 products of a and the int16 pair *b broadcast.
  template <bool kVnni>
  static HWY_INLINE I Dot(I acc, I a, const int32_t* b) {
    if constexpr (kLanes == 8) {
      return I{DotI16<kVnni>(acc.raw, a.raw, _mm256_set1_epi32(*b))};
    } else {
#ifdef KIVI_X86_512
#ifdef KIVI_VNNI
      if constexpr (kVnni) {  // the int16 pair broadcast from memory ({1to16})
        __m512i r = acc.raw;
        asm("%{evex%} vpdpwssd {%2%{1to16%}, %1, %0|%0, %1, %2%{1to16%}}"
            : "+v"(r)
            : "v"(a.raw), "m"(*b));
        return I{r};
      }
#endif
      return I{_mm512_add_epi32(acc.raw, _mm512_madd_epi16(a.raw, _mm512_set1_epi32(*b)))};
#endif
    }
  }
};

// Scores of one key group for NH (1-4) heads, S[h * ld + i] for the group's tokens i in
// [0, G), G a multiple of 2N:
//   exact: qs_h . c_i + bias[h],          qs: [NH][D] floats, q_h * s;
//   fast:  qsc[h] (q16_h . c_i) + bias[h], qs: [NH][D] int16 (q s rounded per head), read
//          as int32 channel pairs.
// The columns are spread over NS sets of accumulators so that eight sums are in flight
// whatever NH.
template <class V, int NH, int BITS, int kW, bool kFast, bool kVnni>
HWY_INLINE void KiviGroupScores(const uint8_t* HWY_RESTRICT cg, int G, int W_,
                                const void* HWY_RESTRICT qs, const float* qsc, const float* bias,
                                float* HWY_RESTRICT S, int ld, PrefetchCursor* pf) {
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
          const I c0 = V::And(V::template Srl<s>(x0), mask),
                  c1 = V::And(V::template Srl<s>(x1), mask);
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
HWY_INLINE void PrepareExactKeyQuery(const float* q, int D, const float* sp, const float* zp,
                                     float* qs, float* bias) {
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
  return (bits == 2 || bits == 4 || bits == 8) && (D * bits / 8) % 4 == 0 && D % 8 == 0 &&
         G % step == 0;
}
// The fast (int16) group kernel: 2- and 4-bit codes, no int32 overflow
// (D (2^bits - 1) 32767 < 2^31), and on AVX3 512-bit vectors (wide). Other group shapes
// take the exact kernel.
bool FastKiviKeyGroupsOk(int D, int bits, bool wide) {
  return (bits == 2 || bits == 4) && D * ((1 << bits) - 1) <= 65535 &&
         (wide || HWY_TARGET != HWY_AVX3);
}

// The fast group kernel's query on 256-bit vectors (D a multiple of 8): q_h s rounded to
// int16 in natural channel order into q16 [NH][D], the scale of the codes per head in
// qsc, and bias[h] = q_h . z. Every head's maximum and bias come first (four bias sums
// and two maxima in flight), then the rounding, so no head waits on its own reduction.
template <int NH>
HWY_INLINE void QuantizeKeyQuery256(const float* qp, int D, const float* sp, const float* zp,
                                    int16_t* q16, float* qsc, float* bias) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  float inv_h[4];
  for (int hh = 0; hh < NH; ++hh) {
    const float* x = qp + static_cast<size_t>(hh) * D;
    __m256 m0 = _mm256_setzero_ps(), m1 = _mm256_setzero_ps();
    __m256 b0 = _mm256_setzero_ps(), b1 = _mm256_setzero_ps(), b2 = _mm256_setzero_ps(),
           b3 = _mm256_setzero_ps();
    for (int d = 0; d + 32 <= D; d += 32) {
      const __m256 x0 = _mm256_loadu_ps(x + d), x1 = _mm256_loadu_ps(x + d + 8);
      const __m256 x2 = _mm256_loadu_ps(x + d + 16), x3 = _mm256_loadu_ps(x + d + 24);
      const __m256 v0 = _mm256_mul_ps(x0, _mm256_loadu_ps(sp + d)),
                   v1 = _mm256_mul_ps(x1, _mm256_loadu_ps(sp + d + 8));
      const __m256 v2 = _mm256_mul_ps(x2, _mm256_loadu_ps(sp + d + 16)),
                   v3 = _mm256_mul_ps(x3, _mm256_loadu_ps(sp + d + 24));
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
      const __m256i lo = _mm256_cvtps_epi32(
          _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + d), _mm256_loadu_ps(sp + d)), inv));
      const __m256i hi = _mm256_cvtps_epi32(_mm256_mul_ps(
          _mm256_mul_ps(_mm256_loadu_ps(x + d + 8), _mm256_loadu_ps(sp + d + 8)), inv));
      // packs works per 128-bit half: (lo 0-3, hi 0-3 | lo 4-7, hi 4-7); qwords 0, 2, 1, 3 restore
      // the order.
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + d),
                          _mm256_permute4x64_epi64(_mm256_packs_epi32(lo, hi), 0xD8));
    }
    if (d < D) {
      const __m256i v = _mm256_cvtps_epi32(
          _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + d), _mm256_loadu_ps(sp + d)), inv));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + d),
                       _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)));
    }
  }
}

#ifdef KIVI_X86_512
// QuantizeKeyQuery256 with 512-bit vectors, for NH heads (D a multiple of
// 32): rounds x_h * mul to int16 in q + h D, sets qsc[h] to the scale of the codes and
// bias[h] = x_h . zero. The heads share the loads of mul and zero, and their maxima and
// sums are independent chains.
template <int NH>
HWY_INLINE void QuantizeKeyQuery512(const float* x, const float* mul, const float* zero, int D,
                                    int16_t* q, float* qsc, float* bias) {
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
      const __m512i lo =
          _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(xh), m0), iv));
      const __m512i hi =
          _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(xh + 16), m1), iv));
      int16_t* qh = q + static_cast<size_t>(hh) * D + d;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(qh), _mm512_cvtsepi32_epi16(lo));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(qh + 16), _mm512_cvtsepi32_epi16(hi));
    }
  }
}
#endif  // KIVI_X86_512

// One key group for NH heads (1-4): the query prepared for the group's scales and zero
// points (q_h s in float, or rounded to int16 on the fast path, and the bias q_h . z),
// then the group kernel. kW > 0 fixes the row size W at compile time.
template <class V, int NH, int BITS, bool kFast, bool kVnni, int kW>
HWY_INLINE void KiviKeyGroupHeads(const uint8_t* cg, int G, int W, const float* q, const float* sp,
                                  const float* zp, float* qs, float* S, int ld,
                                  PrefetchCursor* pf) {
  const int D = W * 8 / BITS;
  float bias[4] = {0, 0, 0, 0};
  if constexpr (kFast) {
    float qsc[4] = {0, 0, 0, 0};
    int16_t* q16 = reinterpret_cast<int16_t*>(qs);
#ifdef KIVI_X86_512
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

// The groups of a task's stored keys, one at a time, with BITS-bit codes on vectors V:
// loads each group's parameters (and prefetches those of the group after next), and
// runs the query heads in passes of up to four. Partial groups at the ends of the
// range are computed whole into k.tmp and the needed columns copied.
template <class V, int BITS, bool kFast, bool kVnni>
HWY_INLINE void KiviKeyGroupsLoop(const KeyGroupArgs& k, Prefetcher& pf_ranges) {
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
        case 1:
          KiviKeyGroupHeads<V, 1, BITS, kFast, kVnni, 0>(cg, G, W, q, k.sp, k.zp, k.qs, dst, ldd,
                                                         pc);
          break;
        case 2:
          KiviKeyGroupHeads<V, 2, BITS, kFast, kVnni, 0>(cg, G, W, q, k.sp, k.zp, k.qs, dst, ldd,
                                                         pc);
          break;
        case 3:
          KiviKeyGroupHeads<V, 3, BITS, kFast, kVnni, 0>(cg, G, W, q, k.sp, k.zp, k.qs, dst, ldd,
                                                         pc);
          break;
        default:
          // The most common head size gets a kernel with the row size fixed at compile time.
          if (D == 128) {
            KiviKeyGroupHeads<V, 4, BITS, kFast, kVnni, 128 * BITS / 8>(cg, G, W, q, k.sp, k.zp,
                                                                        k.qs, dst, ldd, pc);
          } else {
            KiviKeyGroupHeads<V, 4, BITS, kFast, kVnni, 0>(cg, G, W, q, k.sp, k.zp, k.qs, dst, ldd,
                                                           pc);
          }
          break;
      }
      if (!whole) {
        for (int h = 0; h < nh; ++h) {
          std::copy(k.tmp + static_cast<size_t>(h) * G + (g0 - gs),
                    k.tmp + static_cast<size_t>(h) * G + (g1 - gs),
                    k.S + static_cast<size_t>(r + h) * k.ld + (g0 - k.t0));
        }
      }
    }
    g0 = g1;
  }
}

// Picks the code width. The fast kernels exist only for the shapes
// FastKiviKeyGroupsOk admits (KiviKeyGroups routes every other shape to the exact ones),
// so that the VNNI and non-VNNI fast variants do not carry copies of the exact kernels.
template <class V, bool kFast, bool kVnni>
HWY_INLINE void KiviKeyGroupsForBits(const KeyGroupArgs& k, Prefetcher& pf) {
  switch (kv::format_bits(k.K->fmt.format)) {
    case 2:
      return KiviKeyGroupsLoop<V, 2, kFast, kVnni>(k, pf);
    case 4:
      return KiviKeyGroupsLoop<V, 4, kFast, kVnni>(k, pf);
    default:
      if constexpr (kFast) {
        HWY_ABORT("fast KIVI key groups: %d-bit codes (FastKiviKeyGroupsOk)",
                  kv::format_bits(k.K->fmt.format));
      } else {
        return KiviKeyGroupsLoop<V, 8, false, false>(k, pf);
      }
  }
}

// Picks the vector width: 512 bits on AVX3 when the group holds whole pairs of them
// (k.wide), 256 bits otherwise.
template <bool kFast, bool kVnni>
HWY_INLINE void KiviKeyGroupsForWidth(const KeyGroupArgs& k, Prefetcher& pf) {
#ifdef KIVI_X86_512
  if (k.wide) return KiviKeyGroupsForBits<KeyVec<16>, kFast, kVnni>(k, pf);
  if constexpr (kFast) {
    HWY_ABORT("fast KIVI key groups on AVX3 need 512-bit vectors (FastKiviKeyGroupsOk)");
  } else {
    return KiviKeyGroupsForBits<KeyVec<8>, false, false>(k, pf);
  }
#else
  return KiviKeyGroupsForBits<KeyVec<8>, kFast, kVnni>(k, pf);
#endif
}

#endif  // KIVI_X86

}  // namespace kivi::attn::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
