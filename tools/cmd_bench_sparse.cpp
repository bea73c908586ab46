// kivi bench-sparse: decode attention per token over every layer of a random-filled cache,
// dense against block-sparse, with the time to select blocks apart from the time to
// attend them.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "attn/attention.h"
#include "common.h"
#include "core/cpu.h"
#include "core/error.h"
#include "core/json.h"
#include "core/progress.h"
#include "core/rng.h"
#include "core/sysinfo.h"
#include "core/threadpool.h"
#include "core/timer.h"
#include "kv/format.h"
#include "kv/kv_cache.h"
#include "runtime/bench.h"
#include "sparse/sparse_attention.h"

namespace kivi::tools {

namespace {

struct Result {
  int ctx = 0;
  double dense_ms = 0, sparse_ms = 0, select_ms = 0,
         attend_ms = 0;                           // per token (every layer), medians
  double select_mean_ms = 0, attend_mean_ms = 0;  // per token, means (with --sparse-reselect
                                                  // most tokens do not select)
  double selected = 0;                            // share of the sparse calls that selected
  double attended = 0;                            // share of the tokens attended
  uint64_t cache_bytes = 0, summary_bytes = 0;
  double fill_seconds = 0;
};

}  // namespace

int cmd_bench_sparse(int argc, char** argv) {
  Args a("bench-sparse",
         "[--ctx LIST] [--layers L] [--heads H] [--kv-heads K] [--head-dim D] [--kv-cache F] "
         "[--sparse KIND] [--sparse-budget N] [--threads N] [--json]",
         "Decode attention for one token over every layer of a cache filled with random keys and "
         "values\n"
         "(fixed seeds), dense against block-sparse (--sparse, default quest, with the --sparse-*\n"
         "options). Per token: the median time of dense attention, of sparse attention, and of its "
         "two\n"
         "parts: selecting blocks (summaries, scores, top-k) and attending the selected tokens. "
         "Dense\n"
         "and sparse calls alternate, repetition by repetition, so their ratio compares the same\n"
         "moments. The summaries are built by a warm-up call before timing; each timed repetition\n"
         "first appends one token to every layer, as a decode step does (so --sparse-reselect N\n"
         "selects at one step in N: the means of select and attend ms are the amortized costs).\n"
         "Default shape: Llama 3.2 1B.");
  a.section("Benchmark");
  a.add("ctx", 0, "LIST", "Context lengths (tokens in the cache); k suffix = 1024.", "131072");
  a.add("layers", 0, "L", "Layers (each with its own cache).", "16");
  a.add("heads", 0, "H", "Query heads.", "32");
  a.add("kv-heads", 0, "K", "Key/value heads (GQA when < H).", "8");
  a.add("head-dim", 0, "D", "Head dimension.", "64");
  a.add("reps", 0, "N", "Timed tokens per case (median reported).", "10");
  add_threads_options(a);
  a.add("simd", 0, "TARGET", "Force a SIMD target (avx3, avx2, sse4, scalar).");
  a.add_flag(
      "json", 0,
      "Print {\"results\": [{ctx, dense_ms, sparse_ms, select_ms, attend_ms, select_mean_ms, "
      "attend_mean_ms, selected, speedup, attended, cache_bytes, summary_bytes}]}.");
  add_kv_options(a);
  add_sparse_options(a);
  if (!parse_command_line(a, argc, argv)) return 0;  // --help printed
  const bool json = a.flag("json");
  const auto ctxs = a.int_list("ctx", 1, model::kMaxContext);
  const int L = static_cast<int>(a.integer("layers", 1, 1024));
  const int H = static_cast<int>(a.integer("heads", 1, 1024));
  const int Hkv = static_cast<int>(a.integer("kv-heads", 1, 1024));
  const int D = static_cast<int>(a.integer("head-dim", 8, 1024));
  const int reps = static_cast<int>(a.integer("reps", 1, 100000));
  if (H % Hkv != 0) fail("--kv-heads %d must divide --heads %d", Hkv, H);
  if (D % 8 != 0) fail("--head-dim %d: expected a multiple of 8", D);
  const sparse::Options so = sparse_options(a, sparse::Kind::kQuest);
  if (!so.enabled())
    fail("--sparse off: bench-sparse compares a selection with dense attention; choose one");
  const int threads = threads_option(a);
  ThreadPool pool(threads);
  const attn::Precision prec = attn::parse_precision(a.str("attn-precision"));
  std::vector<Result> results;
  Progress bar("bench-sparse", static_cast<int64_t>(ctxs.size()) * L, "layer",
               !json && Progress::stderr_is_terminal());
  int64_t progress = 0;
  for (int64_t ctx : ctxs) {
    kv::CacheConfig cfg = cache_config(a);
    cfg.n_layers = L;
    cfg.n_kv_heads = Hkv;
    cfg.head_dim = D;
    cfg.ctx = static_cast<int>(ctx) + reps + 1;  // room for a token per repetition
    cfg.validate();
    const uint64_t need =
        kv::expected_bytes_reserved(cfg) + sparse::SparseAttention::summary_bytes(so, cfg);
    const uint64_t avail = sys::available_memory_bytes();
    if (avail > 0 && static_cast<double>(need) > 0.8 * static_cast<double>(avail)) {
      fail("--ctx %lld: the cache and summaries need %s but only %s of memory is available",
           static_cast<long long>(ctx), sys::human_bytes(static_cast<double>(need)).c_str(),
           sys::human_bytes(static_cast<double>(avail)).c_str());
    }
    Result res;
    res.ctx = static_cast<int>(ctx);
    const double t_fill = now_seconds();
    kv::KvCache cache(cfg);
    const int64_t before = progress;
    runtime::fill_random(
        {&cache}, static_cast<int>(ctx), 1234, [&](int64_t t) { bar.update(before + L * t / ctx); },
        &pool);
    progress = before + L;
    res.fill_seconds = now_seconds() - t_fill;
    sparse::SparseAttention sa(so, cfg, H);
    attn::Workspace ws(threads, H, Hkv, D, cfg.block(), cfg.ctx);
    std::vector<float> q(static_cast<size_t>(L) * H * D), out(static_cast<size_t>(H) * D);
    Rng rq(99);
    for (auto& x : q) x = rq.normal();
    attn::Params p;
    p.n_heads = H;
    p.scale = 1.0f / std::sqrt(static_cast<float>(D));
    p.precision = prec;
    std::vector<float> rope;
    if (cfg.key_rope == kv::KeyRope::kPre) {
      rope.resize(static_cast<size_t>(cfg.ctx) * D);
      model::fill_rope_table(rope.data(), cfg.ctx, D, 500000.0f);
      p.rope = rope.data();
    }
    auto dense = [&] {
      for (int l = 0; l < L; ++l)
        attn::decode(cache.view(l), q.data() + static_cast<size_t>(l) * H * D, out.data(), p, &pool,
                     ws);
    };
    auto sparse_call = [&] {
      for (int l = 0; l < L; ++l) {
        const float* ql = q.data() + static_cast<size_t>(l) * H * D;
        if (sa.sparse_layer(l)) {
          sa.decode(l, l, cache.view(l), ql, out.data(), p, &pool, ws);
        } else {
          attn::decode(cache.view(l), ql, out.data(), p, &pool, ws);
        }
      }
    };
    dense();
    sparse_call();  // builds the summaries
    sa.stats() = {};
    std::vector<double> td, ts, tsel, tatt;
    std::vector<double> sel_sum, att_sum;
    Rng data(4321);  // the tokens decoded between repetitions
    std::vector<float> k(static_cast<size_t>(Hkv) * D), v(k.size());
    for (int r = 0; r < reps; ++r) {
      // One decode step: a new token in every layer.
      for (int l = 0; l < L; ++l) {
        for (size_t i = 0; i < k.size(); ++i) {
          k[i] = data.normal() * ((i % D) % 16 == 3 ? 6.0f : 1.0f);
          v[i] = data.normal();
        }
        cache.append(l, k.data(), v.data());
      }
      double t0 = now_seconds();
      dense();
      td.push_back(now_seconds() - t0);
      const sparse::Stats before = sa.stats();
      t0 = now_seconds();
      sparse_call();
      ts.push_back(now_seconds() - t0);
      tsel.push_back(sa.stats().select_seconds - before.select_seconds);
      tatt.push_back(sa.stats().attend_seconds - before.attend_seconds);
    }
    res.dense_ms = 1e3 * median(td);
    res.sparse_ms = 1e3 * median(ts);
    res.select_ms = 1e3 * median(tsel);
    res.attend_ms = 1e3 * median(tatt);
    for (double x : tsel) res.select_mean_ms += 1e3 * x / reps;
    for (double x : tatt) res.attend_mean_ms += 1e3 * x / reps;
    res.selected = sa.stats().calls ? double(sa.stats().selections) / sa.stats().calls : 0.0;
    res.attended = sa.stats().tokens_context
                       ? double(sa.stats().tokens_attended) / sa.stats().tokens_context
                       : 0.0;
    res.cache_bytes = cache.bytes_used();
    res.summary_bytes = sa.summaries().bytes_used();
    results.push_back(res);
  }
  bar.finish();
  if (json) {
    JsonWriter j;
    j.begin_object();
    j.kv("simd", cpu::current_target_name())
        .kv("threads", threads)
        .kv("precision", attn::precision_name(prec));
    j.kv("layers", L).kv("heads", H).kv("kv_heads", Hkv).kv("head_dim", D);
    j.kv("kv_cache", describe_cache(cache_config(a))).kv("sparse", sparse::describe(so));
    j.key("results").begin_array();
    for (const auto& r : results) {
      j.begin_object().kv("ctx", r.ctx).kv("dense_ms", r.dense_ms).kv("sparse_ms", r.sparse_ms);
      j.kv("select_ms", r.select_ms)
          .kv("attend_ms", r.attend_ms)
          .kv("select_mean_ms", r.select_mean_ms)
          .kv("attend_mean_ms", r.attend_mean_ms)
          .kv("selected", r.selected)
          .kv("speedup", r.dense_ms / r.sparse_ms);
      j.kv("attended", r.attended)
          .kv("cache_bytes", r.cache_bytes)
          .kv("summary_bytes", r.summary_bytes);
      j.end_object();
    }
    j.end_array().end_object();
    std::printf("%s\n", j.str().c_str());
    return 0;
  }
  std::printf(
      "decode attention per token: %d layers, %d query heads, %d KV heads, head_dim %d, %d "
      "threads, SIMD %s, %s\n",
      L, H, Hkv, D, threads, cpu::current_target_name().c_str(), attn::precision_name(prec));
  std::printf("cache %s; sparse %s\n", describe_cache(cache_config(a)).c_str(),
              sparse::describe(so).c_str());
  std::printf("%8s %10s %10s %10s %10s %10s %10s %8s %9s %9s %12s %12s\n", "ctx", "dense ms",
              "sparse ms", "select ms", "attend ms", "sel mean", "att mean", "speedup", "selected",
              "attended", "cache", "summaries");
  for (const auto& r : results) {
    std::printf("%8d %10.2f %10.3f %10.3f %10.3f %10.3f %10.3f %7.1fx %8.1f%% %8.2f%% %12s %12s\n",
                r.ctx, r.dense_ms, r.sparse_ms, r.select_ms, r.attend_ms, r.select_mean_ms,
                r.attend_mean_ms, r.dense_ms / r.sparse_ms, 100 * r.selected, 100 * r.attended,
                sys::human_bytes(static_cast<double>(r.cache_bytes)).c_str(),
                sys::human_bytes(static_cast<double>(r.summary_bytes)).c_str());
  }
  return 0;
}

}  // namespace kivi::tools
