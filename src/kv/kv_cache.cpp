#include "kv/kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "kv/codec.h"
#include "kv/tq.h"
#include "ops/ops.h"

namespace kivi::kv {

KvCache::KvCache(const CacheConfig& config) : cfg_(config) {
  cfg_.validate();
  const int n_blocks = (cfg_.ctx + cfg_.block() - 1) / cfg_.block();
  own_pool_ = std::make_unique<BlockPool>(cfg_, n_blocks);
  pool_ = own_pool_.get();
  init(true);
}

KvCache::KvCache(BlockPool& pool, int ctx) : cfg_(pool.config()), pool_(&pool) {
  cfg_.ctx = ctx;
  cfg_.validate();
  if (cfg_.has_window()) {
    fail(
        "KV cache: sliding-window layers keep blocks of their own; a shared block pool (kivi "
        "serve, bench-serve) does not hold them");
  }
  init(false);
}

KvCache::~KvCache() {
  if (shares_pool()) clear();
}

void KvCache::init(bool own) {
  block_ = cfg_.block();
  cgroup_ = cfg_.channel_group();
  n_blocks_ = pool_->n_blocks();
  n_logical_ = (cfg_.ctx + block_ - 1) / block_;
  row_tmp_.reset(static_cast<size_t>(cfg_.head_dim));
  tq_tmp_.reset(static_cast<size_t>(cfg_.head_dim));
  rot_tmp_.reset(static_cast<size_t>(cfg_.n_kv_heads) * cfg_.head_dim);
  readonly_.assign(n_logical_, 0);
  layers_.resize(cfg_.n_layers);
  owner_ = layer_owners(cfg_);
  for (int l = 0; l < cfg_.n_layers; ++l) {
    if (owner_[l] != l) continue;  // reads its owner's cache
    last_stored_ = l;
    Layer& L = layers_[l];
    L.n_blocks = pool_->layer_blocks(l);
    L.window = cfg_.window(l);
    L.block_table.assign(L.window > 0 ? L.n_blocks : n_logical_, -1);
    init_stream(L.k, pool_->layer(l).k, true);
    init_stream(L.v, pool_->layer(l).v, false);
    if (L.k.rotated || L.v.rotated) {
      L.rot.reserve(cfg_.n_kv_heads);
      for (int h = 0; h < cfg_.n_kv_heads; ++h)
        L.rot.emplace_back(cfg_.head_dim, rotation_seed(cfg_.rotation_seed, l, h));
    }
  }
  // An own pool holds exactly the context's blocks: map them all, in order, for good.
  if (own) {
    for (int b = 0; b < n_logical_; ++b) map_block(b, pool_->allocate(false), false);
  }
  clear();
}

void KvCache::init_stream(StreamStore& s, BlockPool::StreamStorage& storage, bool key) {
  s.lay = storage.layout;
  s.codes = storage.codes.data();
  s.scales = storage.scales.data();
  s.zeros = storage.zeros.size() ? storage.zeros.data() : nullptr;
  s.code_stride = storage.code_head_stride;
  s.param_stride = storage.param_head_stride;
  s.ring.reset(static_cast<size_t>(s.lay.ring_cap) * cfg_.n_kv_heads * cfg_.head_dim);
  s.tq = tq_codec(s.lay.fmt.format, cfg_.head_dim);
  s.rotated = is_rotated(s.lay.fmt.format, key, cfg_.rotate);
}

void KvCache::map_block(int logical, int32_t physical, bool ro) {
  for (int l = 0; l < cfg_.n_layers; ++l) {
    if (owner_[l] == l && logical < static_cast<int>(layers_[l].block_table.size()))
      layers_[l].block_table[logical] = physical;
  }
  readonly_[logical] = ro ? 1 : 0;
  mapped_ = std::max(mapped_, logical + 1);
}

void KvCache::clear() {
  if (shares_pool()) {
    for (int b = mapped_ - 1; b >= 0; --b) {
      pool_->release(layers_[0].block_table[b]);
      for (int l = 0; l < cfg_.n_layers; ++l) {
        if (owner_[l] == l) layers_[l].block_table[b] = -1;
      }
      readonly_[b] = 0;
    }
    mapped_ = 0;
    pool_->unreserve(reservation_);
    reservation_ = 0;
    published_ = 0;
  }
  for (auto& L : layers_) {
    L.n = 0;
    L.evicted = 0;
    for (int b = 0; b < static_cast<int>(L.block_table.size()); ++b) L.block_table[b] = b;
    for (StreamStore* s : {&L.k, &L.v}) {
      s->n_stored = 0;
      s->ring_shift = 0;
      s->ring_floor = 0;
      s->tensor_scale = 0.0f;
      s->calibrated = false;
      s->clamped = 0;
    }
  }
}

int KvCache::share_prefix(const int* tokens, int n) {
  if (!shares_pool() || !pool_->prefix_sharing()) return 0;
  if (layers_[0].n != 0 || mapped_ != 0) fail("share_prefix: the cache is not empty");
  int32_t parent = -1;
  int b = 0;
  for (; (b + 1) * block_ <= std::min(n, cfg_.ctx); ++b) {
    const int32_t blk = pool_->find(parent, tokens + static_cast<size_t>(b) * block_);
    if (blk < 0) break;
    pool_->retain(blk);
    map_block(b, blk, true);
    parent = blk;
  }
  published_ = b;
  return b;
}

bool KvCache::resumes_at_blocks() const {
  return !cfg_.has_residual() || (cfg_.residual == 0 && block_ % cfg_.group_size == 0);
}

void KvCache::assume_shared(int n) {
  if (n == 0) return;
  if (!resumes_at_blocks())
    fail("assume_shared: a cache with a residual window holds more than its blocks");
  if (layers_[first_stored_].n != 0) fail("assume_shared: the cache is not empty");
  if (n < 0 || n % block_ != 0 || n > published_ * block_) {
    fail("assume_shared: %d tokens are not whole shared blocks (%d of %d tokens mapped)", n,
         published_, block_);
  }
  for (int l = 0; l < cfg_.n_layers; ++l) {
    if (owner_[l] != l) continue;
    Layer& L = layers_[l];
    L.n = n;
    L.k.n_stored = L.v.n_stored = n;
  }
}

void KvCache::release_reservation() {
  if (!shares_pool()) return;
  pool_->unreserve(reservation_);
  reservation_ = 0;
}

bool KvCache::can_truncate(int n) const {
  const Layer& L0 = layers_[first_stored_];
  if (cfg_.has_window() || n < 1 || n > L0.n || L0.evicted != 0) return false;
  for (int l = 0; l < cfg_.n_layers; ++l) {  // every layer's streams (formats may differ)
    if (owner_[l] != l) continue;
    const Layer& L = layers_[l];
    const CacheConfig c = cfg_.at_layer(l);
    const int stored[2] = {keys_quantized_after(c, n), values_quantized_after(c, n)};
    const StreamStore* streams[2] = {&L.k, &L.v};
    for (int i = 0; i < 2; ++i) {
      const StreamStore& s = *streams[i];
      // Tokens [stored, min(n_stored, n)) go back to the ring: their rows are there if no
      // later token took their slots.
      if (!uses_ring(s.lay.fmt.format) || stored[i] >= std::min(s.n_stored, n)) continue;
      if (stored[i] < std::max(L.n - s.lay.ring_cap, s.ring_floor)) return false;
    }
  }
  return true;
}

bool KvCache::truncate(int n) {
  if (!can_truncate(n)) {
    fail("truncate(%d): the cache (%d tokens) cannot be cut back there", n,
         layers_[first_stored_].n);
  }
  // Tokens each layer keeps quantized (formats may differ by layer).
  std::vector<std::pair<int, int>> stored(cfg_.n_layers, {n, n});
  int least = n;
  for (int l = 0; l < cfg_.n_layers; ++l) {
    if (owner_[l] != l) continue;
    const CacheConfig c = cfg_.at_layer(l);
    stored[l] = {keys_quantized_after(c, n), values_quantized_after(c, n)};
    least = std::min({least, stored[l].first, stored[l].second});
  }
  const int keep = (n + block_ - 1) / block_;  // logical blocks [0, keep) stay
  // Blocks from `first_write` on are written again (new tokens, or re-quantized rows):
  // they must be this cache's own and unpublished.
  const int first_write = least / block_;
  int copies = 0;
  for (int b = first_write; b < keep; ++b) copies += readonly_[b] || b < published_;
  if (copies > pool_->available_blocks() + reservation_) return false;
  for (int b = first_write; b < keep; ++b) {
    if (!readonly_[b] && b >= published_) continue;
    const int32_t old = layers_[0].block_table[b];
    const bool from_reservation = reservation_ > 0;
    const int32_t fresh = pool_->allocate(from_reservation);
    if (from_reservation) --reservation_;
    pool_->copy_block(old, fresh);
    pool_->release(old);
    map_block(b, fresh, false);
  }
  // An own pool keeps every block mapped; a shared one takes back those past the cut.
  for (int b = mapped_ - 1; b >= keep && shares_pool(); --b) {
    pool_->release(layers_[0].block_table[b]);
    for (int l = 0; l < cfg_.n_layers; ++l) {
      if (owner_[l] == l) layers_[l].block_table[b] = -1;
    }
    readonly_[b] = 0;
  }
  if (shares_pool()) mapped_ = std::min(mapped_, keep);
  published_ = std::min(published_, first_write);
  for (int l = 0; l < cfg_.n_layers; ++l) {
    if (owner_[l] != l) continue;
    Layer& L = layers_[l];
    L.n = n;
    L.k.n_stored = std::min(L.k.n_stored, stored[l].first);
    L.v.n_stored = std::min(L.v.n_stored, stored[l].second);
  }
  return true;
}

bool KvCache::reserve(int n_tokens) {
  if (!shares_pool()) return n_tokens <= cfg_.ctx;
  if (n_tokens > cfg_.ctx) return false;
  const int need = (n_tokens + block_ - 1) / block_ - mapped_ - reservation_;
  if (need <= 0) return true;
  if (!pool_->try_reserve(need)) return false;
  reservation_ += need;
  return true;
}

void KvCache::map_blocks(int n_tokens) {
  if (n_tokens > cfg_.ctx) {
    fail("KV cache is full: %d tokens requested, the context holds %d", n_tokens, cfg_.ctx);
  }
  while (mapped_ * block_ < n_tokens) {
    const bool from_reservation = reservation_ > 0;
    const int32_t b = pool_->allocate(from_reservation);
    if (from_reservation) --reservation_;
    map_block(mapped_, b, false);
  }
}

void KvCache::publish(const int* tokens) {
  if (!shares_pool() || !pool_->prefix_sharing()) return;
  const Layer& last = layers_[last_stored_];
  const int stored = std::min({last.n, last.k.n_stored, last.v.n_stored});
  const int complete = stored / block_;
  for (int b = published_; b < complete; ++b) {
    if (readonly_[b]) continue;
    const int32_t own = layers_[0].block_table[b];
    const int32_t parent = b > 0 ? layers_[0].block_table[b - 1] : -1;
    const int32_t got = pool_->publish(parent, tokens + static_cast<size_t>(b) * block_, own);
    if (got != own) {
      // The same prefix is stored already: use that block and give this one back.
      pool_->retain(got);
      pool_->release(own);
      map_block(b, got, true);
    }
  }
  published_ = std::max(published_, complete);
}

int KvCache::blocks_shared() const {
  int n = 0;
  for (int b = 0; b < mapped_; ++b) n += pool_->refcount(layers_[0].block_table[b]) > 1;
  return n;
}

void KvCache::pass(int layer, int pos) {
  if (borrows(layer)) return;
  Layer& L = layers_.at(layer);
  if (pos < L.n) fail("KV cache: pass(%d) in layer %d, which holds %d tokens", pos, layer, L.n);
  const int G = cfg_.group_size, R = cfg_.residual;
  // The flushes append() makes, on the tokens held here only (groups of G never straddle
  // the end of a shard: shards are whole blocks).
  if (is_kivi(L.k.lay.fmt.format)) {
    StreamStore& s = L.k;
    const int n_res = pos + 1 - s.n_stored, held = L.n - s.n_stored;
    if (held > 0) {
      if (cfg_.key_flush == KeyFlush::kBatch) {
        if (n_res == std::max(R, G)) flush_keys(L, s.n_stored, held);
      } else if (n_res == std::max(R + 1, G)) {
        flush_keys(L, s.n_stored, std::min(G, held));
      }
    }
  }
  if (is_kivi(L.v.lay.fmt.format) && R > 0) {
    StreamStore& s = L.v;
    if (pos - s.n_stored == R && s.n_stored < L.n) flush_value(L, s.n_stored);
  }
  for (StreamStore* s : {&L.k, &L.v}) {
    if (s->tq && R > 0 && pos - s->n_stored == R && s->n_stored < L.n) flush_tq(L, *s, s->n_stored);
  }
}

void KvCache::calibrate(int layer, const float* k, const float* v, int n) {
  if (borrows(layer))
    fail("KV cache: layer %d reads layer %d's cache and stores none", layer, owner_[layer]);
  Layer& L = layers_.at(layer);
  const size_t count = static_cast<size_t>(n) * cfg_.n_kv_heads * cfg_.head_dim;
  auto cal = [&](StreamStore& s, const float* x) {
    if (s.lay.fmt.format != Format::kInt8 || s.lay.fmt.granularity != Int8Granularity::kTensor ||
        s.calibrated)
      return;
    float m = 0.0f;
    if (s.rotated) {  // the rows as they are quantized: rotated
      const int H = cfg_.n_kv_heads, D = cfg_.head_dim;
      for (size_t r = 0; r < count / D; ++r) {
        std::memcpy(tq_tmp_.data(), x + r * D, D * sizeof(float));
        L.rot[r % H].forward(tq_tmp_.data());
        for (int i = 0; i < D; ++i) m = std::max(m, std::fabs(tq_tmp_[i]));
      }
    } else {
      for (size_t i = 0; i < count; ++i) m = std::max(m, std::fabs(x[i]));
    }
    if (absmax_reduce_) m = absmax_reduce_(m);
    s.tensor_scale = int8_scale(m, cfg_.param_type);
    s.calibrated = true;
  };
  cal(L.k, k);
  cal(L.v, v);
}

void KvCache::store_rows(Layer& L, StreamStore& s, int pos, const float* x) {
  const int H = cfg_.n_kv_heads, D = cfg_.head_dim;
  s.n_stored = pos + 1;
  if (readonly(pos)) return;  // a published block: it holds these very codes already
  const size_t pb = static_cast<size_t>(L.block_table[pos / block_]);
  const int slot = pos % block_;
  // Codes of head h for this token.
  auto dst = [&](int h) { return s.head_codes(h, pb) + slot * s.lay.token_stride; };
  switch (s.lay.fmt.format) {
    case Format::kF32:
      for (int h = 0; h < H; ++h)
        std::memcpy(dst(h), x + static_cast<size_t>(h) * D, D * sizeof(float));
      break;
    case Format::kF16:
      for (int h = 0; h < H; ++h)
        ops::f32_to_f16_n(x + static_cast<size_t>(h) * D, reinterpret_cast<f16_t*>(dst(h)), D);
      break;
    case Format::kInt8: {
      if (s.rotated) {  // every head's row rotated first
        for (int h = 0; h < H; ++h) {
          float* r = rot_tmp_.data() + static_cast<size_t>(h) * D;
          std::memcpy(r, x + static_cast<size_t>(h) * D, D * sizeof(float));
          L.rot[h].forward(r);
        }
        x = rot_tmp_.data();
      }
      const ParamType pt = cfg_.param_type;
      const size_t ps = param_size(pt);
      // Over every head of the model (set_absmax_reduce) when the scale spans them.
      auto absmax = [this](const float* p, int n) {
        float m = 0.0f;
        for (int i = 0; i < n; ++i) m = std::max(m, std::fabs(p[i]));
        return absmax_reduce_ ? absmax_reduce_(m) : m;
      };
      if (s.lay.fmt.granularity == Int8Granularity::kTensor && !s.calibrated) {
        // Decoding into an empty cache: the first token calibrates.
        s.tensor_scale = int8_scale(absmax(x, H * D), pt);
        s.calibrated = true;
      }
      float fixed = s.tensor_scale;
      if (s.lay.fmt.granularity == Int8Granularity::kToken) {
        // One scale over every head of the token, stored once.
        fixed = int8_scale(absmax(x, H * D), pt);
        store_param(s.scales, pb * block_ + slot, fixed, pt);
      }
      for (int h = 0; h < H; ++h) {
        int8_t* codes = reinterpret_cast<int8_t*>(dst(h));
        const float* xh = x + static_cast<size_t>(h) * D;
        const size_t base = s.param_index(h, pb);
        switch (s.lay.fmt.granularity) {
          case Int8Granularity::kTensor:
          case Int8Granularity::kToken:
            s.clamped += quantize_int8(xh, 1, 1, D, Int8Granularity::kTensor, cgroup_, pt, codes,
                                       nullptr, fixed);
            break;
          case Int8Granularity::kHead:
            quantize_int8(xh, 1, 1, D, Int8Granularity::kHead, cgroup_, pt, codes,
                          s.scales + (base + slot) * ps);
            break;
          case Int8Granularity::kGroup:
            quantize_int8(xh, 1, 1, D, Int8Granularity::kGroup, cgroup_, pt, codes,
                          s.scales + (base + static_cast<size_t>(slot) * (D / cgroup_)) * ps);
            break;
        }
      }
      break;
    }
    default:
      break;
  }
}

void KvCache::flush_keys(Layer& L, int first, int count) {
  StreamStore& s = L.k;
  const int H = cfg_.n_kv_heads, D = cfg_.head_dim, G = cfg_.group_size;
  const int bits = format_bits(s.lay.fmt.format);
  const size_t ps = param_size(cfg_.param_type);
  for (int g0 = first; g0 < first + count; g0 += G) {
    if (readonly(g0)) continue;
    const size_t pb = static_cast<size_t>(L.block_table[g0 / block_]);
    const int slot = g0 % block_;
    for (int h = 0; h < H; ++h) {
      const float* src = ring_row(s, h, g0);
      uint8_t* codes = s.head_codes(h, pb) + slot * s.lay.token_stride;
      const size_t pi = s.param_index(h, pb) + static_cast<size_t>(slot / G) * D;
      quantize_keys(src, 1, G, D, G, bits, cfg_.param_type, codes, s.scales + pi * ps,
                    s.zeros + pi * ps);
    }
  }
  s.n_stored = first + count;
}

void KvCache::store_value(Layer& L, int pos, int h, const float* v) {
  StreamStore& s = L.v;
  const int D = cfg_.head_dim;
  if (readonly(pos)) return;
  const int bits = format_bits(s.lay.fmt.format);
  const size_t ps = param_size(cfg_.param_type);
  const size_t pb = static_cast<size_t>(L.block_table[pos / block_]);
  const int slot = pos % block_;
  const size_t pi = s.param_index(h, pb) + static_cast<size_t>(slot) * (D / cgroup_);
  if (s.rotated) {  // the row rotated first
    std::memcpy(tq_tmp_.data(), v, D * sizeof(float));
    L.rot[h].forward(tq_tmp_.data());
    v = tq_tmp_.data();
  }
  quantize_values(v, 1, 1, D, cgroup_, bits, cfg_.param_type, row_tmp_.data(), s.scales + pi * ps,
                  s.zeros + pi * ps);
  // Interleave into the token's quad: byte j goes to 4 j + slot % 4.
  uint8_t* quad = s.head_codes(h, pb) + slot / 4 * 4 * s.lay.code_row_bytes;
  for (size_t j = 0; j < s.lay.code_row_bytes; ++j) quad[4 * j + slot % 4] = row_tmp_[j];
}

void KvCache::to_ring(StreamStore& s, int pos, const float* x) {
  const int D = cfg_.head_dim;
  for (int h = 0; h < cfg_.n_kv_heads; ++h)
    std::memcpy(ring_row(s, h, pos), x + static_cast<size_t>(h) * D, D * sizeof(float));
}

void KvCache::store_tq(Layer& L, StreamStore& s, int pos, const float* x, size_t head_stride) {
  const int H = cfg_.n_kv_heads;
  s.n_stored = pos + 1;
  if (readonly(pos)) return;  // a published block: it holds these very codes already
  const size_t pb = static_cast<size_t>(L.block_table[pos / block_]);
  const int slot = pos % block_;
  for (int h = 0; h < H; ++h) {
    const float sc = s.tq->encode(x + h * head_stride, L.rot[h],
                                  s.head_codes(h, pb) + slot * s.lay.token_stride, tq_tmp_.data());
    store_param(s.scales, s.param_index(h, pb) + slot, sc, cfg_.param_type);
  }
}

void KvCache::flush_tq(Layer& L, StreamStore& s, int pos) {
  // The heads' ring rows of one token are ring_cap rows apart: coded in place.
  store_tq(L, s, pos, ring_row(s, 0, pos), static_cast<size_t>(s.lay.ring_cap) * cfg_.head_dim);
}

void KvCache::append_tq(Layer& L, StreamStore& s, int pos, const float* x) {
  const int R = cfg_.residual;
  if (R == 0) return store_tq(L, s, pos, x, static_cast<size_t>(cfg_.head_dim));
  if (pos - s.n_stored == R) flush_tq(L, s, s.n_stored);  // ring full: oldest goes first
  to_ring(s, pos, x);
}

void KvCache::flush_value(Layer& L, int pos) {
  StreamStore& s = L.v;
  for (int h = 0; h < cfg_.n_kv_heads; ++h) store_value(L, pos, h, ring_row(s, h, pos));
  s.n_stored = pos + 1;
}

void KvCache::append(int layer, const float* k, const float* v) {
  if (borrows(layer))
    fail("KV cache: layer %d reads layer %d's cache and stores none", layer, owner_[layer]);
  Layer& L = layers_.at(layer);
  const int pos = L.n;
  if (pos + L.evicted >= cfg_.ctx) {
    fail("KV cache is full: layer %d already holds %d tokens (--ctx %d)", layer, pos + L.evicted,
         cfg_.ctx);
  }
  if (pos >= static_cast<int>(L.block_table.size()) * block_) {
    fail("KV cache: layer %d holds %d tokens, all its %d blocks (window %d)", layer, pos,
         static_cast<int>(L.block_table.size()), L.window);
  }
  const int H = cfg_.n_kv_heads, D = cfg_.head_dim, G = cfg_.group_size, R = cfg_.residual;
  if (pos >= mapped_ * block_) map_blocks(pos + 1);

  // Keys.
  if (is_kivi(L.k.lay.fmt.format)) {
    StreamStore& s = L.k;
    to_ring(s, pos, k);
    const int n_res = pos + 1 - s.n_stored;
    if (cfg_.key_flush == KeyFlush::kBatch) {
      const int r = std::max(R, G);
      if (n_res == r) flush_keys(L, s.n_stored, r);
    } else {
      const int t = std::max(R + 1, G);
      if (n_res == t) flush_keys(L, s.n_stored, G);
    }
  } else if (L.k.tq) {
    append_tq(L, L.k, pos, k);
  } else {
    store_rows(L, L.k, pos, k);
  }

  // Values.
  if (is_kivi(L.v.lay.fmt.format)) {
    StreamStore& s = L.v;
    if (R == 0) {
      // No residual: quantize the new value directly.
      for (int h = 0; h < H; ++h) store_value(L, pos, h, v + static_cast<size_t>(h) * D);
      s.n_stored = pos + 1;
    } else {
      if (pos - s.n_stored == R) flush_value(L, s.n_stored);  // ring full: oldest goes first
      to_ring(s, pos, v);
    }
  } else if (L.v.tq) {
    append_tq(L, L.v, pos, v);
  } else {
    store_rows(L, L.v, pos, v);
  }
  L.n = pos + 1;
  if (L.window > 0) evict(layer);
}

void KvCache::evict(int layer) {
  Layer& L = layers_[layer];
  // The next attention reads tokens [n - W, n): whole blocks before that can go, once
  // stored (KIVI's residual tokens wait until quantized).
  const int count = std::min(L.n - L.window, droppable(layer)) / block_ * block_;
  if (count < block_) return;
  drop(layer, 0, count);
  L.evicted += count;
}

StreamView KvCache::stream_view(const Layer& L, const StreamStore& s, Stream which) const {
  StreamView v;
  v.fmt = s.lay.fmt;
  v.param_type = cfg_.param_type;
  v.n_heads = cfg_.n_kv_heads;
  v.head_dim = cfg_.head_dim;
  v.block = block_;
  v.per_channel = is_kivi(s.lay.fmt.format) && which == Stream::kKey;
  v.group = v.per_channel ? cfg_.group_size : cgroup_;
  v.n_stored = uses_ring(s.lay.fmt.format) ? s.n_stored : L.n;
  v.tq = s.tq;
  v.rotated = s.rotated;
  v.rotations = s.rotated ? L.rot.data() : nullptr;
  v.codes = s.codes;
  v.scales = s.scales;
  v.zeros = s.zeros;
  v.block_table = L.block_table.data();
  v.n_blocks = L.n_blocks;
  v.code_head_stride = s.code_stride;
  v.param_head_stride = s.param_stride;
  v.head_block_bytes = s.lay.head_block_bytes;
  v.head_block_params = s.lay.head_block_params;
  v.code_row_bytes = s.lay.code_row_bytes;
  v.token_stride = s.lay.token_stride;
  v.quad = is_kivi(s.lay.fmt.format) && which == Stream::kValue;
  v.tensor_scale = s.tensor_scale;
  v.ring = s.ring.data();
  v.ring_capacity = s.lay.ring_cap;
  v.ring_shift = s.ring_shift;
  return v;
}

LayerView KvCache::view(int layer) const {
  const Layer& L = layers_.at(owner_.at(layer));
  LayerView v;
  v.k = stream_view(L, L.k, Stream::kKey);
  v.v = stream_view(L, L.v, Stream::kValue);
  v.n_tokens = L.n;
  return v;
}

int KvCache::droppable(int layer) const {
  const Layer& L = layers_.at(owner_.at(layer));
  const int stored = std::min(uses_ring(L.k.lay.fmt.format) ? L.k.n_stored : L.n,
                              uses_ring(L.v.lay.fmt.format) ? L.v.n_stored : L.n);
  return stored / block_ * block_;
}

void KvCache::rotate_keys(int layer, int first, int last, const float* rope_row, bool neox) {
  if (borrows(layer)) return;
  Layer& L = layers_.at(layer);
  StreamStore& s = L.k;
  if (s.lay.fmt.format != Format::kF32 && s.lay.fmt.format != Format::kF16) {
    fail(
        "KV cache: %s keys cannot be rotated in place (they would be rounded twice); store keys "
        "before RoPE",
        format_name(s.lay.fmt.format));
  }
  const int H = cfg_.n_kv_heads, D = cfg_.head_dim;
  std::vector<float> x(D);
  for (int t = first; t < last; ++t) {
    const size_t pb = static_cast<size_t>(L.block_table[t / block_]);
    for (int h = 0; h < H; ++h) {
      uint8_t* row = s.head_codes(h, pb) + static_cast<size_t>(t % block_) * s.lay.token_stride;
      if (s.lay.fmt.format == Format::kF32) {
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
      if (s.lay.fmt.format == Format::kF32) {
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
  if (shares_pool()) fail("KV cache: a cache in a shared block pool does not drop tokens");
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
  L.n -= count;
  for (StreamStore* s : {&L.k, &L.v}) {
    if (uses_ring(s->lay.fmt.format)) s->n_stored -= count;
    if (s->lay.ring_cap > 0) s->ring_shift = (s->ring_shift + count) % s->lay.ring_cap;
    s->ring_floor = std::max(0, s->ring_floor - count);
  }
}

LayerView KvCache::view_prefix(int layer, int n) const {
  LayerView v = view(layer);
  if (n > v.n_tokens || n < 0)
    fail("KV cache: a view of %d tokens of layer %d, which holds %d", n, layer, v.n_tokens);
  if (n == v.n_tokens) return v;  // as it stands: a KIVI cache's residual tokens stay in its ring
  if (cfg_.has_residual()) fail("KV cache: earlier views of KIVI caches are not kept");
  v.n_tokens = v.k.n_stored = v.v.n_stored = n;
  return v;
}

uint64_t KvCache::stream_bytes_used(const StreamStore& s, Stream which, int n) const {
  const uint64_t H = cfg_.n_kv_heads, D = cfg_.head_dim, ps = param_size(cfg_.param_type);
  const uint64_t stored = uses_ring(s.lay.fmt.format) ? s.n_stored : static_cast<uint64_t>(n);
  // Codes and parameters of stored tokens: the per-block sizes of the buffers scaled
  // to the filled part of the blocks.
  uint64_t bytes = stored * H * s.lay.head_block_bytes / block_;
  uint64_t params = 0;
  if (s.lay.head_block_params) {
    if (is_kivi(s.lay.fmt.format) && which == Stream::kKey) {
      params =
          H * (stored / cfg_.group_size) * (s.lay.head_block_params / (block_ / cfg_.group_size));
    } else {
      params = H * stored * s.lay.head_block_params / block_;
    }
  }
  params += stored * s.lay.shared_params / block_;
  bytes += params * ps * (s.zeros ? 2 : 1);
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
  uint64_t t = L.block_table.size() * sizeof(int32_t);
  if (!shares_pool()) {
    const BlockPool::LayerStorage& P = pool_->layer(layer);
    for (const BlockPool::StreamStorage* s : {&P.k, &P.v})
      t += s->codes.bytes() + s->scales.bytes() + s->zeros.bytes();
  }
  for (const StreamStore* s : {&L.k, &L.v}) {
    t += s->ring.bytes();
    if (s->lay.fmt.format == Format::kInt8 && s->lay.fmt.granularity == Int8Granularity::kTensor)
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

LayerState KvCache::layer_state(int layer) const {
  const Layer& L = layers_.at(owner_.at(layer));
  LayerState st;
  st.n = L.n;
  for (Stream which : {Stream::kKey, Stream::kValue}) {
    const StreamStore& s = which == Stream::kKey ? L.k : L.v;
    StreamState& t = which == Stream::kKey ? st.k : st.v;
    t.n_stored = s.n_stored;
    t.ring_shift = 0;  // a snapshot's ring is written in token order (kv/snapshot.h)
    t.tensor_scale = s.tensor_scale;
    t.calibrated = s.calibrated ? 1 : 0;
    t.clamped = s.clamped;
  }
  return st;
}

void KvCache::for_each_piece(const Layer& L, Stream which, Part p, int nb,
                             const std::function<void(uint8_t*, size_t)>& f) const {
  const StreamStore& s = which == Stream::kKey ? L.k : L.v;
  const size_t H = cfg_.n_kv_heads, ps = param_size(cfg_.param_type);
  const StreamLayout& lay = s.lay;
  // Each head's nb blocks, then the padding of its region (kv/snapshot.h).
  auto blocks = [&](uint8_t* base, size_t head_stride, size_t per_head_block) {
    if (!base || per_head_block == 0) return;
    const size_t used = static_cast<size_t>(nb) * per_head_block;
    const size_t pad = head_region_bytes(used) - used;
    for (size_t h = 0; h < H; ++h) {
      for (int b = 0; b < nb; ++b) {
        f(base + h * head_stride + static_cast<size_t>(L.block_table[b]) * per_head_block,
          per_head_block);
      }
      if (pad) f(nullptr, pad);
    }
  };
  switch (p) {
    case Part::kCodes:
      blocks(s.codes, s.code_stride, lay.head_block_bytes);
      break;
    case Part::kScales:
    case Part::kZeros: {
      uint8_t* base = p == Part::kScales ? s.scales : s.zeros;
      blocks(base, s.param_stride * ps, lay.head_block_params * ps);
      if (p == Part::kScales && lay.shared_params) {  // int8/token: [n_blocks][B] after the heads'
        const size_t off = H * s.param_stride * ps, per = lay.shared_params * ps;
        for (int b = 0; b < nb; ++b)
          f(base + off + static_cast<size_t>(L.block_table[b]) * per, per);
      }
      break;
    }
    case Part::kRing: {
      // The last `rows` tokens' rows, token t's at t % rows (kv/snapshot.h).
      const int rows =
          snapshot_ring_rows(cfg_.at_layer(static_cast<int>(&L - layers_.data())), which);
      if (rows == 0 || !s.ring.size()) break;
      const size_t row = cfg_.head_dim * sizeof(float);
      const int first = L.n - rows;
      for (size_t h = 0; h < H; ++h) {
        for (int j = 0; j < rows; ++j) {
          const int t = first + ((j - first) % rows + rows) % rows;
          if (t < s.ring_floor) {  // before the window (t < 0), or never in this ring
            f(nullptr, row);
            continue;
          }
          const float* src =
              s.ring.data() +
              (h * s.lay.ring_cap + static_cast<size_t>(ring_slot(s, t))) * cfg_.head_dim;
          f(reinterpret_cast<uint8_t*>(const_cast<float*>(src)), row);
        }
      }
      break;
    }
  }
}

void KvCache::read_part(int layer, Stream s, Part p, int nb,
                        const std::function<void(const uint8_t*, size_t)>& f) const {
  if (borrows(layer)) fail("KV cache: layer %d stores no cache", layer);
  if (nb < 0 || nb > n_logical_) fail("KV cache: %d blocks of %d", nb, n_logical_);
  static const uint8_t zeros[4096] = {};
  for_each_piece(layers_.at(layer), s, p, nb, [&](uint8_t* ptr, size_t n) {
    if (ptr) {
      f(ptr, n);
      return;
    }
    for (size_t o = 0; o < n; o += sizeof zeros) f(zeros, std::min(sizeof zeros, n - o));
  });
}

uint64_t KvCache::restore(int layer, const LayerState& st, const uint8_t* const parts[2][kNumParts],
                          const FileSource* file) {
  if (borrows(layer)) fail("KV cache: layer %d stores no cache", layer);
  Layer& L = layers_.at(layer);
  if (L.n != 0) fail("KV cache: layer %d is not empty", layer);
  const CacheConfig lc = cfg_.at_layer(layer);  // this layer's formats
  check_layer_state(lc, st, strfmt("KV cache layer %d", layer));
  const int nb = (st.n + block_ - 1) / block_;
  if (nb > static_cast<int>(L.block_table.size()))
    fail("KV cache: %d blocks restored into layer %d, which maps %zu", nb, layer,
         L.block_table.size());
  uint64_t mapped = 0;
  if (shares_pool()) {
    // Blocks from the pool (every layer's at the first layer restored), filled piece by
    // piece in the snapshot's order.
    if (mapped_ < nb && reservation_ < nb - mapped_)
      fail("KV cache: %d blocks restored without a reservation (%d reserved)", nb, reservation_);
    map_blocks(st.n);
    for (Stream which : {Stream::kKey, Stream::kValue}) {
      for (Part p : {Part::kCodes, Part::kScales, Part::kZeros}) {
        const uint8_t* src = parts[static_cast<int>(which)][static_cast<int>(p)];
        if (!src) continue;
        size_t off = 0;
        for_each_piece(L, which, p, nb, [&](uint8_t* dst, size_t n) {
          if (dst) std::memcpy(dst, src + off, n);
          off += n;
        });
      }
    }
  } else {
    for (int b = 0; b < nb; ++b) {
      if (L.block_table[b] != b) fail("KV cache: layer %d is not in order for a restore", layer);
    }
    const size_t H = cfg_.n_kv_heads, ps = param_size(cfg_.param_type);
    BlockPool::LayerStorage& P = own_pool_->layer(layer);
    // One head's region: if it is page-aligned (64 KiB or more, kv::head_region_bytes), its
    // whole pages mapped where the file allows; the rest copied.
    auto region = [&](AlignedBuffer<uint8_t>& buf, size_t at, const uint8_t* src, size_t n) {
      size_t done = 0;
      const size_t whole = n / kPageBytes * kPageBytes;
      if (file && n >= kPagedRegionMin &&
          buf.map_file(at, file->fd, static_cast<uint64_t>(src - file->base), whole)) {
        done = whole;
      }
      std::memcpy(buf.data() + at + done, src + done, n - done);
      mapped += done;
    };
    for (Stream which : {Stream::kKey, Stream::kValue}) {
      StreamStore& s = which == Stream::kKey ? L.k : L.v;
      BlockPool::StreamStorage& S = which == Stream::kKey ? P.k : P.v;
      const int w = static_cast<int>(which);
      for (Part p : {Part::kCodes, Part::kScales, Part::kZeros}) {
        const uint8_t* src = parts[w][static_cast<int>(p)];
        if (!src) continue;
        AlignedBuffer<uint8_t>& buf = p == Part::kCodes    ? S.codes
                                      : p == Part::kScales ? S.scales
                                                           : S.zeros;
        const size_t stride = p == Part::kCodes ? S.code_head_stride : S.param_head_stride * ps;
        const size_t used = part_head_bytes(lc, which, p, nb),
                     file_stride = head_region_bytes(used);
        if (used > 0) {
          for (size_t h = 0; h < H; ++h) region(buf, h * stride, src + h * file_stride, used);
        }
        if (p == Part::kScales && s.lay.shared_params) {  // int8/token, after the heads
          std::memcpy(buf.data() + H * stride, src + H * file_stride,
                      static_cast<size_t>(nb) * s.lay.shared_params * ps);
        }
      }
    }
  }
  for (Stream which : {Stream::kKey, Stream::kValue}) {
    StreamStore& s = which == Stream::kKey ? L.k : L.v;
    const StreamState& t = which == Stream::kKey ? st.k : st.v;
    // The residual window: the snapshot's last `rows` tokens, token t's row at
    // (t + shift) % rows there, goes to t % ring_cap here.
    const int rows = snapshot_ring_rows(lc, which);
    const uint8_t* ring = parts[static_cast<int>(which)][static_cast<int>(Part::kRing)];
    s.ring_shift = 0;
    s.ring_floor = std::max(0, st.n - rows);
    if (rows > 0 && s.ring.size() && ring) {
      const size_t D = cfg_.head_dim;
      const float* src = reinterpret_cast<const float*>(ring);
      for (size_t h = 0; h < static_cast<size_t>(cfg_.n_kv_heads); ++h) {
        for (int tok = s.ring_floor; tok < st.n; ++tok) {
          std::memcpy(
              s.ring.data() + (h * s.lay.ring_cap + static_cast<size_t>(tok % s.lay.ring_cap)) * D,
              src + (h * rows + static_cast<size_t>((tok + t.ring_shift) % rows)) * D,
              D * sizeof(float));
        }
      }
    }
    s.n_stored = t.n_stored;
    s.tensor_scale = t.tensor_scale;
    s.calibrated = t.calibrated != 0;
    s.clamped = t.clamped;
  }
  L.n = st.n;
  return mapped;
}

KvCache::RawStream KvCache::raw(int layer, Stream s) const {
  const Layer& L = layers_.at(owner_.at(layer));
  const StreamStore& st = s == Stream::kKey ? L.k : L.v;
  const BlockPool::LayerStorage& P = pool_->layer(owner_.at(layer));
  const BlockPool::StreamStorage& p = s == Stream::kKey ? P.k : P.v;
  return {&p.codes, &p.scales, &p.zeros, &st.ring, st.n_stored, st.tensor_scale};
}

}  // namespace kivi::kv
