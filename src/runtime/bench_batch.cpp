#include "runtime/bench_batch.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>

#include "runtime/engine_options.h"
#include "core/aligned.h"
#include "core/bandwidth.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/threadpool.h"
#include "core/timer.h"
#include "kv/block_pool.h"
#include "model/forward_batch.h"
#include "runtime/bench.h"
#include "runtime/sampler.h"
#include "runtime/scheduler.h"

namespace kivi::runtime {

namespace {

kv::CacheConfig shaped(const model::Model& m, const kv::CacheConfig& c, int ctx) {
  return cache_shape_for(m.config(), c, ctx);
}

int blocks_per_sequence(const kv::CacheConfig& s) { return (s.ctx + s.block() - 1) / s.block(); }

bool is_f16(const kv::CacheConfig& c) {
  return !c.mixed() && c.k.format == kv::Format::kF16 && c.v.format == kv::Format::kF16 &&
         c.share_every == 1 && c.share_map.empty() && c.key_rope == kv::KeyRope::kPost;
}

void check(const BatchBenchConfig& cfg) {
  if (cfg.caches.empty()) fail("bench-batch: no cache formats");
  if (cfg.names.size() != cfg.caches.size())
    fail("bench-batch: %zu names for %zu formats", cfg.names.size(), cfg.caches.size());
  if (cfg.batches.empty()) fail("bench-batch: no batch sizes");
  for (size_t i = 0; i < cfg.batches.size(); ++i) {
    if (cfg.batches[i] < 1) fail("bench-batch: batch size %d, expected at least 1", cfg.batches[i]);
    for (size_t j = 0; j < i; ++j) {
      if (cfg.batches[j] == cfg.batches[i])
        fail("bench-batch: batch size %d listed twice", cfg.batches[i]);
    }
  }
  if (cfg.fill < 0) fail("bench-batch: fill of %d positions", cfg.fill);
  if (cfg.steps < 1) fail("bench-batch: %d steps, expected at least 1", cfg.steps);
  for (const auto& c : cfg.caches) {
    if (c.share_every > 1 || !c.share_map.empty())
      fail("bench-batch: cross-layer sharing is not supported (it has no random fill)");
  }
}

}  // namespace

uint64_t step_weight_bytes(const model::Model& m) {
  const model::Weights& w = m.weights();
  uint64_t b = w.output.bytes();
  for (const auto& L : w.layers) {
    b += L.wq.bytes() + L.wk.bytes() + L.wv.bytes() + L.wo.bytes() + L.w_gate.bytes() +
         L.w_up.bytes() + L.w_down.bytes();
  }
  return b;
}

int bench_batch_ctx(const BatchBenchConfig& cfg) {
  const int64_t ctx = static_cast<int64_t>(cfg.fill) + (static_cast<int64_t>(cfg.steps) + 1) *
                                                           static_cast<int64_t>(cfg.batches.size());
  if (ctx > model::kMaxContext)
    fail("bench-batch: fill %d + steps need a context of %lld tokens; at most %d", cfg.fill,
         static_cast<long long>(ctx), model::kMaxContext);
  return static_cast<int>(ctx);
}

uint64_t bench_batch_cache_bytes(const model::Model& m, const BatchBenchConfig& cfg, int ctx) {
  const int bmax = *std::max_element(cfg.batches.begin(), cfg.batches.end());
  uint64_t total = 0;
  for (const auto& c : cfg.caches) {
    const kv::CacheConfig s = shaped(m, c, ctx);
    SchedulerOptions o;
    o.parallel = bmax;
    o.ctx = ctx;
    o.kv_budget_tokens = static_cast<int64_t>(bmax) * blocks_per_sequence(s) * s.block();
    const PoolPlan p = plan_pool(s, o);
    total += static_cast<uint64_t>(p.blocks) * p.block_bytes + p.slot_bytes * bmax;
  }
  return total;
}

BatchBenchResult run_bench_batch(
    const model::Model& m, const BatchBenchConfig& cfg,
    const std::function<void(const char*, int64_t, int64_t)>& progress) {
  check(cfg);
  const int F = static_cast<int>(cfg.caches.size());
  const int bmax = *std::max_element(cfg.batches.begin(), cfg.batches.end());
  const int ctx = bench_batch_ctx(cfg);
  const int V = m.config().vocab_size;
  ThreadPool pool(cfg.threads > 0 ? cfg.threads : hardware_threads());

  BatchBenchResult res;
  res.fill = cfg.fill;
  res.ctx = ctx;
  res.threads = pool.size();
  res.max_batch = bmax;
  res.weight_bytes_step = step_weight_bytes(m);

  // Per format: a shared pool for bmax sequences, their caches, last logits, and a
  // batched forward sized for the largest batch.
  struct Format {
    kv::CacheConfig cache;
    std::unique_ptr<kv::BlockPool> blocks;
    std::vector<std::unique_ptr<kv::KvCache>> seqs;
    std::vector<AlignedBuffer<float>> logits;  // [bmax][V]
    std::vector<int> next;                     // [bmax] the token each feeds next
    std::unique_ptr<model::BatchForward> fwd;
  };
  std::vector<Format> fmts(F);
  for (int f = 0; f < F; ++f) {
    Format& x = fmts[f];
    x.cache = shaped(m, cfg.caches[f], ctx);
    x.blocks = std::make_unique<kv::BlockPool>(x.cache, bmax * blocks_per_sequence(x.cache));
    for (int s = 0; s < bmax; ++s) {
      x.seqs.push_back(std::make_unique<kv::KvCache>(*x.blocks, ctx));
      if (!x.seqs.back()->reserve(ctx)) fail("bench-batch: the pool cannot hold its sequences");
      x.logits.emplace_back(static_cast<size_t>(V));
      Rng r(cfg.seed + static_cast<uint64_t>(s));
      x.next.push_back(static_cast<int>(r.next_u64() % static_cast<uint64_t>(V)));
    }
    x.fwd = std::make_unique<model::BatchForward>(m.config(), bmax, bmax, ctx, pool.size(),
                                                  x.cache.block());
  }
  if (cfg.record) {
    res.records.assign(F, std::vector<BatchBenchRecord>(bmax));
  }

  // Fill: sequence s of every format gets the same keys and values. The blocks the fill
  // needs are mapped here, on this thread, so that sequences fill in parallel (an
  // append then never allocates, and no two workers share a cache).
  {
    const double t0 = now_seconds();
    for (auto& x : fmts) {
      for (auto& c : x.seqs) c->map_blocks(cfg.fill);
    }
    const int64_t total = static_cast<int64_t>(bmax) * cfg.fill;
    std::atomic<int64_t> done{0};
    if (cfg.fill > 0) {
      pool.run(bmax, [&](int s, int thread) {
        std::vector<kv::KvCache*> caches;
        for (auto& x : fmts) caches.push_back(x.seqs[s].get());
        int64_t last = 0;
        fill_random(caches, cfg.fill, cfg.seed + static_cast<uint64_t>(s), [&](int64_t t) {
          const int64_t d = done += t - last;
          last = t;
          // Progress is drawn by the calling thread (worker 0) alone.
          if (progress && thread == 0) progress("fill", d, total);
        });
      });
    }
    if (progress && total > 0) progress("fill", total, total);
    res.fill_seconds = now_seconds() - t0;
  }

  // Configurations, format-major.
  for (int f = 0; f < F; ++f) {
    for (int b : cfg.batches) {
      BatchBenchRow r;
      r.format = f;
      r.name = cfg.names[f];
      r.cache = fmts[f].cache;
      r.batch = b;
      r.step_seconds.reserve(cfg.steps);
      r.attn_seconds.reserve(cfg.steps);
      res.rows.push_back(std::move(r));
    }
  }
  const int C = static_cast<int>(res.rows.size());

  // One step of configuration c: every sequence feeds its next token; returns (step
  // seconds, attention seconds).
  std::vector<model::BatchSequence> batch(bmax);
  auto step = [&](int c, double* attn) {
    BatchBenchRow& r = res.rows[c];
    Format& x = fmts[r.format];
    for (int s = 0; s < r.batch; ++s) {
      batch[s].cache = x.seqs[s].get();
      batch[s].tokens = &x.next[s];
      batch[s].n = 1;
      batch[s].logits = x.logits[s].data();
    }
    model::ForwardOptions o = cfg.forward;
    *attn = 0;
    o.attn_seconds = attn;
    const double t0 = now_seconds();
    x.fwd->run(m, batch.data(), r.batch, &pool, o);
    const double dt = now_seconds() - t0;
    for (int s = 0; s < r.batch; ++s) {
      if (cfg.record) {
        BatchBenchRecord& rec = res.records[r.format][s];
        rec.tokens.push_back(x.next[s]);
        rec.logits.insert(rec.logits.end(), x.logits[s].data(), x.logits[s].data() + V);
      }
      x.next[s] = argmax(x.logits[s].data(), V);
    }
    return dt;
  };

  std::unique_ptr<BandwidthProbe> probe;
  if (cfg.probe) {
    probe = std::make_unique<BandwidthProbe>(pool, static_cast<size_t>(cfg.probe_bytes));
    probe->pass();  // warm-up
  }
  double attn = 0;
  for (int c = 0; c < C; ++c) step(c, &attn);  // warm-up round, untimed
  std::vector<double> probe_gbps;
  const int64_t total = static_cast<int64_t>(cfg.steps) * C;
  for (int i = 0; i < cfg.steps; ++i) {
    if (probe) probe_gbps.push_back(probe->pass());
    for (int j = 0; j < C; ++j) {
      const int c = (i + j) % C;
      const double dt = step(c, &attn);
      res.rows[c].step_seconds.push_back(dt);
      res.rows[c].attn_seconds.push_back(attn);
      if (progress) progress("decode", static_cast<int64_t>(i) * C + j + 1, total);
    }
  }
  res.probe_gbps = probe_gbps.empty() ? 0.0 : median(probe_gbps);

  // Summaries.
  for (BatchBenchRow& r : res.rows) {
    r.step_median = median(r.step_seconds);
    r.attn_median = median(r.attn_seconds);
    std::vector<double> rest(r.step_seconds.size());
    for (size_t i = 0; i < rest.size(); ++i) rest[i] = r.step_seconds[i] - r.attn_seconds[i];
    r.rest_median = median(rest);
    r.agg_tps = r.step_median > 0 ? r.batch / r.step_median : 0.0;
    r.seq_tps = r.step_median > 0 ? 1.0 / r.step_median : 0.0;
    uint64_t bytes = 0;
    for (int s = 0; s < r.batch; ++s) bytes += fmts[r.format].seqs[s]->bytes_used();
    r.cache_bytes_step = bytes;
    r.kv_bytes_per_seq = bytes / static_cast<uint64_t>(r.batch);
    if (res.probe_gbps > 0) {
      r.roofline_seconds =
          static_cast<double>(res.weight_bytes_step + r.cache_bytes_step) / (res.probe_gbps * 1e9);
    }
  }
  for (BatchBenchRow& r : res.rows) {
    for (const BatchBenchRow& o : res.rows) {
      if (o.format == r.format && o.batch == 1 && o.agg_tps > 0)
        r.vs_batch1 = r.agg_tps / o.agg_tps;
      if (o.batch == r.batch && is_f16(o.cache) && o.agg_tps > 0) r.vs_f16 = r.agg_tps / o.agg_tps;
    }
  }
  return res;
}

}  // namespace kivi::runtime
