// KIVI values: the weighted sum O += P V over stored values (quantized per token, a
// scale and zero point per token and group of Gc channels), 256-bit kernels and the
// staging fallback. kivi_values_avx512-inl.h holds the AVX3 kernels.
//
// Values are stored in quads of tokens interleaved by byte (kv/kv_cache.h): one 32-bit
// word holds byte j of four consecutive tokens, and byte j of a token holds channels
// j, j + W, ... (W = D bits / 8 bytes per token; kv/codec.h), so shifting a vector of
// words by 8 b + bits k and masking gives channels kW + j.. of token b in order.
//   exact path: codes to floats (s c + z) in registers, float products: bit for bit the
//               result of dequantize-then-accumulate (AVX2/AVX3, 2- and 4-bit codes);
//   fast path:  per tile, head and channel group the weights p s are rounded to int16,
//               and the four codes of a channel in a word meet them in vpmaddwd /
//               vpdpwssd (int16 products), the zero points added as sum_t p_t z_t;
//   staging:    other targets and shapes dequantize a tile (DequantKiviValues) for the
//               float row kernel.

// Per-target include guard (Highway's toggle).
#if defined(KIVI_ATTN_KIVI_VALUES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KIVI_ATTN_KIVI_VALUES_INL_H_
#undef KIVI_ATTN_KIVI_VALUES_INL_H_
#else
#define KIVI_ATTN_KIVI_VALUES_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "attn/task.h"
#include "attn/vec-inl.h"
#include "attn/x86-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kivi::attn::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// ---------------------------------------------------------------------------------
// Staging (every target).

// Values, stored in quads of tokens interleaved by byte (see kv_cache.h): tokens
// [t, t + len) of one block, with `quad` pointing at the quad holding token t and t4 =
// t % 4. Per token i, scale/zero per group g of Gc channels at s[i*gstride + g].
// Channel kW + j lies in group (kW + j) / Gc, so a vector over lanes j.. shares one
// group when its width divides Gc.
void DequantKiviValues(const uint8_t* quad, int t4, int len, int D, int bits, int Gc,
                       const float* s, const float* z, size_t gstride, float* out) {
  const int p = 8 / bits;
  const int W = D / p;  // bytes of one token's packed row
  const int mask = (1 << bits) - 1;
  auto scalar_token = [&](int i) {  // token i of the range, element by element
    const int slot = t4 + i;
    const uint8_t* qd = quad + static_cast<size_t>(slot / 4) * 4 * W + slot % 4;
    float* o = out + static_cast<size_t>(i) * D;
    for (int k = 0, c = 0; k < p; ++k) {
      for (int j = 0; j < W;
           ++j, ++c) {  // channel c = kW + j is in byte j, bits [bits*k, bits*k + bits)
        const int g = c / Gc;
        o[c] = static_cast<float>((qd[4 * j] >> (bits * k)) & mask) * s[i * gstride + g] +
               z[i * gstride + g];
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
            const auto sv = hn::Set(df, s[(i + b) * gstride + g]),
                       zv = hn::Set(df, z[(i + b) * gstride + g]);
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

#ifdef KIVI_X86
// ---------------------------------------------------------------------------------
// Exact path (AVX2, AVX3).

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
HWY_INLINE void AccumKiviExact256(const float* P, int ld, int D, int Gc, const uint8_t* quad0,
                                  int n, const float* lut, const float* s, const float* z, float* O,
                                  size_t ostride) {
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
            v0 = _mm256_permutevar_ps(_mm256_loadu_ps(lt + g0 * 8),
                                      sh == 0 ? x : _mm256_srli_epi32(x, sh));
            v1 = _mm256_permutevar_ps(_mm256_loadu_ps(lt + g1 * 8), _mm256_srli_epi32(x, sh + 2));
          } else {
            const float* st = s + static_cast<size_t>(t + b) * NG;
            const float* zt = z + static_cast<size_t>(t + b) * NG;
            const __m256 a0 =
                _mm256_cvtepi32_ps(_mm256_and_si256(sh == 0 ? x : _mm256_srli_epi32(x, sh), mask));
            const __m256 a1 =
                _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(x, sh + BITS), mask));
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

// The 2-bit value table of AccumKiviExact: lut[8 e + j] = (j % 4) s[e] + z[e] for the ne
// (token, group) entries e, the FMA DequantKiviValues uses.
HWY_INLINE void BuildValueLut(const float* s, const float* z, int ne, float* lut) {
  int e = 0;
#ifdef KIVI_X86_512
  // 16 entries per pair of loads; each store covers two entries.
  const __m512 c8 = _mm512_setr_ps(0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3);
  for (; e + 16 <= ne; e += 16) {
    const __m512 sv = _mm512_loadu_ps(s + e), zv = _mm512_loadu_ps(z + e);
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
      const __m512i idx = _mm512_setr_epi32(2 * k, 2 * k, 2 * k, 2 * k, 2 * k, 2 * k, 2 * k, 2 * k,
                                            2 * k + 1, 2 * k + 1, 2 * k + 1, 2 * k + 1, 2 * k + 1,
                                            2 * k + 1, 2 * k + 1, 2 * k + 1);
      _mm512_storeu_ps(
          lut + static_cast<size_t>(e + 2 * k) * 8,
          _mm512_fmadd_ps(c8, _mm512_permutexvar_ps(idx, sv), _mm512_permutexvar_ps(idx, zv)));
    }
  }
#endif
  const __m256 c4 = _mm256_setr_ps(0.0f, 1.0f, 2.0f, 3.0f, 0.0f, 1.0f, 2.0f, 3.0f);
  for (; e < ne; ++e) {
    _mm256_storeu_ps(lut + static_cast<size_t>(e) * 8,
                     _mm256_fmadd_ps(c4, _mm256_set1_ps(s[e]), _mm256_set1_ps(z[e])));
  }
}

// ---------------------------------------------------------------------------------
// Fast path (AVX2, AVX3).

// Per-token parameters [n][NG] (vs, vz) transposed to [NG][stride] (vsT, vzT): 4 x 4
// blocks when NG is a multiple of 4, element by element otherwise.
HWY_INLINE void TransposeParams(const float* vs, const float* vz, int n, int NG, size_t stride,
                                float* vsT, float* vzT) {
  auto block4 = [&](const float* src, float* dst, int i, int g) {
    __m128 r0 = _mm_loadu_ps(src + static_cast<size_t>(i) * NG + g),
           r1 = _mm_loadu_ps(src + static_cast<size_t>(i + 1) * NG + g);
    __m128 r2 = _mm_loadu_ps(src + static_cast<size_t>(i + 2) * NG + g),
           r3 = _mm_loadu_ps(src + static_cast<size_t>(i + 3) * NG + g);
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
HWY_INLINE float ValueGroupScale(const float* Ph, const float* sg, const float* zg, int n, int Gc,
                                 float* og, float* scale) {
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
  for (int c = 0; c < Gc; c += 8)
    _mm256_storeu_ps(og + c, _mm256_add_ps(_mm256_loadu_ps(og + c), zsv));
  *scale = wmax / 32767.0f;
  return wmax > 0.0f ? 32767.0f / wmax : 0.0f;
}

// Weights for FastKiviValues*: wq[(h * NG + g) * nq + q] holds the four int16 weights
// p * s of quad q's tokens for head h, channel group g; wsc[h * NG + g] their scale.
// The zero points' contribution, sum_t p_t z_{t,g}, is added to o here.
template <int NH>
HWY_INLINE void PrepareValueWeights(const float* P, int ld, int D, int Gc, int t4, int n,
                                    const float* vs, const float* vz, float* O, size_t ostride,
                                    uint64_t* wq, float* wsc) {
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
      const float inv =
          ValueGroupScale(Ph, sg, vzT + g * kTile, n, Gc, o + g * Gc, &wsc[hh * NG + g]);
      int16_t* w = reinterpret_cast<int16_t*>(wq + (static_cast<size_t>(hh) * NG + g) * nq);
      // Slots [0, t4) and [t4 + n, 4 nq) of the quads are outside the range: weight 0.
      std::memset(w, 0, static_cast<size_t>(4 * nq) * sizeof(int16_t));
      const __m256 invv = _mm256_set1_ps(inv);
      int i = 0;
      for (; i + 8 <= n; i += 8) {
        const __m256i q32 = _mm256_cvtps_epi32(
            _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(Ph + i), _mm256_loadu_ps(sg + i)), invv));
        _mm_storeu_si128(
            reinterpret_cast<__m128i*>(w + t4 + i),
            _mm_packs_epi32(_mm256_castsi256_si128(q32), _mm256_extracti128_si256(q32, 1)));
      }
      for (; i < n; ++i) w[t4 + i] = static_cast<int16_t>(std::nearbyint(Ph[i] * sg[i] * inv));
    }
  }
}

// o += sum over tokens [t4, t4 + n) of the quads starting at `quad0` (per-token value
// params vs/vz [n][D/Gc]), for NH heads with 256-bit vectors. Weights p * s are rounded
// to int16 per head, channel group and tile; a quad's four codes of one channel,
// widened to int16, pair with the four weights in vpdpwssd / vpmaddwd. AVX3 uses it
// for shapes its 512-bit kernel does not take.
template <int NH, int BITS, bool kVnni>
HWY_INLINE void FastKiviValues256(const float* P, int ld, int D, int Gc, const uint8_t* quad0,
                                  int t4, int n, const float* vs, const float* vz, float* O,
                                  size_t ostride, uint64_t* wq, float* wsc) {
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
        const __m256i x = _mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(quad0 + static_cast<size_t>(q) * 4 * W + 32 * l));
        const __m256i pl = BITS == 8 ? x : _mm256_and_si256(_mm256_srli_epi16(x, BITS * k), mask);
        // [channel c: token 0..3] as int16, channels 8l+0..3 and 8l+4..7
        const __m256i cl = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(pl));
        const __m256i ch = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(pl, 1));
#pragma GCC unroll 4
        for (int hh = 0; hh < NH; ++hh) {
          const __m256i w = _mm256_set1_epi64x(
              static_cast<long long>(wq[(static_cast<size_t>(hh) * NG + g) * nq + q]));
          lo[hh] = DotI16<kVnni>(lo[hh], cl, w);
          hi[hh] = DotI16<kVnni>(hi[hh], ch, w);
        }
      }
#pragma GCC unroll 4
      for (int hh = 0; hh < NH; ++hh) {
        // Pairs of lanes per channel: [c0 c1 c4 c5 | c2 c3 c6 c7] after the add, then in order.
        const __m256i sum = _mm256_permutevar8x32_epi32(_mm256_hadd_epi32(lo[hh], hi[hh]), order);
        float* o = O + static_cast<size_t>(hh) * ostride + static_cast<size_t>(k) * W + 8 * l;
        _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum),
                                            _mm256_set1_ps(wsc[hh * NG + g]), _mm256_loadu_ps(o)));
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
HWY_INLINE void PrepareValueWeightPairs(const float* P, int ld, int NG, int Gc, int t4, int n,
                                        const float* vs, const float* vz, float* O, size_t ostride,
                                        uint32_t* wp, float* wsc, float* tmp) {
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
      const float inv = ValueGroupScale(Ph, sg, vzT + static_cast<size_t>(g) * np, n, Gc,
                                        o + g * Gc, &wsc[hh * NG + g]);
      const __m256 invv = _mm256_set1_ps(inv);
      uint32_t* dst = wp + (static_cast<size_t>(hh) * NG + g) * nq * 2;
      int i = 0;
      if (t4 == 0) {
        // Eight tokens are two whole quads: rounded, packed and reordered in registers.
        for (; i + 8 <= n; i += 8) {
          const __m256i q32 = _mm256_cvtps_epi32(
              _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(Ph + i), _mm256_loadu_ps(sg + i)), invv));
          const __m128i w8 =
              _mm_packs_epi32(_mm256_castsi256_si128(q32), _mm256_extracti128_si256(q32, 1));
          _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i / 2),
                           _mm_shufflehi_epi16(_mm_shufflelo_epi16(w8, 0xD8), 0xD8));
        }
      }
      // The rest (and ranges not starting a quad) slot by slot: slots [0, t4) and
      // [t4 + n, 4 nq) are outside the range, weight 0.
      if (i < n) {
        const int s0 = (t4 + i) / 4 * 4;  // first slot still to write, at a quad start
        for (int z = s0; z < 4 * nq; ++z) {
          const int tok = z - t4;
          w[z - s0] = tok < i || tok >= n
                          ? int16_t{0}
                          : static_cast<int16_t>(std::nearbyint(Ph[tok] * sg[tok] * inv));
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

// One step of the weight preparations below: the eight weights p8 spread by idxa and idxb
// to two vectors of (token, group) lanes, times the scales (vs) into tmp, their running
// maxima into mxa, mxb and the zero points' weighted sums (vz) into za, zb.
HWY_INLINE void SpreadWeights(__m256 p8, __m256i idxa, __m256i idxb, const float* vs,
                              const float* vz, float* tmp, __m256& mxa, __m256& mxb, __m256& za,
                              __m256& zb) {
  const __m256 ea = _mm256_permutevar8x32_ps(p8, idxa), eb = _mm256_permutevar8x32_ps(p8, idxb);
  const __m256 wa = _mm256_mul_ps(ea, _mm256_loadu_ps(vs)),
               wb = _mm256_mul_ps(eb, _mm256_loadu_ps(vs + 8));
  _mm256_store_ps(tmp, wa);
  _mm256_store_ps(tmp + 8, wb);
  mxa = _mm256_max_ps(mxa, wa);
  mxb = _mm256_max_ps(mxb, wb);
  za = _mm256_fmadd_ps(ea, _mm256_loadu_ps(vz), za);
  zb = _mm256_fmadd_ps(eb, _mm256_loadu_ps(vz + 8), zb);
}

// PrepareValueWeightPairs for four channel groups (NG = 4) and whole quads (t4 = 0,
// n % 8 == 0), without transposing the per-token parameters: a vector holds two tokens
// x four groups, so the maximum and the zero-point sum per group are lane-wise, and the
// int16 rounding of a quad (two vectors) packs to [t0 | t2] and [t1 | t3] per 128-bit
// half, which one byte shuffle turns into the weight pairs. Layout of the result:
// wp[(h * nq + q) * 8 + g] = (w0, w2) and wp[(h * nq + q) * 8 + 4 + g] = (w1, w3) of
// group g. tmp holds at least 4 n floats.
template <int NH>
HWY_INLINE void PrepareValueWeightPairsG4(const float* P, int ld, int Gc, int n, const float* vs,
                                          const float* vz, float* O, size_t ostride, uint32_t* wp,
                                          float* wsc, float* tmp) {
  const int nq = n / 4;
  // Lanes of eight weights spread to [p_{2j} x 4 | p_{2j+1} x 4], j = 0..3.
  const __m256i idx0 = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1),
                idx1 = _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3);
  const __m256i idx2 = _mm256_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5),
                idx3 = _mm256_setr_epi32(6, 6, 6, 6, 7, 7, 7, 7);
  const __m256i pairs = _mm256_setr_epi8(0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15, 0, 1,
                                         8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15);
  for (int hh = 0; hh < NH; ++hh) {
    const float* Ph = P + static_cast<size_t>(hh) * ld;
    // Four zero-point sums and two maxima in flight: the multiply-add latency would
    // otherwise bound this loop.
    __m256 mx0 = _mm256_setzero_ps(), mx1 = _mm256_setzero_ps();
    __m256 z0 = _mm256_setzero_ps(), z1 = _mm256_setzero_ps(), z2 = _mm256_setzero_ps(),
           z3 = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) {
      const __m256 p8 = _mm256_loadu_ps(Ph + i);
      const size_t o = static_cast<size_t>(i) * 4;
      SpreadWeights(p8, idx0, idx1, vs + o, vz + o, tmp + o, mx0, mx1, z0, z1);
      SpreadWeights(p8, idx2, idx3, vs + o + 16, vz + o + 16, tmp + o + 16, mx0, mx1, z2, z3);
    }
    const __m256 vmax = _mm256_max_ps(mx0, mx1);
    const __m256 zacc = _mm256_add_ps(_mm256_add_ps(z0, z1), _mm256_add_ps(z2, z3));
    const __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
    const __m128 z4 = _mm_add_ps(_mm256_castps256_ps128(zacc), _mm256_extractf128_ps(zacc, 1));
    _mm_storeu_ps(wsc + hh * 4, _mm_div_ps(m4, _mm_set1_ps(32767.0f)));
    const __m128 inv4 =
        _mm_and_ps(_mm_cmpgt_ps(m4, _mm_setzero_ps()), _mm_div_ps(_mm_set1_ps(32767.0f), m4));
    const __m256 inv = _mm256_set_m128(inv4, inv4);
    alignas(16) float zs[4];
    _mm_store_ps(zs, z4);
    float* o = O + static_cast<size_t>(hh) * ostride;
    for (int g = 0; g < 4; ++g) {
      const __m256 zv = _mm256_set1_ps(zs[g]);
      for (int c = g * Gc; c < (g + 1) * Gc; c += 8)
        _mm256_storeu_ps(o + c, _mm256_add_ps(_mm256_loadu_ps(o + c), zv));
    }
    uint32_t* dst = wp + static_cast<size_t>(hh) * nq * 8;
    for (int q = 0; q < nq; ++q) {
      const __m256i a =
          _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_load_ps(tmp + 16 * q), inv));  // t0 | t1
      const __m256i b =
          _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_load_ps(tmp + 16 * q + 8), inv));  // t2 | t3
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 8 * q),
                          _mm256_shuffle_epi8(_mm256_packs_epi32(a, b), pairs));
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
HWY_INLINE void PrepareValueWeightPairsG2(const float* P, int ld, int Gc, int n, const float* vs,
                                          const float* vz, float* O, size_t ostride, uint32_t* wp,
                                          float* wsc, float* tmp) {
  const int nq = n / 4;
  // Lanes of eight weights spread to [p_{4j} p_{4j} p_{4j+1} p_{4j+1} ... p_{4j+3}], j = 0, 1.
  const __m256i idx0 = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3),
                idx1 = _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7);
  const __m256i pairs = _mm256_setr_epi8(0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15, 0, 1,
                                         8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15);
  for (int hh = 0; hh < NH; ++hh) {
    const float* Ph = P + static_cast<size_t>(hh) * ld;
    __m256 mx0 = _mm256_setzero_ps(), mx1 = _mm256_setzero_ps();
    __m256 z0 = _mm256_setzero_ps(), z1 = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) {
      const __m256 p8 = _mm256_loadu_ps(Ph + i);
      const size_t o = static_cast<size_t>(i) * 2;
      SpreadWeights(p8, idx0, idx1, vs + o, vz + o, tmp + o, mx0, mx1, z0, z1);
    }
    // Lanes 2j + g -> group g.
    const __m256 vmax = _mm256_max_ps(mx0, mx1);
    const __m256 zacc = _mm256_add_ps(z0, z1);
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
    __m128 z4 = _mm_add_ps(_mm256_castps256_ps128(zacc), _mm256_extractf128_ps(zacc, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));  // [g0 g1 . .]
    z4 = _mm_add_ps(z4, _mm_movehl_ps(z4, z4));
    const __m128 m2 = _mm_movelh_ps(m4, m4);  // [g0 g1 g0 g1]
    alignas(16) float sc[4], zs[4];
    _mm_store_ps(sc, _mm_div_ps(m2, _mm_set1_ps(32767.0f)));
    _mm_store_ps(zs, z4);
    wsc[hh * 2] = sc[0];
    wsc[hh * 2 + 1] = sc[1];
    const __m128 inv4 =
        _mm_and_ps(_mm_cmpgt_ps(m2, _mm_setzero_ps()), _mm_div_ps(_mm_set1_ps(32767.0f), m2));
    const __m256 inv = _mm256_set_m128(inv4, inv4);
    float* o = O + static_cast<size_t>(hh) * ostride;
    for (int g = 0; g < 2; ++g) {
      const __m256 zv = _mm256_set1_ps(zs[g]);
      for (int c = g * Gc; c < (g + 1) * Gc; c += 8)
        _mm256_storeu_ps(o + c, _mm256_add_ps(_mm256_loadu_ps(o + c), zv));
    }
    uint32_t* dst = wp + static_cast<size_t>(hh) * nq * 4;
    for (int q = 0; q < nq; q += 2) {
      const __m256i a =
          _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_load_ps(tmp + 8 * q), inv));  // quad q
      const __m256i b =
          _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_load_ps(tmp + 8 * q + 8), inv));  // quad q + 1
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
HWY_INLINE void FastKiviValuesPairs(const float* P, int ld, int D, int Gc, const uint8_t* quad0,
                                    int t4, int n, const float* vs, const float* vz, float* O,
                                    size_t ostride, uint32_t* wp, float* wsc, float* tmp) {
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
        const __m256i a = _mm256_and_si256(_mm256_srli_epi16(x, BITS * k), mask);  // tokens 0, 2
        const __m256i b =
            _mm256_and_si256(_mm256_srli_epi16(x, BITS * k + 8), mask);  // tokens 1, 3
#pragma GCC unroll 4
        for (int hh = 0; hh < NH; ++hh) {
          const __m256i w02 = _mm256_set1_epi32(static_cast<int>(wq[hh * hs]));
          const __m256i w13 = _mm256_set1_epi32(static_cast<int>(wq[hh * hs + w13o]));
          acc[hh] = _mm256_add_epi32(
              acc[hh], _mm256_add_epi32(_mm256_madd_epi16(a, w02), _mm256_madd_epi16(b, w13)));
        }
      }
#pragma GCC unroll 4
      for (int hh = 0; hh < NH; ++hh) {
        float* o = O + static_cast<size_t>(hh) * ostride + c0;
        _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[hh]),
                                            _mm256_set1_ps(wsc[hh * NG + g]), _mm256_loadu_ps(o)));
      }
    }
  }
}

#endif  // KIVI_X86

}  // namespace kivi::attn::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
