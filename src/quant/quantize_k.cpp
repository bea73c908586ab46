// K-quant quantization: a least-squares search per sub-block, then the super-block's
// scale codes. Written from the format definitions (quant/blocks.h).
//
// Sub-blocks (16 or 32 values) get a scale (and, for Q2_K/Q4_K/Q5_K, a min) minimizing
// the squared error: candidate scales spread around range / levels, each followed by the
// least-squares scale (and min) for the codes it produces; the best is kept. The
// super-block then stores these scales as 4-, 6- or 8-bit codes of one f16 step (the
// largest scale maps to the largest code); for each sub-block the codes next to the
// rounded ones are tried too, and the value codes are finally chosen for the stored
// scales. The search minimizes plain squared error (ggml's reference weights each value
// by its magnitude), so the RMS error it reaches is at least as low as ggml's on the
// fixtures (tests/test_quant.cpp).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/f16.h"
#include "quant/blocks.h"
#include "quant/quantize.h"

namespace kivi::quant {

namespace {

// v clamped to [lo, hi] (NaN gives lo) and rounded to the nearest integer, ties to
// even: adding and subtracting 1.5 * 2^23 rounds any |v| < 2^22 exactly that way, in
// two float additions.
inline float nearest_f(float v, float lo, float hi) {
  v = v > lo ? v : lo;
  v = v < hi ? v : hi;
  return (v + 12582912.0f) - 12582912.0f;
}
inline int nearest_clamp(float v, int lo, int hi) {
  return static_cast<int>(nearest_f(v, static_cast<float>(lo), static_cast<float>(hi)));
}

// x ~ a * q - b, q in [0, nmax], a >= 0, b >= 0 (the min is subtracted, so a block whose
// values are all positive is fitted with b = 0).
struct Affine {
  float a = 0, b = 0;
};

// Squared error of x[n] against a * q - b with q chosen by rounding.
inline float affine_error(const float* x, int n, int nmax, float a, float b) {
  const float ia = a > 0 ? 1.0f / a : 0.0f, fmax = static_cast<float>(nmax);
  float err = 0;
  for (int i = 0; i < n; ++i) {
    const float q = nearest_f((x[i] + b) * ia, 0.0f, fmax);  // 0 when a = 0
    const float e = x[i] - (a * q - b);
    err += e * e;
  }
  return err;
}

// Candidate scales: range / (nmax + step * k) for k in [-steps, steps].
Affine fit_affine(const float* x, int n, int nmax, int steps, float step) {
  float lo = x[0], hi = x[0];
  for (int i = 1; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  lo = std::min(lo, 0.0f);
  Affine best;
  best.b = -lo;
  if (!(hi > lo)) return best;  // constant block (or NaN): the min alone
  float sum_x = 0, sum_x2 = 0;
  for (int i = 0; i < n; ++i) {
    sum_x += x[i];
    sum_x2 += x[i] * x[i];
  }
  float best_err = affine_error(x, n, nmax, (hi - lo) / static_cast<float>(nmax), -lo);
  best.a = (hi - lo) / static_cast<float>(nmax);
  for (int k = -steps; k <= steps; ++k) {
    const float iscale = (static_cast<float>(nmax) + step * static_cast<float>(k)) / (hi - lo);
    float sq = 0, sq2 = 0, sxq = 0;
    const float fmax = static_cast<float>(nmax);
    for (int i = 0; i < n; ++i) {
      const float q = nearest_f(iscale * (x[i] - lo), 0.0f, fmax);
      sq += q;
      sq2 += q * q;
      sxq += x[i] * q;
    }
    // Least squares for x ~ a q + c, then c <= 0 (c = -b).
    const double N = n, Sq = sq, Sq2 = sq2, Sxq = sxq, Sx = sum_x;
    const double det = N * Sq2 - Sq * Sq;
    if (!(det > 0)) continue;
    double a = (N * Sxq - Sq * Sx) / det;
    double c = (Sq2 * Sx - Sq * Sxq) / det;
    if (c > 0) {
      c = 0;
      a = Sxq / Sq2;
    }
    if (!(a > 0)) continue;
    // Squared error from the sums: sum (x - a q - c)^2.
    const double err = sum_x2 - 2 * a * Sxq - 2 * c * Sx + a * a * Sq2 + 2 * a * c * Sq + N * c * c;
    if (err < best_err) {
      best_err = static_cast<float>(err);
      best.a = static_cast<float>(a);
      best.b = static_cast<float>(-c);
    }
  }
  return best;
}

// Squared error of x[n] against s * q, q in [qmin, qmax] chosen by rounding.
inline float symmetric_error(const float* x, int n, int qmin, int qmax, float s) {
  const float is = s != 0 ? 1.0f / s : 0.0f, lo = static_cast<float>(qmin),
              hi = static_cast<float>(qmax);
  float err = 0;
  for (int i = 0; i < n; ++i) {
    const float q = nearest_f(x[i] * is, lo, hi);  // 0 when s = 0
    const float e = x[i] - s * q;
    err += e * e;
  }
  return err;
}

// x ~ s * q, q in [qmin, qmax] (qmin = -qmax - 1): the scale may be negative, so the
// value of largest magnitude can take the longer side of the range.
float fit_symmetric(const float* x, int n, int qmin, int qmax) {
  float amax = 0, m = 0;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      m = x[i];
    }
  }
  if (!(amax > 0)) return 0.0f;
  float sum_x2 = 0;
  for (int i = 0; i < n; ++i) sum_x2 += x[i] * x[i];
  float best_s = m / static_cast<float>(qmin), best_err = symmetric_error(x, n, qmin, qmax, best_s);
  for (int side = 0; side < 2; ++side) {
    const float levels = side == 0 ? static_cast<float>(-qmin) : static_cast<float>(qmax);
    for (int k = -6; k <= 6; ++k) {
      const float t = levels + 0.1f * static_cast<float>(k);
      if (!(t > 0.5f)) continue;
      const float s0 = side == 0 ? -m / t : m / t;
      const float is = 1.0f / s0;
      float sxq = 0, sq2 = 0;
      for (int i = 0; i < n; ++i) {
        const float qi = nearest_f(x[i] * is, static_cast<float>(qmin), static_cast<float>(qmax));
        sxq += x[i] * qi;
        sq2 += qi * qi;
      }
      if (!(sq2 > 0)) continue;
      const float s = sxq / sq2;
      // sum (x - s q)^2 = sum x^2 - s * sum x q at the least-squares s.
      const float err =
          static_cast<float>(static_cast<double>(sum_x2) - static_cast<double>(sxq) * sxq / sq2);
      if (err < best_err) {
        best_err = err;
        best_s = s;
      }
    }
  }
  return best_s;
}

// The f16 step of the codes for scales up to `top` (code `max_code` = top); returns the
// step as stored and its f16 bits.
inline float code_step(float top, int max_code, uint16_t* bits) {
  *bits = f32_to_f16(top / static_cast<float>(max_code));
  return f16_to_f32(*bits);
}

// Affine K-quants (Q2_K, Q4_K, Q5_K): S sub-blocks of L values, value codes 0..nmax,
// scale and min codes 0..cmax. Fills the unpacked codes and the two f16 steps.
// The search around the rounded codes (+-kCodeRadius each) and the 21 candidate scales
// (nmax + step * k, |k| <= 10: +-1 level for Q2_K, +-3 levels for Q4_K/Q5_K) were
// chosen on the fixtures' source for error and speed: +-1 level costs Q5_K 4% of RMS
// error, +-2 codes gain under 1% at almost three times the work, and wider candidate
// ranges raise Q2_K's error (its 4-bit scale codes then lose more than the sub-blocks
// gain).
constexpr int kCodeRadius = 1;
template <int S, int L>
void affine_superblock(const float* x, int nmax, int cmax, uint8_t* sc, uint8_t* mn, uint8_t* q,
                       uint16_t* d_bits, uint16_t* dmin_bits) {
  const int steps = 10;
  const float step = nmax <= 3 ? 0.1f : 0.3f;
  Affine fit[S];
  float top_a = 0, top_b = 0;
  for (int j = 0; j < S; ++j) {
    fit[j] = fit_affine(x + L * j, L, nmax, steps, step);
    top_a = std::max(top_a, fit[j].a);
    top_b = std::max(top_b, fit[j].b);
  }
  const float d = code_step(top_a, cmax, d_bits), dmin = code_step(top_b, cmax, dmin_bits);
  for (int j = 0; j < S; ++j) {
    const float* xj = x + L * j;
    const int s0 = d > 0 ? nearest_clamp(fit[j].a / d, 0, cmax) : 0;
    const int m0 = dmin > 0 ? nearest_clamp(fit[j].b / dmin, 0, cmax) : 0;
    int bs = s0, bm = m0;
    float best =
        affine_error(xj, L, nmax, d * static_cast<float>(s0), dmin * static_cast<float>(m0));
    for (int ds = -kCodeRadius; ds <= kCodeRadius; ++ds) {
      for (int dm = -kCodeRadius; dm <= kCodeRadius; ++dm) {
        const int s = s0 + ds, m = m0 + dm;
        if ((ds == 0 && dm == 0) || s < 0 || s > cmax || m < 0 || m > cmax) continue;
        const float err =
            affine_error(xj, L, nmax, d * static_cast<float>(s), dmin * static_cast<float>(m));
        if (err < best) {
          best = err;
          bs = s;
          bm = m;
        }
      }
    }
    sc[j] = static_cast<uint8_t>(bs);
    mn[j] = static_cast<uint8_t>(bm);
    const float a = d * static_cast<float>(bs), b = dmin * static_cast<float>(bm);
    const float ia = a > 0 ? 1.0f / a : 0.0f;
    for (int i = 0; i < L; ++i)
      q[L * j + i] = static_cast<uint8_t>(a > 0 ? nearest_clamp((xj[i] + b) * ia, 0, nmax) : 0);
  }
}

// Symmetric K-quants (Q3_K, Q6_K): 16 sub-blocks of 16, value codes qmin..qmax, signed
// scale codes cmin..cmax (the scale of largest magnitude maps to cmin). q gets q - qmin.
void symmetric_superblock(const float* x, int qmin, int qmax, int cmin, int cmax, int8_t* sc,
                          uint8_t* q, uint16_t* d_bits) {
  float s[16], top = 0, top_abs = 0;
  for (int j = 0; j < 16; ++j) {
    s[j] = fit_symmetric(x + 16 * j, 16, qmin, qmax);
    if (std::fabs(s[j]) > top_abs) {
      top_abs = std::fabs(s[j]);
      top = s[j];
    }
  }
  *d_bits = f32_to_f16(top / static_cast<float>(cmin));
  const float d = f16_to_f32(*d_bits);
  for (int j = 0; j < 16; ++j) {
    const float* xj = x + 16 * j;
    const int c0 = d != 0 ? nearest_clamp(s[j] / d, cmin, cmax) : 0;
    int bc = c0;
    float best = symmetric_error(xj, 16, qmin, qmax, d * static_cast<float>(c0));
    for (int dc = -1; dc <= 1; dc += 2) {
      const int c = c0 + dc;
      if (c < cmin || c > cmax) continue;
      const float err = symmetric_error(xj, 16, qmin, qmax, d * static_cast<float>(c));
      if (err < best) {
        best = err;
        bc = c;
      }
    }
    sc[j] = static_cast<int8_t>(bc);
    const float a = d * static_cast<float>(bc);
    const float ia = a != 0 ? 1.0f / a : 0.0f;
    for (int i = 0; i < 16; ++i) {
      const int v = a != 0 ? nearest_clamp(xj[i] * ia, qmin, qmax) : 0;
      q[16 * j + i] = static_cast<uint8_t>(v - qmin);
    }
  }
}

template <class B, class F>
void superblocks(const float* x, void* dst, int64_t n, F&& f) {
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t b = 0; b < n / kBlockK; ++b) {
    B blk;
    std::memset(&blk, 0, sizeof(B));
    f(x + kBlockK * b, blk);
    std::memcpy(out + b * sizeof(B), &blk, sizeof(B));
  }
}

// Low 2 bits of value e at qs[32*(e/128) + e%32], bits 2*((e%128)/32) (Q2_K, Q3_K).
inline void put2(uint8_t* qs, int e, int v) {
  qs[32 * (e / 128) + e % 32] |= static_cast<uint8_t>((v & 3) << (2 * ((e % 128) / 32)));
}
// Low 4 bits of value e at qs[32*(e/64) + e%32], low or high nibble (Q4_K, Q5_K).
inline void put4(uint8_t* qs, int e, int v) {
  qs[32 * (e / 64) + e % 32] |= static_cast<uint8_t>((v & 15) << ((e % 64) < 32 ? 0 : 4));
}

}  // namespace

void quantize_row_q2_k(const float* x, void* dst, int64_t n) {
  superblocks<BlockQ2_K>(x, dst, n, [](const float* v, BlockQ2_K& b) {
    uint8_t sc[16], mn[16], q[256];
    affine_superblock<16, 16>(v, 3, 15, sc, mn, q, &b.d, &b.dmin);
    for (int j = 0; j < 16; ++j) b.scales[j] = static_cast<uint8_t>(sc[j] | (mn[j] << 4));
    for (int e = 0; e < 256; ++e) put2(b.qs, e, q[e]);
  });
}

void quantize_row_q3_k(const float* x, void* dst, int64_t n) {
  superblocks<BlockQ3_K>(x, dst, n, [](const float* v, BlockQ3_K& b) {
    int8_t sc[16];
    uint8_t q[256];
    symmetric_superblock(v, -4, 3, -32, 31, sc, q, &b.d);
    pack_q3_k_scales(sc, b.scales);
    for (int e = 0; e < 256; ++e) {
      put2(b.qs, e, q[e]);
      b.hmask[e % 32] |= static_cast<uint8_t>((q[e] >> 2) << (e / 32));
    }
  });
}

void quantize_row_q4_k(const float* x, void* dst, int64_t n) {
  superblocks<BlockQ4_K>(x, dst, n, [](const float* v, BlockQ4_K& b) {
    uint8_t sc[8], mn[8], q[256];
    affine_superblock<8, 32>(v, 15, 63, sc, mn, q, &b.d, &b.dmin);
    pack_k4_scales(sc, mn, b.scales);
    for (int e = 0; e < 256; ++e) put4(b.qs, e, q[e]);
  });
}

void quantize_row_q5_k(const float* x, void* dst, int64_t n) {
  superblocks<BlockQ5_K>(x, dst, n, [](const float* v, BlockQ5_K& b) {
    uint8_t sc[8], mn[8], q[256];
    affine_superblock<8, 32>(v, 31, 63, sc, mn, q, &b.d, &b.dmin);
    pack_k4_scales(sc, mn, b.scales);
    for (int e = 0; e < 256; ++e) {
      put4(b.qs, e, q[e]);
      b.qh[e % 32] |= static_cast<uint8_t>((q[e] >> 4) << (e / 32));
    }
  });
}

void quantize_row_q6_k(const float* x, void* dst, int64_t n) {
  superblocks<BlockQ6_K>(x, dst, n, [](const float* v, BlockQ6_K& b) {
    uint8_t q[256];
    symmetric_superblock(v, -32, 31, -128, 127, b.scales, q, &b.d);
    for (int e = 0; e < 256; ++e) {
      const int h = e / 128, k = (e % 128) / 32, l = e % 32;
      b.ql[64 * h + 32 * (k % 2) + l] |= static_cast<uint8_t>((q[e] & 15) << (k < 2 ? 0 : 4));
      b.qh[32 * h + l] |= static_cast<uint8_t>((q[e] >> 4) << (2 * k));
    }
  });
}

// Q8_K (ggml's activation format): d = m / -127 with m the value of largest magnitude
// (the first on ties), q = min(127, round_half_even(x * (-127 / m))), d stored as
// 1 / (-127 / m); bsums[j] = sum of q[16j .. 16j + 15]. An all-zero block is all zero.
void quantize_row_q8_k(const float* x, void* dst, int64_t n) {
  superblocks<BlockQ8_K>(x, dst, n, [](const float* v, BlockQ8_K& b) {
    float amax = 0, m = 0;
    for (int i = 0; i < 256; ++i) {
      if (std::fabs(v[i]) > amax) {
        amax = std::fabs(v[i]);
        m = v[i];
      }
    }
    if (!(amax > 0)) return;
    const float iscale = -127.0f / m;
    for (int i = 0; i < 256; ++i)
      b.qs[i] = static_cast<int8_t>(nearest_clamp(iscale * v[i], -127, 127));
    for (int j = 0; j < 16; ++j) {
      int s = 0;
      for (int i = 0; i < 16; ++i) s += b.qs[16 * j + i];
      b.bsums[j] = static_cast<int16_t>(s);
    }
    b.d = 1.0f / iscale;
  });
}

}  // namespace kivi::quant
