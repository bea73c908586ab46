// Block-sparse decode attention (options.h) over a session's KV cache: block summaries
// kept beside the cache, selection per layer and KV head, and attention over the
// selected token ranges through the dense path's task kernel (attn::attend_range) and
// its (m, d, o) merge.
//
// A call for one layer and one query token:
//   1. the summaries of the blocks filled since the last call are computed;
//   2. per KV head (heads run in parallel), every summarized block before the local
//      window is scored against the query heads that share the KV head, and the top
//      budget / block blocks are kept;
//   3. the attended ranges (sinks, selected blocks, local window and everything not yet
//      summarized) are split at the dense path's chunk boundaries, each piece is a task,
//      and the tasks' states are merged per head in token order.
// When every block is selected the tasks are dense attention's tasks, in the same order:
// the result has the same bits as attn::decode.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "attn/attention.h"
#include "core/aligned.h"
#include "kv/kv_cache.h"
#include "sparse/options.h"
#include "sparse/select.h"
#include "sparse/summaries.h"

namespace kivi {
class ThreadPool;
}

namespace kivi::sparse {

// Time spent and tokens read by the sparse layers' calls.
struct Stats {
  double select_seconds = 0.0;  // summaries, scores and top-k
  double attend_seconds = 0.0;  // attention over the ranges and the merge
  int64_t calls = 0;            // sparse layer calls
  int64_t tokens_attended = 0;  // summed over calls and KV heads
  int64_t tokens_context = 0;   // the same for dense attention
};

class SparseAttention {
 public:
  // For a cache of shape c (c.ctx tokens, c.n_layers layers, owners: kv::layer_owners(c))
  // read by n_heads query heads. Throws on options that do not fit the cache (a block
  // that is not a multiple of the KIVI key group).
  SparseAttention(const Options& o, const kv::CacheConfig& c, int n_heads);
  // Bytes the constructor allocates for the summaries (the scratch is small beside them).
  static uint64_t summary_bytes(const Options& o, const kv::CacheConfig& c);

  const Options& options() const { return o_; }
  // Whether `layer` selects blocks (past the dense layers).
  bool sparse_layer(int layer) const { return o_.enabled() && layer >= o_.dense_layers; }

  // out[n_heads, D] = attention of q over the selected tokens of `kv`, the cache of
  // layer `owner` (the layer itself unless it borrows another's cache). p as for
  // attn::decode, without a sliding window.
  void decode(int layer, int owner, const kv::LayerView& kv, const float* q, float* out,
              const attn::Params& p, ThreadPool* pool, attn::Workspace& ws);

  // Steps 1 and 2 of decode alone: updates the summaries and selects every KV head's
  // blocks for query q, without attending (decode calls it). last_ranges, last_blocks
  // and last_scores then describe the choice.
  void select(int layer, int owner, const kv::LayerView& kv, const float* q, const attn::Params& p,
              ThreadPool* pool);
  // The scores of KV head h's candidate blocks in the last call: every block that
  // starts before last_local_start() (none with a budget of 0), ranked as top_k ranks them.
  std::vector<float> last_scores(int h) const;
  // The first token of the last call's local window (the tokens from there on are
  // always attended).
  int last_local_start() const { return local_start_; }

  // The ranges KV head h attended in the last call (sorted, disjoint).
  std::vector<Range> last_ranges(int h) const;
  // The blocks KV head h selected in the last call (ascending).
  std::vector<int> last_blocks(int h) const;

  const BlockSummaries& summaries() const { return summ_; }
  BlockSummaries& summaries() { return summ_; }
  uint64_t bytes_reserved() const { return summ_.bytes_reserved(); }
  Stats& stats() { return stats_; }
  // Forgets every summary (the cache was cleared).
  void reset() { summ_.clear(); }

 private:
  struct Head {
    std::vector<float> scores;                // [n_blocks]
    std::vector<std::pair<float, int>> heap;  // [max_sel]
    std::vector<int> blocks;                  // [max_sel]
    std::vector<Range> ranges, pieces;        // attended ranges, split at chunk boundaries
    std::vector<float> w;                     // [2 D] weights of the summary vectors
    int n_candidates = 0, n_blocks = 0, n_ranges = 0, n_pieces = 0;
  };
  void select_head(int layer, int owner, int h, const kv::LayerView& kv, const float* q, int rep,
                   int local_start, int chunk);

  Options o_;
  int D_ = 0, Hkv_ = 0, n_heads_ = 0, max_sel_ = 0;
  int local_start_ = 0, chunk_ = 0;  // of the last call
  BlockSummaries summ_;
  std::vector<Head> heads_;
  std::vector<int> task_head_, task_piece_;  // per task: KV head and piece
  AlignedBuffer<float> partial_;             // [tasks][rep][D + 2]
  size_t task_stride_ = 0;
  Stats stats_;
};

}  // namespace kivi::sparse
