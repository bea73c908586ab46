// Block summaries: for every block of B tokens, KV head and layer that selects blocks,
// a compact representative of the block's keys (f16): per-channel min and max (Quest),
// max, mean, or the mean of the fixed representative keys (options.h). They are kept beside the
// cache, indexed by the block's position in the sequence, and computed once, when every key of a
// block is stored:
//   - KIVI keys stored after RoPE, B a multiple of G: min and max follow from the stored
//     group parameters alone (the codes of a group reconstruct to [zero, zero + L scale],
//     L = 2^bits - 1), so nothing is dequantized;
//   - otherwise from the stored keys as attention reads them: dequantized and, for keys
//     stored before RoPE, rotated by their positions (the bound must hold for the keys
//     attention scores, not for the stored ones).
// Bounds are rounded outward to f16 (min toward -inf, max toward +inf), so for every key
// k of a block and any query q: sum_c max(q_c min_c, q_c max_c) >= q . k. Keys rotated
// here in float are widened by their rotation's rounding error as well. The residual
// window and a block still filling have no summary: attention always reads them.
//
// Storage, allocated up front, per summarized layer:
//   [H][n_blocks][V][D] f16, n_blocks = ceil(ctx / B), V = 2 (min, max) or 1
#pragma once

#include <cstdint>
#include <vector>

#include "attn/attention.h"
#include "core/aligned.h"
#include "core/f16.h"
#include "kv/kv_cache.h"
#include "sparse/options.h"

namespace kivi::sparse {

class BlockSummaries {
 public:
  BlockSummaries() = default;
  // Summaries of `block`-token blocks for the layers with layers[l] != 0 of a cache of
  // shape c (c.ctx tokens).
  BlockSummaries(const kv::CacheConfig& c, int block, SummaryKind kind,
                 const std::vector<char>& layers);
  // Bytes the constructor allocates.
  static uint64_t bytes_for(const kv::CacheConfig& c, int block, SummaryKind kind, int n_layers);

  SummaryKind kind() const { return kind_; }
  int block() const { return block_; }
  int vectors() const { return vecs_; }
  int head_dim() const { return D_; }
  int n_blocks() const { return n_blocks_; }
  bool has(int layer) const {
    return layer < static_cast<int>(layers_.size()) && layers_[layer].data.size() > 0;
  }

  // Summarizes the blocks of `layer` whose keys are all stored (kv: the layer's view;
  // rope: the RoPE table of keys stored before RoPE, null when they are stored rotated).
  void update(int layer, const kv::LayerView& kv, const float* rope, attn::RopeStyle style);
  // Tokens [0, summarized) of `layer` have summaries (a multiple of the block).
  int summarized(int layer) const { return layers_[layer].done; }
  void clear();
  // Sets `layer`'s summaries of tokens [0, done) (a multiple of the block, within the
  // context) from `data` [H][done / block][V][D] f16, as a saved session stored them
  // (runtime/session_file.h).
  void restore(int layer, int done, const uint8_t* data);

  // The summaries of KV head h: [n_blocks][V][D].
  const f16_t* head(int layer, int h) const {
    return layers_[layer].data.data() + h * head_stride();
  }
  f16_t* mutable_head(int layer, int h) { return layers_[layer].data.data() + h * head_stride(); }
  size_t head_stride() const { return static_cast<size_t>(n_blocks_) * vecs_ * D_; }
  uint64_t bytes_reserved() const;
  uint64_t bytes_used() const;  // summaries computed so far

 private:
  struct Layer {
    AlignedBuffer<f16_t> data;  // [H][n_blocks][V][D]
    int done = 0;               // tokens summarized
  };
  SummaryKind kind_ = SummaryKind::kNone;
  int block_ = 0, vecs_ = 0, D_ = 0, H_ = 0, n_blocks_ = 0;
  std::vector<Layer> layers_;
  std::vector<float> row_;   // [D] one key
  std::vector<double> acc_;  // [3][D] min, max, sum
};

// The summary of KV head h's keys [t0, t0 + n) in `K` (all stored), as update() computes
// it: out [V][D]. For tests and for callers that summarize on their own.
void summarize_block(const kv::StreamView& K, int t0, int n, int h, SummaryKind kind,
                     const float* rope, attn::RopeStyle style, f16_t* out, float* row, double* acc);

}  // namespace kivi::sparse
