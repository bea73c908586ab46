#include "kv/kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "kv/codec.h"
#include "ops/ops.h"

namespace kivi::kv {

static bool is_row_format(Format f) { return !is_kivi(f); }
static size_t row_elem_bytes(Format f) { return f == Format::kF32 ? 4 : f == Format::kF16 ? 2 : 1; }

KvCache::KvCache(const CacheConfig& config, bool block_summaries)
    : cfg_(config), summaries_(block_summaries) {
  cfg_.validate();
  block_ = cfg_.block();
  cgroup_ = cfg_.channel_group();
  n_blocks_ = (cfg_.ctx + block_ - 1) / block_;
  row_tmp_.reset(static_cast<size_t>(cfg_.head_dim));
  layers_.resize(cfg_.n_layers);
  owner_ = layer_owners(cfg_);
  for (int l = 0; l < cfg_.n_layers; ++l) {
    if (owner_[l] != l) continue;  // reads its owner's cache
    Layer& L = layers_[l];
    L.block_table.resize(n_blocks_);
    for (int b = 0; b < n_blocks_; ++b) L.block_table[b] = b;  // identity until blocks are shared
    init_stream(L.k, cfg_.k, Stream::kKey, n_blocks_);
    init_stream(L.v, cfg_.v, Stream::kValue, n_blocks_);
    if (summaries_)
      L.summaries.reset(static_cast<size_t>(n_blocks_) * cfg_.n_kv_heads * 2 * cfg_.head_dim);
  }
  clear();
}

void KvCache::init_stream(StreamStore& s, const StreamFormat& f, Stream which, int n_blocks) {
  const size_t H = cfg_.n_kv_heads, D = cfg_.head_dim, B = block_;
  const size_t ps = param_size(cfg_.param_type);
  s.fmt = f;
  s.head_block_params = 0;
  s.shared_params = 0;
  if (is_row_format(f.format)) {
    const size_t eb = row_elem_bytes(f.format);
    s.code_row_bytes = D * eb;
    s.token_stride = D * eb;
    if (f.format == Format::kInt8) {
      switch (f.granularity) {
        case Int8Granularity::kTensor:
          break;
        case Int8Granularity::kToken:
          s.shared_params = B;
          break;
        case Int8Granularity::kHead:
          s.head_block_params = B;
          break;
        case Int8Granularity::kGroup:
          s.head_block_params = B * (D / cgroup_);
          break;
      }
    }
    s.ring_cap = 0;
  } else {
    const int bits = format_bits(f.format);
    s.code_row_bytes = packed_row_bytes(static_cast<int>(D), bits);
    s.token_stride = s.code_row_bytes;
    s.head_block_params = which == Stream::kKey ? (B / cfg_.group_size) * D : B * (D / cgroup_);
    s.ring_cap = which == Stream::kKey ? key_ring_capacity(cfg_) : value_ring_capacity(cfg_);
  }
  s.head_block_bytes = B * s.code_row_bytes;
  s.codes.reset(s.head_block_bytes * n_blocks * H);
  const size_t np = s.head_block_params * n_blocks * H + s.shared_params * n_blocks;
  s.scales.reset(np * ps);
  if (is_kivi(f.format)) s.zeros.reset(np * ps);
  s.ring.reset(static_cast<size_t>(s.ring_cap) * H * D);
}

void KvCache::clear() {
  for (auto& L : layers_) {
    L.n = 0;
    for (int b = 0; b < static_cast<int>(L.block_table.size()); ++b) L.block_table[b] = b;
    for (StreamStore* s : {&L.k, &L.v}) {
      s->n_stored = 0;
      s->ring_shift = 0;
      s->tensor_scale = 0.0f;
      s->calibrated = false;
      s->clamped = 0;
    }
    if (summaries_) {
      const size_t D = cfg_.head_dim;
      for (size_t i = 0; i < L.summaries.size(); i += 2 * D) {
        std::fill(L.summaries.data() + i, L.summaries.data() + i + D,
                  std::numeric_limits<float>::infinity());
        std::fill(L.summaries.data() + i + D, L.summaries.data() + i + 2 * D,
                  -std::numeric_limits<float>::infinity());
      }
    }
  }
}

void KvCache::calibrate(int layer, const float* k, const float* v, int n) {
  if (borrows(layer))
    fail("KV cache: layer %d reads layer %d's cache and stores none", layer, owner_[layer]);
  Layer& L = layers_.at(layer);
  const size_t count = static_cast<size_t>(n) * cfg_.n_kv_heads * cfg_.head_dim;
  auto cal = [&](StreamStore& s, const float* x) {
    if (s.fmt.format != Format::kInt8 || s.fmt.granularity != Int8Granularity::kTensor ||
        s.calibrated)
      return;
    float m = 0.0f;
    for (size_t i = 0; i < count; ++i) m = std::max(m, std::fabs(x[i]));
    s.tensor_scale = int8_scale(m, cfg_.param_type);
    s.calibrated = true;
  };
  cal(L.k, k);
  cal(L.v, v);
}

void KvCache::store_rows(Layer& L, StreamStore& s, int pos, const float* x) {
  const int H = cfg_.n_kv_heads, D = cfg_.head_dim;
  const size_t pb = static_cast<size_t>(L.block_table[pos / block_]);
  const int slot = pos % block_;
  // Codes of head h for this token.
  auto dst = [&](int h) {
    return s.codes.data() + (static_cast<size_t>(h) * n_blocks_ + pb) * s.head_block_bytes +
           slot * s.token_stride;
  };
  switch (s.fmt.format) {
    case Format::kF32:
      for (int h = 0; h < H; ++h)
        std::memcpy(dst(h), x + static_cast<size_t>(h) * D, D * sizeof(float));
      break;
    case Format::kF16:
      for (int h = 0; h < H; ++h)
        ops::f32_to_f16_n(x + static_cast<size_t>(h) * D, reinterpret_cast<f16_t*>(dst(h)), D);
      break;
    case Format::kInt8: {
      const ParamType pt = cfg_.param_type;
      const size_t ps = param_size(pt);
      auto absmax = [](const float* p, int n) {
        float m = 0.0f;
        for (int i = 0; i < n; ++i) m = std::max(m, std::fabs(p[i]));
        return m;
      };
      if (s.fmt.granularity == Int8Granularity::kTensor && !s.calibrated) {
        // Decoding into an empty cache: the first token calibrates.
        s.tensor_scale = int8_scale(absmax(x, H * D), pt);
        s.calibrated = true;
      }
      float fixed = s.tensor_scale;
      if (s.fmt.granularity == Int8Granularity::kToken) {
        // One scale over every head of the token, stored once.
        fixed = int8_scale(absmax(x, H * D), pt);
        store_param(s.scales.data(), pb * block_ + slot, fixed, pt);
      }
      for (int h = 0; h < H; ++h) {
        int8_t* codes = reinterpret_cast<int8_t*>(dst(h));
        const float* xh = x + static_cast<size_t>(h) * D;
        const size_t base = (static_cast<size_t>(h) * n_blocks_ + pb) * s.head_block_params;
        switch (s.fmt.granularity) {
          case Int8Granularity::kTensor:
          case Int8Granularity::kToken:
            s.clamped += quantize_int8(xh, 1, 1, D, Int8Granularity::kTensor, cgroup_, pt, codes,
                                       nullptr, fixed);
            break;
          case Int8Granularity::kHead:
            quantize_int8(xh, 1, 1, D, Int8Granularity::kHead, cgroup_, pt, codes,
                          s.scales.data() + (base + slot) * ps);
            break;
          case Int8Granularity::kGroup:
            quantize_int8(
                xh, 1, 1, D, Int8Granularity::kGroup, cgroup_, pt, codes,
                s.scales.data() + (base + static_cast<size_t>(slot) * (D / cgroup_)) * ps);
            break;
        }
      }
      break;
    }
    default:
      break;
  }
  s.n_stored = pos + 1;
}

void KvCache::flush_keys(Layer& L, int first, int count) {
  StreamStore& s = L.k;
  const int H = cfg_.n_kv_heads, D = cfg_.head_dim, G = cfg_.group_size;
  const int bits = format_bits(s.fmt.format);
  const size_t ps = param_size(cfg_.param_type);
  for (int g0 = first; g0 < first + count; g0 += G) {
    const size_t pb = static_cast<size_t>(L.block_table[g0 / block_]);
    const int slot = g0 % block_;
    for (int h = 0; h < H; ++h) {
      const float* src =
          s.ring.data() + (static_cast<size_t>(h) * s.ring_cap + ring_slot(s, g0)) * D;
      const size_t hb = static_cast<size_t>(h) * n_blocks_ + pb;
      uint8_t* codes = s.codes.data() + hb * s.head_block_bytes + slot * s.token_stride;
      const size_t pi = hb * s.head_block_params + static_cast<size_t>(slot / G) * D;
      quantize_keys(src, 1, G, D, G, bits, cfg_.param_type, codes, s.scales.data() + pi * ps,
                    s.zeros.data() + pi * ps);
      if (summaries_) {
        float* sm = L.summaries.data() + ((pb * H + h) * 2) * D;
        for (int t = 0; t < G; ++t) {
          for (int d = 0; d < D; ++d) {
            sm[d] = std::min(sm[d], src[t * D + d]);
            sm[D + d] = std::max(sm[D + d], src[t * D + d]);
          }
        }
      }
    }
  }
  s.n_stored = first + count;
}

void KvCache::store_value(Layer& L, int pos, int h, const float* v) {
  StreamStore& s = L.v;
  const int D = cfg_.head_dim;
  const int bits = format_bits(s.fmt.format);
  const size_t ps = param_size(cfg_.param_type);
  const size_t hb =
      static_cast<size_t>(h) * n_blocks_ + static_cast<size_t>(L.block_table[pos / block_]);
  const int slot = pos % block_;
  const size_t pi = hb * s.head_block_params + static_cast<size_t>(slot) * (D / cgroup_);
  quantize_values(v, 1, 1, D, cgroup_, bits, cfg_.param_type, row_tmp_.data(),
                  s.scales.data() + pi * ps, s.zeros.data() + pi * ps);
  // Interleave into the token's quad: byte j goes to 4 j + slot % 4.
  uint8_t* quad = s.codes.data() + hb * s.head_block_bytes + slot / 4 * 4 * s.code_row_bytes;
  for (size_t j = 0; j < s.code_row_bytes; ++j) quad[4 * j + slot % 4] = row_tmp_[j];
}

void KvCache::flush_value(Layer& L, int pos) {
  StreamStore& s = L.v;
  const int H = cfg_.n_kv_heads, D = cfg_.head_dim;
  for (int h = 0; h < H; ++h) {
    store_value(L, pos, h,
                s.ring.data() + (static_cast<size_t>(h) * s.ring_cap + ring_slot(s, pos)) * D);
  }
  s.n_stored = pos + 1;
}

void KvCache::append(int layer, const float* k, const float* v) {
  if (borrows(layer))
    fail("KV cache: layer %d reads layer %d's cache and stores none", layer, owner_[layer]);
  Layer& L = layers_.at(layer);
  const int pos = L.n;
  if (pos >= cfg_.ctx)
    fail("KV cache is full: layer %d already holds %d tokens (--ctx %d)", layer, pos, cfg_.ctx);
  const int H = cfg_.n_kv_heads, D = cfg_.head_dim, G = cfg_.group_size, R = cfg_.residual;

  // Keys.
  if (is_kivi(L.k.fmt.format)) {
    StreamStore& s = L.k;
    for (int h = 0; h < H; ++h) {
      std::memcpy(s.ring.data() + (static_cast<size_t>(h) * s.ring_cap + ring_slot(s, pos)) * D,
                  k + static_cast<size_t>(h) * D, D * sizeof(float));
    }
    const int n_res = pos + 1 - s.n_stored;
    if (cfg_.key_flush == KeyFlush::kBatch) {
      const int r = std::max(R, G);
      if (n_res == r) flush_keys(L, s.n_stored, r);
    } else {
      const int t = std::max(R + 1, G);
      if (n_res == t) flush_keys(L, s.n_stored, G);
    }
  } else {
    store_rows(L, L.k, pos, k);
    if (summaries_) {
      const int32_t pb = L.block_table[pos / block_];
      for (int h = 0; h < H; ++h) {
        float* sm = L.summaries.data() + ((static_cast<size_t>(pb) * H + h) * 2) * D;
        const float* kh = k + static_cast<size_t>(h) * D;
        for (int d = 0; d < D; ++d) {
          sm[d] = std::min(sm[d], kh[d]);
          sm[D + d] = std::max(sm[D + d], kh[d]);
        }
      }
    }
  }

  // Values.
  if (is_kivi(L.v.fmt.format)) {
    StreamStore& s = L.v;
    if (R == 0) {
      // No residual: quantize the new value directly.
      for (int h = 0; h < H; ++h) store_value(L, pos, h, v + static_cast<size_t>(h) * D);
      s.n_stored = pos + 1;
    } else {
      if (pos - s.n_stored == R) flush_value(L, s.n_stored);  // ring full: oldest goes first
      for (int h = 0; h < H; ++h) {
        std::memcpy(s.ring.data() + (static_cast<size_t>(h) * s.ring_cap + ring_slot(s, pos)) * D,
                    v + static_cast<size_t>(h) * D, D * sizeof(float));
      }
    }
  } else {
    store_rows(L, L.v, pos, v);
  }
  L.n = pos + 1;
}

StreamView KvCache::stream_view(const Layer& L, const StreamStore& s, Stream which) const {
  StreamView v;
  v.fmt = s.fmt;
  v.param_type = cfg_.param_type;
  v.n_heads = cfg_.n_kv_heads;
  v.head_dim = cfg_.head_dim;
  v.block = block_;
  v.per_channel = is_kivi(s.fmt.format) && which == Stream::kKey;
  v.group = v.per_channel ? cfg_.group_size : cgroup_;
  v.n_stored = is_kivi(s.fmt.format) ? s.n_stored : L.n;
  v.codes = s.codes.data();
  v.scales = s.scales.data();
  v.zeros = s.zeros.data();
  v.block_table = L.block_table.data();
  v.n_blocks = n_blocks_;
  v.head_block_bytes = s.head_block_bytes;
  v.head_block_params = s.head_block_params;
  v.code_row_bytes = s.code_row_bytes;
  v.token_stride = s.token_stride;
  v.quad = is_kivi(s.fmt.format) && which == Stream::kValue;
  v.tensor_scale = s.tensor_scale;
  v.ring = s.ring.data();
  v.ring_capacity = s.ring_cap;
  v.ring_shift = s.ring_shift;
  return v;
}

LayerView KvCache::view(int layer) const {
  const Layer& L = layers_.at(owner_.at(layer));
  LayerView v;
  v.k = stream_view(L, L.k, Stream::kKey);
  v.v = stream_view(L, L.v, Stream::kValue);
  v.n_tokens = L.n;
  v.summaries = summaries_ ? L.summaries.data() : nullptr;
  return v;
}

int KvCache::droppable(int layer) const {
  const Layer& L = layers_.at(owner_.at(layer));
  const int stored = std::min(is_kivi(L.k.fmt.format) ? L.k.n_stored : L.n,
                              is_kivi(L.v.fmt.format) ? L.v.n_stored : L.n);
  return stored / block_ * block_;
}

void KvCache::rotate_keys(int layer, int first, int last, const float* rope_row, bool neox) {
  if (borrows(layer)) return;
  Layer& L = layers_.at(layer);
  StreamStore& s = L.k;
  if (s.fmt.format != Format::kF32 && s.fmt.format != Format::kF16) {
    fail(
        "KV cache: %s keys cannot be rotated in place (they would be rounded twice); store keys "
        "before RoPE",
        format_name(s.fmt.format));
  }
  const int H = cfg_.n_kv_heads, D = cfg_.head_dim;
  std::vector<float> x(D);
  for (int t = first; t < last; ++t) {
    const size_t pb = static_cast<size_t>(L.block_table[t / block_]);
    for (int h = 0; h < H; ++h) {
      uint8_t* row = s.codes.data() +
                     (static_cast<size_t>(h) * n_blocks_ + pb) * s.head_block_bytes +
                     static_cast<size_t>(t % block_) * s.token_stride;
      if (s.fmt.format == Format::kF32) {
        std::memcpy(x.data(), row, D * sizeof(float));
      } else {
        ops::f16_to_f32_n(reinterpret_cast<const f16_t*>(row), x.data(), D);
      }
      for (int i = 0; i < D / 2; ++i) {  // the pairs the model rotates
        const int i0 = neox ? i : 2 * i, i1 = neox ? i + D / 2 : 2 * i + 1;
        const float c = rope_row[2 * i], sn = rope_row[2 * i + 1], a = x[i0], b = x[i1];
        x[i0] = a * c - b * sn;
        x[i1] = a * sn + b * c;
      }
      if (s.fmt.format == Format::kF32) {
        std::memcpy(row, x.data(), D * sizeof(float));
      } else {
        ops::f32_to_f16_n(x.data(), reinterpret_cast<f16_t*>(row), D);
      }
    }
  }
}

void KvCache::drop(int layer, int first, int count) {
  if (borrows(layer))
    fail("KV cache: layer %d reads layer %d's cache and stores none", layer, owner_[layer]);
  Layer& L = layers_.at(layer);
  if (count == 0) return;
  if (first < 0 || count < 0 || first % block_ != 0 || count % block_ != 0 ||
      first + count > droppable(layer)) {
    fail(
        "KV cache: cannot drop tokens [%d, %d) of layer %d: whole blocks of %d tokens among the %d "
        "stored ones",
        first, first + count, layer, block_, droppable(layer));
  }
  // The dropped blocks move to the end of the table, where the next tokens will go.
  const int b0 = first / block_, nb = count / block_;
  std::rotate(L.block_table.begin() + b0, L.block_table.begin() + b0 + nb, L.block_table.end());
  if (summaries_) {
    const size_t D = cfg_.head_dim, per_block = static_cast<size_t>(cfg_.n_kv_heads) * 2 * D;
    for (int b = n_blocks_ - nb; b < n_blocks_; ++b) {
      float* sm = L.summaries.data() + static_cast<size_t>(L.block_table[b]) * per_block;
      for (size_t i = 0; i < per_block; i += 2 * D) {
        std::fill(sm + i, sm + i + D, std::numeric_limits<float>::infinity());
        std::fill(sm + i + D, sm + i + 2 * D, -std::numeric_limits<float>::infinity());
      }
    }
  }
  L.n -= count;
  for (StreamStore* s : {&L.k, &L.v}) {
    if (is_kivi(s->fmt.format)) s->n_stored -= count;
    if (s->ring_cap > 0) s->ring_shift = (s->ring_shift + count) % s->ring_cap;
  }
}

LayerView KvCache::view_prefix(int layer, int n) const {
  LayerView v = view(layer);
  if (n > v.n_tokens || n < 0)
    fail("KV cache: a view of %d tokens of layer %d, which holds %d", n, layer, v.n_tokens);
  if (cfg_.has_residual() && n < v.n_tokens)
    fail("KV cache: earlier views of KIVI caches are not kept");
  v.n_tokens = v.k.n_stored = v.v.n_stored = n;
  return v;
}

uint64_t KvCache::stream_bytes_used(const StreamStore& s, Stream which, int n) const {
  const uint64_t H = cfg_.n_kv_heads, D = cfg_.head_dim, ps = param_size(cfg_.param_type);
  const uint64_t stored = is_kivi(s.fmt.format) ? s.n_stored : static_cast<uint64_t>(n);
  // Codes and parameters of stored tokens: the per-block sizes of the buffers scaled
  // to the filled part of the blocks.
  uint64_t bytes = stored * H * s.head_block_bytes / block_;
  uint64_t params = 0;
  if (s.head_block_params) {
    if (is_kivi(s.fmt.format) && which == Stream::kKey) {
      params = H * (stored / cfg_.group_size) * (s.head_block_params / (block_ / cfg_.group_size));
    } else {
      params = H * stored * s.head_block_params / block_;
    }
  }
  params += stored * s.shared_params / block_;
  bytes += params * ps * (s.zeros.size() ? 2 : 1);
  bytes += (static_cast<uint64_t>(n) - stored) * H * D * sizeof(float);  // residual rows held
  if (s.calibrated) bytes += sizeof(float);
  return bytes;
}

uint64_t KvCache::bytes_used(int layer) const {
  if (borrows(layer)) return 0;
  const Layer& L = layers_.at(layer);
  return stream_bytes_used(L.k, Stream::kKey, L.n) + stream_bytes_used(L.v, Stream::kValue, L.n);
}

uint64_t KvCache::bytes_used() const {
  uint64_t t = 0;
  for (int l = 0; l < cfg_.n_layers; ++l) t += bytes_used(l);
  return t;
}

uint64_t KvCache::bytes_reserved(int layer) const {
  if (borrows(layer)) return 0;
  const Layer& L = layers_.at(layer);
  uint64_t t = L.block_table.size() * sizeof(int32_t) + L.summaries.bytes();
  for (const StreamStore* s : {&L.k, &L.v}) {
    t += s->codes.bytes() + s->scales.bytes() + s->zeros.bytes() + s->ring.bytes();
    if (s->fmt.format == Format::kInt8 && s->fmt.granularity == Int8Granularity::kTensor)
      t += sizeof(float);
  }
  return t;
}

uint64_t KvCache::bytes_reserved() const {
  uint64_t t = 0;
  for (int l = 0; l < cfg_.n_layers; ++l) t += bytes_reserved(l);
  return t;
}

int64_t KvCache::clamped() const {
  int64_t c = 0;
  for (const auto& L : layers_) c += L.k.clamped + L.v.clamped;
  return c;
}

KvCache::RawStream KvCache::raw(int layer, Stream s) const {
  const Layer& L = layers_.at(owner_.at(layer));
  const StreamStore& st = s == Stream::kKey ? L.k : L.v;
  return {&st.codes, &st.scales, &st.zeros, &st.ring, st.n_stored, st.tensor_scale};
}

}  // namespace kivi::kv
