// The reference attention: dequantize with the codec's scalar rules, attend in double.
// Written for clarity; the kernels (task.cpp and the files it calls) are tested against it.
#include <algorithm>
#include <cmath>
#include <vector>

#include "attn/attention.h"
#include "core/f16.h"
#include "kv/codec.h"

namespace kivi::attn {

using kv::Format;
using kv::Int8Granularity;

static size_t param_index(const kv::StreamView& s, int t, int h, int d, bool key) {
  const size_t slot = t % s.block;
  const size_t D = s.head_dim;
  if (kv::is_kivi(s.fmt.format)) {
    if (key) return s.param_base(t, h) + (slot / s.group) * D + d;
    return s.param_base(t, h) + slot * (D / s.group) + d / s.group;
  }
  switch (s.fmt.granularity) {
    case Int8Granularity::kToken:
      return s.token_param_index(t);
    case Int8Granularity::kHead:
      return s.param_base(t, h) + slot;
    case Int8Granularity::kGroup:
      return s.param_base(t, h) + slot * (D / s.group) + d / s.group;
    default:
      return 0;
  }
}

// A stored row as stored (rotated streams in the rotated space).
static void dequantize_stored(const kv::StreamView& s, int t, int h, float* out, bool key);

static void dequantize_row(const kv::StreamView& s, int t, int h, float* out, bool key) {
  const int D = s.head_dim;
  if (t >= s.n_stored) {
    const float* r = s.residual_row(t, h);
    std::copy(r, r + D, out);
    return;
  }
  dequantize_stored(s, t, h, out, key);
  if (s.rotated) s.rotations[h].inverse(out);  // back to the original space
}

static void dequantize_stored(const kv::StreamView& s, int t, int h, float* out, bool key) {
  const int D = s.head_dim;
  const uint8_t* row = s.row(t, h);
  if (s.tq) {  // one scale per token and head; codes in the head's rotated space
    const float sc = kv::load_param(s.scales, s.param_base(t, h) + t % s.block, s.param_type);
    s.tq->decode_rotated(row, sc, out);
    return;
  }
  switch (s.fmt.format) {
    case Format::kF32: {
      const float* r = reinterpret_cast<const float*>(row);
      std::copy(r, r + D, out);
      return;
    }
    case Format::kF16: {
      const f16_t* r = reinterpret_cast<const f16_t*>(row);
      for (int d = 0; d < D; ++d) out[d] = f16_to_f32(r[d]);
      return;
    }
    case Format::kInt8: {
      const int8_t* r = reinterpret_cast<const int8_t*>(row);
      for (int d = 0; d < D; ++d) {
        const float sc = s.fmt.granularity == Int8Granularity::kTensor
                             ? s.tensor_scale
                             : kv::load_param(s.scales, param_index(s, t, h, d, key), s.param_type);
        out[d] = r[d] * sc;
      }
      return;
    }
    default: {
      const int bits = kv::format_bits(s.fmt.format);
      // Quad-interleaved rows: gather this token's bytes back into one packed row.
      uint8_t packed[1024];
      const uint8_t* r = row;
      if (s.quad) {
        const uint8_t* q = s.quad_row(t, h);
        for (size_t j = 0; j < s.code_row_bytes; ++j) packed[j] = q[4 * j + t % 4];
        r = packed;
      }
      if (s.per_channel) {  // key group: the rows are interleaved in 4-byte units
        const uint8_t* g = s.group_codes(t, h);
        const int W = static_cast<int>(s.code_row_bytes);
        for (int j = 0; j < W; ++j) packed[j] = g[kv::key_group_offset(t % s.group, j, W, s.group)];
        r = packed;
      }
      for (int d = 0; d < D; ++d) {
        const size_t pi = param_index(s, t, h, d, key);
        out[d] = kv::unpack_code(r, d, bits, D) * kv::load_param(s.scales, pi, s.param_type) +
                 kv::load_param(s.zeros, pi, s.param_type);
      }
      return;
    }
  }
}

void dequantize_key(const kv::StreamView& s, int t, int h, float* out) {
  dequantize_row(s, t, h, out, true);
}
void dequantize_value(const kv::StreamView& s, int t, int h, float* out) {
  dequantize_row(s, t, h, out, false);
}

// Scores of query head hq over tokens [0, n) of `kv` where attended(t), in double:
// scale q . k_t (keys stored before RoPE rotated by position t) plus the ALiBi bias.
// Returns the largest.
template <typename Attended>
static double head_scores(const kv::LayerView& kv, const float* q, const Params& p, int hq,
                          Attended attended, std::vector<float>& kr, double* s) {
  const int n = kv.n_tokens, D = kv.k.head_dim;
  const int h = hq / (p.n_heads / kv.k.n_heads);
  const int q_pos = n - 1;
  const float* qh = q + static_cast<size_t>(hq) * D;
  double mx = -INFINITY;
  for (int t = 0; t < n; ++t) {
    if (!attended(t)) continue;
    dequantize_key(kv.k, t, h, kr.data());
    double dot = 0.0;
    if (p.rope) {  // keys stored before RoPE: rotate key t by position t, in double
      const float* row = p.rope + static_cast<size_t>(t) * D;
      const int half = D / 2;
      for (int i = 0; i < half; ++i) {
        const int i0 = p.rope_style == RopeStyle::kAdjacent ? 2 * i : i;
        const int i1 = p.rope_style == RopeStyle::kAdjacent ? 2 * i + 1 : i + half;
        const double c = row[2 * i], sn = row[2 * i + 1], a = kr[i0], b = kr[i1];
        dot += qh[i0] * (a * c - b * sn) + qh[i1] * (a * sn + b * c);
      }
    } else {
      for (int d = 0; d < D; ++d) dot += static_cast<double>(qh[d]) * kr[d];
    }
    s[t] = dot * p.scale;
    if (p.softcap > 0.0f) s[t] = p.softcap * std::tanh(s[t] / p.softcap);
    s[t] += p.alibi_slopes ? static_cast<double>(p.alibi_slopes[hq]) * (t - q_pos) : 0.0;
    mx = std::max(mx, s[t]);
  }
  return mx;
}

void decode_reference(const kv::LayerView& kv, const float* q, float* out, const Params& p) {
  const int n = kv.n_tokens, D = kv.k.head_dim, Hkv = kv.k.n_heads;
  const int rep = p.n_heads / Hkv;
  const int start = p.window > 0 ? std::max(0, n - p.window) : 0;
  std::vector<float> kr(D), vr(D);
  std::vector<double> s(n), o(D);
  for (int hq = 0; hq < p.n_heads; ++hq) {
    const int h = hq / rep;
    const int sink_end = start > 0 ? std::min(p.sinks, start) : 0;
    auto attended = [&](int t) { return t >= start || t < sink_end; };
    const double mx = head_scores(kv, q, p, hq, attended, kr, s.data());
    double den = 0.0;
    std::fill(o.begin(), o.end(), 0.0);
    for (int t = 0; t < n; ++t) {
      if (!attended(t)) continue;
      const double w = std::exp(s[t] - mx);
      den += w;
      dequantize_value(kv.v, t, h, vr.data());
      for (int d = 0; d < D; ++d) o[d] += w * vr[d];
    }
    if (p.head_sinks) den += std::exp(static_cast<double>(p.head_sinks[hq]) - mx);
    for (int d = 0; d < D; ++d)
      out[static_cast<size_t>(hq) * D + d] = static_cast<float>(o[d] / den);
  }
}

void attention_weights_reference(const kv::LayerView& kv, const float* q, const Params& p, int h,
                                 double* w) {
  const int n = kv.n_tokens, D = kv.k.head_dim;
  const int rep = p.n_heads / kv.k.n_heads;
  std::vector<float> kr(D);
  for (int r = 0; r < rep; ++r) {
    double* s = w + static_cast<size_t>(r) * n;
    const double mx = head_scores(
        kv, q, p, h * rep + r, [](int) { return true; }, kr, s);
    double den = 0.0;
    for (int t = 0; t < n; ++t) den += (s[t] = std::exp(s[t] - mx));
    if (p.head_sinks) den += std::exp(static_cast<double>(p.head_sinks[h * rep + r]) - mx);
    for (int t = 0; t < n; ++t) s[t] /= den;
  }
}

}  // namespace kivi::attn
