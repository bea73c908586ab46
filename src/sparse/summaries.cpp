#include "sparse/summaries.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "kv/codec.h"

namespace kivi::sparse {

namespace {

// x rounded to a float not below / not above it, then to f16 the same way.
f16_t f16_at_least(double x) {
  float f = static_cast<float>(x);
  if (static_cast<double>(f) < x) f = std::nextafter(f, std::numeric_limits<float>::infinity());
  return f32_to_f16_up(f);
}
f16_t f16_at_most(double x) {
  float f = static_cast<float>(x);
  if (static_cast<double>(f) > x) f = std::nextafter(f, -std::numeric_limits<float>::infinity());
  return f32_to_f16_down(f);
}

// Attention rotates a key pair (a, b) in float (a c - b s, a s + b c, possibly fused);
// each result is within a few float roundings of the exact rotation, at most this
// much times |a| + |b|. The summaries widen rotated keys by it.
constexpr double kRotationSlack = 0x1p-20;
// Dequantization in float (code * scale + zero, fused or not) is within a float rounding
// or two of the codec's value: bounds are widened by this much of the magnitudes that
// enter it, so that the f16 rounding never leaves them exactly on a float the kernels
// could exceed.
constexpr double kFloatSlack = 0x1p-21;

}  // namespace

void summarize_block(const kv::StreamView& K, int t0, int n, int h, SummaryKind kind,
                     const float* rope, attn::RopeStyle style, f16_t* out, float* row,
                     double* acc) {
  const int D = K.head_dim;
  double* mn = acc;
  double* mx = acc + D;
  double* sum = acc + 2 * D;
  std::fill(mn, mn + D, std::numeric_limits<double>::infinity());
  std::fill(mx, mx + D, -std::numeric_limits<double>::infinity());
  std::fill(sum, sum + D, 0.0);
  const bool from_params = kv::is_kivi(K.fmt.format) && K.per_channel && rope == nullptr &&
                           kind != SummaryKind::kMean && kind != SummaryKind::kFixed &&
                           t0 % K.group == 0 && n % K.group == 0;
  if (from_params) {
    // Each key group reconstructs to [zero, zero + L scale] per channel.
    const double L = (1 << kv::format_bits(K.fmt.format)) - 1;
    for (int g0 = t0; g0 < t0 + n; g0 += K.group) {
      const size_t gp = K.group_params(g0, h);
      for (int d = 0; d < D; ++d) {
        const double z = kv::load_param(K.zeros, gp + d, K.param_type);
        const double s = kv::load_param(K.scales, gp + d, K.param_type);
        const double slack = kFloatSlack * (std::fabs(z) + L * std::fabs(s));
        const double top = z + L * s;  // codes 0 and L: the two ends, whatever the sign of s
        mn[d] = std::min(mn[d], std::min(z, top) - slack);
        mx[d] = std::max(mx[d], std::max(z, top) + slack);
      }
    }
  } else {
    const int half = D / 2;
    // fix reads only its representatives: the keys at the fixed offsets.
    const bool fixed = kind == SummaryKind::kFixed;
    const int count = fixed ? fixed_count(n) : n;
    for (int j = 0; j < count; ++j) {
      const int t = t0 + (fixed ? fixed_offset(n, j) : j);
      attn::dequantize_key(K, t, h, row);
      if (rope) {
        for (int i = 0; i < half; ++i) {
          const int i0 = style == attn::RopeStyle::kAdjacent ? 2 * i : i;
          const int i1 = style == attn::RopeStyle::kAdjacent ? 2 * i + 1 : i + half;
          const double a = row[i0], b = row[i1];
          const double c = rope[static_cast<size_t>(t) * D + 2 * i],
                       s = rope[static_cast<size_t>(t) * D + 2 * i + 1];
          const double x0 = a * c - b * s, x1 = a * s + b * c;
          const double slack = (kRotationSlack + kFloatSlack) * (std::fabs(a) + std::fabs(b));
          mn[i0] = std::min(mn[i0], x0 - slack);
          mx[i0] = std::max(mx[i0], x0 + slack);
          mn[i1] = std::min(mn[i1], x1 - slack);
          mx[i1] = std::max(mx[i1], x1 + slack);
          sum[i0] += x0;
          sum[i1] += x1;
        }
      } else {
        for (int d = 0; d < D; ++d) {
          const double x = row[d], slack = kFloatSlack * std::fabs(x);
          mn[d] = std::min(mn[d], x - slack);
          mx[d] = std::max(mx[d], x + slack);
          sum[d] += x;
        }
      }
    }
  }
  switch (kind) {
    case SummaryKind::kMinMax:
      for (int d = 0; d < D; ++d) {
        out[d] = f16_at_most(mn[d]);
        out[D + d] = f16_at_least(mx[d]);
      }
      break;
    case SummaryKind::kMax:
      for (int d = 0; d < D; ++d) out[d] = f16_at_least(mx[d]);
      break;
    case SummaryKind::kMean:
      for (int d = 0; d < D; ++d) out[d] = f32_to_f16(static_cast<float>(sum[d] / n));
      break;
    case SummaryKind::kFixed:
      for (int d = 0; d < D; ++d) out[d] = f32_to_f16(static_cast<float>(sum[d] / fixed_count(n)));
      break;
    case SummaryKind::kNone:
      break;
  }
}

BlockSummaries::BlockSummaries(const kv::CacheConfig& c, int block, SummaryKind kind,
                               const std::vector<char>& layers)
    : kind_(kind), block_(block), vecs_(summary_vectors(kind)), D_(c.head_dim), H_(c.n_kv_heads) {
  if (block < 1) fail("block summaries: blocks of %d tokens", block);
  n_blocks_ = (c.ctx + block - 1) / block;
  layers_.resize(layers.size());
  if (vecs_ > 0) {
    for (size_t l = 0; l < layers.size(); ++l) {
      if (layers[l]) layers_[l].data.reset(static_cast<size_t>(H_) * head_stride());
    }
  }
  row_.resize(D_);
  acc_.resize(3 * static_cast<size_t>(D_));
}

uint64_t BlockSummaries::bytes_for(const kv::CacheConfig& c, int block, SummaryKind kind,
                                   int n_layers) {
  const uint64_t n_blocks = (static_cast<uint64_t>(c.ctx) + block - 1) / block;
  return static_cast<uint64_t>(n_layers) * c.n_kv_heads * n_blocks * summary_vectors(kind) *
         c.head_dim * sizeof(f16_t);
}

void BlockSummaries::update(int layer, const kv::LayerView& kv, const float* rope,
                            attn::RopeStyle style) {
  Layer& L = layers_[layer];
  if (L.data.size() == 0) return;
  const int stored = std::min(kv.k.n_stored, kv.n_tokens);
  while (L.done + block_ <= stored) {
    const size_t b = static_cast<size_t>(L.done / block_);
    for (int h = 0; h < H_; ++h) {
      summarize_block(kv.k, L.done, block_, h, kind_, rope, style,
                      L.data.data() + h * head_stride() + b * vecs_ * D_, row_.data(), acc_.data());
    }
    L.done += block_;
  }
}

void BlockSummaries::restore(int layer, int done, const uint8_t* data) {
  if (!has(layer)) fail("block summaries: layer %d keeps none", layer);
  if (done < 0 || done % block_ != 0 || done / block_ > n_blocks_)
    fail("block summaries: %d tokens of blocks of %d in %d blocks", done, block_, n_blocks_);
  Layer& L = layers_[layer];
  const size_t per_head = static_cast<size_t>(done / block_) * vecs_ * D_ * sizeof(f16_t);
  for (int h = 0; h < H_; ++h) {
    std::memcpy(L.data.data() + h * head_stride(), data + h * per_head, per_head);
  }
  L.done = done;
}

void BlockSummaries::clear() {
  for (auto& L : layers_) L.done = 0;
}

uint64_t BlockSummaries::bytes_reserved() const {
  uint64_t t = 0;
  for (const auto& L : layers_) t += L.data.bytes();
  return t;
}

uint64_t BlockSummaries::bytes_used() const {
  uint64_t t = 0;
  for (const auto& L : layers_) {
    if (L.data.size())
      t += static_cast<uint64_t>(L.done / block_) * H_ * vecs_ * D_ * sizeof(f16_t);
  }
  return t;
}

}  // namespace kivi::sparse
