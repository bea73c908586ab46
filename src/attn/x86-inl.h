// x86 helpers of the attention kernels (AVX2 and AVX3 targets): reductions of many
// vectors at once, horizontal max/sum, and the int16 pairwise dot products of the fast
// path with their AVX512-VNNI variant. Raw intrinsics: these shuffle trees and the
// VNNI encoding have no Highway equivalent.

// Per-target include guard (Highway's toggle).
#if defined(KIVI_ATTN_X86_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KIVI_ATTN_X86_INL_H_
#undef KIVI_ATTN_X86_INL_H_
#else
#define KIVI_ATTN_X86_INL_H_
#endif

#include "attn/task.h"
#include "attn/vec-inl.h"

// KIVI_VNNI: the AVX3 target compiles VNNI variants of the fast kernels, in separate
// functions with their own target attribute (AVX3 plus avx512vnni: KIVI_VNNI_ATTR), run
// only where HasVnni() holds. Clang checks intrinsics against the function they are
// written in rather than where they are inlined, so clang builds use the vpmaddwd
// sequence instead.
#undef KIVI_VNNI
#undef KIVI_VNNI_ATTR
#if defined(KIVI_X86_512) && !defined(__clang__)
#define KIVI_VNNI 1
#define KIVI_VNNI_ATTR __attribute__((target(HWY_TARGET_STR ",avx512vnni")))
#endif

HWY_BEFORE_NAMESPACE();
namespace kivi::attn::HWY_NAMESPACE {

#ifdef KIVI_X86
// Whether the VNNI variants run: the CPU has AVX512-VNNI and tests have not turned
// them off (set_vnni_kernels).
inline bool HasVnni() {
#ifdef KIVI_VNNI
  static const bool has = __builtin_cpu_supports("avx512vnni");
  return has && g_switches.vnni.load(std::memory_order_relaxed);
#else
  return false;
#endif
}

// Lane i of the result is the sum of the lanes of v[i] (8 vectors of 8 floats).
template <class V>
HWY_INLINE __m256 SumEach8(const V* v) {
  const __m256 h01 = _mm256_hadd_ps(v[0].raw, v[1].raw), h23 = _mm256_hadd_ps(v[2].raw, v[3].raw);
  const __m256 h45 = _mm256_hadd_ps(v[4].raw, v[5].raw), h67 = _mm256_hadd_ps(v[6].raw, v[7].raw);
  const __m256 a = _mm256_hadd_ps(h01, h23), b = _mm256_hadd_ps(h45, h67);
  // a = [s0 s1 s2 s3 (low halves) | s0 s1 s2 s3 (high halves)], b likewise for 4..7
  return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

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

// The four lane sums of a0..a3, as floats.
HWY_INLINE __m128 SumsOf4(__m256i a0, __m256i a1, __m256i a2, __m256i a3) {
  const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(a0, a1), _mm256_hadd_epi32(a2, a3));
  return _mm_cvtepi32_ps(_mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
}

// acc += pairwise int16 products (vpdpwssd with VNNI, else vpmaddwd + vpaddd), for
// 256- and 512-bit vectors. vpdpwssd is issued by inline asm with the accumulator tied to
// its register ("+v"): with GCC's builtin (or intrinsic) the register allocator copies
// every accumulator before and after the instruction in the value loops (two vmovdqa per
// product). The {evex} prefix keeps the AVX512-VNNI encoding (the VEX one, AVX-VNNI,
// faults on CPUs without it, e.g. AMD Zen 4); the kVnni functions run only where
// HasVnni() holds.
HWY_INLINE __m256i MaddAdd(__m256i acc, __m256i a, __m256i b) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
}
#ifdef KIVI_X86_512
HWY_INLINE __m512i MaddAdd(__m512i acc, __m512i a, __m512i b) {
  return _mm512_add_epi32(acc, _mm512_madd_epi16(a, b));
}
#endif
template <bool kVnni, class V>
HWY_INLINE V DotI16(V acc, V a, V b) {
#ifdef KIVI_VNNI
  if constexpr (kVnni) {
    asm("%{evex%} vpdpwssd {%2, %1, %0|%0, %1, %2}" : "+v"(acc) : "v"(a), "vm"(b));
    return acc;
  }
#endif
  return MaddAdd(acc, a, b);
}
#endif  // KIVI_X86

#ifdef KIVI_X86_512
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
// then one permutation into order (GCC turns a scalar loop here into a scatter, which
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
  return _mm512_setr_ps(v[0], v[0], v[0], v[0], v[1], v[1], v[1], v[1], v[2], v[2], v[2], v[2],
                        v[3], v[3], v[3], v[3]);
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

#endif  // KIVI_X86_512

}  // namespace kivi::attn::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
