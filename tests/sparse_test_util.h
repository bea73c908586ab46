// Helpers of the block-sparse attention tests: caches of any format (test_util.h lists
// them) filled at random, the keys and values as attention reads them, and attention in
// double over given ranges.
#pragma once

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "attn/attention.h"
#include "core/rng.h"
#include "kv/kv_cache.h"
#include "model/forward.h"
#include "sparse/select.h"
#include "test_util.h"

namespace kivi::sparse_test {

using test::all_formats;
using test::format_named;
using test::FormatCase;
using test::rel_error;

inline kv::CacheConfig config_for(const FormatCase& c, int Hkv, int D, int ctx, int G, int R,
                                  kv::KeyRope rope) {
  kv::CacheConfig cfg;
  cfg.n_layers = 1;
  cfg.n_kv_heads = Hkv;
  cfg.head_dim = D;
  cfg.ctx = ctx;
  cfg.k = c.k;
  cfg.rotate = c.rotate;
  cfg.v = c.v;
  cfg.group_size = G;
  cfg.residual = R;
  cfg.key_rope = rope;
  return cfg;
}

// n tokens of random keys (a few outlier channels, as real keys have) and values.
inline std::unique_ptr<kv::KvCache> filled_cache(const kv::CacheConfig& cfg, int n, uint64_t seed) {
  auto cache = std::make_unique<kv::KvCache>(cfg);
  const int HD = cfg.n_kv_heads * cfg.head_dim;
  Rng r(seed);
  std::vector<float> k(HD), v(HD);
  for (int t = 0; t < n; ++t) {
    for (int i = 0; i < HD; ++i) {
      k[i] = r.normal() * ((i % cfg.head_dim) % 13 == 1 ? 8.0f : 1.0f) + 0.5f;
      v[i] = r.normal();
    }
    if (t == 0) cache->calibrate(0, k.data(), v.data(), 1);
    cache->append(0, k.data(), v.data());
  }
  return cache;
}

inline std::vector<float> rope_table(int ctx, int D) {
  std::vector<float> t(static_cast<size_t>(ctx) * D);
  model::fill_rope_table(t.data(), ctx, D, 10000.0f);
  return t;
}

// Key t of head h as attention scores it, in double: dequantized and, for keys stored
// before RoPE, rotated by position t (adjacent pairs).
inline std::vector<double> true_key(const kv::LayerView& v, int t, int h, const float* rope) {
  const int D = v.k.head_dim;
  std::vector<float> row(D);
  if (t < v.k.n_stored) {
    attn::dequantize_key(v.k, t, h, row.data());
  } else {
    std::copy(v.k.residual_row(t, h), v.k.residual_row(t, h) + D, row.begin());
  }
  std::vector<double> k(row.begin(), row.end());
  if (rope) {
    for (int i = 0; i < D / 2; ++i) {
      const double c = rope[static_cast<size_t>(t) * D + 2 * i],
                   s = rope[static_cast<size_t>(t) * D + 2 * i + 1];
      const double a = row[2 * i], b = row[2 * i + 1];
      k[2 * i] = a * c - b * s;
      k[2 * i + 1] = a * s + b * c;
    }
  }
  return k;
}

inline std::vector<double> true_value(const kv::LayerView& v, int t, int h) {
  const int D = v.v.head_dim;
  std::vector<float> row(D);
  if (t < v.v.n_stored) {
    attn::dequantize_value(v.v, t, h, row.data());
  } else {
    std::copy(v.v.residual_row(t, h), v.v.residual_row(t, h) + D, row.begin());
  }
  return std::vector<double>(row.begin(), row.end());
}

// Attention in double over the given ranges of each KV head: the reference for sparse
// attention restricted to the tokens it selected.
inline std::vector<double> restricted_reference(
    const kv::LayerView& v, const std::vector<float>& q, int n_heads, float scale,
    const float* rope, const std::vector<std::vector<sparse::Range>>& ranges) {
  const int D = v.k.head_dim, Hkv = v.k.n_heads, rep = n_heads / Hkv;
  std::vector<double> out(static_cast<size_t>(n_heads) * D, 0.0);
  for (int h = 0; h < Hkv; ++h) {
    std::vector<int> toks;
    for (const auto& rg : ranges[h])
      for (int t = rg.t0; t < rg.t1; ++t) toks.push_back(t);
    std::vector<std::vector<double>> K, V;
    for (int t : toks) {
      K.push_back(true_key(v, t, h, rope));
      V.push_back(true_value(v, t, h));
    }
    for (int r = 0; r < rep; ++r) {
      const float* qr = q.data() + static_cast<size_t>(h * rep + r) * D;
      std::vector<double> s(toks.size());
      double m = -1e300;
      for (size_t i = 0; i < toks.size(); ++i) {
        double d = 0;
        for (int c = 0; c < D; ++c) d += qr[c] * K[i][c];
        s[i] = d * scale;
        m = std::max(m, s[i]);
      }
      double den = 0;
      double* o = out.data() + static_cast<size_t>(h * rep + r) * D;
      for (size_t i = 0; i < toks.size(); ++i) {
        const double p = std::exp(s[i] - m);
        den += p;
        for (int c = 0; c < D; ++c) o[c] += p * V[i][c];
      }
      for (int c = 0; c < D; ++c) o[c] /= den;
    }
  }
  return out;
}

inline attn::Params params(int n_heads, int D, const float* rope) {
  attn::Params p;
  p.n_heads = n_heads;
  p.scale = 1.0f / std::sqrt(static_cast<float>(D));
  p.rope = rope;
  return p;
}

}  // namespace kivi::sparse_test
