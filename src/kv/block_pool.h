// The storage of KV caches: a fixed number of blocks, each holding B tokens of every
// layer's keys and values in the configured formats, allocated once. One cache owns a
// pool of its own (a single sequence); many caches can draw blocks from one shared
// pool, each mapping its logical blocks to physical ones through its block table.
//
// Layout per layer and stream (H KV heads): the buffers are head-major,
// [H][n_blocks][head block], exactly as kv_cache.h describes, so a block id indexes
// every layer's buffers and a StreamView over a shared pool looks like one over a
// private cache with a permuted block table. A head's region of 64 KiB or more starts on
// a page (kv::head_region_bytes), so that a saved cache can be mapped into it.
//
// Accounting (shared pools): a block is free, or held by one or more caches
// (reference counted). A sequence reserves the blocks it may need before it starts,
// so that allocating never fails mid-step; `available` = free - reserved.
//
// Prefix sharing: a block whose B tokens are all stored (quantized, out of any
// residual window) never changes again. Such a block can be published under its
// prefix: (the physical block holding the previous B tokens, these B token ids). A
// sequence starting with the same tokens then maps its logical block to the published
// one instead of storing a copy (the contents would be the same bits: the forward pass
// does not depend on what else is in the batch). Disabled for int8 with one scale per
// tensor (the scale depends on the whole first prefill).
//
// Not thread-safe: one thread (the scheduler's) allocates and releases.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/aligned.h"
#include "kv/format.h"

namespace kivi::kv {

// Sizes of one stream's data in one block.
struct StreamLayout {
  StreamFormat fmt;
  size_t head_block_bytes = 0;   // codes of one head in one block
  size_t head_block_params = 0;  // parameters (each of scale, zero) of one head in one block
  size_t shared_params = 0;      // int8/token: scales shared by the heads, per block
  size_t code_row_bytes = 0;     // one token's codes for one head
  size_t token_stride = 0;       // bytes between tokens' rows within a block
  int ring_cap = 0;              // residual ring (KIVI), per sequence, not in blocks
};
StreamLayout stream_layout(const CacheConfig& c, Stream which);

class BlockPool {
 public:
  struct StreamStorage {
    StreamLayout layout;
    size_t code_head_stride = 0;   // bytes: head_region_bytes(n_blocks * head_block_bytes)
    size_t param_head_stride = 0;  // parameters: head_region_bytes(n_blocks * params) / size
    AlignedBuffer<uint8_t> codes;  // [H][code_head_stride]
    AlignedBuffer<uint8_t>
        scales;                    // [H][param_head_stride] + [n_blocks][shared_params], param type
    AlignedBuffer<uint8_t> zeros;  // like scales (KIVI only)
  };
  struct LayerStorage {  // empty for a layer that reads another layer's cache
    StreamStorage k, v;
  };

  // `config` gives the shape and formats (its ctx is not used, except with sliding
  // windows). Storage is reserved here, zeroed; large buffers are fresh anonymous maps,
  // so memory is committed only as blocks are written. A layer with a sliding window
  // (config.layer_window) stores only its first kv::layer_blocks() blocks: block ids past them hold
  // nothing of that layer.
  BlockPool(const CacheConfig& config, int n_blocks);
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // Bytes of one block: every layer, keys and values, codes and parameters.
  static uint64_t bytes_per_block(const CacheConfig& c);

  const CacheConfig& config() const { return cfg_; }
  int block_tokens() const { return block_; }
  int n_blocks() const { return n_blocks_; }
  // Blocks stored for layer l: n_blocks(), or fewer for a layer with a sliding window.
  int layer_blocks(int l) const { return layer_blocks_[l]; }
  LayerStorage& layer(int l) { return layers_[l]; }
  const LayerStorage& layer(int l) const { return layers_[l]; }
  uint64_t block_bytes() const { return block_bytes_; }
  uint64_t bytes_reserved() const;  // all storage

  int free_blocks() const { return static_cast<int>(free_.size()); }
  int used_blocks() const { return n_blocks_ - free_blocks(); }
  int reserved_blocks() const { return reserved_; }
  int available_blocks() const { return free_blocks() - reserved_; }
  int shared_blocks() const { return shared_; }  // held by more than one cache
  int published_blocks() const { return static_cast<int>(index_.size()); }

  // Reserves n blocks for later allocation; false (and nothing reserved) if fewer are available.
  bool try_reserve(int n);
  void unreserve(int n);
  // Hands out a free block with reference count 1, zeroed. `reserved`: draws on a
  // reservation made earlier. Throws kivi::Error when no block is available.
  int32_t allocate(bool reserved);
  void retain(int32_t b);
  // Drops one reference; at zero the block is free again and unpublished.
  void release(int32_t b);
  // Copies block src's codes and parameters (every layer, keys and values) into dst.
  void copy_block(int32_t src, int32_t dst);
  int refcount(int32_t b) const { return refs_[b]; }

  bool prefix_sharing() const { return sharing_; }
  // The published block holding `tokens` [B] after the block `parent` (-1: at the
  // start of a sequence), or -1.
  int32_t find(int32_t parent, const int* tokens) const;
  // Publishes `block` (complete, never written again) under its prefix and returns
  // the block now published there: `block`, or an identical one published before.
  int32_t publish(int32_t parent, const int* tokens, int32_t block);

 private:
  std::string key(int32_t parent, const int* tokens) const;
  // Zeroes block b's codes and parameters.
  void zero_block(int32_t b);

  CacheConfig cfg_;
  int block_ = 0, n_blocks_ = 0;
  bool sharing_ = false;
  uint64_t block_bytes_ = 0;
  std::vector<LayerStorage> layers_;
  std::vector<int> layer_blocks_;     // [n_layers]
  std::vector<int32_t> free_;         // stack of free block ids, lowest on top
  std::vector<int32_t> refs_;         // [n_blocks]
  std::vector<uint8_t> used_before_;  // [n_blocks] handed out before: not zero any more
  int reserved_ = 0, shared_ = 0;
  std::unordered_map<std::string, int32_t> index_;  // prefix key -> published block
  std::vector<std::string> keys_;  // [n_blocks] the key a block is published under, or ""
};

}  // namespace kivi::kv
