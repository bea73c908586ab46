#include "kv/block_pool.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "kv/codec.h"

namespace kivi::kv {

StreamLayout stream_layout(const CacheConfig& c, Stream which) {
  const StreamFormat& f = which == Stream::kKey ? c.k : c.v;
  const size_t D = c.head_dim, B = c.block(), cg = c.channel_group();
  StreamLayout s;
  s.fmt = f;
  if (is_tq(f.format)) {  // bit-stream rows, one scale per token and head
    s.code_row_bytes = code_row_bytes(f.format, static_cast<int>(D));
    s.token_stride = s.code_row_bytes;
    s.head_block_params = B;
    s.ring_cap = which == Stream::kKey ? key_ring_capacity(c) : value_ring_capacity(c);
  } else if (!is_kivi(f.format)) {
    const size_t eb = f.format == Format::kF32 ? 4 : f.format == Format::kF16 ? 2 : 1;
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
          s.head_block_params = B * (D / cg);
          break;
      }
    }
  } else {
    s.code_row_bytes = packed_row_bytes(static_cast<int>(D), format_bits(f.format));
    s.token_stride = s.code_row_bytes;
    s.head_block_params = which == Stream::kKey ? (B / c.group_size) * D : B * (D / cg);
    s.ring_cap = which == Stream::kKey ? key_ring_capacity(c) : value_ring_capacity(c);
  }
  s.head_block_bytes = B * s.code_row_bytes;
  return s;
}

static uint64_t stream_block_bytes(const CacheConfig& c, const StreamLayout& s) {
  const uint64_t H = c.n_kv_heads;
  const uint64_t params = (H * s.head_block_params + s.shared_params) * param_size(c.param_type);
  return H * s.head_block_bytes + params * (is_kivi(s.fmt.format) ? 2 : 1);
}

uint64_t BlockPool::bytes_per_block(const CacheConfig& c) {
  const std::vector<int> owners = layer_owners(c);
  uint64_t total = 0;
  for (int l = 0; l < c.n_layers; ++l) {
    if (owners[l] != l) continue;
    const CacheConfig one = c.at_layer(l);
    total += stream_block_bytes(one, stream_layout(one, Stream::kKey)) +
             stream_block_bytes(one, stream_layout(one, Stream::kValue));
  }
  return total;
}

BlockPool::BlockPool(const CacheConfig& config, int n_blocks) : cfg_(config), n_blocks_(n_blocks) {
  if (cfg_.ctx < 1) cfg_.ctx = std::max(1, n_blocks) * cfg_.block();
  cfg_.validate();
  if (n_blocks < 1) fail("KV pool: %d blocks, expected at least 1", n_blocks);
  block_ = cfg_.block();
  block_bytes_ = bytes_per_block(cfg_);
  sharing_ = !cfg_.any_stream([](const StreamFormat& f, bool) {
    return f.format == Format::kInt8 && f.granularity == Int8Granularity::kTensor;
  });
  const size_t H = cfg_.n_kv_heads, ps = param_size(cfg_.param_type);
  layers_.resize(cfg_.n_layers);
  layer_blocks_.assign(cfg_.n_layers, n_blocks_);
  const std::vector<int> owners = layer_owners(cfg_);
  for (int l = 0; l < cfg_.n_layers; ++l) {
    if (cfg_.window(l) > 0) layer_blocks_[l] = std::min(n_blocks_, kv::layer_blocks(cfg_, l));
    if (owners[l] != l) continue;  // a layer that reads another's cache stores nothing
    const size_t nb = layer_blocks_[l];
    LayerStorage& L = layers_[l];
    for (Stream which : {Stream::kKey, Stream::kValue}) {
      StreamStorage& s = which == Stream::kKey ? L.k : L.v;
      s.layout = stream_layout(cfg_.at_layer(l), which);
      // Zeroed: large buffers are fresh maps (zero, committing memory only as tokens are
      // written), small ones are cleared. allocate() zeroes a block again only when it
      // hands it out a second time.
      s.code_head_stride = head_region_bytes(s.layout.head_block_bytes * nb);
      s.param_head_stride = head_region_bytes(s.layout.head_block_params * nb * ps) / ps;
      s.codes.reset(s.code_head_stride * H);
      const size_t np = s.param_head_stride * H + s.layout.shared_params * nb;
      s.scales.reset(np * ps);
      if (is_kivi(s.layout.fmt.format)) s.zeros.reset(np * ps);
    }
  }
  used_before_.assign(n_blocks_, 0);
  free_.resize(n_blocks_);
  for (int i = 0; i < n_blocks_; ++i) free_[i] = n_blocks_ - 1 - i;  // block 0 on top
  refs_.assign(n_blocks_, 0);
  keys_.resize(n_blocks_);
}

uint64_t BlockPool::bytes_reserved() const {
  uint64_t t = 0;
  for (const auto& L : layers_) {
    for (const StreamStorage* s : {&L.k, &L.v})
      t += s->codes.bytes() + s->scales.bytes() + s->zeros.bytes();
  }
  return t;
}

void BlockPool::zero_block(int32_t b) {
  const size_t H = cfg_.n_kv_heads, ps = param_size(cfg_.param_type);
  for (int l = 0; l < cfg_.n_layers; ++l) {
    LayerStorage& L = layers_[l];
    if (L.k.codes.size() == 0) continue;  // stores nothing
    if (b >= layer_blocks_[l]) continue;  // a sliding-window layer's fewer blocks
    for (StreamStorage* s : {&L.k, &L.v}) {
      const StreamLayout& lay = s->layout;
      const size_t pb = lay.head_block_params * ps;
      for (size_t h = 0; h < H; ++h) {
        std::memset(s->codes.data() + h * s->code_head_stride + b * lay.head_block_bytes, 0,
                    lay.head_block_bytes);
        if (pb) {
          const size_t at = h * s->param_head_stride * ps + b * pb;
          std::memset(s->scales.data() + at, 0, pb);
          if (s->zeros.size()) std::memset(s->zeros.data() + at, 0, pb);
        }
      }
      if (lay.shared_params) {
        const size_t base = H * s->param_head_stride + static_cast<size_t>(b) * lay.shared_params;
        std::memset(s->scales.data() + base * ps, 0, lay.shared_params * ps);
      }
    }
  }
}

void BlockPool::copy_block(int32_t src, int32_t dst) {
  const size_t H = cfg_.n_kv_heads, ps = param_size(cfg_.param_type);
  for (int l = 0; l < cfg_.n_layers; ++l) {
    LayerStorage& L = layers_[l];
    if (L.k.codes.size() == 0) continue;
    if (src >= layer_blocks_[l] || dst >= layer_blocks_[l]) continue;
    for (StreamStorage* s : {&L.k, &L.v}) {
      const StreamLayout& lay = s->layout;
      const size_t pb = lay.head_block_params * ps;
      for (size_t h = 0; h < H; ++h) {
        uint8_t* codes = s->codes.data() + h * s->code_head_stride;
        std::memcpy(codes + dst * lay.head_block_bytes, codes + src * lay.head_block_bytes,
                    lay.head_block_bytes);
        if (pb) {
          const size_t at = h * s->param_head_stride * ps;
          std::memcpy(s->scales.data() + at + dst * pb, s->scales.data() + at + src * pb, pb);
          if (s->zeros.size())
            std::memcpy(s->zeros.data() + at + dst * pb, s->zeros.data() + at + src * pb, pb);
        }
      }
      if (lay.shared_params) {
        uint8_t* base = s->scales.data() + H * s->param_head_stride * ps;
        const size_t n = lay.shared_params * ps;
        std::memcpy(base + static_cast<size_t>(dst) * n, base + static_cast<size_t>(src) * n, n);
      }
    }
  }
  used_before_[dst] = 1;
}

bool BlockPool::try_reserve(int n) {
  if (n < 0 || n > available_blocks()) return false;
  reserved_ += n;
  return true;
}

void BlockPool::unreserve(int n) {
  if (n < 0 || n > reserved_) fail("KV pool: unreserving %d blocks, %d reserved", n, reserved_);
  reserved_ -= n;
}

int32_t BlockPool::allocate(bool reserved) {
  if (reserved) {
    if (reserved_ < 1) fail("KV pool: allocation from a reservation, but none is held");
    --reserved_;
  } else if (available_blocks() < 1) {
    fail("KV pool exhausted: %d blocks of %d tokens, %d free, %d of them reserved", n_blocks_,
         block_, free_blocks(), reserved_);
  }
  const int32_t b = free_.back();
  free_.pop_back();
  refs_[b] = 1;
  if (used_before_[b]) zero_block(b);
  used_before_[b] = 1;
  return b;
}

void BlockPool::retain(int32_t b) {
  if (refs_[b] < 1) fail("KV pool: block %d retained while free", b);
  if (refs_[b]++ == 1) ++shared_;
}

void BlockPool::release(int32_t b) {
  if (refs_[b] < 1) fail("KV pool: block %d released while free", b);
  if (--refs_[b] == 1) --shared_;
  if (refs_[b] > 0) return;
  if (!keys_[b].empty()) {
    index_.erase(keys_[b]);
    keys_[b].clear();
  }
  free_.push_back(b);
}

std::string BlockPool::key(int32_t parent, const int* tokens) const {
  std::string k(sizeof(int32_t) * (1 + static_cast<size_t>(block_)), '\0');
  std::memcpy(k.data(), &parent, sizeof(int32_t));
  std::memcpy(k.data() + sizeof(int32_t), tokens, sizeof(int32_t) * block_);
  return k;
}

int32_t BlockPool::find(int32_t parent, const int* tokens) const {
  if (!sharing_) return -1;
  const auto it = index_.find(key(parent, tokens));
  return it == index_.end() ? -1 : it->second;
}

int32_t BlockPool::publish(int32_t parent, const int* tokens, int32_t block) {
  if (!sharing_) return block;
  if (refs_[block] < 1) fail("KV pool: publishing free block %d", block);
  std::string k = key(parent, tokens);
  const auto it = index_.find(k);
  if (it != index_.end()) return it->second;
  if (!keys_[block].empty()) return block;  // already published under another prefix
  keys_[block] = k;
  index_.emplace(std::move(k), block);
  return block;
}

}  // namespace kivi::kv
