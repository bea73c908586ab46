#include "model/forward.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/threadpool.h"
#include "core/timer.h"
#include "model/finite.h"
#include "model/tensor_parallel.h"
#include "ops/ops.h"
#include "sparse/sparse_attention.h"

namespace kivi::model {

void fill_rope_row(float* row, int64_t pos, int hd, float theta, float freq_scale,
                   const float* factors) {
  // Angles in double: at long positions a float angle pos * freq loses digits (llama2.c
  // computes it in float; the difference is below 1e-4 in the logits either way).
  for (int i = 0; i < hd; i += 2) {
    double freq = freq_scale / std::pow(static_cast<double>(theta), static_cast<double>(i) / hd);
    if (factors) freq /= factors[i / 2];
    const double val = static_cast<double>(pos) * freq;
    row[i] = static_cast<float>(std::cos(val));
    row[i + 1] = static_cast<float>(std::sin(val));
  }
}

void fill_rope_table(float* table, int ctx, int hd, float theta, float freq_scale,
                     const float* factors) {
  for (int pos = 0; pos < ctx; ++pos) {
    fill_rope_row(table + static_cast<size_t>(pos) * hd, pos, hd, theta, freq_scale, factors);
  }
}

void fill_yarn_row(float* row, int64_t pos, int hd, float theta, float freq_scale, int orig_ctx,
                   float beta_fast, float beta_slow) {
  // The pairs that turn `beta` times in orig_ctx tokens bound the ramp (llama.cpp rounds
  // the fast one down and the slow one up, in float).
  auto corr = [&](float beta) {
    return static_cast<float>(hd) *
           std::log(static_cast<float>(orig_ctx) / (beta * 2.0f * static_cast<float>(M_PI))) /
           (2.0f * std::log(theta));
  };
  const float low = std::max(0.0f, std::floor(corr(beta_fast)));
  const float high = std::min(static_cast<float>(hd - 1), std::ceil(corr(beta_slow)));
  const double mscale = 1.0 + 0.1 * std::log(1.0 / freq_scale);
  for (int i = 0; i < hd; i += 2) {
    const double extrap = static_cast<double>(pos) /
                          std::pow(static_cast<double>(theta), static_cast<double>(i) / hd);
    const double interp = extrap * freq_scale;
    const float y = (static_cast<float>(i / 2) - low) / std::max(0.001f, high - low);
    const double mix = 1.0 - std::min(1.0f, std::max(0.0f, y));
    const double val = interp * (1.0 - mix) + extrap * mix;
    row[i] = static_cast<float>(std::cos(val) * mscale);
    row[i + 1] = static_cast<float>(std::sin(val) * mscale);
  }
}

void fill_rope_row(float* row, int64_t pos, const ModelConfig& c, int ctx, bool local) {
  // The rotated channels' pairs come first in the row (a NeoX model's rotated channels are
  // moved there at load: model/model.cpp); the rest pass unrotated, unscaled.
  const int hd = c.head_dim(), rd = c.rope_dim();
  const float theta = local ? c.rope_theta_swa : c.rope_theta;
  const float scale = local ? c.rope_freq_scale_swa : c.rope_freq_scale;
  if (c.yarn_orig_ctx > 0) {
    fill_yarn_row(row, pos, rd, theta, scale, c.yarn_orig_ctx, c.yarn_beta_fast, c.yarn_beta_slow);
  } else {
    fill_rope_row(row, pos, rd, theta, scale, local ? nullptr : c.freq_factors(ctx));
  }
  if (c.rope_attn_factor != 1.0f)
    for (int i = 0; i < rd; ++i) row[i] *= c.rope_attn_factor;
  for (int i = rd; i < hd; i += 2) {
    row[i] = 1.0f;
    row[i + 1] = 0.0f;
  }
}

void fill_rope_rotation(float* row, int64_t pos, const ModelConfig& c, int ctx, bool local) {
  fill_rope_row(row, pos, c, ctx, local);
  for (int i = 0; i < c.head_dim(); i += 2) {
    const double r = std::hypot(static_cast<double>(row[i]), static_cast<double>(row[i + 1]));
    row[i] = static_cast<float>(row[i] / r);
    row[i + 1] = static_cast<float>(row[i + 1] / r);
  }
}

void fill_rope_table(float* table, int ctx, const ModelConfig& c, bool local) {
  for (int pos = 0; pos < ctx; ++pos)
    fill_rope_row(table + static_cast<size_t>(pos) * c.head_dim(), pos, c, ctx, local);
}

void scale_embedding(const ModelConfig& c, float* x, int n) {
  if (!c.embed_scale) return;
  const float s = std::sqrt(static_cast<float>(c.dim));
  for (size_t i = 0; i < static_cast<size_t>(n) * c.dim; ++i) x[i] *= s;
}

void post_norm(const ModelConfig& c, const std::vector<float>& weight, float* x, int n) {
  if (!c.post_norms) return;
  for (int i = 0; i < n; ++i) {
    float* xi = x + static_cast<size_t>(i) * c.dim;
    ops::rmsnorm(xi, xi, weight.data(), c.dim, c.norm_eps);
  }
}

void output_bias(const ModelConfig& c, const LayerWeights& L, float* x, int n) {
  if (L.bo.empty() || c.tp.rank != 0) return;
  for (int i = 0; i < n; ++i)
    ops::add_inplace(x + static_cast<size_t>(i) * c.dim, L.bo.data(), c.dim);
}

void apply_rope(float* x, int n_heads, int hd, const float* rope_row, attn::RopeStyle style) {
  for (int h = 0; h < n_heads; ++h)
    attn::rotate_rope(x + static_cast<size_t>(h) * hd, hd, rope_row, style);
}

void finish_projections(const ModelConfig& c, const LayerWeights& L, float* q, float* k, float* v,
                        int n) {
  const int qd = c.q_dim(), kvd = c.kv_dim(), hd = c.head_dim();
  for (int i = 0; i < n; ++i) {
    float* qi = q + static_cast<size_t>(i) * qd;
    float* ki = k ? k + static_cast<size_t>(i) * kvd : nullptr;
    if (c.attn_bias) {
      ops::add_inplace(qi, L.bq.data(), qd);
      if (k) {
        ops::add_inplace(ki, L.bk.data(), kvd);
        ops::add_inplace(v + static_cast<size_t>(i) * kvd, L.bv.data(), kvd);
      }
    }
    if (c.qk_norm) {
      for (int h = 0; h < c.n_heads; ++h)
        ops::rmsnorm(qi + h * hd, qi + h * hd, L.q_norm.data(), hd, c.norm_eps);
      for (int h = 0; k && h < c.n_kv_heads; ++h)
        ops::rmsnorm(ki + h * hd, ki + h * hd, L.k_norm.data(), hd, c.norm_eps);
    }
  }
}

ForwardState::ForwardState(const ModelConfig& c, int mb, int ctx, int n_threads, int kv_block)
    : max_batch(mb),
      x(static_cast<size_t>(mb) * c.dim),
      xb(static_cast<size_t>(mb) * c.dim),
      xb2(static_cast<size_t>(mb) * c.dim),
      q(static_cast<size_t>(mb) * c.q_dim()),
      k(static_cast<size_t>(mb) * c.kv_dim()),
      v(static_cast<size_t>(mb) * c.kv_dim()),
      att(static_cast<size_t>(mb) * c.q_dim()),
      hb(static_cast<size_t>(mb) * c.hidden_dim),
      hb2(static_cast<size_t>(mb) * c.hidden_dim),
      moe(c, mb),
      rope(static_cast<size_t>(ctx) * c.head_dim()),
      rope_local(c.has_local_rope() ? static_cast<size_t>(ctx) * c.head_dim() : 0),
      rope_rows(ctx),
      rope_batch(static_cast<size_t>(2 * mb) * c.head_dim()),
      rope_ptrs(2 * mb),
      ws(n_threads, c.n_heads, c.n_kv_heads, c.head_dim(), kv_block, ctx),
      pws(mb >= attn::kPrefillMinRows
              ? attn::PrefillWorkspace(n_threads, c.n_heads, c.n_kv_heads, c.head_dim())
              : attn::PrefillWorkspace()) {
  fill_rope_table(rope.data(), ctx, c);
  if (c.has_local_rope()) fill_rope_table(rope_local.data(), ctx, c, true);
  if (c.alibi) {
    // Under tensor parallelism the slopes of this process's heads among all of them.
    const bool tp = c.tp.size > 1;
    slopes = attn::alibi_slopes(tp ? c.tp.n_heads_total : c.n_heads);
    if (tp) slopes.assign(slopes.begin() + c.tp.head0, slopes.begin() + c.tp.head0 + c.n_heads);
  }
}

void forward(const Model& m, ForwardState& st, kv::KvCache& cache, const int* tokens, int n,
             float* logits, bool all_logits, ThreadPool* pool, const ForwardOptions& opt) {
  const ModelConfig& c = m.config();
  const Weights& w = m.weights();
  const int dim = c.dim, qd = c.q_dim(), kvd = c.kv_dim(), hd = c.head_dim();
  if (n < 1 || n > st.max_batch) fail("forward: batch of %d tokens (max %d)", n, st.max_batch);
  // Absolute position of the first token (layers with a sliding window hold fewer; a
  // context-parallel shard holds only its own positions).
  const CpShard& cp = opt.cp;
  const int pos0 = cp.comm ? static_cast<int>(st.cp_pos) : cache.position(0);
  const int capacity = cp.comm ? cp.ctx : cache.capacity();
  if (pos0 + n > capacity) {
    fail("context full: %d tokens in the cache + %d new exceed the context of %d", pos0, n,
         capacity);
  }
  // A layer that reads another layer's cache attends, for token i of the batch, over
  // the owner's cache as it was after token i. Row formats keep that state (a prefix);
  // KIVI caches quantize their residual as they go, so with sharing the batch runs one
  // token at a time through all layers (the same arithmetic as decoding it).
  bool sharing = false;
  for (int l = 0; l < c.n_layers; ++l) sharing = sharing || cache.borrows(l);
  if (sharing && n > 1 && cache.config().has_residual()) {
    const int V = c.vocab_size;
    for (int i = 0; i < n; ++i) {
      float* out = !logits      ? nullptr
                   : all_logits ? logits + static_cast<size_t>(i) * V
                   : i == n - 1 ? logits
                                : nullptr;
      forward(m, st, cache, tokens + i, 1, out, false, pool, opt);
    }
    return;
  }
  for (int i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= c.vocab_size)
      fail("token id %d outside the vocabulary (0 to %d)", tokens[i], c.vocab_size - 1);
    ops::copy_row(w.token_embd, tokens[i], st.x.data() + static_cast<size_t>(i) * dim);
  }
  scale_embedding(c, st.x.data(), n);
  check_finite_activations(m, st.x.data(), n, dim, -1, pos0, tokens);
  attn::Params ap;
  ap.n_heads = c.n_heads;
  ap.scale = c.attention_scale();
  ap.softcap = c.attn_softcap;
  ap.alibi_slopes = c.alibi ? st.slopes.data() : nullptr;
  ap.window = opt.window;
  ap.precision = opt.precision;
  ap.rope_style = c.rope_style;
  // Keys stored before RoPE: the cache gets them as the K projection leaves them, and
  // attention rotates each by its position.
  const bool pre_rope = !c.alibi && cache.config().key_rope == kv::KeyRope::kPre;
  ap.sinks = opt.sinks;
  // RoPE rows of the new tokens: their positions (with keys after RoPE, position_offset
  // past the tokens a context overflow dropped), beyond the table when needed; then the
  // same rows of the windowed layers' own RoPE when they have one.
  const float** rows = st.rope_ptrs.data();
  for (int local = 0; local < (c.has_local_rope() ? 2 : 1) && !c.alibi; ++local) {
    const AlignedBuffer<float>& table = local ? st.rope_local : st.rope;
    for (int i = 0; i < n; ++i) {
      const int64_t p = pos0 + i + (pre_rope ? 0 : st.position_offset);
      const size_t at = static_cast<size_t>(local * st.max_batch + i);
      if (p < st.rope_rows) {
        rows[at] = table.data() + static_cast<size_t>(p) * hd;
      } else {
        fill_rope_row(st.rope_batch.data() + at * hd, p, c, st.rope_rows, local);
        rows[at] = st.rope_batch.data() + at * hd;
      }
    }
  }

  if (cp.comm) st.cp_states.resize(static_cast<size_t>(n) * c.n_heads * (hd + 2));
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& L = w.layers[l];
    ap.head_sinks = L.sinks.empty() ? nullptr : L.sinks.data();
    for (int i = 0; i < n; ++i) {
      ops::rmsnorm(st.xb.data() + static_cast<size_t>(i) * dim,
                   st.x.data() + static_cast<size_t>(i) * dim, L.attn_norm.data(), dim, c.norm_eps);
    }
    // A borrowing layer computes only its queries: no K and V projections.
    const bool borrows = cache.borrows(l);
    ops::matmul(L.wq, st.xb.data(), n, st.q.data(), pool);
    if (!borrows) {
      ops::matmul(L.wk, st.xb.data(), n, st.k.data(), pool);
      ops::matmul(L.wv, st.xb.data(), n, st.v.data(), pool);
    }
    finish_projections(c, L, st.q.data(), borrows ? nullptr : st.k.data(), st.v.data(), n);
    const bool local = c.local_rope(l);
    if (!c.alibi) {
      for (int i = 0; i < n; ++i) {
        const float* rr = rows[(local ? st.max_batch : 0) + i];
        apply_rope(st.q.data() + static_cast<size_t>(i) * qd, c.n_heads, hd, rr, c.rope_style);
        if (!pre_rope && !borrows) {
          apply_rope(st.k.data() + static_cast<size_t>(i) * kvd, c.n_kv_heads, hd, rr,
                     c.rope_style);
        }
      }
    }
    if (!borrows && cache.position(l) == 0) cache.calibrate(l, st.k.data(), st.v.data(), n);
    // A sliding-window layer attends its last `window` tokens (with --window too: the smaller).
    const int lw = cache.window(l);
    ap.window = lw > 0 && opt.window > 0 ? std::min(lw, opt.window) : std::max(lw, opt.window);
    // Block-sparse attention selects in the layers that see the whole context; a
    // sliding-window layer reads its window densely.
    const bool sparse = opt.sparse && opt.sparse->sparse_layer(l) && lw == 0;
    // A chunk of tokens attends over query tiles where nothing evicts, borrows or
    // observes per token (see the file comment).
    const bool tiled = opt.prefill == attn::PrefillMode::kTiled && n >= attn::kPrefillMinRows &&
                       !borrows && !cp.comm && !sparse && !opt.observer && lw == 0 &&
                       st.pws.threads() > 0;
    if (tiled) {
      if (pre_rope) {
        ap.rope =
            (local ? st.rope_local : st.rope).data() + static_cast<size_t>(cache.evicted(l)) * hd;
      }
      const double t0 = opt.attn_seconds ? now_seconds() : 0.0;
      attn::append_and_prefill(cache, l, st.k.data(), st.v.data(), n, st.q.data(), st.att.data(),
                               ap, pool, st.pws);
      if (opt.attn_seconds) *opt.attn_seconds += now_seconds() - t0;
    }
    for (int i = 0; i < n && !tiled; ++i) {
      // Under context parallelism only the shard holding the position stores the token.
      if (!borrows && (!cp.comm || cp.owns(pos0 + i))) {
        cache.append(l, st.k.data() + static_cast<size_t>(i) * kvd,
                     st.v.data() + static_cast<size_t>(i) * kvd);
      } else if (!borrows && pos0 + i >= cp.start + cp.size) {
        cache.pass(l, pos0 + i - cp.start);  // a full shard flushes as one process would
      }
      // Keys before RoPE: cache index t holds position t + evicted (the append may evict)
      // + the shard's first position.
      if (pre_rope) {
        ap.rope = (local ? st.rope_local : st.rope).data() +
                  static_cast<size_t>(cache.evicted(l) + cp.start) * hd;
      }
      const double t0 = opt.attn_seconds ? now_seconds() : 0.0;
      const int seen = cp.comm ? cp.local_count(pos0 + i + 1) : pos0 + i + 1;
      const kv::LayerView view = borrows ? cache.view_prefix(l, seen) : cache.view(l);
      const float* qi = st.q.data() + static_cast<size_t>(i) * qd;
      float* oi = st.att.data() + static_cast<size_t>(i) * qd;
      if (cp.comm) {
        // This shard's softmax state; merged with the other shards' after the batch.
        float* si = st.cp_states.data() + static_cast<size_t>(i) * c.n_heads * (hd + 2);
        if (sparse) {
          opt.sparse->set_shard_query(cp.start, pos0 + i);
          opt.sparse->decode_state(l, cache.owner(l), view, qi, si, ap, pool, st.ws);
        } else {
          attn::decode_state(view, qi, si, ap, pool, st.ws);
        }
      } else if (sparse) {
        opt.sparse->decode(l, cache.owner(l), view, qi, oi, ap, pool, st.ws);
      } else {
        attn::decode(view, qi, oi, ap, pool, st.ws);
      }
      if (opt.attn_seconds) *opt.attn_seconds += now_seconds() - t0;
      if (opt.observer) opt.observer->attended(l, cache.owner(l), view, qi, ap);
    }
    if (cp.comm)
      cp_merge(cp, st.cp_states.data(), n, c.n_heads, hd, st.att.data(), st.cp_buf, ap.head_sinks);
    ops::matmul(L.wo, st.att.data(), n, st.xb2.data(), pool);
    output_bias(c, L, st.xb2.data(), n);
    tp_reduce(m, st.xb2.data(), static_cast<size_t>(n) * dim);
    post_norm(c, L.attn_post_norm, st.xb2.data(), n);
    ops::add_inplace(st.x.data(), st.xb2.data(), n * dim);
    for (int i = 0; i < n; ++i) {
      ops::rmsnorm(st.xb.data() + static_cast<size_t>(i) * dim,
                   st.x.data() + static_cast<size_t>(i) * dim, L.ffn_norm.data(), dim, c.norm_eps);
    }
    ffn(c, L, st.xb.data(), n, st.xb2.data(), st.hb.data(), st.hb2.data(), st.moe, pool);
    tp_reduce(m, st.xb2.data(), static_cast<size_t>(n) * dim);
    post_norm(c, L.ffn_post_norm, st.xb2.data(), n);
    ops::add_inplace(st.x.data(), st.xb2.data(), n * dim);
    check_finite_activations(m, st.x.data(), n, dim, l, pos0, tokens);
  }
  if (cp.comm) st.cp_pos += n;
  if (opt.hidden) {
    for (int i = 0; i < n; ++i) {
      ops::rmsnorm(opt.hidden + static_cast<size_t>(i) * dim,
                   st.x.data() + static_cast<size_t>(i) * dim, w.output_norm.data(), dim,
                   c.norm_eps);
    }
  }
  if (!logits) return;
  const int first = all_logits ? 0 : n - 1;
  for (int i = first; i < n; ++i) {
    ops::rmsnorm(st.xb.data() + static_cast<size_t>(i) * dim,
                 st.x.data() + static_cast<size_t>(i) * dim, w.output_norm.data(), dim, c.norm_eps);
  }
  classify(m, st.xb.data() + static_cast<size_t>(first) * dim, n - first, logits, pool);
  check_finite_activations(m, logits, n - first, c.vocab_size, c.n_layers, pos0 + first,
                           tokens + first);
}

std::vector<float> forward_no_cache(const Model& m, const std::vector<int>& tokens,
                                    ThreadPool* pool, const std::vector<int>& layer_owner) {
  const ModelConfig& c = m.config();
  const Weights& w = m.weights();
  const int n = static_cast<int>(tokens.size());
  const int dim = c.dim, qd = c.q_dim(), kvd = c.kv_dim(), hd = c.head_dim(), hid = c.hidden_dim;
  const int rep = c.n_heads / c.n_kv_heads;
  if (n < 1 || n > c.ctx) fail("no-cache forward: %d tokens (context %d)", n, c.ctx);
  std::vector<float> x(static_cast<size_t>(n) * dim), xb(x.size()), xb2(x.size());
  std::vector<float> q(static_cast<size_t>(n) * qd), att(q.size());
  // Keys and values of every layer (a borrowing layer reads its owner's).
  std::vector<std::vector<float>> ks(c.n_layers), vs(c.n_layers);
  std::vector<float> hb(static_cast<size_t>(n) * hid), hb2(hb.size());
  MoeScratch moe(c, n);
  std::vector<float> rope(static_cast<size_t>(n) * hd), rope_local(rope.size());
  // RoPE as a session at the model's context runs it (LongRoPE picks its factors by that).
  for (int i = 0; i < n; ++i) {
    fill_rope_row(&rope[static_cast<size_t>(i) * hd], i, c, c.ctx);
    if (c.has_local_rope())
      fill_rope_row(&rope_local[static_cast<size_t>(i) * hd], i, c, c.ctx, true);
  }
  const std::vector<float> slopes = c.alibi ? attn::alibi_slopes(c.n_heads) : std::vector<float>();
  for (int i = 0; i < n; ++i)
    ops::copy_row(w.token_embd, tokens[i], x.data() + static_cast<size_t>(i) * dim);
  scale_embedding(c, x.data(), n);
  check_finite_activations(m, x.data(), n, dim, -1, 0, tokens.data());
  std::vector<double> s(n);
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& L = w.layers[l];
    for (int i = 0; i < n; ++i)
      ops::rmsnorm(&xb[i * dim], &x[i * dim], L.attn_norm.data(), dim, c.norm_eps);
    const int owner = layer_owner.empty() ? l : layer_owner[l];
    ops::matmul(L.wq, xb.data(), n, q.data(), pool);
    if (owner == l) {
      ks[l].resize(static_cast<size_t>(n) * kvd);
      vs[l].resize(ks[l].size());
      ops::matmul(L.wk, xb.data(), n, ks[l].data(), pool);
      ops::matmul(L.wv, xb.data(), n, vs[l].data(), pool);
    }
    std::vector<float>& k = ks[owner];
    std::vector<float>& v = vs[owner];
    finish_projections(c, L, q.data(), owner == l ? k.data() : nullptr, v.data(), n);
    if (!c.alibi) {
      const float* table = (c.local_rope(l) ? rope_local : rope).data();
      for (int i = 0; i < n; ++i) {
        apply_rope(&q[static_cast<size_t>(i) * qd], c.n_heads, hd,
                   table + static_cast<size_t>(i) * hd, c.rope_style);
        if (owner == l)
          apply_rope(&k[static_cast<size_t>(i) * kvd], c.n_kv_heads, hd,
                     table + static_cast<size_t>(i) * hd, c.rope_style);
      }
    }
    // Plain causal attention, in double; a sliding-window layer masks key t for query i
    // when i - t >= window; scores capped at cap * tanh(score / cap) when the model caps;
    // a head's sink logit joins the denominator.
    const int window = c.layer_window(l);
    const double scale = c.attention_scale(), cap = c.attn_softcap;
    for (int i = 0; i < n; ++i) {
      const int t0 = window > 0 ? std::max(0, i - window + 1) : 0;
      for (int hq = 0; hq < c.n_heads; ++hq) {
        const int h = hq / rep;
        const float* qh = &q[static_cast<size_t>(i) * qd + hq * hd];
        double mx = -INFINITY;
        for (int t = t0; t <= i; ++t) {
          const float* kt = &k[static_cast<size_t>(t) * kvd + h * hd];
          double dot = 0.0;
          for (int d = 0; d < hd; ++d) dot += static_cast<double>(qh[d]) * kt[d];
          s[t] = dot * scale;
          if (cap > 0.0) s[t] = cap * std::tanh(s[t] / cap);
          s[t] += c.alibi ? static_cast<double>(slopes[hq]) * (t - i) : 0.0;
          mx = std::max(mx, s[t]);
        }
        double den = 0.0;
        for (int t = t0; t <= i; ++t) den += (s[t] = std::exp(s[t] - mx));
        if (!L.sinks.empty()) den += std::exp(static_cast<double>(L.sinks[hq]) - mx);
        float* out = &att[static_cast<size_t>(i) * qd + hq * hd];
        for (int d = 0; d < hd; ++d) {
          double acc = 0.0;
          for (int t = t0; t <= i; ++t) acc += s[t] * v[static_cast<size_t>(t) * kvd + h * hd + d];
          out[d] = static_cast<float>(acc / den);
        }
      }
    }
    ops::matmul(L.wo, att.data(), n, xb2.data(), pool);
    output_bias(c, L, xb2.data(), n);
    post_norm(c, L.attn_post_norm, xb2.data(), n);
    ops::add_inplace(x.data(), xb2.data(), n * dim);
    for (int i = 0; i < n; ++i)
      ops::rmsnorm(&xb[i * dim], &x[i * dim], L.ffn_norm.data(), dim, c.norm_eps);
    ffn(c, L, xb.data(), n, xb2.data(), hb.data(), hb2.data(), moe, pool);
    post_norm(c, L.ffn_post_norm, xb2.data(), n);
    ops::add_inplace(x.data(), xb2.data(), n * dim);
    check_finite_activations(m, x.data(), n, dim, l, 0, tokens.data());
  }
  std::vector<float> logits(c.vocab_size);
  ops::rmsnorm(xb.data(), &x[static_cast<size_t>(n - 1) * dim], w.output_norm.data(), dim,
               c.norm_eps);
  ops::matvec(w.output, xb.data(), logits.data(), pool);
  if (c.final_softcap > 0.0f) ops::softcap(logits.data(), logits.size(), c.final_softcap);
  check_finite_activations(m, logits.data(), 1, c.vocab_size, c.n_layers, n - 1, &tokens[n - 1]);
  return logits;
}

}  // namespace kivi::model
