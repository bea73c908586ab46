// Products of the 32-value block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4) with
// activations quantized to 8 bits per block of 32 (see qkernels.h). Compiled for every
// Highway target: x86 AVX2/AVX3 use vpmaddubsw + vpmaddwd (vpdpbusd where AVX512-VNNI is
// present), the other targets the same integer arithmetic in scalar code. MXFP4's 4-bit
// codes become their integer values (doubled E2M1, -12..12) through a 16-byte table
// lookup (vpshufb), so its blocks take the signed path of Q4_0 with the block scale
// 2^(e - 128) in place of an f16 d.
#include "ops/qkernels.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/qdot32.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/f16.h"
#include "quant/blocks.h"

HWY_BEFORE_NAMESPACE();
namespace kivi::ops::detail::HWY_NAMESPACE {

using quant::Type;

// Activation pointers of one token.
struct Act32 {
  const int8_t* q;
  const float* d;
  const float* s;
};
inline Act32 act32(const uint8_t* base, const ActLayout& l) {
  return {reinterpret_cast<const int8_t*>(base + l.q), reinterpret_cast<const float*>(base + l.d),
          reinterpret_cast<const float*>(base + l.extra)};
}

// Bytes of a block of the 32-value types.
constexpr size_t BlockBytes(Type t) {
  return t == Type::kQ8_0   ? sizeof(quant::BlockQ8_0)
         : t == Type::kQ4_0 ? sizeof(quant::BlockQ4_0)
         : t == Type::kQ4_1 ? sizeof(quant::BlockQ4_1)
         : t == Type::kQ5_0 ? sizeof(quant::BlockQ5_0)
         : t == Type::kQ5_1 ? sizeof(quant::BlockQ5_1)
                            : sizeof(quant::BlockMXFP4);
}

inline int RoundAct(float v) {
  const float r = std::nearbyint(v);
  return r >= 127.0f ? 127 : r <= -127.0f ? -127 : r == r ? static_cast<int>(r) : 0;
}

#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3
#define KIVI_Q32_X86 1

#undef KIVI_Q32_VNNI
#if HWY_TARGET == HWY_AVX3 && !defined(__clang__)
// AVX512-VNNI (checked at run time; untested on machines without it). The EVEX form is
// forced: the VEX form (AVX-VNNI) faults on CPUs that have only AVX512-VNNI.
#define KIVI_Q32_VNNI 1
inline bool HasVnni() { return use_vnni(); }
#else
inline bool HasVnni() { return false; }
#endif

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

HWY_INLINE float F16(uint16_t h) { return _cvtsh_ss(h); }

void QuantizeActs32(const float* x, int64_t cols, uint8_t* out) {
  const ActLayout l = act_layout(ActKind::kQ8x32, cols);
  auto* q = reinterpret_cast<int8_t*>(out + l.q);
  auto* dd = reinterpret_cast<float*>(out + l.d);
  auto* ss = reinterpret_cast<float*>(out + l.extra);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t b = 0; b < cols / 32; ++b) {
    const float* xb = x + 32 * b;
    __m256 v[4];
    HWY_UNROLL(8)
    for (int k = 0; k < 4; ++k) v[k] = _mm256_loadu_ps(xb + 8 * k);
    __m256 m = _mm256_andnot_ps(sign, v[0]);
    for (int k = 1; k < 4; ++k) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[k]));
    const float amax = HMax(m);
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    const __m256 idv = _mm256_set1_ps(id);
    const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
    __m256i i[4];
    HWY_UNROLL(8)
    for (int k = 0; k < 4; ++k) {
      i[k] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], idv));  // round to nearest even
      i[k] = _mm256_min_epi32(_mm256_max_epi32(i[k], lo), hi);
    }
    const __m256i sum =
        _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
    const __m256i p16 =
        _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 32 * b),
                        _mm256_permutevar8x32_epi32(p16, perm));
    dd[b] = d;
    ss[b] = d * static_cast<float>(_mm_cvtsi128_si32(s4));
  }
}

// The 32 codes of a block's 16 nibble bytes, in value order (low nibbles first).
HWY_INLINE __m256i Nibbles(const uint8_t* qs) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i m = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m), _mm_and_si128(q, m));
}

// 0x10 in byte i where bit i of qh is set.
HWY_INLINE __m256i HighBits(const uint8_t* qh_bytes) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, 4);
  const __m256i spread =
      _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(qh)),
                          _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                           2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit),
                          _mm256_set1_epi8(0x10));
}

// Sums of u[i] * s[i] (u unsigned, s signed bytes) over each 4 bytes, in int32 lanes: 8
// of them in a 256-bit vector, 16 in a 512-bit one.
template <bool kVnni, class V>
HWY_INLINE V DotU8I8(V u, V s) {
  constexpr bool kWide = sizeof(V) == 64;
#ifdef KIVI_Q32_VNNI
  if constexpr (kVnni) {
    V acc;
    if constexpr (kWide) {
      acc = _mm512_setzero_si512();
      asm("vpdpbusd {%2, %1, %0|%0, %1, %2}" : "+v"(acc) : "v"(u), "vm"(s));
    } else {
      acc = _mm256_setzero_si256();
      asm("%{evex%} vpdpbusd {%2, %1, %0|%0, %1, %2}" : "+v"(acc) : "v"(u), "vm"(s));
    }
    return acc;
  }
#endif
#if HWY_TARGET == HWY_AVX3
  if constexpr (kWide) return _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1));
#endif
  if constexpr (!kWide) return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

// A weight block's codes: signed (q - offset; Q8_0, Q4_0, Q5_0; MXFP4's table values) or
// unsigned with a min (Q4_1, Q5_1); `scale` and `min` are its f16 fields (MXFP4: the
// half scale of its exponent, no min).
template <Type kT>
struct Block32 {
  __m256i w;
  float scale, min;
};

// MXFP4's values of the 16 codes, in each 128-bit lane of a vpshufb table.
HWY_INLINE __m128i Mxfp4Table() {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(quant::kMxfp4Values));
}

template <Type kT>
HWY_INLINE Block32<kT> Decode(const uint8_t* p) {
  Block32<kT> b;
  b.min = 0.0f;
  if constexpr (kT == Type::kMXFP4) {
    b.scale = quant::e8m0_to_f32_half(p[0]);
    b.w = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(Mxfp4Table()), Nibbles(p + 1));
    return b;
  } else {
    uint16_t h[2];
    std::memcpy(h, p, 4);
    b.scale = F16(h[0]);
    if constexpr (kT == Type::kQ8_0) {
      b.w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2));
    } else if constexpr (kT == Type::kQ4_0) {
      b.w = _mm256_sub_epi8(Nibbles(p + 2), _mm256_set1_epi8(8));
    } else if constexpr (kT == Type::kQ5_0) {
      b.w = _mm256_sub_epi8(_mm256_or_si256(Nibbles(p + 6), HighBits(p + 2)), _mm256_set1_epi8(16));
    } else if constexpr (kT == Type::kQ4_1) {
      b.min = F16(h[1]);
      b.w = Nibbles(p + 4);
    } else {
      b.min = F16(h[1]);
      b.w = _mm256_or_si256(Nibbles(p + 8), HighBits(p + 4));
    }
    return b;
  }
}

constexpr bool HasMin(Type t) { return t == Type::kQ4_1 || t == Type::kQ5_1; }

// T tokens' dot products with one row of nb blocks. Blocks alternate between two
// accumulators per token (even and odd blocks) to shorten the dependency chains.
// One block for T tokens into acc[T] (and accm[T], the mins' share).
template <Type kT, int T, bool kVnni>
HWY_INLINE void Block(const uint8_t* p, int64_t b, const Act32* a, __m256* acc, float* accm) {
  const Block32<kT> blk = Decode<kT>(p);
  const __m256i u = HasMin(kT) ? blk.w : _mm256_sign_epi8(blk.w, blk.w);
  HWY_UNROLL(8)
  for (int t = 0; t < T; ++t) {
    const __m256i xq = _mm256_load_si256(reinterpret_cast<const __m256i*>(a[t].q + 32 * b));
    const __m256i s = HasMin(kT) ? xq : _mm256_sign_epi8(xq, blk.w);
    const __m256 sum = _mm256_cvtepi32_ps(DotU8I8<kVnni>(u, s));
    acc[t] = _mm256_fmadd_ps(sum, _mm256_set1_ps(blk.scale * a[t].d[b]), acc[t]);
    if constexpr (HasMin(kT)) accm[t] += blk.min * a[t].s[b];
  }
}

#if HWY_TARGET == HWY_AVX3
// Q8_0, Q4_0 and MXFP4 with 512-bit vectors: an even block and the odd block after it side
// by side. The low and high halves are the 256-bit kernel's even and odd accumulators, with
// the same integers and the same float operations in every lane, so both targets give the
// same bits and each pair of blocks costs half the instructions.
constexpr bool HasPairKernel(Type t) {
  return t == Type::kQ8_0 || t == Type::kQ4_0 || t == Type::kMXFP4;
}

// The scale of the block at p: its f16 d, or MXFP4's half scale.
template <Type kT>
HWY_INLINE float BlockScale(const uint8_t* p) {
  if constexpr (kT == Type::kMXFP4) {
    return quant::e8m0_to_f32_half(p[0]);
  } else {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return F16(h);
  }
}

// The signed codes of blocks b (low half) and b + 1 (high half); p points at block b.
template <Type kT>
HWY_INLINE __m512i PairCodes(const uint8_t* p) {
  constexpr size_t kBytes = BlockBytes(kT);
  if constexpr (kT == Type::kQ8_0) {
    return _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2))),
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + kBytes + 2)), 1);
  } else {
    static_assert(kT == Type::kQ4_0 || kT == Type::kMXFP4, "pair kernels: Q8_0, Q4_0, MXFP4");
    constexpr size_t kQs = kT == Type::kQ4_0 ? 2 : 1;
    // Each block's 16 nibble bytes in two 128-bit lanes: [b, b, b + 1, b + 1]; the second
    // lane of each pair takes the high nibbles, as Nibbles() lays them out.
    const __m512i q =
        _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_broadcastsi128_si256(
                               _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + kQs)))),
                           _mm256_broadcastsi128_si256(
                               _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + kBytes + kQs))),
                           1);
    const __m512i nib = _mm512_and_si512(_mm512_mask_blend_epi64(0xCC, q, _mm512_srli_epi16(q, 4)),
                                         _mm512_set1_epi8(0x0F));
    if constexpr (kT == Type::kMXFP4) {
      return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(Mxfp4Table()), nib);
    } else {
      return _mm512_sub_epi8(nib, _mm512_set1_epi8(8));
    }
  }
}

template <Type kT, int T, bool kVnni>
HWY_INLINE void DotRowPairs(const uint8_t* w, int64_t nb, const Act32* a, float* const* out,
                            size_t r) {
  constexpr size_t kBytes = BlockBytes(kT);
  __m512 acc[T];
  HWY_UNROLL(8)
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    const uint8_t* p = w + b * kBytes;
    _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetch), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetch + 63), _MM_HINT_T0);
    const __m512i codes = PairCodes<kT>(p);
    const __m512i u = _mm512_abs_epi8(codes);
    const __mmask64 neg = _mm512_movepi8_mask(codes);
    const float s0 = BlockScale<kT>(p), s1 = BlockScale<kT>(p + kBytes);
    HWY_UNROLL(8)
    for (int t = 0; t < T; ++t) {
      const __m512i xq = _mm512_loadu_si512(a[t].q + 32 * b);
      const __m512i s = _mm512_mask_sub_epi8(xq, neg, _mm512_setzero_si512(), xq);
      const __m512 scale =
          _mm512_insertf32x8(_mm512_set1_ps(s0 * a[t].d[b]), _mm256_set1_ps(s1 * a[t].d[b + 1]), 1);
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(DotU8I8<kVnni>(u, s)), scale, acc[t]);
    }
  }
  __m256 acc0[T], acc1[T];
  float accm[T];
  HWY_UNROLL(8)
  for (int t = 0; t < T; ++t) {
    acc0[t] = _mm512_castps512_ps256(acc[t]);
    acc1[t] = _mm512_extractf32x8_ps(acc[t], 1);
    accm[t] = 0.0f;
  }
  if (b < nb) Block<kT, T, kVnni>(w + b * kBytes, b, a, acc0, accm);
  HWY_UNROLL(8)
  for (int t = 0; t < T; ++t) out[t][r] = HSum(_mm256_add_ps(acc0[t], acc1[t])) + accm[t];
}
#else
constexpr bool HasPairKernel(Type) { return false; }
#endif

// T tokens' dot products with one row of nb blocks. Even and odd blocks go to two
// accumulators per token, to shorten the dependency chains.
template <Type kT, int T, bool kVnni>
HWY_INLINE void DotRow(const uint8_t* w, int64_t nb, const Act32* a, float* const* out, size_t r) {
#if HWY_TARGET == HWY_AVX3
  if constexpr (HasPairKernel(kT)) {
    DotRowPairs<kT, T, kVnni>(w, nb, a, out, r);
    return;
  }
#endif
  constexpr size_t kBytes = BlockBytes(kT);
  __m256 acc0[T], acc1[T];
  float accm0[T], accm1[T];
  HWY_UNROLL(8)
  for (int t = 0; t < T; ++t) {
    acc0[t] = acc1[t] = _mm256_setzero_ps();
    accm0[t] = accm1[t] = 0.0f;
  }
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    {
      _mm_prefetch(reinterpret_cast<const char*>(w + b * kBytes + kPrefetch), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(w + b * kBytes + kPrefetch + 63), _MM_HINT_T0);
    }
    Block<kT, T, kVnni>(w + b * kBytes, b, a, acc0, accm0);
    Block<kT, T, kVnni>(w + (b + 1) * kBytes, b + 1, a, acc1, accm1);
  }
  if (b < nb) Block<kT, T, kVnni>(w + b * kBytes, b, a, acc0, accm0);
  HWY_UNROLL(8)
  for (int t = 0; t < T; ++t)
    out[t][r] = HSum(_mm256_add_ps(acc0[t], acc1[t])) + (accm0[t] + accm1[t]);
}

#else  // scalar targets

void QuantizeActs32(const float* x, int64_t cols, uint8_t* out) {
  const ActLayout l = act_layout(ActKind::kQ8x32, cols);
  auto* q = reinterpret_cast<int8_t*>(out + l.q);
  auto* dd = reinterpret_cast<float*>(out + l.d);
  auto* ss = reinterpret_cast<float*>(out + l.extra);
  for (int64_t b = 0; b < cols / 32; ++b) {
    const float* xb = x + 32 * b;
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int sum = 0;
    for (int j = 0; j < 32; ++j) {
      const int v = RoundAct(xb[j] * id);
      q[32 * b + j] = static_cast<int8_t>(v);
      sum += v;
    }
    dd[b] = d;
    ss[b] = d * static_cast<float>(sum);
  }
}

constexpr bool HasMin(Type t) { return t == Type::kQ4_1 || t == Type::kQ5_1; }

// The 32 codes of a block (signed for Q8_0/Q4_0/Q5_0, MXFP4's table values), its scale
// and min.
template <Type kT>
HWY_INLINE size_t Decode(const uint8_t* p, int* w, float* scale, float* min) {
  if constexpr (kT == Type::kMXFP4) {
    *scale = quant::e8m0_to_f32_half(p[0]);
    *min = 0.0f;
    for (int j = 0; j < 16; ++j) {
      w[j] = quant::kMxfp4Values[p[1 + j] & 15];
      w[j + 16] = quant::kMxfp4Values[p[1 + j] >> 4];
    }
    return sizeof(quant::BlockMXFP4);
  } else {
    uint16_t h[2];
    std::memcpy(h, p, 4);
    *scale = f16_to_f32(h[0]);
    *min = HasMin(kT) ? f16_to_f32(h[1]) : 0.0f;
    if constexpr (kT == Type::kQ8_0) {
      for (int j = 0; j < 32; ++j) w[j] = static_cast<int8_t>(p[2 + j]);
      return sizeof(quant::BlockQ8_0);
    } else {
      const size_t qs = kT == Type::kQ4_0 ? 2 : kT == Type::kQ4_1 ? 4 : kT == Type::kQ5_0 ? 6 : 8;
      uint32_t qh = 0;
      if (kT == Type::kQ5_0) std::memcpy(&qh, p + 2, 4);
      if (kT == Type::kQ5_1) std::memcpy(&qh, p + 4, 4);
      const int off = kT == Type::kQ4_0 ? 8 : kT == Type::kQ5_0 ? 16 : 0;
      for (int j = 0; j < 16; ++j) {
        w[j] = (p[qs + j] & 15) + static_cast<int>(((qh >> j) & 1u) << 4) - off;
        w[j + 16] = (p[qs + j] >> 4) + static_cast<int>(((qh >> (j + 16)) & 1u) << 4) - off;
      }
      return qs + 16;
    }
  }
}

template <Type kT, int T, bool kVnni>
HWY_INLINE void DotRow(const uint8_t* w, int64_t nb, const Act32* a, float* const* out, size_t r) {
  float acc[2][T] = {}, accm[2][T] = {};
  int wq[32];
  for (int64_t b = 0; b < nb; ++b) {
    const int p = static_cast<int>(b & 1);
    float scale, min;
    const size_t bytes = Decode<kT>(w, wq, &scale, &min);
    w += bytes;
    HWY_UNROLL(8)
    for (int t = 0; t < T; ++t) {
      int sum = 0;
      for (int j = 0; j < 32; ++j) sum += wq[j] * a[t].q[32 * b + j];
      acc[p][t] += static_cast<float>(sum) * (scale * a[t].d[b]);
      if constexpr (HasMin(kT)) accm[p][t] += min * a[t].s[b];
    }
  }
  HWY_UNROLL(8)
  for (int t = 0; t < T; ++t) out[t][r] = (acc[0][t] + acc[1][t]) + (accm[0][t] + accm[1][t]);
}

inline bool HasVnni() { return false; }

#endif

// Rows [r0, r1), tokens in tiles of 4 (each tile reads a row's blocks once).
template <Type kT, bool kVnni>
void RowsOf(const uint8_t* w, size_t row_bytes, int64_t cols, const uint8_t* acts,
            size_t act_stride, int n, float* y, size_t ldy, size_t r0, size_t r1) {
  const ActLayout l = act_layout(ActKind::kQ8x32, cols);
  const int64_t nb = cols / 32;
  constexpr int kTile = 4;
  for (int t0 = 0; t0 < n; t0 += kTile) {
    Act32 a[kTile];
    float* out[kTile];
    const int tn = std::min(kTile, n - t0);
    for (int t = 0; t < tn; ++t) {
      a[t] = act32(acts + static_cast<size_t>(t0 + t) * act_stride, l);
      out[t] = y + static_cast<size_t>(t0 + t) * ldy;
    }
    for (size_t r = r0; r < r1; ++r) {
      const uint8_t* wr = w + r * row_bytes;
      switch (tn) {
        case 4:
          DotRow<kT, 4, kVnni>(wr, nb, a, out, r);
          break;
        case 3:
          DotRow<kT, 3, kVnni>(wr, nb, a, out, r);
          break;
        case 2:
          DotRow<kT, 2, kVnni>(wr, nb, a, out, r);
          break;
        default:
          DotRow<kT, 1, kVnni>(wr, nb, a, out, r);
          break;
      }
    }
  }
}

template <bool kVnni>
void RowsTyped(Type t, const uint8_t* w, size_t row_bytes, int64_t cols, const uint8_t* acts,
               size_t act_stride, int n, float* y, size_t ldy, size_t r0, size_t r1) {
  switch (t) {
    case Type::kQ8_0:
      return RowsOf<Type::kQ8_0, kVnni>(w, row_bytes, cols, acts, act_stride, n, y, ldy, r0, r1);
    case Type::kQ4_0:
      return RowsOf<Type::kQ4_0, kVnni>(w, row_bytes, cols, acts, act_stride, n, y, ldy, r0, r1);
    case Type::kQ4_1:
      return RowsOf<Type::kQ4_1, kVnni>(w, row_bytes, cols, acts, act_stride, n, y, ldy, r0, r1);
    case Type::kQ5_0:
      return RowsOf<Type::kQ5_0, kVnni>(w, row_bytes, cols, acts, act_stride, n, y, ldy, r0, r1);
    case Type::kQ5_1:
      return RowsOf<Type::kQ5_1, kVnni>(w, row_bytes, cols, acts, act_stride, n, y, ldy, r0, r1);
    case Type::kMXFP4:
      return RowsOf<Type::kMXFP4, kVnni>(w, row_bytes, cols, acts, act_stride, n, y, ldy, r0, r1);
    default:
      return;
  }
}

void Rows32(Type t, const uint8_t* w, size_t row_bytes, int64_t cols, const uint8_t* acts,
            size_t act_stride, int n, float* y, size_t ldy, size_t r0, size_t r1) {
#ifdef KIVI_Q32_VNNI
  if (HasVnni()) return RowsTyped<true>(t, w, row_bytes, cols, acts, act_stride, n, y, ldy, r0, r1);
#endif
  RowsTyped<false>(t, w, row_bytes, cols, acts, act_stride, n, y, ldy, r0, r1);
}

}  // namespace kivi::ops::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kivi::ops::detail {

HWY_EXPORT(QuantizeActs32);
HWY_EXPORT(Rows32);

void quantize_acts32(const float* x, int64_t cols, uint8_t* out) {
  HWY_DYNAMIC_DISPATCH(QuantizeActs32)(x, cols, out);
}

void rows32(quant::Type t, const uint8_t* w, size_t row_bytes, int64_t cols, const uint8_t* acts,
            size_t act_stride, int n, float* y, size_t ldy, size_t r0, size_t r1) {
  HWY_DYNAMIC_DISPATCH(Rows32)(t, w, row_bytes, cols, acts, act_stride, n, y, ldy, r0, r1);
}

}  // namespace kivi::ops::detail
#endif  // HWY_ONCE
