#include "runtime/session.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "runtime/engine_options.h"
#include "core/error.h"
#include "core/timer.h"
#include "model/tensor_parallel.h"

namespace kivi::runtime {

ContextOverflow parse_context_overflow(const std::string& s) {
  if (s == "stop") return ContextOverflow::kStop;
  if (s == "shift") return ContextOverflow::kShift;
  if (s == "window") return ContextOverflow::kWindow;
  fail("--context-overflow: unknown value '%s' (valid: stop, shift, window)", s.c_str());
}

const char* context_overflow_name(ContextOverflow o) {
  return o == ContextOverflow::kShift ? "shift" : o == ContextOverflow::kWindow ? "window" : "stop";
}

Session::Session(const model::Model& m, const SessionOptions& opt) : m_(m), opt_(opt) {
  const auto& c = m.config();
  ctx_ = context_for(m, opt);
  if (ctx_ > c.ctx && !c.synthetic) {
    fail("--ctx %d is larger than the model's context length %d", ctx_, c.ctx);
  }
  const int threads = opt.pool          ? opt.pool->size()
                      : opt.threads > 0 ? opt.threads
                                        : hardware_threads();
  kv::CacheConfig cc = cache_shape_for(c, opt.cache, ctx_);
  if (opt.rewind < 0 || opt.rewind > 4096)
    fail("rewind = %d tokens, expected 0 to 4096", opt.rewind);
  if (opt.rewind > 0) {
    const char* no = opt.overflow != ContextOverflow::kStop ? "--context-overflow shift/window"
                     : opt.sparse.enabled()                 ? "--sparse"
                     : cc.has_window()                      ? "the model's sliding-window layers"
                     : opt.cp && opt.cp->size() > 1         ? "context parallelism"
                                                            : nullptr;
    if (no) fail("speculative decoding cuts the cache back, which %s does not allow", no);
    if (cc.has_residual()) cc.ring_slack = opt.rewind;
  }
  if (opt.cp && opt.cp->size() > 1) {
    // Context parallelism: this rank's cache holds its shard of the positions.
    const int N = opt.cp->size();
    const char* no = c.alibi                                  ? "--alibi"
                     : cc.has_window()                        ? "the model's sliding window"
                     : opt.overflow != ContextOverflow::kStop ? "--context-overflow"
                     : opt.forward.window > 0                 ? "--window"
                     : opt.sparse.preselect > 0               ? "--sparse-preselect"
                                                              : nullptr;
    if (no) {
      fail(
          "--dist cp=%d: context parallelism does not run with %s yet (every shard would have to "
          "drop, window or select its own tokens)",
          N, no);
    }
    if (opt.sparse.enabled() && opt.sparse.budget > 0) {
      // Each shard selects its own blocks within an equal share of the budget.
      opt_.sparse.budget = opt.sparse.budget / N;
      if (opt_.sparse.budget < opt.sparse.block) {
        fail(
            "--dist cp=%d: --sparse-budget %d leaves %d tokens per shard, less than one block of "
            "%d (each shard selects within budget / %d)",
            N, opt.sparse.budget, opt_.sparse.budget, opt.sparse.block, N);
      }
    }
    const int S = model::cp_shard_tokens(ctx_, N, cc.block());
    cc = cache_shape_for(c, opt.cache, S);
    opt_.forward.cp = model::CpShard{opt.cp, opt.cp->rank() * S, S, ctx_};
  }
  opt_.cache = cc;
  if (cc.has_window()) {
    // The model's sliding window evicts blocks as it goes; the overflow policies and
    // block selection manage the same blocks their own way.
    if (opt_.overflow != ContextOverflow::kStop) {
      fail("--context-overflow %s: not supported with the model's sliding-window attention",
           context_overflow_name(opt_.overflow));
    }
    // Block selection runs in the layers that attend the whole context; the windowed
    // ones read their windows densely.
    bool global = false;
    for (int l = 0; l < c.n_layers; ++l) global = global || cc.window(l) == 0;
    if (opt_.sparse.enabled() && !global)
      fail("--sparse: every layer of the model has a sliding window; there is nothing to select");
    if (opt_.sparse.enabled() && opt_.sparse.reuse_layers > 1) {
      fail(
          "--sparse-reuse-layers %d: not supported with the model's sliding-window layers (they "
          "select nothing to reuse)",
          opt_.sparse.reuse_layers);
    }
  }
  if (opt.pool) {
    pool_ = opt.pool;
  } else {
    own_pool_ = std::make_unique<ThreadPool>(threads);
    pool_ = own_pool_.get();
  }
  // int8 with one scale per tensor fixes the scale from the first prefill: prefill the
  // whole prompt as one batch so the scale sees all of it.
  auto tensor_scaled = [](const kv::StreamFormat& f) {
    return f.format == kv::Format::kInt8 && f.granularity == kv::Int8Granularity::kTensor;
  };
  if (cc.any_stream([&](const kv::StreamFormat& f, bool) { return tensor_scaled(f); }))
    opt_.max_batch = std::max(opt_.max_batch, ctx_);
  if (opt_.overflow != ContextOverflow::kStop) {
    // Tokens are dropped a block at a time and the sinks kept in whole blocks: blocks of
    // 64 tokens (rounded to whole key groups and value quads) waste less than 128.
    if (cc.block_tokens == 0) {
      const int g = std::max(1, cc.group_size), unit = g % 4 == 0 ? g : g % 2 == 0 ? 2 * g : 4 * g;
      cc.block_tokens = (64 + unit - 1) / unit * unit;
      opt_.cache.block_tokens = cc.block_tokens;
      cc.validate();
    }
    const int B = cc.block();
    if (opt_.sinks < 0 || opt_.sinks > 512)
      fail("--sinks %d: expected 0 to 512 tokens", opt_.sinks);
    sink_keep_ = (opt_.sinks + B - 1) / B * B;
    const bool post = cc.key_rope == kv::KeyRope::kPost && !c.alibi;
    // The first key format that cannot be rotated in place, if any.
    kv::Format fixed = kv::Format::kF32;
    cc.any_stream([&](const kv::StreamFormat& f, bool key) {
      if (!key || f.format == kv::Format::kF32 || f.format == kv::Format::kF16) return false;
      fixed = f.format;
      return true;
    });
    const bool rotatable = fixed == kv::Format::kF32;
    if (opt_.overflow == ContextOverflow::kShift && post && !rotatable) {
      fail(
          "--context-overflow shift moves tokens to new positions: %s keys stored after RoPE would "
          "have to be "
          "re-rotated and rounded again; use --key-rope pre (positions then live only in "
          "attention) or the window "
          "policy",
          kv::format_name(fixed));
    }
    if (opt_.overflow == ContextOverflow::kWindow) {
      // The cache holds the sink blocks, the window and one block dropped at a time.
      const int W = opt_.forward.window > 0 ? opt_.forward.window : ctx_ - sink_keep_ - B;
      if (W < 1 || sink_keep_ + W + B > ctx_) {
        fail(
            "--context-overflow window: %d sink tokens (%d in whole blocks of %d) + a window of %d "
            "+ one block "
            "need a context of %d tokens, more than --ctx %d",
            opt_.sinks, sink_keep_, B, W, sink_keep_ + W + B, ctx_);
      }
      opt_.forward.window = W;
      opt_.forward.sinks = opt_.sinks;
    } else if (ctx_ - sink_keep_ < 2 * B) {
      fail(
          "--context-overflow shift: --ctx %d leaves less than two blocks of %d tokens after the "
          "sinks",
          ctx_, B);
    }
  }
  cache_ = std::make_unique<kv::KvCache>(cc);
  if (m.tp_comm()) {
    const model::Model* mp = &m;
    cache_->set_absmax_reduce([mp](float x) { return model::tp_max(*mp, x); });
  }
  if (opt_.sparse.enabled()) {
    if (opt_.overflow != ContextOverflow::kStop) {
      fail(
          "--sparse: block selection needs --context-overflow stop (dropped tokens would leave "
          "stale summaries)");
    }
    if (opt_.forward.window > 0) fail("--sparse: block selection and --window do not combine");
    if (c.tp.size > 1 && opt_.sparse.heads == sparse::Heads::kShared) {
      fail(
          "--sparse-heads shared sums the scores of every KV head, and under --dist tp each rank "
          "holds only some of them; use --sparse-heads per");
    }
    if (opt_.sparse.dense_layers > c.n_layers) {
      fail("--sparse-dense-layers %d: the model has %d layers", opt_.sparse.dense_layers,
           c.n_layers);
    }
    sparse_ = std::make_unique<sparse::SparseAttention>(opt_.sparse, cc, c.n_heads);
    opt_.forward.sparse = sparse_.get();
  } else {
    opt_.forward.sparse = nullptr;
  }
  st_ = std::make_unique<model::ForwardState>(c, std::max(1, opt_.max_batch), ctx_, threads,
                                              cc.block());
  logits_.reset(static_cast<size_t>(c.vocab_size));
}

void Session::make_room() {
  const double t0 = now_seconds();
  const int B = cache_->config().block(), first = sink_keep_, n = pos();
  int count;
  if (opt_.overflow == ContextOverflow::kWindow) {
    // Every token before the next query's window that is not a sink.
    count = (n + 1 - opt_.forward.window - first) / B * B;
  } else {
    count = (n - first) / 2 / B * B;  // the oldest half
  }
  int droppable = cache_->droppable(0);
  for (int l = 1; l < m_.config().n_layers; ++l)
    droppable = std::min(droppable, cache_->droppable(l));
  count = std::min(count, (droppable - first) / B * B);
  if (count < B) {
    fail(
        "the context of %d tokens is full and no whole block of %d stored tokens can be dropped "
        "after the %d sink "
        "tokens (the newest %d are in the residual window or the attention window): use a larger "
        "--ctx or a smaller "
        "--residual",
        ctx_, B, first, n - droppable);
  }
  const auto& c = m_.config();
  const bool post = cache_->config().key_rope == kv::KeyRope::kPost && !c.alibi;
  for (int l = 0; l < c.n_layers; ++l) {
    if (cache_->borrows(l)) continue;
    cache_->drop(l, first, count);
    if (post && opt_.overflow == ContextOverflow::kShift) {
      // The kept tokens move down by `count` positions: rotate their keys back by as much.
      std::vector<float> back(c.head_dim());
      // A pure rotation: the keys carry the attention factor once already.
      model::fill_rope_rotation(back.data(), count, c, ctx_, c.local_rope(l));
      for (int i = 1; i < c.head_dim(); i += 2) back[i] = -back[i];
      cache_->rotate_keys(l, first, n - count, back.data(), c.rope_style == attn::RopeStyle::kNeox);
    }
  }
  if (post && opt_.overflow == ContextOverflow::kWindow) st_->position_offset += count;
  dropped_ += count;
  ++overflows_;
  overflow_seconds_ += now_seconds() - t0;
}

const float* Session::prefill(const std::vector<int>& tokens, float* all_logits) {
  const int n = static_cast<int>(tokens.size());
  if (n == 0) fail("prefill: no tokens");
  if (opt_.overflow == ContextOverflow::kStop && pos() + n > ctx_) {
    fail("prompt of %d tokens does not fit: %d already in the context of %d tokens", n, pos(),
         ctx_);
  }
  const int V = vocab();
  if (sparse_) sparse_->begin_prefill(pos(), n);
  for (int i = 0, b = 0; i < n; i += b) {
    if (pos() == ctx_) make_room();
    b = std::min({st_->max_batch, n - i, ctx_ - pos()});
    if (all_logits) {
      model::forward(m_, *st_, *cache_, tokens.data() + i, b,
                     all_logits + static_cast<size_t>(i) * V, true, pool_, opt_.forward);
    } else {
      model::forward(m_, *st_, *cache_, tokens.data() + i, b, i + b == n ? logits_.data() : nullptr,
                     false, pool_, opt_.forward);
    }
  }
  if (all_logits)
    std::memcpy(logits_.data(), all_logits + static_cast<size_t>(n - 1) * V, V * sizeof(float));
  return logits_.data();
}

const float* Session::verify(const std::vector<int>& tokens, float* all_logits) {
  const attn::PrefillMode mode = opt_.forward.prefill;
  opt_.forward.prefill = attn::PrefillMode::kStream;
  try {
    prefill(tokens, all_logits);
  } catch (...) {
    opt_.forward.prefill = mode;
    throw;
  }
  opt_.forward.prefill = mode;
  return logits_.data();
}

void Session::truncate(int n) {
  if (n == pos()) return;
  if (n < 0 || n > pos() || pos() - n > opt_.rewind || (n > 0 && !cache_->can_truncate(n))) {
    fail("the cache of %d tokens cannot be cut back to %d (rewind %d)", pos(), n, opt_.rewind);
  }
  if (n == 0) {
    reset();
  } else if (!cache_->truncate(n)) {
    fail("internal: cutting the cache back to %d tokens failed", n);
  }
}

std::vector<float> Session::embed(const std::vector<int>& tokens, Pooling pooling) {
  const int n = static_cast<int>(tokens.size()), dim = m_.config().dim;
  if (n == 0) fail("embedding: no tokens");
  if (n > ctx_) fail("embedding: %d tokens exceed the context of %d", n, ctx_);
  reset();
  std::vector<double> sum(dim, 0.0);
  std::vector<float> hidden(static_cast<size_t>(st_->max_batch) * dim), out(dim);
  model::ForwardOptions fo = opt_.forward;
  fo.hidden = hidden.data();
  for (int i = 0, b = 0; i < n; i += b) {
    b = std::min(st_->max_batch, n - i);
    model::forward(m_, *st_, *cache_, tokens.data() + i, b, nullptr, false, pool_, fo);
    for (int r = 0; r < b; ++r) {
      const float* h = hidden.data() + static_cast<size_t>(r) * dim;
      if (pooling == Pooling::kMean) {
        for (int d = 0; d < dim; ++d) sum[d] += h[d];
      } else if (i + r == n - 1) {
        for (int d = 0; d < dim; ++d) sum[d] = h[d];
      }
    }
  }
  reset();
  double norm = 0.0;
  for (double x : sum) norm += x * x;
  norm = std::sqrt(norm);
  for (int d = 0; d < dim; ++d) out[d] = static_cast<float>(norm > 0 ? sum[d] / norm : 0.0);
  return out;
}

const float* Session::decode(int token) {
  if (pos() >= ctx_) {
    if (opt_.overflow == ContextOverflow::kStop) fail("context full: %d tokens", ctx_);
    make_room();
  }
  model::forward(m_, *st_, *cache_, &token, 1, logits_.data(), false, pool_, opt_.forward);
  return logits_.data();
}

void Session::reset() {
  cache_->clear();
  st_->cp_pos = 0;
  if (sparse_) sparse_->reset();
  st_->position_offset = 0;
  dropped_ = 0;
  overflows_ = 0;
  overflow_seconds_ = 0.0;
}

int64_t Session::position_offset() const { return st_->position_offset; }

void Session::restore_cp_position(int64_t positions) {
  if (!opt_.forward.cp.comm) fail("restore_cp_position: this session is not a context shard");
  st_->cp_pos = positions;
}

void Session::restore_counters(int64_t position_offset, int64_t dropped, int overflows) {
  st_->position_offset = position_offset;
  dropped_ = dropped;
  overflows_ = overflows;
}

uint64_t Session::kv_bytes_used() const {
  return cache_->bytes_used() + (sparse_ ? sparse_->summaries().bytes_used() : 0);
}

uint64_t Session::kv_bytes_reserved() const {
  return cache_->bytes_reserved() + (sparse_ ? sparse_->bytes_reserved() : 0);
}

uint64_t session_bytes(const model::ModelConfig& c, const kv::CacheConfig& cache, int ctx,
                       int max_batch, const sparse::Options& sparse) {
  const kv::CacheConfig cc = cache_shape_for(c, cache, ctx);
  const bool tensor_scaled = cc.any_stream([](const kv::StreamFormat& f, bool) {
    return f.format == kv::Format::kInt8 && f.granularity == kv::Int8Granularity::kTensor;
  });
  const uint64_t b =
      static_cast<uint64_t>(std::max(1, tensor_scaled ? std::max(max_batch, ctx) : max_batch));
  const uint64_t activations =
      b * (4ull * c.dim + 2ull * c.q_dim() + 2ull * c.kv_dim() + 2ull * c.hidden_dim) *
      sizeof(float);
  const uint64_t rope =
      static_cast<uint64_t>(ctx) * c.head_dim() * sizeof(float) * (c.has_local_rope() ? 2 : 1);
  const uint64_t summaries = sparse.enabled()
                                 ? sparse::SparseAttention::summary_bytes(sparse, cc) +
                                       sparse::SparseAttention::scratch_bytes(sparse, cc, c.n_heads)
                                 : 0;
  return kv::expected_bytes_reserved(cc) + summaries + activations + rope +
         static_cast<uint64_t>(c.vocab_size) * sizeof(float);
}

}  // namespace kivi::runtime
