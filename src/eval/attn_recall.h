// Attention recall of block-sparse selection: how much of dense attention the chosen
// tokens keep, independent of what the model then does with it.
//
// At a measured position, for every layer that selects blocks and every KV head, the
// dense softmax weights w of each query head over the whole cache are computed in
// double (attn::attention_weights_reference), and for each selection S (a kind of
// block summary at a token budget, as src/sparse chooses it for the query heads of
// the KV head, with the sinks and the local window; or the sinks and the local window
// alone):
//   mass  = sum_{t in S} w_t                    the share of the softmax kept
//   error = |o_S - o| / |o|                     L2, o = sum_t w_t v_t (dense),
//                                               o_S = sum_{t in S} w_t v_t / mass
// o_S is what sparse attention computes over S (up to float rounding). Both are
// averaged over the query heads and KV heads, per layer over the measured positions,
// and overall over the layers.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kv/kv_cache.h"
#include "model/forward.h"
#include "sparse/options.h"
#include "sparse/sparse_attention.h"

namespace kivi::eval {

// A selection kind of the measurement: the sparse kinds, and "local" (sinks and local
// window only, no blocks).
struct RecallKind {
  sparse::Kind kind = sparse::Kind::kOff;  // kOff: local
  std::string name() const {
    return kind == sparse::Kind::kOff ? "local" : sparse::kind_name(kind);
  }
};
// "quest,max,mean,random,local" -> kinds; throws naming an unknown one.
std::vector<RecallKind> parse_recall_kinds(const std::vector<std::string>& names);

struct RecallOptions {
  sparse::Options sparse;  // block, sinks, local, dense layers and seed (kind and budget unused)
  std::vector<RecallKind> kinds;
  std::vector<int> budgets;  // tokens of selected blocks
  int every = 16;            // measure every `every` positions ...
  int first = 0;             // ... from the first with this many tokens in the cache
};

// The sums of one selection in one layer.
struct RecallSums {
  double mass = 0.0, error = 0.0, attended = 0.0;  // summed over samples
  int64_t samples = 0;                             // query heads x measured positions
  double mean_mass() const { return samples ? mass / samples : 0.0; }
  double mean_error() const { return samples ? error / samples : 0.0; }
  double mean_attended() const { return samples ? attended / samples : 0.0; }
};

// One row of the result: a kind at a budget ("local" has budget 0).
struct RecallSelection {
  RecallKind kind;
  int budget = 0;
  std::string label() const;  // "quest@64", "local"
};

class AttnRecall : public model::AttentionObserver {
 public:
  // For a cache of shape c (n_layers, n_kv_heads, head_dim, ctx filled) read by n_heads
  // query heads. Throws on options that do not fit the cache.
  AttnRecall(const RecallOptions& o, const kv::CacheConfig& c, int n_heads);
  ~AttnRecall() override;

  // The first position measured: o.first, or when 0, the first with a whole block
  // before the local window.
  int first_position() const { return first_; }
  bool measured(int n_tokens) const {
    return n_tokens >= first_ && (n_tokens - first_) % o_.every == 0;
  }

  void attended(int layer, int owner, const kv::LayerView& kv, const float* q,
                const attn::Params& p) override;

  const std::vector<RecallSelection>& selections() const { return sel_; }
  int n_layers() const { return n_layers_; }
  // Whether layer l selects blocks (past the dense layers): the others are not measured.
  bool measured_layer(int l) const { return l >= o_.sparse.dense_layers; }
  const RecallSums& sums(int selection, int layer) const {
    return sums_[static_cast<size_t>(selection) * n_layers_ + layer];
  }
  // The mean over the measured layers of each layer's means.
  RecallSums overall(int selection) const;
  int64_t positions() const { return positions_; }

 private:
  RecallOptions o_;
  int n_layers_ = 0, n_heads_ = 0, Hkv_ = 0, D_ = 0, first_ = 0;
  std::vector<RecallSelection> sel_;
  // One selector per sparse kind at the largest budget (its scores rank the blocks for
  // every budget), and one without blocks for "local".
  std::vector<std::unique_ptr<sparse::SparseAttention>> selectors_;
  std::vector<int> selector_of_;  // per selection
  std::vector<RecallSums> sums_;  // [selection][layer]
  int64_t positions_ = 0;
  // Scratch.
  std::vector<double> w_, o_dense_, o_sel_;
  std::vector<float> v_;
  std::vector<int> blocks_;
  std::vector<std::pair<float, int>> heap_;
  std::vector<sparse::Range> ranges_;
};

// The measurement itself for one KV head, exposed for tests: w [rep][n] the dense
// softmax weights, v [n][D] the values, dense [rep][D] = dense_output(w, v),
// ranges the selection (sorted, disjoint). Adds each query head's mass, error and the
// attended share to `sums`.
void dense_output(const double* w, const float* v, int rep, int n, int D, double* dense);
void add_recall(const double* w, const float* v, const double* dense, int rep, int n, int D,
                const sparse::Range* ranges, int n_ranges, RecallSums& sums);

}  // namespace kivi::eval
