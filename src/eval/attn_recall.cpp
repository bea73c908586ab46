#include "eval/attn_recall.h"

#include <algorithm>
#include <cmath>

#include "attn/attention.h"
#include "core/error.h"
#include "sparse/select.h"

namespace kivi::eval {

std::vector<RecallKind> parse_recall_kinds(const std::vector<std::string>& names) {
  std::vector<RecallKind> out;
  for (const auto& n : names) {
    RecallKind k;
    if (n != "local") {
      if (n == "off")
        fail("--sparse: 'off' is no selection (valid: quest, max, mean, random, local)");
      k.kind = sparse::parse_kind(n);
    }
    for (const auto& x : out) {
      if (x.kind == k.kind) fail("--sparse: '%s' is listed twice", n.c_str());
    }
    out.push_back(k);
  }
  if (out.empty()) fail("--sparse: no selection kind");
  return out;
}

std::string RecallSelection::label() const {
  if (kind.kind == sparse::Kind::kOff) return "local";
  return kind.name() + "@" + std::to_string(budget);
}

AttnRecall::AttnRecall(const RecallOptions& o, const kv::CacheConfig& c, int n_heads)
    : o_(o), n_layers_(c.n_layers), n_heads_(n_heads), Hkv_(c.n_kv_heads), D_(c.head_dim) {
  if (o.every < 1) fail("--every %d: expected 1 or more", o.every);
  if (o.budgets.empty()) fail("--sparse-budget: no budget");
  // Each position is measured with a fresh selection per KV head, as the budgets re-rank
  // the same scores; shared, reused or preselected selections are not.
  if (o.sparse.heads != sparse::Heads::kPer || o.sparse.reselect != 1 ||
      o.sparse.reuse_layers != 1 || o.sparse.preselect != 0) {
    fail(
        "attention recall measures a fresh selection per KV head at every position: "
        "--sparse-heads shared, --sparse-reselect, --sparse-reuse-layers and --sparse-preselect "
        "are not measured");
  }
  const int max_budget = *std::max_element(o.budgets.begin(), o.budgets.end());
  first_ = o.first > 0 ? o.first : o.sparse.local + o.sparse.block;
  for (const RecallKind& k : o.kinds) {
    sparse::Options so = o.sparse;
    so.kind = k.kind == sparse::Kind::kOff ? sparse::Kind::kRandom : k.kind;
    so.budget = k.kind == sparse::Kind::kOff ? 0 : max_budget;
    selectors_.push_back(std::make_unique<sparse::SparseAttention>(so, c, n_heads));
    const int s = static_cast<int>(selectors_.size()) - 1;
    if (k.kind == sparse::Kind::kOff) {
      sel_.push_back({k, 0});
      selector_of_.push_back(s);
    } else {
      for (int b : o.budgets) {
        sel_.push_back({k, b});
        selector_of_.push_back(s);
      }
    }
  }
  sums_.resize(sel_.size() * static_cast<size_t>(n_layers_));
  const size_t blocks = static_cast<size_t>(c.ctx) / o.sparse.block + 1;
  blocks_.resize(blocks);
  heap_.resize(blocks);
  ranges_.resize(blocks + 2);
  o_dense_.resize(static_cast<size_t>(n_heads / Hkv_) * D_);
}

AttnRecall::~AttnRecall() = default;

void AttnRecall::attended(int layer, int owner, const kv::LayerView& kv, const float* q,
                          const attn::Params& p) {
  const int n = kv.n_tokens, D = D_, rep = n_heads_ / Hkv_, B = o_.sparse.block;
  if (!measured_layer(layer) || !measured(n)) return;
  if (p.window > 0) fail("attention recall: a sliding window (--window) is not measured");
  if (layer == o_.sparse.dense_layers) ++positions_;
  for (auto& sa : selectors_) sa->select(layer, owner, kv, q, p, nullptr);
  w_.resize(static_cast<size_t>(rep) * n);
  v_.resize(static_cast<size_t>(n) * D);
  for (int h = 0; h < Hkv_; ++h) {
    attn::attention_weights_reference(kv, q, p, h, w_.data());
    for (int t = 0; t < n; ++t)
      attn::dequantize_value(kv.v, t, h, v_.data() + static_cast<size_t>(t) * D);
    dense_output(w_.data(), v_.data(), rep, n, D, o_dense_.data());
    for (size_t i = 0; i < sel_.size(); ++i) {
      const sparse::SparseAttention& sa = *selectors_[selector_of_[i]];
      int m = 0;
      if (sel_[i].kind.kind == sparse::Kind::kOff) {
        const std::vector<sparse::Range> r = sa.last_ranges(h);
        m = static_cast<int>(r.size());
        std::copy(r.begin(), r.end(), ranges_.begin());
      } else {
        // The selection at this budget, as a selector with this budget would make it.
        const std::vector<float> scores = sa.last_scores(h);
        const int cand = static_cast<int>(scores.size());
        const int k = std::min(sel_[i].budget / B, cand);
        const int got = sparse::top_k(scores.data(), cand, k, blocks_.data(), heap_.data());
        m = sparse::attended_ranges(blocks_.data(), got, B, o_.sparse.sinks, sa.last_local_start(),
                                    n, ranges_.data());
      }
      add_recall(w_.data(), v_.data(), o_dense_.data(), rep, n, D, ranges_.data(), m,
                 sums_[i * n_layers_ + layer]);
    }
  }
}

RecallSums AttnRecall::overall(int selection) const {
  RecallSums r;
  for (int l = 0; l < n_layers_; ++l) {
    const RecallSums& s = sums(selection, l);
    if (!measured_layer(l) || s.samples == 0) continue;
    r.mass += s.mean_mass();
    r.error += s.mean_error();
    r.attended += s.mean_attended();
    ++r.samples;
  }
  return r;
}

void dense_output(const double* w, const float* v, int rep, int n, int D, double* dense) {
  for (int r = 0; r < rep; ++r) {
    double* o = dense + static_cast<size_t>(r) * D;
    std::fill(o, o + D, 0.0);
    const double* wr = w + static_cast<size_t>(r) * n;
    for (int t = 0; t < n; ++t) {
      const float* vt = v + static_cast<size_t>(t) * D;
      for (int d = 0; d < D; ++d) o[d] += wr[t] * vt[d];
    }
  }
}

void add_recall(const double* w, const float* v, const double* dense, int rep, int n, int D,
                const sparse::Range* ranges, int n_ranges, RecallSums& sums) {
  int attended = 0;
  for (int i = 0; i < n_ranges; ++i) attended += ranges[i].t1 - ranges[i].t0;
  std::vector<double> o(D);
  for (int r = 0; r < rep; ++r) {
    const double* wr = w + static_cast<size_t>(r) * n;
    std::fill(o.begin(), o.end(), 0.0);
    double mass = 0.0;
    for (int i = 0; i < n_ranges; ++i) {
      for (int t = ranges[i].t0; t < ranges[i].t1; ++t) {
        mass += wr[t];
        const float* vt = v + static_cast<size_t>(t) * D;
        for (int d = 0; d < D; ++d) o[d] += wr[t] * vt[d];
      }
    }
    const double* od = dense + static_cast<size_t>(r) * D;
    double diff = 0.0, norm = 0.0;
    for (int d = 0; d < D; ++d) {
      const double os = mass > 0.0 ? o[d] / mass : 0.0;
      diff += (os - od[d]) * (os - od[d]);
      norm += od[d] * od[d];
    }
    sums.mass += mass;
    sums.error += norm > 0.0 ? std::sqrt(diff / norm) : std::sqrt(diff);
    sums.attended += n > 0 ? double(attended) / n : 0.0;
    ++sums.samples;
  }
}

}  // namespace kivi::eval
