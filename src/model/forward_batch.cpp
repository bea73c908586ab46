#include "model/forward_batch.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/threadpool.h"
#include "core/timer.h"
#include "model/tensor_parallel.h"
#include "ops/ops.h"

namespace kivi::model {

BatchForward::BatchForward(const ModelConfig& c, int max_rows, int max_seqs, int ctx, int n_threads,
                           int kv_block)
    : max_seqs_(std::max(1, max_seqs)),
      ctx_(ctx),
      st_(c, std::max(1, max_rows), ctx, n_threads, kv_block),
      first_row_(max_seqs_ + 1),
      pos0_(max_seqs_),
      last_(static_cast<size_t>(max_seqs_) * c.dim),
      logits_(static_cast<size_t>(max_seqs_) * c.vocab_size),
      out_rows_(max_seqs_) {
  worker_ws_.reserve(std::max(1, n_threads));
  for (int t = 0; t < std::max(1, n_threads); ++t) {
    worker_ws_.emplace_back(1, c.n_heads, c.n_kv_heads, c.head_dim(), kv_block, ctx);
  }
}

void BatchForward::attend(const Model& m, int l, const BatchSequence* seqs, int n_seqs,
                          ThreadPool* pool, const attn::Params& ap, bool per_sequence,
                          attn::PrefillMode prefill) {
  const ModelConfig& c = m.config();
  const int qd = c.q_dim(), kvd = c.kv_dim();
  // One sequence's rows in order: append the token, then attend over the cache as it
  // stands (what model::forward does for a chunk of one sequence).
  // A layer that reads another layer's cache appends nothing and attends, for each row,
  // over the owner's cache as it was after that row's token.
  auto run_seq = [&](int s, ThreadPool* inner, attn::Workspace& ws) {
    kv::KvCache& cache = *seqs[s].cache;
    const int r0 = first_row_[s], n = seqs[s].n;
    const bool borrows = cache.borrows(l);
    if (!borrows && cache.n_tokens(l) == 0) {
      cache.calibrate(l, st_.k.data() + static_cast<size_t>(r0) * kvd,
                      st_.v.data() + static_cast<size_t>(r0) * kvd, n);
    }
    attn::Params p = ap;
    // A chunk of a prefilling sequence attends over query tiles (attn/prefill.h).
    if (prefill == attn::PrefillMode::kTiled && !seqs[s].all_logits && n >= attn::kPrefillMinRows &&
        !borrows && cache.window(l) == 0 && st_.pws.threads() > 0) {
      if (ap.rope) p.rope = ap.rope + static_cast<size_t>(cache.evicted(l)) * c.head_dim();
      attn::append_and_prefill(cache, l, st_.k.data() + static_cast<size_t>(r0) * kvd,
                               st_.v.data() + static_cast<size_t>(r0) * kvd, n,
                               st_.q.data() + static_cast<size_t>(r0) * qd,
                               st_.att.data() + static_cast<size_t>(r0) * qd, p, inner, st_.pws);
      return;
    }
    for (int i = 0; i < n; ++i) {
      const size_t r = static_cast<size_t>(r0 + i);
      if (!borrows) cache.append(l, st_.k.data() + r * kvd, st_.v.data() + r * kvd);
      // Keys before RoPE: cache index t holds position t + evicted (a window drops blocks).
      if (ap.rope) p.rope = ap.rope + static_cast<size_t>(cache.evicted(l)) * c.head_dim();
      attn::decode(borrows ? cache.view_prefix(l, pos0_[s] + i + 1) : cache.view(l),
                   st_.q.data() + r * qd, st_.att.data() + r * qd, p, inner, ws);
    }
  };
  if (per_sequence) {
    pool->run(n_seqs, [&](int s, int thread) { run_seq(s, nullptr, worker_ws_[thread]); });
  } else {
    for (int s = 0; s < n_seqs; ++s) run_seq(s, pool, st_.ws);
  }
}

void BatchForward::run(const Model& m, const BatchSequence* seqs, int n_seqs, ThreadPool* pool,
                       const ForwardOptions& opt) {
  const ModelConfig& c = m.config();
  const Weights& w = m.weights();
  const int dim = c.dim, qd = c.q_dim(), kvd = c.kv_dim(), hd = c.head_dim();
  if (n_seqs < 1 || n_seqs > max_seqs_) fail("batch of %d sequences (1 to %d)", n_seqs, max_seqs_);
  int rows = 0;
  bool one_row_each = true;
  for (int s = 0; s < n_seqs; ++s) {
    const BatchSequence& q = seqs[s];
    if (!q.cache || q.n < 1) fail("batch sequence %d has no cache or no tokens", s);
    if (q.all_logits && !q.logits) fail("batch sequence %d wants every logit but has no buffer", s);
    const int pos0 = q.cache->n_tokens(0);
    if (pos0 + q.n > std::min(q.cache->capacity(), ctx_)) {
      fail("context full: sequence %d holds %d tokens, %d more exceed its context of %d", s, pos0,
           q.n, std::min(q.cache->capacity(), ctx_));
    }
    for (int i = 0; i < q.n; ++i) {
      if (q.tokens[i] < 0 || q.tokens[i] >= c.vocab_size) {
        fail("token id %d outside the vocabulary (0 to %d)", q.tokens[i], c.vocab_size - 1);
      }
    }
    first_row_[s] = rows;
    pos0_[s] = pos0;
    rows += q.n;
    one_row_each = one_row_each && q.n == 1;
    if (rows > st_.max_batch)
      fail("batch of %d rows exceeds the maximum of %d", rows, st_.max_batch);
  }
  first_row_[n_seqs] = rows;
  // All caches of a batch share one configuration (they draw on one pool).
  const kv::KvCache& c0 = *seqs[0].cache;
  bool sharing = false;
  for (int l = 0; l < c.n_layers; ++l) sharing = sharing || c0.borrows(l);
  if (sharing && c0.config().has_residual() && rows > n_seqs) {
    // KIVI caches quantize their residual as tokens arrive, so a layer reading another
    // layer's cache can attend only over its latest state: one token per sequence.
    fail("batch: with cross-layer sharing of KIVI caches each sequence takes one token per step");
  }
  // Blocks for this step's tokens are taken from the pool here, on this thread, so
  // that appends running on several workers never allocate.
  for (int s = 0; s < n_seqs; ++s) seqs[s].cache->map_blocks(pos0_[s] + seqs[s].n);
  const int threads = pool ? pool->size() : 1;
  const bool per_sequence = pool && threads > 1 && one_row_each && n_seqs >= 2 * threads &&
                            static_cast<int>(worker_ws_.size()) >= threads;

  for (int s = 0; s < n_seqs; ++s) {
    for (int i = 0; i < seqs[s].n; ++i) {
      ops::copy_row(w.token_embd, seqs[s].tokens[i],
                    st_.x.data() + static_cast<size_t>(first_row_[s] + i) * dim);
    }
  }
  scale_embedding(c, st_.x.data(), rows);
  attn::Params ap;
  ap.n_heads = c.n_heads;
  ap.scale = c.attention_scale();
  ap.softcap = c.attn_softcap;
  ap.alibi_slopes = c.alibi ? st_.slopes.data() : nullptr;
  ap.window = opt.window;
  ap.precision = opt.precision;
  ap.rope_style = c.rope_style;
  // Keys stored before RoPE: the cache gets them as the K projection leaves them, and
  // attention rotates each by its position.
  const bool pre_rope = !c.alibi && c0.config().key_rope == kv::KeyRope::kPre;

  for (int l = 0; l < c.n_layers; ++l) {
    // Sliding-window layers may rotate with RoPE of their own (gemma3).
    const AlignedBuffer<float>& table = c.local_rope(l) ? st_.rope_local : st_.rope;
    if (pre_rope) ap.rope = table.data();
    const LayerWeights& L = w.layers[l];
    ap.head_sinks = L.sinks.empty() ? nullptr : L.sinks.data();
    for (int r = 0; r < rows; ++r) {
      ops::rmsnorm(st_.xb.data() + static_cast<size_t>(r) * dim,
                   st_.x.data() + static_cast<size_t>(r) * dim, L.attn_norm.data(), dim,
                   c.norm_eps);
    }
    // A borrowing layer computes only its queries: no K and V projections.
    const bool borrows = c0.borrows(l);
    ops::matmul(L.wq, st_.xb.data(), rows, st_.q.data(), pool);
    if (!borrows) {
      ops::matmul(L.wk, st_.xb.data(), rows, st_.k.data(), pool);
      ops::matmul(L.wv, st_.xb.data(), rows, st_.v.data(), pool);
    }
    finish_projections(c, L, st_.q.data(), borrows ? nullptr : st_.k.data(), st_.v.data(), rows);
    if (!c.alibi) {
      for (int s = 0; s < n_seqs; ++s) {
        for (int i = 0; i < seqs[s].n; ++i) {
          const int r = first_row_[s] + i;
          const float* rr = table.data() + static_cast<size_t>(pos0_[s] + i) * hd;
          apply_rope(st_.q.data() + static_cast<size_t>(r) * qd, c.n_heads, hd, rr, c.rope_style);
          if (!pre_rope && !borrows)
            apply_rope(st_.k.data() + static_cast<size_t>(r) * kvd, c.n_kv_heads, hd, rr,
                       c.rope_style);
        }
      }
    }
    // A sliding-window layer attends its last `window` tokens (with --window too: the smaller).
    const int lw = c.layer_window(l);
    ap.window = lw > 0 && opt.window > 0 ? std::min(lw, opt.window) : std::max(lw, opt.window);
    const double t0 = opt.attn_seconds ? now_seconds() : 0.0;
    attend(m, l, seqs, n_seqs, pool, ap, per_sequence, opt.prefill);
    if (opt.attn_seconds) *opt.attn_seconds += now_seconds() - t0;
    ops::matmul(L.wo, st_.att.data(), rows, st_.xb2.data(), pool);
    output_bias(c, L, st_.xb2.data(), rows);
    tp_reduce(m, st_.xb2.data(), static_cast<size_t>(rows) * dim);
    post_norm(c, L.attn_post_norm, st_.xb2.data(), rows);
    ops::add_inplace(st_.x.data(), st_.xb2.data(), rows * dim);
    for (int r = 0; r < rows; ++r) {
      ops::rmsnorm(st_.xb.data() + static_cast<size_t>(r) * dim,
                   st_.x.data() + static_cast<size_t>(r) * dim, L.ffn_norm.data(), dim, c.norm_eps);
    }
    ffn(c, L, st_.xb.data(), rows, st_.xb2.data(), st_.hb.data(), st_.hb2.data(), st_.moe, pool);
    tp_reduce(m, st_.xb2.data(), static_cast<size_t>(rows) * dim);
    post_norm(c, L.ffn_post_norm, st_.xb2.data(), rows);
    ops::add_inplace(st_.x.data(), st_.xb2.data(), rows * dim);
  }

  // The classifier over the last row of each sequence that wants logits (every row of
  // one that wants all), in one product.
  int n_out = 0;
  for (int s = 0; s < n_seqs; ++s) {
    if (seqs[s].logits) n_out += seqs[s].all_logits ? seqs[s].n : 1;
  }
  if (n_out == 0) return;
  if (n_out > out_rows_) {
    out_rows_ = n_out;
    last_.reset(static_cast<size_t>(n_out) * dim);
    logits_.reset(static_cast<size_t>(n_out) * c.vocab_size);
  }
  int i = 0;
  for (int s = 0; s < n_seqs; ++s) {
    if (!seqs[s].logits) continue;
    for (int r = seqs[s].all_logits ? first_row_[s] : first_row_[s + 1] - 1; r < first_row_[s + 1];
         ++r) {
      ops::rmsnorm(last_.data() + static_cast<size_t>(i++) * dim,
                   st_.x.data() + static_cast<size_t>(r) * dim, w.output_norm.data(), dim,
                   c.norm_eps);
    }
  }
  classify(m, last_.data(), n_out, logits_.data(), pool);
  i = 0;
  for (int s = 0; s < n_seqs; ++s) {
    if (!seqs[s].logits) continue;
    const int n = seqs[s].all_logits ? seqs[s].n : 1;
    std::memcpy(seqs[s].logits, logits_.data() + static_cast<size_t>(i) * c.vocab_size,
                static_cast<size_t>(n) * c.vocab_size * sizeof(float));
    i += n;
  }
}

}  // namespace kivi::model
