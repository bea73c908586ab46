// KIVI values with 512-bit vectors (AVX3): the exact kernel, the fast path's weight
// preparation for two or four channel groups, and the fast kernel, 64 bytes of a quad
// (16 channel bytes of four tokens) per load. The layouts and the arithmetic are those
// of the 256-bit kernels in kivi_values-inl.h, which AVX3 uses for other shapes.

// Per-target include guard (Highway's toggle).
#if defined(KIVI_ATTN_KIVI_VALUES_AVX512_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KIVI_ATTN_KIVI_VALUES_AVX512_INL_H_
#undef KIVI_ATTN_KIVI_VALUES_AVX512_INL_H_
#else
#define KIVI_ATTN_KIVI_VALUES_AVX512_INL_H_
#endif

#include "attn/kivi_values-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kivi::attn::HWY_NAMESPACE {

#ifdef KIVI_X86_512
// AccumKiviExact256 with 512-bit vectors (16 channels per vector, W % 16 == 0, Gc % 16 ==
// 0) and every plane of a byte column in one pass (NH x 8/BITS accumulators, at most 16),
// so each code vector is loaded once. Per channel the products and their order are those
// of AccumKiviExact256: bit for bit the same result. The 2-bit table of a token and group
// (s c + z for c = 0..3) is broadcast to every 128-bit block, where vpermilps looks up.
template <int NH, int BITS>
HWY_INLINE void AccumKiviExact512(const float* P, int ld, int D, int Gc, const uint8_t* quad0,
                                  int n, const float* lut, const float* s, const float* z, float* O,
                                  size_t ostride) {
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
            v[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(xs, mask)),
                                   _mm512_set1_ps(s[pi]), _mm512_set1_ps(z[pi]));
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

// PrepareValueWeights for NG = 4 or 2 channel groups (D = NG Gc; head_dim 128 or 64 at
// G = 32) with 512-bit vectors. One vector holds 16 / NG tokens x NG groups, so no
// transposition of the per-token parameters is needed: with four groups a quad's 4
// tokens, lane 4 g + b for token b; with two a pair of quads' 8 tokens, lane 8 d + 4 g + b
// for token 4 d + b. n must cover whole vectors (t4 = 0, n % (16 / NG) == 0). Layout of
// the result: wq[h * hs + NG q + g] with hs = n NG / 4 (the 16 lanes of vector i, rounded
// to int16, are uint64s 4i .. 4i + 3). wtmp: scratch of n NG / 16 * NH * 16 floats.
template <int NH, int NG>
HWY_NOINLINE void PrepareValueWeightsWide(const float* P, int ld, int Gc, int n, const float* vs,
                                          const float* vz, float* O, size_t ostride, uint64_t* wq,
                                          float* wsc, float* wtmp) {
  static_assert(NG == 4 || NG == 2, "four or two channel groups");
  constexpr int kTok = 16 / NG;  // tokens per vector
  // Lane l takes vs[tr[l]] (token-major input [token][group]).
  const __m512i tr = NG == 4
                         ? _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15)
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
      for (int c = g * Gc; c < (g + 1) * Gc; c += 16)
        _mm512_storeu_ps(o + c, _mm512_add_ps(_mm512_loadu_ps(o + c), zsv));
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

// One 64-byte column (16 channel bytes of four tokens) of FastKiviValues512, code plane
// K: over the nq quads, head h's weights are w[h * hs + q * qs]; the sums of the 16
// channels, times the head's weight scale wsc[h * NG], are added to o + h * ostride.
// Out of line, with a pointer loop, so that its accumulators, pointers and counter stay
// in registers (inlined into the value kernel, GCC kept the loop counter on the stack).
template <int NH, int BITS, bool kVnni, int K>
HWY_NOINLINE void ValueColumn512K(const uint8_t* src, size_t qbytes, int nq, const uint64_t* w,
                                  size_t hs, size_t qs, const float* wsc, int NG, float* o,
                                  size_t ostride) {
  const __m512i mask = _mm512_set1_epi8(static_cast<char>((1 << BITS) - 1));
  __m512i lo[4], hi[4];
#pragma GCC unroll 4
  for (int hh = 0; hh < 4; ++hh) lo[hh] = hi[hh] = _mm512_setzero_si512();
  const uint8_t* const end = src + static_cast<size_t>(nq) * qbytes;
  for (; src != end; src += qbytes, w += qs) {
    const __m512i x = _mm512_loadu_si512(src);
    const __m512i pl =
        BITS == 8 ? x : _mm512_and_si512(K == 0 ? x : _mm512_srli_epi16(x, BITS * K), mask);
    const __m512i cl = _mm512_cvtepu8_epi16(_mm512_castsi512_si256(pl));
    const __m512i ch = _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(pl, 1));
#pragma GCC unroll 4
    for (int hh = 0; hh < NH; ++hh) {
      const __m512i wv = _mm512_set1_epi64(static_cast<long long>(w[hh * hs]));
      lo[hh] = DotI16<kVnni>(lo[hh], cl, wv);
      hi[hh] = DotI16<kVnni>(hi[hh], ch, wv);
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
    _mm512_storeu_ps(oh, _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_set1_ps(wsc[hh * NG]),
                                         _mm512_loadu_ps(oh)));
  }
}
template <int NH, int BITS, bool kVnni>
HWY_INLINE void ValueColumn512(int k, const uint8_t* src, size_t qbytes, int nq, const uint64_t* w,
                               size_t hs, size_t qs, const float* wsc, int NG, float* o,
                               size_t ostride) {
  switch (k) {
    case 0:
      return ValueColumn512K<NH, BITS, kVnni, 0>(src, qbytes, nq, w, hs, qs, wsc, NG, o, ostride);
    case 1:
      return ValueColumn512K<NH, BITS, kVnni, 1>(src, qbytes, nq, w, hs, qs, wsc, NG, o, ostride);
    case 2:
      return ValueColumn512K<NH, BITS, kVnni, 2>(src, qbytes, nq, w, hs, qs, wsc, NG, o, ostride);
    default:
      return ValueColumn512K<NH, BITS, kVnni, 3>(src, qbytes, nq, w, hs, qs, wsc, NG, o, ostride);
  }
}

// FastKiviValues256 with 512-bit vectors: 64 bytes of a quad (16 channel bytes of four
// tokens) per load; each vpdpwssd covers 8 channels x 4 tokens. Needs W % 16 == 0 and
// Gc % 16 == 0 (the 16 channels of a load share one group).
template <int NH, int BITS, bool kVnni, int kD>
HWY_INLINE void FastKiviValues512(const float* P, int ld, int D_, int Gc, const uint8_t* quad0,
                                  int t4, int n, const float* vs, const float* vz, float* O,
                                  size_t ostride, uint64_t* wq, float* wsc, float* wtmp) {
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
      ValueColumn512<NH, BITS, kVnni>(k, quad0 + 64 * l, static_cast<size_t>(4 * W), nq,
                                      wq + g * gs, hs, qs, wsc + g, NG,
                                      O + static_cast<size_t>(k) * W + 16 * l, ostride);
    }
  }
}
#endif  // KIVI_X86_512

}  // namespace kivi::attn::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
