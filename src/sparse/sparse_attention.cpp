#include "sparse/sparse_attention.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>

#include "attn/task.h"
#include "core/error.h"
#include "core/threadpool.h"
#include "core/timer.h"
#include "kv/codec.h"
#include "ops/ops.h"
#include "sparse/score.h"

namespace kivi::sparse {

namespace {

// Calls with fewer multiply-adds than this run on the caller alone (as attn::decode).
constexpr int64_t kParallelMacs = int64_t{1} << 17;

// The layers whose cache some selecting layer reads: they keep summaries (a layer that
// reuses another's selection reads no summary).
std::vector<char> summarized_layers(const Options& o, const kv::CacheConfig& c) {
  std::vector<char> layers(c.n_layers, 0);
  if (!o.enabled()) return layers;
  const std::vector<int> owner = kv::layer_owners(c);
  for (int l = o.dense_layers; l < c.n_layers; l += o.reuse_layers) layers[owner[l]] = 1;
  return layers;
}

void check_fits(const Options& o, const kv::CacheConfig& c) {
  o.validate();
  if (!o.enabled()) return;
  const bool kivi_keys = c.any_stream(
      [](const kv::StreamFormat& f, bool key) { return key && kv::is_kivi(f.format); });
  if (kivi_keys && o.block % c.group_size != 0) {
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

uint64_t SparseAttention::scratch_bytes(const Options& o, const kv::CacheConfig& c, int n_heads) {
  if (!o.enabled()) return 0;
  const uint64_t n_blocks = (static_cast<uint64_t>(c.ctx) + o.block - 1) / o.block;
  const uint64_t hkv = static_cast<uint64_t>(c.n_kv_heads);
  uint64_t b = hkv * n_blocks * 3 * sizeof(float);  // scores, candidate scores and indices
  if (o.preselect > 0) {
    const uint64_t rep = static_cast<uint64_t>(n_heads) / hkv;
    int selecting = 0;
    for (int l = o.dense_layers; l < c.n_layers; l += o.reuse_layers) ++selecting;
    b += hkv * rep * static_cast<uint64_t>(c.ctx) * sizeof(float) +
         static_cast<uint64_t>(selecting) * hkv * n_blocks * (sizeof(float) + 1);
  }
  return b;
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
  const int rep = n_heads / Hkv_;
  heads_.resize(Hkv_);
  for (auto& hd : heads_) {
    hd.scores.resize(std::max(1, n_blocks));
    hd.cand_scores.resize(std::max(1, n_blocks));
    hd.cand_index.resize(std::max(1, n_blocks));
    if (o.preselect > 0) hd.probs.resize(static_cast<size_t>(rep) * c.ctx);
    hd.key.resize(D_);
    if (o.preselect > 0) hd.keys.resize(static_cast<size_t>(std::max(1, c.group_size)) * D_);
    hd.heap.resize(std::max(1, max_sel_));
    hd.blocks.resize(std::max(1, max_sel_));
    hd.ranges.resize(max_sel_ + 2);
    hd.pieces.resize(max_pieces);
    hd.w.resize(2 * static_cast<size_t>(D_));
  }
  shared_.resize(std::max(1, n_blocks));
  sel_.resize(c.n_layers);
  for (int l = o.enabled() ? o.dense_layers : c.n_layers; l < c.n_layers; l += o.reuse_layers) {
    Selection& sl = sel_[l];
    sl.blocks.resize(static_cast<size_t>(Hkv_) * std::max(1, max_sel_));
    sl.count.assign(Hkv_, 0);
    if (o.preselect > 0) {
      sl.votes.assign(static_cast<size_t>(Hkv_) * n_blocks, 0.0f);
      sl.cand.assign(sl.votes.size(), 0);
    }
  }
  task_stride_ = (static_cast<size_t>(rep) * (D_ + 2) + 15) / 16 * 16;
  partial_.reset(task_stride_ * Hkv_ * max_pieces);
  task_head_.resize(static_cast<size_t>(Hkv_) * max_pieces);
  task_first_.resize(task_head_.size());
  task_count_.resize(task_head_.size());
  piece_base_.resize(Hkv_);
}

void SparseAttention::score_head(int layer, int owner, int h, const float* q, int rep, int n,
                                 int candidates) {
  Head& hd = heads_[h];
  const int D = D_;
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
    case Kind::kFix:
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
}

int SparseAttention::top_blocks(const float* scores, Head& scratch, const Selection& sel, int h,
                                int candidates, int k, int* out) {
  if (sel.cand_limit < 0) return top_k(scores, candidates, k, out, scratch.heap.data());
  // Rank the preselected blocks and those filled since the prefill, nothing else.
  const char* flag = sel.cand.data() + static_cast<size_t>(h) * summ_.n_blocks();
  int m = 0;
  for (int b = 0; b < candidates; ++b) {
    if (b >= sel.cand_limit || flag[b]) {
      scratch.cand_scores[m] = scores[b];
      scratch.cand_index[m++] = b;
    }
  }
  const int got = top_k(scratch.cand_scores.data(), m, std::min(k, m), out, scratch.heap.data());
  for (int i = 0; i < got; ++i) out[i] = scratch.cand_index[out[i]];
  return got;
}

void SparseAttention::observe(const kv::LayerView& kv, const float* q, const attn::Params& p,
                              int rep, int h, Selection& sel) {
  // The softmax weights of the query heads of KV head h over every token (logits in
  // float, their normalization in double), summed per block into the votes.
  Head& hd = heads_[h];
  const int n = kv.n_tokens, D = D_, B = o_.block;
  const int q_pos = n - 1;
  float* lg = hd.probs.data();  // [rep][n] logits, then weights
  auto score = [&](int t, float* key) {
    if (p.rope) attn::rotate_rope(key, D, p.rope + static_cast<size_t>(t) * D, p.rope_style);
    for (int r = 0; r < rep; ++r) {
      const float* qr = q + (static_cast<size_t>(h) * rep + r) * D;
      float d = ops::dot(qr, key, static_cast<size_t>(D)) * p.scale;
      if (p.softcap > 0.0f) d = p.softcap * std::tanh(d / p.softcap);
      if (p.alibi_slopes) d += p.alibi_slopes[h * rep + r] * static_cast<float>(t - q_pos);
      lg[static_cast<size_t>(r) * n + t] = d;
    }
  };
  // KIVI keys a stored group at a time (the codec's group dequantizer), others a token
  // at a time.
  const kv::StreamView& K = kv.k;
  const int G = K.group;
  const bool groups = kv::is_kivi(K.fmt.format) && K.per_channel;
  const size_t param_bytes = kv::param_size(K.param_type);
  for (int t = 0; t < n;) {
    if (groups && t % G == 0 && t + G <= std::min(K.n_stored, n)) {
      float* keys = hd.keys.data();
      const size_t pi = K.group_params(t, h) * param_bytes;
      kv::dequantize_keys(K.group_codes(t, h), K.scales + pi, K.zeros + pi, 1, G, D, G,
                          kv::format_bits(K.fmt.format), K.param_type, keys);
      for (int i = 0; i < G; ++i) score(t + i, keys + static_cast<size_t>(i) * D);
      t += G;
      continue;
    }
    float* key = hd.key.data();
    if (t < K.n_stored) {
      attn::dequantize_key(K, t, h, key);
    } else {
      std::copy(K.residual_row(t, h), K.residual_row(t, h) + D, key);
    }
    score(t, key);
    ++t;
  }
  float* votes = sel.votes.data() + static_cast<size_t>(h) * summ_.n_blocks();
  for (int r = 0; r < rep; ++r) {
    float* x = lg + static_cast<size_t>(r) * n;
    const float m = *std::max_element(x, x + n);
    double den = 0.0;
    for (int t = 0; t < n; ++t) den += (x[t] = std::exp(x[t] - m));
    const double inv = 1.0 / den;
    for (int t = 0; t < n; ++t) votes[t / B] += static_cast<float>(x[t] * inv);
  }
}

void SparseAttention::pick_candidates(Selection& sel, int n_full) {
  const int nb = summ_.n_blocks(), keep = std::min(n_full, o_.candidates / o_.block);
  const bool shared = o_.heads == Heads::kShared;
  std::vector<float> votes(std::max(1, n_full)), pooled(votes.size());
  std::vector<int> top(votes.size());
  std::vector<std::pair<float, int>> heap(votes.size());
  std::fill(sel.cand.begin(), sel.cand.end(), 0);
  for (int h = 0; h < (shared ? 1 : Hkv_); ++h) {
    for (int b = 0; b < n_full; ++b) {
      votes[b] = 0.0f;
      for (int g = shared ? 0 : h; g < (shared ? Hkv_ : h + 1); ++g)
        votes[b] += sel.votes[static_cast<size_t>(g) * nb + b];
    }
    // Max-pooling over each block and its neighbours keeps a block beside a strong one.
    for (int b = 0; b < n_full; ++b) {
      float v = votes[b];
      if (b > 0) v = std::max(v, votes[b - 1]);
      if (b + 1 < n_full) v = std::max(v, votes[b + 1]);
      pooled[b] = v;
    }
    const int got = top_k(pooled.data(), n_full, keep, top.data(), heap.data());
    for (int g = shared ? 0 : h; g < (shared ? Hkv_ : h + 1); ++g)
      for (int i = 0; i < got; ++i) sel.cand[static_cast<size_t>(g) * nb + top[i]] = 1;
  }
  sel.cand_limit = n_full;
  sel.n = -1;  // the next call selects among the candidates
}

void SparseAttention::begin_prefill(int pos0, int n) {
  if (!o_.enabled() || o_.preselect <= 0 || n <= 0) return;
  obs_end_ = pos0 + n;
  obs_start_ = std::max(pos0, obs_end_ - o_.preselect);
  for (auto& sl : sel_) {
    std::fill(sl.votes.begin(), sl.votes.end(), 0.0f);
    sl.cand_limit = -1;
  }
}

bool SparseAttention::has_candidates(int layer) const { return sel_[layer].cand_limit >= 0; }

std::vector<int> SparseAttention::candidates(int layer, int h) const {
  std::vector<int> out;
  const Selection& sl = sel_[layer];
  if (sl.cand_limit < 0) return out;
  for (int b = 0; b < summ_.n_blocks(); ++b)
    if (sl.cand[static_cast<size_t>(h) * summ_.n_blocks() + b]) out.push_back(b);
  return out;
}

int SparseAttention::candidate_limit(int layer) const { return sel_[layer].cand_limit; }

void SparseAttention::reset() {
  summ_.clear();
  for (auto& sl : sel_) {
    sl.n = -1;
    sl.cand_limit = -1;
    std::fill(sl.votes.begin(), sl.votes.end(), 0.0f);
  }
  obs_start_ = obs_end_ = 0;
}

// Runs f(i, thread) for i in [0, count): on the pool when there is enough work to share.
template <class F>
static void run_tasks(ThreadPool* pool, int count, int64_t work, F&& f) {
  if (pool && pool->size() > 1 && count > 1 && work >= kParallelMacs) {
    pool->run(count, f);
  } else {
    for (int i = 0; i < count; ++i) f(i, 0);
  }
}

void SparseAttention::select(int layer, int owner, const kv::LayerView& kv, const float* q,
                             const attn::Params& p, ThreadPool* pool) {
  const int n = kv.n_tokens, D = D_, Hkv = Hkv_, rep = p.n_heads / Hkv, B = o_.block;
  auto run = [&](int count, int64_t work, auto&& f) { run_tasks(pool, count, work, f); };
  const int sl = selector(layer);
  Selection& sel = sel_[sl];
  // Tokens from local_start on are always attended: the local window and every token
  // without a summary (KIVI's residual, a block still filling).
  // Random scores need no summaries: its blocks are the stored ones.
  auto covered = [&] {
    return summ_.vectors() > 0 ? summ_.summarized(owner) : std::min(kv.k.n_stored, n) / B * B;
  };
  if (layer == sl && o_.preselect > 0 && n - 1 >= obs_start_ && n - 1 < obs_end_) {
    run(Hkv, static_cast<int64_t>(n) * rep * D * Hkv,
        [&](int h, int) { observe(kv, q, p, rep, h, sel); });
    if (n == obs_end_) {
      summ_.update(owner, kv, p.rope, p.rope_style);
      pick_candidates(sel, covered() / B);
    }
  }
  // Where the local window ends in this cache: its end, or under context parallelism
  // past it when the query is in a later shard (set_shard_query). Reselection counts
  // queries by it, so a full shard reselects as the query moves on.
  const int window_end = shard_query_ >= 0 ? shard_query_ + 1 - shard_start_ : n;
  const int sinks = shard_start_ == 0 ? o_.sinks : 0;
  const bool selects = layer == sl && (o_.reselect <= 1 || sel.n < 0 || window_end < sel.n ||
                                       window_end - sel.n >= o_.reselect);
  // A layer that reuses a selection attends its blocks with the local window reaching
  // back to where it began then, so every token since is attended; without a selection
  // to reuse (none yet, or made on a longer cache) it attends every token.
  const bool reuses = !selects && sel.n >= 0 && sel.n <= window_end;
  int local_start = 0;
  const int C = attn::chunk_tokens_for(kv.k.block, Hkv, n);
  if (selects) {
    summ_.update(owner, kv, p.rope, p.rope_style);
    local_start = std::clamp(std::min(window_end - o_.local, covered()), 0, n);
    const int candidates = (local_start + B - 1) / B;  // blocks that start before the local window
    const int k = std::min(max_sel_, candidates);
    const int64_t select_work = static_cast<int64_t>(candidates) * summ_.vectors() * D * Hkv;
    if (o_.heads == Heads::kShared) {
      if (k > 0) {
        run(Hkv, select_work,
            [&](int h, int) { score_head(layer, owner, h, q, rep, n, candidates); });
        std::copy(heads_[0].scores.begin(), heads_[0].scores.begin() + candidates, shared_.begin());
        for (int h = 1; h < Hkv; ++h)
          for (int b = 0; b < candidates; ++b) shared_[b] += heads_[h].scores[b];
      }
      const int got =
          k > 0 ? top_blocks(shared_.data(), heads_[0], sel, 0, candidates, k, sel.blocks.data())
                : 0;
      sel.count[0] = got;
      for (int h = 1; h < Hkv; ++h) {
        std::copy(sel.blocks.begin(), sel.blocks.begin() + got,
                  sel.blocks.begin() + static_cast<size_t>(h) * std::max(1, max_sel_));
        sel.count[h] = got;
      }
    } else {
      run(Hkv, select_work, [&](int h, int) {
        int* blocks = sel.blocks.data() + static_cast<size_t>(h) * std::max(1, max_sel_);
        sel.count[h] = 0;
        if (k == 0) return;
        score_head(layer, owner, h, q, rep, n, candidates);
        sel.count[h] =
            top_blocks(heads_[h].scores.data(), heads_[h], sel, h, candidates, k, blocks);
      });
    }
    sel.n = window_end;
    sel.local_start = local_start;
    stats_.selections += 1;
  } else if (reuses) {
    local_start = std::clamp(std::min(window_end - o_.local, sel.local_start), 0, n);
  }
  const int scored =
      selects ? std::min(max_sel_, (local_start + B - 1) / B) > 0 ? (local_start + B - 1) / B : 0
              : 0;
  for (int h = 0; h < Hkv; ++h) {
    Head& hd = heads_[h];
    hd.n_candidates = scored;
    hd.n_blocks = selects || reuses ? sel.count[h] : 0;
    const int* blocks = sel.blocks.data() + static_cast<size_t>(h) * std::max(1, max_sel_);
    std::copy(blocks, blocks + hd.n_blocks, hd.blocks.begin());
    hd.n_ranges =
        attended_ranges(hd.blocks.data(), hd.n_blocks, B, sinks, local_start, n, hd.ranges.data());
    hd.n_pieces = split_ranges(hd.ranges.data(), hd.n_ranges, C, hd.pieces.data());
    assert(hd.n_pieces <= static_cast<int>(hd.pieces.size()));
  }
  local_start_ = local_start;
  chunk_ = C;
}

void SparseAttention::decode(int layer, int owner, const kv::LayerView& kv, const float* q,
                             float* out, const attn::Params& p, ThreadPool* pool,
                             attn::Workspace& ws) {
  attend(layer, owner, kv, q, out, p, pool, ws, false);
}

void SparseAttention::decode_state(int layer, int owner, const kv::LayerView& kv, const float* q,
                                   float* states, const attn::Params& p, ThreadPool* pool,
                                   attn::Workspace& ws) {
  attend(layer, owner, kv, q, states, p, pool, ws, true);
}

void SparseAttention::attend(int layer, int owner, const kv::LayerView& kv, const float* q,
                             float* out, const attn::Params& p, ThreadPool* pool,
                             attn::Workspace& ws, bool states) {
  const int n = kv.n_tokens, D = D_, Hkv = Hkv_, rep = p.n_heads / Hkv;
  if (p.window > 0)
    fail("sparse attention: a sliding window (--window) and block selection do not combine");
  if (n == 0) {
    if (!states) {
      std::fill(out, out + static_cast<size_t>(p.n_heads) * D, 0.0f);
      return;
    }
    attn::empty_states(out, p.n_heads, D);  // an empty shard: no mass
    return;
  }
  const double t_start = now_seconds();
  select(layer, owner, kv, q, p, pool);
  // Tasks: each KV head's pieces in runs of consecutive pieces, enough runs for every
  // thread. A task attends its pieces in order and prefetches the next piece's bytes
  // before attending one: the pieces are scattered blocks, and without it each one
  // starts with a wait on memory (~1 us a piece).
  const int C = chunk_;
  const int threads = pool ? std::max(1, pool->size()) : 1;
  const int runs_per_head = std::max(1, (2 * threads + Hkv - 1) / Hkv);
  int n_tasks = 0, n_pieces = 0;
  int64_t attended = 0;
  for (int h = 0; h < Hkv; ++h) {
    const int np = heads_[h].n_pieces, runs = std::min(runs_per_head, np);
    piece_base_[h] = n_pieces;
    for (int r = 0; r < runs; ++r) {
      task_head_[n_tasks] = h;
      task_first_[n_tasks] = n_pieces + r * np / runs;
      task_count_[n_tasks++] = (r + 1) * np / runs - r * np / runs;
    }
    for (int i = 0; i < np; ++i) attended += heads_[h].pieces[i].t1 - heads_[h].pieces[i].t0;
    n_pieces += np;
  }
  const double t_selected = now_seconds();

  auto task = [&](int ti, int thread) {
    const int h = task_head_[ti], base = piece_base_[h];
    const Range* pieces = heads_[h].pieces.data();
    const int end = task_first_[ti] + task_count_[ti];
    for (int j = task_first_[ti]; j < end; ++j) {
      const Range& rg = pieces[j - base];
      if (j + 1 < end)
        attn::prefetch_range(kv, h, pieces[j + 1 - base].t0, pieces[j + 1 - base].t1);
      attn::attend_range(attn::decode_task(kv, q, p, h, rg.t0, rg.t1,
                                           partial_.data() + static_cast<size_t>(j) * task_stride_,
                                           ws.thread_scratch(thread), C));
    }
  };
  run_tasks(pool, n_tasks, 2 * attended * rep * D, task);
  // Merge each head's states in token order, as attn::decode does.
  // (Every head has a piece: the local window holds at least the query's own token.)
  for (int h = 0; h < Hkv; ++h) {
    const float* first = partial_.data() + static_cast<size_t>(piece_base_[h]) * task_stride_;
    if (states) {
      attn::merge_partial_states(first, task_stride_, heads_[h].n_pieces, rep, D,
                                 out + static_cast<size_t>(h) * rep * (D + 2));
    } else {
      attn::merge_partials(first, task_stride_, heads_[h].n_pieces, rep, D,
                           out + static_cast<size_t>(h) * rep * D,
                           p.head_sinks ? p.head_sinks + static_cast<size_t>(h) * rep : nullptr);
    }
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
