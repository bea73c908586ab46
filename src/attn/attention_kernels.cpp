// Attention kernels over every cache format (first version: per-token
// dequantization into registers-sized buffers, float arithmetic).
#include <algorithm>
#include <cmath>
#include <limits>

#include "attn/kernels.h"
#include "ops/ops.h"

namespace kivi::attn {

size_t kernel_scratch_floats(int rep, int D, int block) {
  return static_cast<size_t>(rep) * block + 2 * static_cast<size_t>(D) + 2 * rep;
}

void attend_range(const TaskArgs& a) {
  const kv::LayerView& kv = *a.kv;
  const int D = kv.k.head_dim, rep = a.rep, B = kv.k.block;
  float* s = a.scratch;                       // [rep][B] scores, then probabilities
  float* kbuf = s + static_cast<size_t>(rep) * B;
  float* vbuf = kbuf + D;
  for (int r = 0; r < rep; ++r) {
    float* o = a.out + r * a.out_stride;
    std::fill(o, o + D, 0.0f);
    o[D] = -std::numeric_limits<float>::infinity();
    o[D + 1] = 0.0f;
  }
  for (int t0 = a.t0; t0 < a.t1;) {
    const int t1 = std::min(a.t1, (t0 / B + 1) * B);
    const int len = t1 - t0;
    for (int t = t0; t < t1; ++t) {
      dequantize_key(kv.k, t, a.h, kbuf);
      for (int r = 0; r < rep; ++r) {
        float sc = ops::dot(a.q + static_cast<size_t>(r) * D, kbuf, D) * a.scale;
        if (a.slopes) sc += a.slopes[r] * static_cast<float>(t - a.q_pos);
        s[r * B + (t - t0)] = sc;
      }
    }
    for (int r = 0; r < rep; ++r) {
      float* o = a.out + r * a.out_stride;
      float* sr = s + r * B;
      float mx = o[D];
      for (int i = 0; i < len; ++i) mx = std::max(mx, sr[i]);
      const float corr = std::exp(o[D] - mx);
      float den = o[D + 1] * corr;
      for (int i = 0; i < D; ++i) o[i] *= corr;
      for (int i = 0; i < len; ++i) {
        sr[i] = std::exp(sr[i] - mx);
        den += sr[i];
      }
      o[D] = mx;
      o[D + 1] = den;
    }
    for (int t = t0; t < t1; ++t) {
      dequantize_value(kv.v, t, a.h, vbuf);
      for (int r = 0; r < rep; ++r) {
        float* o = a.out + r * a.out_stride;
        const float p = s[r * B + (t - t0)];
        for (int i = 0; i < D; ++i) o[i] += p * vbuf[i];
      }
    }
    t0 = t1;
  }
}

}  // namespace kivi::attn
