#include "sparse/sparse_attention.h"

#include <algorithm>
#include <cassert>
#include <cstring>

#include "attn/task.h"
#include "core/error.h"
#include "core/threadpool.h"
#include "core/timer.h"
#include "sparse/score.h"

namespace kivi::sparse {

namespace {

// Calls with fewer multiply-adds than this run on the caller alone (as attn::decode).
constexpr int64_t kParallelMacs = int64_t{1} << 17;

// The layers whose cache some sparse layer reads: they keep summaries.
std::vector<char> summarized_layers(const Options& o, const kv::CacheConfig& c) {
  std::vector<char> layers(c.n_layers, 0);
  if (!o.enabled()) return layers;
  const std::vector<int> owner = kv::layer_owners(c);
  for (int l = o.dense_layers; l < c.n_layers; ++l) layers[owner[l]] = 1;
  return layers;
}

void check_fits(const Options& o, const kv::CacheConfig& c) {
  o.validate();
  if (!o.enabled()) return;
  if (kv::is_kivi(c.k.format) && o.block % c.group_size != 0) {
    fail(
        "--sparse-block %d: expected a multiple of the KIVI key group G=%d (summaries cover whole "
        "groups)",
        o.block, c.group_size);
  }
}

}  // namespace

uint64_t SparseAttention::summary_bytes(const Options& o, const kv::CacheConfig& c) {
  const auto layers = summarized_layers(o, c);
  return BlockSummaries::bytes_for(c, o.block, summary_kind(o.kind),
                                   static_cast<int>(std::count(layers.begin(), layers.end(), 1)));
}

SparseAttention::SparseAttention(const Options& o, const kv::CacheConfig& c, int n_heads)
    : o_(o), D_(c.head_dim), Hkv_(c.n_kv_heads), n_heads_(n_heads) {
  check_fits(o, c);
  if (n_heads % Hkv_ != 0) fail("sparse attention: %d query heads for %d KV heads", n_heads, Hkv_);
  summ_ = BlockSummaries(c, o.block, summary_kind(o.kind), summarized_layers(o, c));
  const int n_blocks = summ_.n_blocks();
  max_sel_ = std::min(n_blocks, o.budget / o.block);
  const int kv_block = c.block();
  const int max_pieces = (max_sel_ + 2) + c.ctx / attn::min_chunk_tokens(kv_block) + 2;
  heads_.resize(Hkv_);
  for (auto& hd : heads_) {
    hd.scores.resize(std::max(1, n_blocks));
    hd.heap.resize(std::max(1, max_sel_));
    hd.blocks.resize(std::max(1, max_sel_));
    hd.ranges.resize(max_sel_ + 2);
    hd.pieces.resize(max_pieces);
    hd.w.resize(2 * static_cast<size_t>(D_));
  }
  const int rep = n_heads / Hkv_;
  task_stride_ = (static_cast<size_t>(rep) * (D_ + 2) + 15) / 16 * 16;
  partial_.reset(task_stride_ * Hkv_ * max_pieces);
  task_head_.resize(static_cast<size_t>(Hkv_) * max_pieces);
  task_piece_.resize(task_head_.size());
}

void SparseAttention::select_head(int layer, int owner, int h, const kv::LayerView& kv,
                                  const float* q, int rep, int local_start, int chunk) {
  Head& hd = heads_[h];
  const int n = kv.n_tokens, B = o_.block, D = D_;
  const int candidates = (local_start + B - 1) / B;  // blocks that start before the local window
  const int k = std::min(max_sel_, candidates);
  hd.n_blocks = 0;
  hd.n_candidates = k > 0 ? candidates : 0;
  if (k > 0) {
    const float* qh = q + static_cast<size_t>(h) * rep * D;
    float* w = hd.w.data();
    switch (o_.kind) {
      case Kind::kQuest:
        // [N, P] . [min, max]: a channel's larger product is q max where q > 0, q min where q < 0.
        std::fill(w, w + 2 * D, 0.0f);
        for (int r = 0; r < rep; ++r) {
          for (int c = 0; c < D; ++c) {
            const float x = qh[static_cast<size_t>(r) * D + c];
            (x < 0.0f ? w[c] : w[D + c]) += x;
          }
        }
        break;
      case Kind::kMax:
      case Kind::kMean:
        std::fill(w, w + D, 0.0f);
        for (int r = 0; r < rep; ++r)
          for (int c = 0; c < D; ++c) w[c] += qh[static_cast<size_t>(r) * D + c];
        break;
      default:
        break;
    }
    if (o_.kind == Kind::kRandom) {
      for (int b = 0; b < candidates; ++b) hd.scores[b] = random_score(o_.seed, layer, n, h, b);
    } else {
      const int V = summ_.vectors();
      dot_f16_rows(summ_.head(owner, h), static_cast<size_t>(V) * D, candidates, w,
                   static_cast<size_t>(V) * D, hd.scores.data());
    }
    hd.n_blocks = top_k(hd.scores.data(), candidates, k, hd.blocks.data(), hd.heap.data());
  }
  hd.n_ranges =
      attended_ranges(hd.blocks.data(), hd.n_blocks, B, o_.sinks, local_start, n, hd.ranges.data());
  hd.n_pieces = split_ranges(hd.ranges.data(), hd.n_ranges, chunk, hd.pieces.data());
  assert(hd.n_pieces <= static_cast<int>(hd.pieces.size()));
}

void SparseAttention::select(int layer, int owner, const kv::LayerView& kv, const float* q,
                             const attn::Params& p, ThreadPool* pool) {
  const int n = kv.n_tokens, D = D_, Hkv = Hkv_, rep = p.n_heads / Hkv;
  summ_.update(owner, kv, p.rope, p.rope_style);
  // Tokens from local_start on are always attended: the local window and every token
  // without a summary (KIVI's residual, a block still filling).
  // Random scores need no summaries: its blocks are the stored ones.
  const int covered = summ_.vectors() > 0 ? summ_.summarized(owner)
                                          : std::min(kv.k.n_stored, n) / o_.block * o_.block;
  local_start_ = std::clamp(std::min(n - o_.local, covered), 0, n);
  chunk_ = attn::chunk_tokens_for(kv.k.block, Hkv, n);
  auto select = [&](int h, int) { select_head(layer, owner, h, kv, q, rep, local_start_, chunk_); };
  const int64_t select_work =
      static_cast<int64_t>(local_start_ / o_.block) * summ_.vectors() * D * Hkv;
  if (pool && pool->size() > 1 && Hkv > 1 && select_work >= kParallelMacs) {
    pool->run(Hkv, select);
  } else {
    for (int h = 0; h < Hkv; ++h) select(h, 0);
  }
}

void SparseAttention::decode(int layer, int owner, const kv::LayerView& kv, const float* q,
                             float* out, const attn::Params& p, ThreadPool* pool,
                             attn::Workspace& ws) {
  const int n = kv.n_tokens, D = D_, Hkv = Hkv_, rep = p.n_heads / Hkv;
  if (p.window > 0)
    fail("sparse attention: a sliding window (--window) and block selection do not combine");
  if (n == 0) {
    std::fill(out, out + static_cast<size_t>(p.n_heads) * D, 0.0f);
    return;
  }
  const double t_start = now_seconds();
  select(layer, owner, kv, q, p, pool);
  const int C = chunk_;
  int n_tasks = 0;
  int64_t attended = 0;
  for (int h = 0; h < Hkv; ++h) {
    for (int i = 0; i < heads_[h].n_pieces; ++i) {
      task_head_[n_tasks] = h;
      task_piece_[n_tasks++] = i;
      attended += heads_[h].pieces[i].t1 - heads_[h].pieces[i].t0;
    }
  }
  const double t_selected = now_seconds();

  auto task = [&](int ti, int thread) {
    const int h = task_head_[ti];
    const Range& rg = heads_[h].pieces[task_piece_[ti]];
    attn::TaskArgs a;
    a.kv = &kv;
    a.h = h;
    a.t0 = rg.t0;
    a.t1 = rg.t1;
    a.q = q + static_cast<size_t>(h) * rep * D;
    a.rep = rep;
    a.scale = p.scale;
    a.slopes = p.alibi_slopes ? p.alibi_slopes + h * rep : nullptr;
    a.q_pos = n - 1;
    a.out = partial_.data() + static_cast<size_t>(ti) * task_stride_;
    a.out_stride = D + 2;
    a.scratch = ws.thread_scratch(thread);
    a.ld = C;
    a.precision = p.precision;
    a.rope = p.rope;
    a.rope_style = p.rope_style;
    attn::attend_range(a);
  };
  const int64_t macs = 2 * attended * rep * D;
  if (pool && pool->size() > 1 && n_tasks > 1 && macs >= kParallelMacs) {
    pool->run(n_tasks, task);
  } else {
    for (int t = 0; t < n_tasks; ++t) task(t, 0);
  }
  // Merge each head's states in token order, as attn::decode does.
  for (int ti = 0; ti < n_tasks;) {
    const int h = task_head_[ti], count = heads_[h].n_pieces;
    for (int r = 0; r < rep; ++r) {
      float* o = out + (static_cast<size_t>(h) * rep + r) * D;
      const float* first = partial_.data() + static_cast<size_t>(ti) * task_stride_ + r * (D + 2);
      std::copy(first, first + D, o);
      attn::State acc{first[D], first[D + 1], o};
      for (int c = 1; c < count; ++c) {
        float* b = partial_.data() + static_cast<size_t>(ti + c) * task_stride_ + r * (D + 2);
        attn::merge(acc, attn::State{b[D], b[D + 1], b}, D);
      }
      const float inv = 1.0f / acc.d;
      for (int i = 0; i < D; ++i) o[i] *= inv;
    }
    ti += count;
  }
  const double t_end = now_seconds();
  stats_.select_seconds += t_selected - t_start;
  stats_.attend_seconds += t_end - t_selected;
  stats_.calls += 1;
  stats_.tokens_attended += attended;
  stats_.tokens_context += static_cast<int64_t>(n) * Hkv;
}

std::vector<Range> SparseAttention::last_ranges(int h) const {
  const Head& hd = heads_[h];
  return std::vector<Range>(hd.ranges.begin(), hd.ranges.begin() + hd.n_ranges);
}

std::vector<float> SparseAttention::last_scores(int h) const {
  const Head& hd = heads_[h];
  return std::vector<float>(hd.scores.begin(), hd.scores.begin() + hd.n_candidates);
}

std::vector<int> SparseAttention::last_blocks(int h) const {
  const Head& hd = heads_[h];
  return std::vector<int>(hd.blocks.begin(), hd.blocks.begin() + hd.n_blocks);
}

}  // namespace kivi::sparse
