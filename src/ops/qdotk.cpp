// Products of the K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) with activations quantized as
// Q8_K (see qkernels.h). Compiled for every Highway target: x86 AVX2/AVX3 use
// vpmaddubsw for the codes and vpmaddwd for the sub-block scales, mins and code offsets;
// the other targets the same integer arithmetic in scalar code.
#include "ops/qkernels.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/qdotk.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/f16.h"
#include "quant/blocks.h"
#include "quant/quantize.h"

HWY_BEFORE_NAMESPACE();
namespace kivi::ops::detail::HWY_NAMESPACE {

using quant::Type;

// Activation pointers of one token.
struct ActK {
  const int8_t* q;
  const float* d;
  const int16_t* bsums;
};
inline ActK actk(const uint8_t* base, const ActLayout& l) {
  return {reinterpret_cast<const int8_t*>(base + l.q), reinterpret_cast<const float*>(base + l.d),
          reinterpret_cast<const int16_t*>(base + l.extra)};
}

constexpr size_t BlockBytes(Type t) {
  return t == Type::kQ2_K   ? sizeof(quant::BlockQ2_K)
         : t == Type::kQ3_K ? sizeof(quant::BlockQ3_K)
         : t == Type::kQ4_K ? sizeof(quant::BlockQ4_K)
         : t == Type::kQ5_K ? sizeof(quant::BlockQ5_K)
                            : sizeof(quant::BlockQ6_K);
}

#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3

// Weights are prefetched this far ahead of the block being multiplied: the integer
// kernels do enough work per byte that the hardware prefetcher alone keeps too few
// lines in flight (one thread, 2048 x 8192: Q8_0 15 -> 21 GB/s, Q4_K 14 -> 18,
// Q6_K 14 -> 19 with 2 KiB; 4 and 8 KiB were no better).
constexpr size_t kPrefetch = 2048;
HWY_INLINE float HSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

HWY_INLINE float HMax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Q8_K rounding of quant/quantize_k.cpp, vectorized (the same bytes).
void QuantizeActsK(const float* x, int64_t cols, uint8_t* out) {
  const ActLayout l = act_layout(ActKind::kQ8x256, cols);
  auto* q = reinterpret_cast<int8_t*>(out + l.q);
  auto* dd = reinterpret_cast<float*>(out + l.d);
  auto* bs = reinterpret_cast<int16_t*>(out + l.extra);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
  for (int64_t b = 0; b < cols / 256; ++b) {
    const float* xb = x + 256 * b;
    int8_t* qb = q + 256 * b;
    __m256 m = _mm256_setzero_ps();
    for (int k = 0; k < 32; ++k)
      m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(xb + 8 * k)));
    const float amax = HMax(m);
    if (!(amax > 0.0f)) {
      std::memset(qb, 0, 256);
      std::memset(bs + 16 * b, 0, 32);
      dd[b] = 0.0f;
      continue;
    }
    // The first value of largest magnitude decides the sign of the scale.
    float mval = 0.0f;
    const __m256 av = _mm256_set1_ps(amax);
    for (int k = 0; k < 32; ++k) {
      const int mask = _mm256_movemask_ps(
          _mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(xb + 8 * k)), av, _CMP_EQ_OQ));
      if (mask) {
        mval = xb[8 * k + __builtin_ctz(static_cast<unsigned>(mask))];
        break;
      }
    }
    const float iscale = -127.0f / mval;
    const __m256 is = _mm256_set1_ps(iscale);
    HWY_UNROLL(8)
    for (int k = 0; k < 8; ++k) {
      __m256i i[4];
      HWY_UNROLL(8)
      for (int u = 0; u < 4; ++u) {
        i[u] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + 32 * k + 8 * u), is));
        i[u] = _mm256_min_epi32(_mm256_max_epi32(i[u], lo), hi);
      }
      const __m256i p =
          _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(qb + 32 * k),
                          _mm256_permutevar8x32_epi32(p, perm));
    }
    for (int j = 0; j < 16; ++j) {
      int s = 0;
      for (int i = 0; i < 16; ++i) s += qb[16 * j + i];
      bs[16 * b + j] = static_cast<int16_t>(s);
    }
    dd[b] = 1.0f / iscale;
  }
}

// Scale vector for a pair of 16-value sub-blocks j, j + 1 (j even) from their 16-bit
// scales sc16: the low 128 bits hold sc[j], the high 128 bits sc[j + 1], matching the
// int16 lanes vpmaddubsw produces from 32 consecutive codes.
HWY_INLINE __m256i PairScale(__m256i sc16, int j) {
  const __m256i pair = _mm256_permutevar8x32_epi32(sc16, _mm256_set1_epi32(j / 2));
  return _mm256_shuffle_epi8(
      pair, _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3,
                             2, 3, 2, 3, 2, 3, 2, 3));
}

// Shuffle control that broadcasts int16 word j (of each 128-bit half) to all lanes.
HWY_INLINE __m256i WordShuffle(int j) {
  return _mm256_set1_epi16(static_cast<int16_t>((2 * j) | ((2 * j + 1) << 8)));
}

HWY_INLINE __m256i Load(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}
HWY_INLINE __m256i Codes(const ActK& a, int64_t b, int off) {
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(a.q + 256 * b + off));
}
HWY_INLINE __m256i Bsums(const ActK& a, int64_t b) {
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(a.bsums + 16 * b));
}
// 0xFF in the bytes of v where all bits of `bit` are set.
HWY_INLINE __m256i HasBit(__m256i v, __m256i bit) {
  return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}

// One super-block of each type for T tokens: sumi[t] (8 int32 lanes) gets
// sum_j sc_j sum(q x) minus the code offset's share, summ[t] the mins' share; d, dmin
// are the block's f16 fields.
template <Type kT, int T>
HWY_INLINE void SuperBlock(const uint8_t* p, const ActK* a, int64_t b, __m256i* sumi, __m256i* summ,
                           float* d, float* dmin) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);
  HWY_UNROLL(8)
  for (int t = 0; t < T; ++t) sumi[t] = summ[t] = _mm256_setzero_si256();
  if constexpr (kT == Type::kQ4_K || kT == Type::kQ5_K) {
    quant::BlockQ4_K h;  // the common prefix: d, dmin, scales
    std::memcpy(&h, p, 16);
    *d = _cvtsh_ss(h.d);
    *dmin = _cvtsh_ss(h.dmin);
    alignas(16) uint8_t sc[8], mn[8];
    quant::unpack_k4_scales(h.scales, sc, mn);
    const __m128i mn8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(mn));
    const __m256i mins =
        _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn8, mn8));  // m_j for bsums 2j, 2j+1
    // The 8 scales as int16 in both 128-bit halves, for WordShuffle.
    const __m256i scales = _mm256_broadcastsi128_si256(
        _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc))));
    HWY_UNROLL(8)
    for (int t = 0; t < T; ++t) summ[t] = _mm256_madd_epi16(Bsums(a[t], b), mins);
    const uint8_t* qs = p + (kT == Type::kQ4_K ? 16 : 48);
    __m256i qh = _mm256_setzero_si256();
    if constexpr (kT == Type::kQ5_K) qh = Load(p + 16);
    HWY_UNROLL(8)
    for (int c = 0; c < 4; ++c) {
      const __m256i w = Load(qs + 32 * c);
      __m256i lo = _mm256_and_si256(w, m4), hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), m4);
      if constexpr (kT == Type::kQ5_K) {
        const __m256i b16 = _mm256_set1_epi8(0x10);
        lo = _mm256_or_si256(
            lo,
            _mm256_and_si256(HasBit(qh, _mm256_set1_epi8(static_cast<char>(1 << (2 * c)))), b16));
        hi = _mm256_or_si256(
            hi,
            _mm256_and_si256(HasBit(qh, _mm256_set1_epi8(static_cast<char>(2 << (2 * c)))), b16));
      }
      const __m256i s_lo = _mm256_shuffle_epi8(scales, WordShuffle(2 * c));
      const __m256i s_hi = _mm256_shuffle_epi8(scales, WordShuffle(2 * c + 1));
      HWY_UNROLL(8)
      for (int t = 0; t < T; ++t) {
        const __m256i p0 = _mm256_maddubs_epi16(lo, Codes(a[t], b, 64 * c));
        const __m256i p1 = _mm256_maddubs_epi16(hi, Codes(a[t], b, 64 * c + 32));
        sumi[t] = _mm256_add_epi32(
            sumi[t], _mm256_add_epi32(_mm256_madd_epi16(p0, s_lo), _mm256_madd_epi16(p1, s_hi)));
      }
    }
  } else if constexpr (kT == Type::kQ6_K) {
    uint16_t dh;
    std::memcpy(&dh, p + 208, 2);
    *d = _cvtsh_ss(dh);
    *dmin = 0.0f;
    const __m256i sc16 =
        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 192)));
    const __m256i m30 = _mm256_set1_epi8(0x30);
    HWY_UNROLL(8)
    for (int t = 0; t < T; ++t) summ[t] = _mm256_madd_epi16(Bsums(a[t], b), sc16);
    HWY_UNROLL(8)
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = Load(p + 64 * h), ql1 = Load(p + 64 * h + 32),
                    qh = Load(p + 128 + 32 * h);
      const __m256i q[4] = {_mm256_or_si256(_mm256_and_si256(ql0, m4),
                                            _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30)),
                            _mm256_or_si256(_mm256_and_si256(ql1, m4),
                                            _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30)),
                            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                                            _mm256_and_si256(qh, m30)),
                            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                                            _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30))};
      HWY_UNROLL(8)
      for (int k = 0; k < 4; ++k) {
        const __m256i s = PairScale(sc16, 8 * h + 2 * k);
        HWY_UNROLL(8)
        for (int t = 0; t < T; ++t) {
          const __m256i pr = _mm256_maddubs_epi16(q[k], Codes(a[t], b, 128 * h + 32 * k));
          sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(pr, s));
        }
      }
    }
    // sum sc_j (q - 32) x = sum sc_j q x - 32 sum sc_j bsum_j
    HWY_UNROLL(8)
    for (int t = 0; t < T; ++t) {
      sumi[t] = _mm256_sub_epi32(sumi[t], _mm256_slli_epi32(summ[t], 5));
      summ[t] = _mm256_setzero_si256();
    }
  } else if constexpr (kT == Type::kQ3_K) {
    uint16_t dh;
    std::memcpy(&dh, p + 108, 2);
    *d = _cvtsh_ss(dh);
    *dmin = 0.0f;
    alignas(16) uint8_t sc[16];
    quant::unpack_q3_k_scales_biased(p + 96, sc);
    const __m256i sc16 =
        _mm256_sub_epi16(_mm256_cvtepu8_epi16(_mm_load_si128(reinterpret_cast<const __m128i*>(sc))),
                         _mm256_set1_epi16(32));
    HWY_UNROLL(8)
    for (int t = 0; t < T; ++t) summ[t] = _mm256_madd_epi16(Bsums(a[t], b), sc16);
    const __m256i hm = Load(p), b4 = _mm256_set1_epi8(4);
    HWY_UNROLL(8)
    for (int h = 0; h < 2; ++h) {
      const __m256i qs = Load(p + 32 + 32 * h);
      HWY_UNROLL(8)
      for (int j = 0; j < 4; ++j) {
        const __m256i bit = _mm256_set1_epi8(static_cast<char>(1 << (4 * h + j)));
        const __m256i q = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qs, 2 * j), m2),
                                          _mm256_and_si256(HasBit(hm, bit), b4));
        const __m256i s = PairScale(sc16, 8 * h + 2 * j);
        HWY_UNROLL(8)
        for (int t = 0; t < T; ++t) {
          const __m256i pr = _mm256_maddubs_epi16(q, Codes(a[t], b, 128 * h + 32 * j));
          sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(pr, s));
        }
      }
    }
    // sum sc_j (q - 4) x = sum sc_j q x - 4 sum sc_j bsum_j
    HWY_UNROLL(8)
    for (int t = 0; t < T; ++t) {
      sumi[t] = _mm256_sub_epi32(sumi[t], _mm256_slli_epi32(summ[t], 2));
      summ[t] = _mm256_setzero_si256();
    }
  } else {  // Q2_K
    uint16_t dh[2];
    std::memcpy(dh, p + 80, 4);
    *d = _cvtsh_ss(dh[0]);
    *dmin = _cvtsh_ss(dh[1]);
    const __m128i s8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m128i m4x = _mm_set1_epi8(0x0F);
    const __m256i sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(s8, m4x));
    const __m256i mn16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s8, 4), m4x));
    HWY_UNROLL(8)
    for (int t = 0; t < T; ++t) summ[t] = _mm256_madd_epi16(Bsums(a[t], b), mn16);
    HWY_UNROLL(8)
    for (int h = 0; h < 2; ++h) {
      const __m256i qs = Load(p + 16 + 32 * h);
      HWY_UNROLL(8)
      for (int j = 0; j < 4; ++j) {
        const __m256i q = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * j), m2);
        const __m256i s = PairScale(sc16, 8 * h + 2 * j);
        HWY_UNROLL(8)
        for (int t = 0; t < T; ++t) {
          const __m256i pr = _mm256_maddubs_epi16(q, Codes(a[t], b, 128 * h + 32 * j));
          sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(pr, s));
        }
      }
    }
  }
}

#if HWY_TARGET == HWY_AVX3
// Q4_K and Q6_K with 512-bit vectors: one vector holds two 32-code sub-block pieces whose
// activations are 64 consecutive bytes, so each token costs half the loads, vpmaddubsw
// and vpmaddwd of the 256-bit kernel. The two halves of sumi are added at the end: lane j
// then holds exactly the integer the 256-bit kernel's lane j holds (the same products,
// the same pairs), so both targets give the same bits.
HWY_INLINE __m512i Codes512(const ActK& a, int64_t b, int off) {
  return _mm512_loadu_si512(a.q + 256 * b + off);
}
inline bool UseVnni512() {
#if !defined(__clang__)
  return use_vnni();
#else
  return false;  // the asm below is GCC's
#endif
}
// acc + the pairwise int16 products of p and s summed into int32 lanes: vpdpwssd with
// AVX512-VNNI (checked at run time; GCC only, as the other VNNI kernels), else vpmaddwd
// and vpaddd. The same integers either way.
template <bool kVnni>
HWY_INLINE __m512i AddProducts(__m512i acc, __m512i p, __m512i s) {
#if !defined(__clang__)
  if constexpr (kVnni) {
    asm("vpdpwssd {%2, %1, %0|%0, %1, %2}" : "+v"(acc) : "v"(p), "v"(s));
    return acc;
  }
#endif
  return _mm512_add_epi32(acc, _mm512_madd_epi16(p, s));
}
// int16 index vector: word w selects word base + w / 16 (two halves) or base + w / 8
// (four quarters) of the scales.
HWY_INLINE __m512i HalfIndex(int lo, int hi) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16(static_cast<int16_t>(lo))),
                            _mm256_set1_epi16(static_cast<int16_t>(hi)), 1);
}
HWY_INLINE __m512i QuarterIndex(int base) {
  return _mm512_inserti64x4(
      _mm512_castsi256_si512(_mm256_setr_epi16(static_cast<int16_t>(base), base, base, base, base,
                                               base, base, base, base + 1, base + 1, base + 1,
                                               base + 1, base + 1, base + 1, base + 1, base + 1)),
      _mm256_setr_epi16(static_cast<int16_t>(base + 2), base + 2, base + 2, base + 2, base + 2,
                        base + 2, base + 2, base + 2, base + 3, base + 3, base + 3, base + 3,
                        base + 3, base + 3, base + 3, base + 3),
      1);
}

template <Type kT, int T, bool kVnni>
HWY_INLINE void SuperBlock512(const uint8_t* p, const ActK* a, int64_t b, __m256i* sumi,
                              __m256i* summ, float* d, float* dmin) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  __m512i acc[T];
  HWY_UNROLL(8)
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_si512();
  if constexpr (kT == Type::kQ4_K) {
    quant::BlockQ4_K h;
    std::memcpy(&h, p, 16);
    *d = _cvtsh_ss(h.d);
    *dmin = _cvtsh_ss(h.dmin);
    alignas(16) uint8_t sc[8], mn[8];
    quant::unpack_k4_scales(h.scales, sc, mn);
    const __m128i mn8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(mn));
    const __m256i mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn8, mn8));
    const __m512i scales = _mm512_castsi128_si512(
        _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc))));
    HWY_UNROLL(8)
    for (int t = 0; t < T; ++t) summ[t] = _mm256_madd_epi16(Bsums(a[t], b), mins);
    // Low nibbles of a 32-byte chunk in the low half, high nibbles in the high half.
    const __m512i shift = HalfIndex(0, 4);
    HWY_UNROLL(8)
    for (int c = 0; c < 4; ++c) {
      const __m512i w = _mm512_broadcast_i64x4(Load(p + 16 + 32 * c));
      const __m512i q = _mm512_and_si512(_mm512_srlv_epi16(w, shift), m4);
      const __m512i s = _mm512_permutexvar_epi16(HalfIndex(2 * c, 2 * c + 1), scales);
      HWY_UNROLL(8)
      for (int t = 0; t < T; ++t) {
        acc[t] = AddProducts<kVnni>(acc[t], _mm512_maddubs_epi16(q, Codes512(a[t], b, 64 * c)), s);
      }
    }
    HWY_UNROLL(8)
    for (int t = 0; t < T; ++t) {
      sumi[t] =
          _mm256_add_epi32(_mm512_castsi512_si256(acc[t]), _mm512_extracti64x4_epi64(acc[t], 1));
    }
  } else {
    static_assert(kT == Type::kQ6_K, "512-bit kernels: Q4_K and Q6_K");
    uint16_t dh;
    std::memcpy(&dh, p + 208, 2);
    *d = _cvtsh_ss(dh);
    *dmin = 0.0f;
    const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 192));
    const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
    const __m512i scales = _mm512_castsi256_si512(sc16);
    const __m512i m30 = _mm512_set1_epi8(0x30);
    const __m512i up01 = HalfIndex(4, 2), down23 = HalfIndex(0, 2);
    HWY_UNROLL(8)
    for (int h = 0; h < 2; ++h) {
      const __m512i ql = _mm512_loadu_si512(p + 64 * h);
      const __m512i qh = _mm512_broadcast_i64x4(Load(p + 128 + 32 * h));
      // Codes 32k..32k+31 of this half for k = 0, 1 (q01) and k = 2, 3 (q23).
      const __m512i q01 = _mm512_or_si512(_mm512_and_si512(ql, m4),
                                          _mm512_and_si512(_mm512_sllv_epi16(qh, up01), m30));
      const __m512i q23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                          _mm512_and_si512(_mm512_srlv_epi16(qh, down23), m30));
      const __m512i s01 = _mm512_permutexvar_epi16(QuarterIndex(8 * h), scales);
      const __m512i s23 = _mm512_permutexvar_epi16(QuarterIndex(8 * h + 4), scales);
      HWY_UNROLL(8)
      for (int t = 0; t < T; ++t) {
        const __m512i p01 = _mm512_maddubs_epi16(q01, Codes512(a[t], b, 128 * h));
        const __m512i p23 = _mm512_maddubs_epi16(q23, Codes512(a[t], b, 128 * h + 64));
        acc[t] = AddProducts<kVnni>(AddProducts<kVnni>(acc[t], p01, s01), p23, s23);
      }
    }
    // sum sc_j (q - 32) x = sum sc_j q x - 32 sum sc_j bsum_j
    // (computed after the loop: no registers held through it)
    HWY_UNROLL(8)
    for (int t = 0; t < T; ++t) {
      const __m256i bs = _mm256_madd_epi16(Bsums(a[t], b), sc16);
      sumi[t] = _mm256_sub_epi32(
          _mm256_add_epi32(_mm512_castsi512_si256(acc[t]), _mm512_extracti64x4_epi64(acc[t], 1)),
          _mm256_slli_epi32(bs, 5));
      summ[t] = _mm256_setzero_si256();
    }
  }
}
#endif

template <Type kT, int T, bool kVnni>
HWY_INLINE void DotRow(const uint8_t* w, int64_t nb, const ActK* a, float* const* out, size_t r) {
  __m256 acc[T];
  HWY_UNROLL(8)
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    {
      for (size_t o = 0; o < BlockBytes(kT); o += 64)
        _mm_prefetch(reinterpret_cast<const char*>(w + b * BlockBytes(kT) + kPrefetch + o),
                     _MM_HINT_T0);
    }
    __m256i sumi[T], summ[T];
    float d, dmin;
#if HWY_TARGET == HWY_AVX3
    if constexpr (kT == Type::kQ4_K || kT == Type::kQ6_K) {
      SuperBlock512<kT, T, kVnni>(w + b * BlockBytes(kT), a, b, sumi, summ, &d, &dmin);
    } else {
      SuperBlock<kT, T>(w + b * BlockBytes(kT), a, b, sumi, summ, &d, &dmin);
    }
#else
    SuperBlock<kT, T>(w + b * BlockBytes(kT), a, b, sumi, summ, &d, &dmin);
#endif
    HWY_UNROLL(8)
    for (int t = 0; t < T; ++t) {
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[t]), _mm256_set1_ps(d * a[t].d[b]), acc[t]);
      if constexpr (kT == Type::kQ2_K || kT == Type::kQ4_K || kT == Type::kQ5_K) {
        acc[t] =
            _mm256_fnmadd_ps(_mm256_cvtepi32_ps(summ[t]), _mm256_set1_ps(dmin * a[t].d[b]), acc[t]);
      }
    }
  }
  HWY_UNROLL(8)
  for (int t = 0; t < T; ++t) out[t][r] = HSum(acc[t]);
}

#else  // scalar targets

void QuantizeActsK(const float* x, int64_t cols, uint8_t* out) {
  const ActLayout l = act_layout(ActKind::kQ8x256, cols);
  auto* q = reinterpret_cast<int8_t*>(out + l.q);
  auto* dd = reinterpret_cast<float*>(out + l.d);
  auto* bs = reinterpret_cast<int16_t*>(out + l.extra);
  for (int64_t b = 0; b < cols / 256; ++b) {
    quant::BlockQ8_K blk;
    quant::quantize_row_q8_k(x + 256 * b, &blk, 256);
    std::memcpy(q + 256 * b, blk.qs, 256);
    std::memcpy(bs + 16 * b, blk.bsums, 32);
    dd[b] = blk.d;
  }
}

// A super-block's codes (without offsets), sub-block scales (signed) and mins.
struct Codes {
  int q[256];
  int sc[16], mn[16];
  float d, dmin;
};

inline float F16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

template <Type kT>
void Decode(const uint8_t* p, Codes* c) {
  if constexpr (kT == Type::kQ4_K || kT == Type::kQ5_K) {
    c->d = F16(p);
    c->dmin = F16(p + 2);
    uint8_t sc[8], mn[8];
    quant::unpack_k4_scales(p + 4, sc, mn);
    HWY_UNROLL(8)
    for (int j = 0; j < 8; ++j) {
      c->sc[j] = sc[j];
      c->mn[j] = mn[j];
    }
    const uint8_t* qs = p + (kT == Type::kQ4_K ? 16 : 48);
    for (int e = 0; e < 256; ++e) {
      const uint8_t byte = qs[32 * (e / 64) + e % 32];
      c->q[e] = (e % 64) < 32 ? (byte & 15) : (byte >> 4);
      if (kT == Type::kQ5_K) c->q[e] |= ((p[16 + e % 32] >> (e / 32)) & 1) << 4;
    }
  } else if constexpr (kT == Type::kQ6_K) {
    c->d = F16(p + 208);
    c->dmin = 0.0f;
    for (int j = 0; j < 16; ++j) c->sc[j] = static_cast<int8_t>(p[192 + j]);
    for (int e = 0; e < 256; ++e) {
      const int h = e / 128, k = (e % 128) / 32, l = e % 32;
      const uint8_t byte = p[64 * h + 32 * (k % 2) + l];
      c->q[e] = (k < 2 ? (byte & 15) : (byte >> 4)) | (((p[128 + 32 * h + l] >> (2 * k)) & 3) << 4);
    }
  } else if constexpr (kT == Type::kQ3_K) {
    c->d = F16(p + 108);
    c->dmin = 0.0f;
    int8_t sc[16];
    quant::unpack_q3_k_scales(p + 96, sc);
    for (int j = 0; j < 16; ++j) c->sc[j] = sc[j];
    for (int e = 0; e < 256; ++e) {
      c->q[e] = ((p[32 + 32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3) |
                (((p[e % 32] >> (e / 32)) & 1) << 2);
    }
  } else {  // Q2_K
    c->d = F16(p + 80);
    c->dmin = F16(p + 82);
    for (int j = 0; j < 16; ++j) {
      c->sc[j] = p[j] & 15;
      c->mn[j] = p[j] >> 4;
    }
    for (int e = 0; e < 256; ++e)
      c->q[e] = (p[16 + 32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
  }
}

template <Type kT, int T, bool kVnni>
HWY_INLINE void DotRow(const uint8_t* w, int64_t nb, const ActK* a, float* const* out, size_t r) {
  constexpr int kSub = (kT == Type::kQ4_K || kT == Type::kQ5_K) ? 32 : 16;  // values per sub-block
  constexpr int kOff = kT == Type::kQ6_K ? 32 : kT == Type::kQ3_K ? 4 : 0;  // code offset
  constexpr bool kMin = kT == Type::kQ2_K || kT == Type::kQ4_K || kT == Type::kQ5_K;
  float acc[T] = {};
  Codes c;
  for (int64_t b = 0; b < nb; ++b) {
    Decode<kT>(w + b * BlockBytes(kT), &c);
    HWY_UNROLL(8)
    for (int t = 0; t < T; ++t) {
      const int8_t* x = a[t].q + 256 * b;
      const int16_t* bs = a[t].bsums + 16 * b;
      int sumi = 0, summ = 0;
      for (int j = 0; j < 256 / kSub; ++j) {
        int s = 0;
        for (int i = 0; i < kSub; ++i) s += c.q[kSub * j + i] * x[kSub * j + i];
        const int bsum = kSub == 32 ? bs[2 * j] + bs[2 * j + 1] : bs[j];
        sumi += c.sc[j] * (s - kOff * bsum);
        if (kMin) summ += c.mn[j] * bsum;
      }
      acc[t] += static_cast<float>(sumi) * (c.d * a[t].d[b]);
      if (kMin) acc[t] -= static_cast<float>(summ) * (c.dmin * a[t].d[b]);
    }
  }
  HWY_UNROLL(8)
  for (int t = 0; t < T; ++t) out[t][r] = acc[t];
}

#endif

// Rows [r0, r1), tokens in tiles of up to kTile (each tile reads a row's blocks once):
// 8 with 32 vector registers (AVX-512), else 4; a remainder of 5-7 as 4 and the rest, one
// of 1-4 as one tile.
template <Type kT, bool kVnni>
void RowsOf(const uint8_t* w, size_t row_bytes, int64_t cols, const uint8_t* acts,
            size_t act_stride, int n, float* y, size_t ldy, size_t r0, size_t r1) {
  const ActLayout l = act_layout(ActKind::kQ8x256, cols);
  const int64_t nb = cols / 256;
  constexpr int kTile = HWY_TARGET == HWY_AVX3 ? 8 : 4;
  for (int t0 = 0; t0 < n;) {
    ActK a[kTile];
    float* out[kTile];
    const int left = n - t0;
    const int tn = left >= kTile ? kTile : left >= 4 ? 4 : left;
    for (int t = 0; t < tn; ++t) {
      a[t] = actk(acts + static_cast<size_t>(t0 + t) * act_stride, l);
      out[t] = y + static_cast<size_t>(t0 + t) * ldy;
    }
    for (size_t r = r0; r < r1; ++r) {
      const uint8_t* wr = w + r * row_bytes;
      if (tn == kTile) {
        DotRow<kT, kTile, kVnni>(wr, nb, a, out, r);
      } else if (tn == 4) {
        DotRow<kT, 4, kVnni>(wr, nb, a, out, r);
      } else if (tn == 3) {
        DotRow<kT, 3, kVnni>(wr, nb, a, out, r);
      } else if (tn == 2) {
        DotRow<kT, 2, kVnni>(wr, nb, a, out, r);
      } else {
        DotRow<kT, 1, kVnni>(wr, nb, a, out, r);
      }
    }
    t0 += tn;
  }
}

void RowsK(Type t, const uint8_t* w, size_t row_bytes, int64_t cols, const uint8_t* acts,
           size_t act_stride, int n, float* y, size_t ldy, size_t r0, size_t r1) {
  switch (t) {
    case Type::kQ2_K:
      return RowsOf<Type::kQ2_K, false>(w, row_bytes, cols, acts, act_stride, n, y, ldy, r0, r1);
    case Type::kQ3_K:
      return RowsOf<Type::kQ3_K, false>(w, row_bytes, cols, acts, act_stride, n, y, ldy, r0, r1);
    case Type::kQ4_K:
#if HWY_TARGET == HWY_AVX3
      if (UseVnni512())
        return RowsOf<Type::kQ4_K, true>(w, row_bytes, cols, acts, act_stride, n, y, ldy, r0, r1);
#endif
      return RowsOf<Type::kQ4_K, false>(w, row_bytes, cols, acts, act_stride, n, y, ldy, r0, r1);
    case Type::kQ5_K:
      return RowsOf<Type::kQ5_K, false>(w, row_bytes, cols, acts, act_stride, n, y, ldy, r0, r1);
    case Type::kQ6_K:
#if HWY_TARGET == HWY_AVX3
      if (UseVnni512())
        return RowsOf<Type::kQ6_K, true>(w, row_bytes, cols, acts, act_stride, n, y, ldy, r0, r1);
#endif
      return RowsOf<Type::kQ6_K, false>(w, row_bytes, cols, acts, act_stride, n, y, ldy, r0, r1);
    default:
      return;
  }
}

}  // namespace kivi::ops::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kivi::ops::detail {

HWY_EXPORT(QuantizeActsK);
HWY_EXPORT(RowsK);

void quantize_acts256(const float* x, int64_t cols, uint8_t* out) {
  HWY_DYNAMIC_DISPATCH(QuantizeActsK)(x, cols, out);
}

void rowsk(quant::Type t, const uint8_t* w, size_t row_bytes, int64_t cols, const uint8_t* acts,
           size_t act_stride, int n, float* y, size_t ldy, size_t r0, size_t r1) {
  HWY_DYNAMIC_DISPATCH(RowsK)(t, w, row_bytes, cols, acts, act_stride, n, y, ldy, r0, r1);
}

}  // namespace kivi::ops::detail
#endif  // HWY_ONCE
