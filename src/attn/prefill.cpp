// The tiled prefill's driver: tasks of (KV head, query tile) over the thread pool, and
// the append that records what each query of a chunk saw (prefill.h).
#include "attn/prefill.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/threadpool.h"

namespace kivi::attn {

const char* prefill_mode_name(PrefillMode m) {
  return m == PrefillMode::kTiled ? "tiled" : "stream";
}

PrefillMode parse_prefill_mode(const std::string& s) {
  if (s == "tiled") return PrefillMode::kTiled;
  if (s == "stream") return PrefillMode::kStream;
  fail("--prefill: unknown value '%s' (valid: tiled, stream)", s.c_str());
}

// A tile holds whole positions, each with all rep query heads of its KV head.
static int max_tile_vectors(int rep) { return std::max(kPrefillQueries, rep); }

PrefillWorkspace::PrefillWorkspace(int n_threads, int n_heads, int n_kv_heads, int head_dim)
    : threads_(std::max(1, n_threads)), D_(head_dim) {
  const int rep = n_heads / std::max(1, n_kv_heads);
  stride_ = prefill_scratch_floats(max_tile_vectors(rep), head_dim);
  stride_ = (stride_ + 15) / 16 * 16;  // each thread's scratch on its own cache lines
  scratch_ = AlignedBuffer<float>(stride_ * threads_);
}

void prefill(const kv::LayerView& kv, const PrefillChunk& c, const Params& p, ThreadPool* pool,
             PrefillWorkspace& ws) {
  const int Hkv = kv.k.n_heads, D = kv.k.head_dim, rep = p.n_heads / Hkv;
  if (c.n < 1) return;
  if (D != ws.head_dim() || kv.n_tokens < c.pos0 + c.n) {
    fail("prefill: a chunk of %d tokens at %d over a cache of %d (head size %d, workspace %d)", c.n,
         c.pos0, kv.n_tokens, D, ws.head_dim());
  }
  const int threads = std::min(pool ? pool->size() : 1, ws.threads());
  // Positions per tile: as many as kPrefillQueries vectors hold, fewer when that leaves
  // threads idle. Each query's arithmetic does not depend on the tile it is in (runs of
  // keys start on a fixed grid), so neither does the result on the thread count.
  int T = std::max(1, kPrefillQueries / rep);
  while (T > 8 && Hkv * ((c.n + T - 1) / T) < 2 * threads) T = (T + 1) / 2;
  T = std::min(T, c.n);
  const int tiles = (c.n + T - 1) / T, n_tasks = Hkv * tiles;
  auto task = [&](int ti, int thread) {
    // Later tiles see more tokens: hand them out first.
    const int tile = tiles - 1 - ti / Hkv, h = ti % Hkv;
    detail::PrefillTask t{
        &kv, &c, &p, h, tile * T, std::min(c.n, (tile + 1) * T), ws.thread_scratch(thread)};
    detail::prefill_tile(t);
  };
  if (pool && threads > 1 && n_tasks > 1) {
    pool->run(n_tasks, task);
  } else {
    for (int t = 0; t < n_tasks; ++t) task(t, 0);
  }
}

void append_and_prefill(kv::KvCache& cache, int layer, const float* k, const float* v, int n,
                        const float* q, float* out, const Params& p, ThreadPool* pool,
                        PrefillWorkspace& ws) {
  const kv::LayerView before = cache.view(layer);
  const int H = before.k.n_heads, D = before.k.head_dim;
  const size_t kvd = static_cast<size_t>(H) * D;
  const int P = before.n_tokens, evicted = cache.evicted(layer);
  // The residual rows of the history, which the chunk's first queries still see in full
  // precision (the appends below may quantize them and reuse their ring slots).
  const int fp_first = std::min({before.k.n_stored, before.v.n_stored, P});
  const size_t pre = static_cast<size_t>(P - fp_first) * kvd;
  if (ws.pre_k.size() < pre) {
    ws.pre_k.resize(pre);
    ws.pre_v.resize(pre);
  }
  for (int t = fp_first; t < P; ++t) {
    for (int h = 0; h < H; ++h) {
      const size_t at = static_cast<size_t>(t - fp_first) * kvd + static_cast<size_t>(h) * D;
      float* dk = ws.pre_k.data() + at;
      float* dv = ws.pre_v.data() + at;
      if (t >= before.k.n_stored) {
        std::memcpy(dk, before.k.residual_row(t, h), D * sizeof(float));
      } else {
        std::fill(dk, dk + D, 0.0f);
      }
      if (t >= before.v.n_stored) {
        std::memcpy(dv, before.v.residual_row(t, h), D * sizeof(float));
      } else {
        std::fill(dv, dv + D, 0.0f);
      }
    }
  }
  if (static_cast<int>(ws.k_stored.size()) < n) {
    ws.k_stored.resize(n);
    ws.v_stored.resize(n);
  }
  for (int i = 0; i < n; ++i) {
    cache.append(layer, k + i * kvd, v + i * kvd);
    const kv::LayerView now = cache.view(layer);
    ws.k_stored[i] = now.k.n_stored;
    ws.v_stored[i] = now.v.n_stored;
  }
  if (cache.evicted(layer) != evicted) {
    fail("prefill: layer %d evicted tokens within a chunk (a windowed layer attends per token)",
         layer);
  }
  PrefillChunk c;
  c.pos0 = P;
  c.n = n;
  c.q = q;
  c.q_stride = static_cast<size_t>(p.n_heads) * D;
  c.out = out;
  c.out_stride = c.q_stride;
  c.k_stored = ws.k_stored.data();
  c.v_stored = ws.v_stored.data();
  c.fp_first = fp_first;
  c.pre_k = ws.pre_k.data();
  c.pre_v = ws.pre_v.data();
  c.new_k = k;
  c.new_v = v;
  c.kv_stride = kvd;
  prefill(cache.view(layer), c, p, pool, ws);
}

}  // namespace kivi::attn
