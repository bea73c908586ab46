// Block-sparse decode attention (options.h) over a session's KV cache: block summaries
// kept beside the cache, selection per layer and KV head, and attention over the
// selected token ranges through the dense path's task kernel (attn::attend_range) and
// its (m, d, o) merge.
//
// A call for one layer and one query token:
//   1. when the layer selects at this step (options.h: reselect, reuse-layers), the
//      summaries of the blocks filled since its last selection are computed and, per KV
//      head (heads run in parallel), every summarized block before the local window
//      (or every candidate of the preselection) is scored against the query heads that
//      share the KV head; the top budget / block blocks are kept, per head or for all
//      heads by their summed scores; otherwise the layer's selection is the last one
//      of its selecting layer, and the local window reaches back to where it began
//      then;
//   2. the attended ranges (sinks, selected blocks, local window and everything not yet
//      summarized) are split at the dense path's chunk boundaries, each piece is a task,
//      and the tasks' states are merged per head in token order.
// With preselection, the calls at the observation window's positions (begin_prefill)
// also accumulate the window's attention per block, and the last one picks the
// candidates.
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
  int64_t selections = 0;       // calls that selected (the others reused a selection)
  int64_t tokens_attended = 0;  // summed over calls and KV heads
  int64_t tokens_context = 0;   // the same for dense attention
};

class SparseAttention {
 public:
  // For a cache of shape c (c.ctx tokens, c.n_layers layers, owners: kv::layer_owners(c))
  // read by n_heads query heads. Throws on options that do not fit the cache (a block
  // that is not a multiple of the KIVI key group).
  SparseAttention(const Options& o, const kv::CacheConfig& c, int n_heads);
  // Bytes the constructor allocates for the summaries.
  static uint64_t summary_bytes(const Options& o, const kv::CacheConfig& c);
  // Bytes of its scratch: per KV head the scores of every block and, with preselection,
  // the observation window's attention weights over the whole context (n_heads / KV heads
  // floats per token) and every selecting layer's votes and candidate flags.
  static uint64_t scratch_bytes(const Options& o, const kv::CacheConfig& c, int n_heads);

  const Options& options() const { return o_; }
  // Whether `layer` attends selected blocks (past the dense layers).
  bool sparse_layer(int layer) const { return o_.enabled() && layer >= o_.dense_layers; }
  // The layer whose selection sparse layer `layer` attends (itself when it selects).
  int selector(int layer) const {
    return o_.dense_layers + (layer - o_.dense_layers) / o_.reuse_layers * o_.reuse_layers;
  }

  // Preselection: the next tokens [pos0, pos0 + n) are a prefill; the calls for its last
  // `preselect` positions observe, and candidates replace the previous ones. Without
  // preselection this does nothing.
  void begin_prefill(int pos0, int n);
  // Whether the selecting layer `layer` has preselected candidates, and KV head h's
  // (ascending block indices; blocks from candidate_limit on are candidates too).
  bool has_candidates(int layer) const;
  std::vector<int> candidates(int layer, int h) const;
  int candidate_limit(int layer) const;

  // out[n_heads, D] = attention of q over the selected tokens of `kv`, the cache of
  // layer `owner` (the layer itself unless it borrows another's cache). p as for
  // attn::decode, without a sliding window.
  void decode(int layer, int owner, const kv::LayerView& kv, const float* q, float* out,
              const attn::Params& p, ThreadPool* pool, attn::Workspace& ws);
  // decode() without the final normalization: states [n_heads][D + 2] as
  // attn::decode_state gives them, for merging with other shards' states.
  void decode_state(int layer, int owner, const kv::LayerView& kv, const float* q, float* states,
                    const attn::Params& p, ThreadPool* pool, attn::Workspace& ws);
  // Context parallelism (model/context_parallel.h): this cache holds the context's
  // positions from `start` on and the next call is for the query at global position
  // `query`. The sinks (the context's first tokens) are then attended only by the shard
  // at 0, and the local window reaches into this shard only as far as it spans; the rest
  // of the shard's blocks compete for its budget.
  void set_shard_query(int start, int query) {
    shard_start_ = start;
    shard_query_ = query;
  }

  // Steps 1 and 2 of decode alone: updates the summaries and selects every KV head's
  // blocks for query q (or reuses a selection, as decode would), without attending
  // (decode calls it). last_ranges, last_blocks and last_scores then describe the choice.
  void select(int layer, int owner, const kv::LayerView& kv, const float* q, const attn::Params& p,
              ThreadPool* pool);
  // The scores of KV head h's candidate blocks in the last call: every block that
  // starts before last_local_start() (none with a budget of 0, or when the call reused a
  // selection), ranked as top_k ranks them.
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
  const Stats& stats() const { return stats_; }
  // Forgets every summary, selection and candidate (the cache was cleared).
  void reset();

 private:
  struct Head {
    std::vector<float> scores;                // [n_blocks]
    std::vector<float> cand_scores;           // [n_blocks] scores of the candidates
    std::vector<int> cand_index;              // [n_blocks] their block indices
    std::vector<std::pair<float, int>> heap;  // [max_sel]
    std::vector<int> blocks;                  // [max_sel] the blocks of the last call
    std::vector<Range> ranges, pieces;        // attended ranges, split at chunk boundaries
    std::vector<float> w;                     // [2 D] weights of the summary vectors
    std::vector<float> probs;                 // [rep][ctx] preselection: logits, then weights
    std::vector<float> key;                   // [D]
    std::vector<float> keys;                  // [G][D] preselection: one KIVI key group
    int n_candidates = 0, n_blocks = 0, n_ranges = 0, n_pieces = 0;
  };
  // The blocks a selecting layer chose and when.
  struct Selection {
    std::vector<int> blocks;  // [Hkv][max_sel]
    std::vector<int> count;   // [Hkv]
    int n = -1;               // tokens in the cache when it selected (-1: none yet)
    int local_start = 0;      // where its local window began
    // Preselection: votes [Hkv][n_blocks], candidate flags [Hkv][n_blocks], and the
    // blocks summarized at the prefill (later ones are candidates too).
    std::vector<float> votes;
    std::vector<char> cand;
    int cand_limit = -1;  // -1: no candidates
  };
  void score_head(int layer, int owner, int h, const float* q, int rep, int n, int candidates);
  // The top k of scores[0, candidates) among the preselected candidates of head h (all
  // of them without preselection), ascending, written to out; returns how many.
  int top_blocks(const float* scores, Head& scratch, const Selection& sel, int h, int candidates,
                 int k, int* out);
  void observe(const kv::LayerView& kv, const float* q, const attn::Params& p, int rep, int h,
               Selection& sel);
  void pick_candidates(Selection& sel, int n_full);
  void attend(int layer, int owner, const kv::LayerView& kv, const float* q, float* out,
              const attn::Params& p, ThreadPool* pool, attn::Workspace& ws, bool states);

  Options o_;
  int D_ = 0, Hkv_ = 0, n_heads_ = 0, max_sel_ = 0;
  int local_start_ = 0, chunk_ = 0;         // of the last call
  int shard_start_ = 0, shard_query_ = -1;  // set_shard_query (-1: one process)
  BlockSummaries summ_;
  std::vector<Head> heads_;
  std::vector<Selection> sel_;       // per layer (used by selecting layers)
  std::vector<float> shared_;        // [n_blocks] summed scores (heads shared)
  int obs_start_ = 0, obs_end_ = 0;  // preselection: positions of the observation window
  // Per task: its KV head and its run of pieces (global piece indices, head by head).
  std::vector<int> task_head_, task_first_, task_count_;
  std::vector<int> piece_base_;   // [Hkv] global index of each head's first piece
  AlignedBuffer<float> partial_;  // [pieces][rep][D + 2]
  size_t task_stride_ = 0;
  Stats stats_;
};

}  // namespace kivi::sparse
