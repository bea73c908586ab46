#include "runtime/bench.h"

#include <algorithm>
#include <memory>

#include "core/error.h"
#include "core/normal_table.h"
#include "core/rng.h"
#include "core/threadpool.h"
#include "core/timer.h"
#include "runtime/sampler.h"
#include "runtime/session.h"

namespace kivi::runtime {

const char* const kFillText =
    "Once upon a time, there was a little girl named Lily. She lived in a small house near the "
    "woods with her "
    "mom, her dad and a big brown dog called Max. Every morning Lily and Max ran to the old tree "
    "by the river "
    "to look for birds. One day they found a tiny bird that could not fly. Lily was sad, but her "
    "mom said they "
    "could help it. They gave the bird water and seeds and kept it warm in a box. After a few days "
    "the bird was "
    "strong again. It sang a happy song and flew up into the blue sky. Lily smiled and waved "
    "goodbye. ";

std::vector<int> fill_tokens(const tok::Tokenizer& tk, const std::string& text, int n) {
  std::vector<int> out;
  if (n <= 0) return out;
  out.reserve(n);
  out.push_back(tk.bos_id() >= 0 ? tk.bos_id() : 0);
  const std::vector<int> t = tk.encode(text, false);
  if (t.empty()) fail("fill text has no tokens");
  while (static_cast<int>(out.size()) < n) out.push_back(t[(out.size() - 1) % t.size()]);
  return out;
}

void fill_random(const std::vector<kv::KvCache*>& caches, int n_tokens, uint64_t seed,
                 const std::function<void(int64_t)>& progress, ThreadPool* pool) {
  if (caches.empty() || n_tokens <= 0) return;
  const kv::CacheConfig& c0 = caches[0]->config();
  const int L = c0.n_layers, H = c0.n_kv_heads, D = c0.head_dim;
  const size_t row = static_cast<size_t>(H) * D;
  const NormalTable& nt = NormalTable::get();
  bool shared = false;
  for (const kv::KvCache* c : caches) shared = shared || c->shares_pool();
  // Layer l, tokens [t0, t1), from the layer's stream `rng`.
  auto fill_layer = [&](int l, Rng& rng, int t0, int t1, float* k, float* v) {
    for (int t = t0; t < t1; ++t) {
      nt.fill(rng, k, row);
      nt.fill(rng, v, row);
      for (size_t i = 3; i < row; i += 16) {
        if (i % D % 16 == 3) k[i] *= 6.0f;
      }
      for (kv::KvCache* c : caches) {
        if (c->borrows(l)) continue;  // reads another layer's cache
        if (c->n_tokens(l) == 0) c->calibrate(l, k, v, 1);
        c->append(l, k, v);
      }
    }
  };
  std::vector<Rng> rngs;
  for (int l = 0; l < L; ++l) rngs.emplace_back(seed + 0x9E3779B97F4A7C15ull * (l + 1));
  if (shared || !pool || pool->size() == 1) {
    // Token-major, so a shared pool maps each block once for every layer.
    std::vector<float> k(row), v(row);  // [H, D]
    for (int t = 0; t < n_tokens; ++t) {
      for (int l = 0; l < L; ++l) fill_layer(l, rngs[l], t, t + 1, k.data(), v.data());
      if (progress && (t % 64 == 63 || t + 1 == n_tokens)) progress(t + 1);
    }
    return;
  }
  // Layers in parallel, in chunks of tokens so progress can be reported between them.
  const int P = pool->size();
  std::vector<std::vector<float>> kb(P, std::vector<float>(row)), vb(P, std::vector<float>(row));
  const int chunk = std::max(64, n_tokens / 100);
  for (int t0 = 0; t0 < n_tokens; t0 += chunk) {
    const int t1 = std::min(n_tokens, t0 + chunk);
    pool->run(L, [&](int l, int thread) {
      fill_layer(l, rngs[l], t0, t1, kb[thread].data(), vb[thread].data());
    });
    if (progress) progress(t1);
  }
}

BenchResult run_bench(const model::Model& m, const BenchConfig& cfg,
                      const std::function<void(int64_t, int64_t)>& progress) {
  const int F = static_cast<int>(cfg.caches.size());
  if (F == 0) fail("bench: no cache formats");
  if (cfg.names.size() != cfg.caches.size())
    fail("bench: %zu names for %d formats", cfg.names.size(), F);
  if (!cfg.fill.empty() && cfg.fill_random > 0)
    fail("bench: give a text fill or a random fill, not both");
  if (cfg.prompt.empty()) fail("bench: the prompt has no tokens");
  if (cfg.n_gen < 1) fail("bench: -n %d, expected at least 1", cfg.n_gen);
  const int n_fill = cfg.fill_random > 0 ? cfg.fill_random : static_cast<int>(cfg.fill.size());
  const int n_prompt = static_cast<int>(cfg.prompt.size());
  const int need = n_fill + n_prompt + cfg.n_gen;
  const int ctx = cfg.ctx > 0 ? cfg.ctx : need;
  if (need > ctx) {
    fail("bench: fill %d + prompt %d + %d generated tokens = %d exceed the context of %d tokens",
         n_fill, n_prompt, cfg.n_gen, need, ctx);
  }
  auto cacheless = [&](int f) {
    return f < static_cast<int>(cfg.no_cache.size()) && cfg.no_cache[f];
  };
  if (cacheless(0)) fail("bench: the reference runs with an f32 cache");
  for (int f = 0; f < F; ++f) {
    if (cacheless(f) && cfg.fill_random > 0)
      fail("bench: no-cache needs a text fill, not --ctx-fill-random");
  }
  ThreadPool pool(cfg.threads > 0 ? cfg.threads : hardware_threads());
  BenchResult res;
  res.ctx = n_fill + n_prompt;
  res.fill = n_fill;
  res.fill_random = cfg.fill_random > 0;
  res.prompt_tokens = n_prompt;
  res.threads = pool.size();

  // Each session's attention time goes to its own counter.
  std::vector<double> attn(F, 0.0);
  std::vector<std::unique_ptr<Session>> sessions;
  // A cacheless decoder keeps only its tokens.
  std::vector<std::vector<int>> history(F);
  auto nocache_step = [&](int f, std::vector<float>& out) {
    out = model::forward_no_cache(m, history[f], &pool);
    return out.data();
  };
  std::vector<std::vector<float>> nocache_logits(F);
  for (int f = 0; f < F; ++f) {
    if (cacheless(f)) {
      sessions.push_back(nullptr);
      continue;
    }
    SessionOptions o;
    o.ctx = ctx;
    o.cache = cfg.caches[f];
    o.forward = cfg.forward;
    o.forward.attn_seconds = &attn[f];
    if (f > 0 || cfg.sparse_reference) o.sparse = cfg.sparse;
    o.pool = &pool;
    o.cp = cfg.cp;
    sessions.push_back(std::make_unique<Session>(m, o));
  }
  // Warm-up: a throwaway session prefills the prompt once, so the weights are in memory
  // (a mapped file is read on first touch) before anything is timed.
  {
    SessionOptions o;
    o.ctx = n_prompt;
    o.cache = cfg.caches[0];
    o.cache.k = o.cache.v = {kv::Format::kF32, kv::Int8Granularity::kHead};
    o.forward = cfg.forward;
    o.pool = &pool;
    Session warm(m, o);
    warm.prefill(cfg.prompt);
  }
  const int64_t total = static_cast<int64_t>(F) * need;
  int64_t done = 0;
  auto report = [&](int64_t d) {
    done += d;
    if (progress) progress(done, total);
  };

  // Fill.
  if (cfg.fill_random > 0 && cfg.cp) {
    // Each format's shard gets its own positions of the fill (shards follow each
    // format's block); a full shard then quantizes as the later positions would make it.
    for (int f = 0; f < F; ++f) {
      Session& s = *sessions[f];
      const model::CpShard& sh = *s.cp_shard();
      const int local = sh.local_count(cfg.fill_random);
      fill_random({&s.cache()}, local, cfg.seed + static_cast<uint64_t>(sh.start), nullptr, &pool);
      const int64_t after = static_cast<int64_t>(cfg.fill_random) - sh.start;
      for (int l = 0; l < s.cache().config().n_layers && local == sh.size; ++l) {
        if (s.cache().borrows(l)) continue;
        for (int64_t pos = sh.size; pos < after; ++pos) s.cache().pass(l, static_cast<int>(pos));
      }
      s.restore_cp_position(cfg.fill_random);
      report(n_fill);
    }
  } else if (cfg.fill_random > 0) {
    std::vector<kv::KvCache*> caches;
    for (auto& s : sessions) caches.push_back(&s->cache());
    int64_t last = 0;
    fill_random(
        caches, cfg.fill_random, cfg.seed,
        [&](int64_t t) {
          report((t - last) * F);
          last = t;
        },
        &pool);
  } else if (!cfg.fill.empty()) {
    const int chunk = std::max(1, cfg.fill_chunk);
    for (int f = 0; f < F; ++f) {
      if (cacheless(f)) {
        history[f] = cfg.fill;
        report(n_fill);
        continue;
      }
      auto& s = sessions[f];
      for (int i = 0; i < n_fill; i += chunk) {
        const int b = std::min(chunk, n_fill - i);
        s->prefill(std::vector<int>(cfg.fill.begin() + i, cfg.fill.begin() + i + b));
        report(b);
      }
    }
  }

  // Prompt, timed per format; the first greedy token comes from its logits.
  res.formats.resize(F);
  std::vector<const float*> logits(F);
  for (int f = 0; f < F; ++f) {
    BenchFormatResult& r = res.formats[f];
    r.name = cfg.names[f];
    r.no_cache = cacheless(f);
    r.cache = r.no_cache ? cfg.caches[f] : sessions[f]->options().cache;
    const double t0 = now_seconds();
    if (r.no_cache) {
      history[f].insert(history[f].end(), cfg.prompt.begin(), cfg.prompt.end());
      logits[f] = nocache_step(f, nocache_logits[f]);
    } else {
      logits[f] = sessions[f]->prefill(cfg.prompt);
    }
    r.prefill_seconds = now_seconds() - t0;
    r.prefill_tps = r.prefill_seconds > 0 ? n_prompt / r.prefill_seconds : 0.0;
    r.step_seconds.reserve(cfg.n_gen);
    r.attn_seconds.reserve(cfg.n_gen);
    r.tokens.reserve(cfg.n_gen);
    report(n_prompt);
  }

  // Decode, round-robin; step i starts with format i % F.
  const int V = m.config().vocab_size;
  for (int i = 0; i < cfg.n_gen; ++i) {
    for (int j = 0; j < F; ++j) {
      const int f = (i + j) % F;
      BenchFormatResult& r = res.formats[f];
      const int tok = argmax(logits[f], V);
      r.tokens.push_back(tok);
      attn[f] = 0.0;
      const double t0 = now_seconds();
      if (r.no_cache) {
        history[f].push_back(tok);
        logits[f] = nocache_step(f, nocache_logits[f]);
      } else {
        logits[f] = sessions[f]->decode(tok);
      }
      r.step_seconds.push_back(now_seconds() - t0);
      r.attn_seconds.push_back(attn[f]);
    }
    report(F);
  }

  // Summaries against the reference.
  const BenchFormatResult& ref = res.formats[0];
  const int n_tokens = sessions[0]->pos();  // tokens fed (a sliding window evicts some)
  kv::CacheConfig c32 = ref.cache, c16 = ref.cache;
  c32.k = c32.v = {kv::Format::kF32, kv::Int8Granularity::kHead};
  c16.k = c16.v = {kv::Format::kF16, kv::Int8Granularity::kHead};
  const double bytes32 = static_cast<double>(kv::expected_bytes_used(c32, n_tokens));
  const double bytes16 = static_cast<double>(kv::expected_bytes_used(c16, n_tokens));
  for (int f = 0; f < F; ++f) {
    BenchFormatResult& r = res.formats[f];
    r.decode_seconds = median(r.step_seconds);
    r.decode_tps = r.decode_seconds > 0 ? 1.0 / r.decode_seconds : 0.0;
    std::vector<double> share(r.step_seconds.size());
    for (size_t s = 0; s < share.size(); ++s)
      share[s] = r.step_seconds[s] > 0 ? r.attn_seconds[s] / r.step_seconds[s] : 0.0;
    r.attn_share = median(share);
    r.kv_bytes = r.no_cache ? 0 : sessions[f]->cache().bytes_used();
    double b32 = bytes32, b16 = bytes16;
    if (cfg.cp && !r.no_cache) {
      // A context shard: against the float bytes of the positions it holds.
      const int held = sessions[f]->cache().position(0);
      b32 = static_cast<double>(kv::expected_bytes_used(c32, held));
      b16 = static_cast<double>(kv::expected_bytes_used(c16, held));
    }
    r.compression_vs_f32 = r.kv_bytes > 0 ? b32 / r.kv_bytes : 0.0;
    r.compression_vs_f16 = r.kv_bytes > 0 ? b16 / r.kv_bytes : 0.0;
    int same = 0;
    r.first_divergence = -1;
    for (int i = 0; i < cfg.n_gen; ++i) {
      if (r.tokens[i] == ref.tokens[i]) {
        ++same;
      } else if (r.first_divergence < 0) {
        r.first_divergence = i;
      }
    }
    r.token_match = 100.0 * same / cfg.n_gen;
  }
  for (auto& r : res.formats) {
    r.overhead_pct =
        ref.decode_seconds > 0 ? 100.0 * (r.decode_seconds / ref.decode_seconds - 1.0) : 0.0;
  }
  return res;
}

}  // namespace kivi::runtime
