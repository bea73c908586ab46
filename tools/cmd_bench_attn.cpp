#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "attn/attention.h"
#include "common.h"
#include "core/bandwidth.h"
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
#include "model/forward.h"

namespace kivi::tools {

namespace {

struct Row {
  std::string format;
  int ctx, threads, batch;
  double median_us, min_us;
  uint64_t bytes_read;
  double gbps, probe_gbps, floor_us, vs_f16;
};

}  // namespace

int cmd_bench_attn(int argc, char** argv) {
  Args a(
      "bench-attn",
      "[--ctx LIST] [--heads H] [--kv-heads K] [--head-dim D] [--batch B] [--reps N] "
      "[--kv-cache LIST] [KV options] [--threads N] [--simd TARGET] [--no-probe] [--json]",
      "Benchmarks decode attention (one query token per sequence over a full cache) for each "
      "cache\n"
      "format and context length, on random data with fixed seeds. A memory-read bandwidth probe\n"
      "runs in the same process at the same thread count. For each case it reports the median\n"
      "time per call, the bytes of cache the call reads, the effective GB/s, the bandwidth floor\n"
      "(bytes / probe GB/s) and the time relative to f16. Formats and probe passes are timed\n"
      "alternately, repetition by repetition, so ratios compare the same moments.");
  a.section("Benchmark");
  a.add("ctx", 0, "LIST", "Context lengths (tokens in the cache); k suffix = 1024.",
        "1024,4096,16384,65536");
  a.add("heads", 0, "H", "Query heads.", "32");
  a.add("kv-heads", 0, "K", "Key/value heads (GQA when < H).", "8");
  a.add("head-dim", 0, "D", "Head dimension.", "128");
  a.add("batch", 0, "B", "Sequences per call (each with its own cache).", "1");
  a.add("reps", 0, "N", "Timed repetitions per case (median reported).", "20");
  add_threads_options(a);
  a.add("simd", 0, "TARGET", "Force a SIMD target (avx3, avx2, sse4, scalar).");
  a.add_flag("no-probe", 0,
             "Skip the bandwidth probe: the floor columns then read n/a (null in JSON).");
  a.add_flag("json", 0,
             "Print {\"probe_gbps\", \"results\": [{format, ctx, threads, batch, median_us, "
             "bytes_read, gbps, "
             "vs_f16, floor_us}]}; with --no-probe the probe and floor fields are null.");
  add_kv_options(a, true);
  if (!parse_command_line(a, argc, argv)) return 0;  // --help printed
  const bool json = a.flag("json");
  const auto ctxs = a.int_list("ctx", 1, model::kMaxContext);
  const int H = static_cast<int>(a.integer("heads", 1, 1024));
  const int Hkv = static_cast<int>(a.integer("kv-heads", 1, 1024));
  const int D = static_cast<int>(a.integer("head-dim", 2, 1024));
  const int B = static_cast<int>(a.integer("batch", 1, 256));
  const int reps = static_cast<int>(a.integer("reps", 1, 100000));
  if (H % Hkv != 0) fail("--kv-heads %d must divide --heads %d", Hkv, H);
  const int threads = threads_option(a);
  const std::vector<std::string> formats =
      kv_format_list(a, {"f32", "f16", "int8", "kivi4", "kivi2"});
  // Estimate memory before allocating: the largest cache per format x batch.
  {
    const int cmax = static_cast<int>(*std::max_element(ctxs.begin(), ctxs.end()));
    double need = 0;
    for (const auto& f : formats) {
      kv::CacheConfig c = cache_config(a, f);
      c.n_layers = 1;
      c.n_kv_heads = Hkv;
      c.head_dim = D;
      c.ctx = cmax;
      c.validate();
      need += static_cast<double>(kv::expected_bytes_reserved(c)) * B;  // all formats live at once
    }
    const double avail = static_cast<double>(sys::available_memory_bytes());
    if (!a.flag("no-probe")) need += 512.0 * (1 << 20);
    if (avail > 0 && need > 0.8 * avail) {
      fail(
          "the largest case needs %s of cache but only %s of memory is available; lower --ctx or "
          "--batch",
          sys::human_bytes(need).c_str(), sys::human_bytes(avail).c_str());
    }
  }
  ThreadPool pool(threads);
  const attn::Precision prec = attn::parse_precision(a.str("attn-precision"));
  std::unique_ptr<BandwidthProbe> probe;
  if (!a.flag("no-probe")) {
    probe = std::make_unique<BandwidthProbe>(pool);
    probe->pass();  // warm-up
  }
  std::vector<Row> rows;
  std::vector<double> all_probe;
  Progress bar("bench-attn", static_cast<int64_t>(ctxs.size()) * reps, "rep", !json);
  int64_t progress = 0;
  // Per context: every format's cache is built first, then each repetition times one
  // call of every format back to back, plus one pass of the bandwidth probe, so that
  // ratios and the floor come from the same moments of a machine whose memory
  // bandwidth drifts.
  for (int64_t ctx : ctxs) {
    struct Case {
      kv::CacheConfig cfg;
      std::vector<std::unique_ptr<kv::KvCache>> caches;
      std::vector<kv::LayerView> views;
      std::unique_ptr<attn::Workspace> ws;
      std::vector<double> us;
    };
    std::vector<Case> cases;
    Rng rng(1234);
    std::vector<float> k(static_cast<size_t>(Hkv) * D), v(k.size());
    for (const auto& f : formats) {
      Case c;
      c.cfg = cache_config(a, f);
      c.cfg.n_layers = 1;
      c.cfg.n_kv_heads = Hkv;
      c.cfg.head_dim = D;
      c.cfg.ctx = static_cast<int>(ctx);
      Rng data(1234);  // the same keys and values for every format
      for (int b = 0; b < B; ++b) {
        c.caches.push_back(std::make_unique<kv::KvCache>(c.cfg));
        for (int64_t t = 0; t < ctx; ++t) {
          for (size_t i = 0; i < k.size(); ++i) {
            k[i] = data.normal() *
                   ((i % D) % 16 == 3 ? 6.0f : 1.0f);  // a few outlier channels, as in real keys
            v[i] = data.normal();
          }
          if (t == 0) c.caches.back()->calibrate(0, k.data(), v.data(), 1);
          c.caches.back()->append(0, k.data(), v.data());
        }
        c.views.push_back(c.caches.back()->view(0));
      }
      c.ws = std::make_unique<attn::Workspace>(threads, H, Hkv, D, c.cfg.block(),
                                               static_cast<int>(ctx));
      cases.push_back(std::move(c));
    }
    std::vector<float> q(static_cast<size_t>(H) * D), out(q.size());
    for (auto& x : q) x = rng.normal();
    attn::Params p;
    p.n_heads = H;
    p.scale = 1.0f / std::sqrt(static_cast<float>(D));
    p.precision = prec;
    p.window = static_cast<int>(a.integer("window", 0, model::kMaxContext));
    // Keys stored before RoPE are rotated by their positions inside attention.
    std::vector<float> rope;
    if (cache_config(a, formats[0]).key_rope == kv::KeyRope::kPre) {
      rope.resize(static_cast<size_t>(ctx) * D);
      model::fill_rope_table(rope.data(), static_cast<int>(ctx), D, 500000.0f);
      p.rope = rope.data();
    }
    auto call = [&](Case& c) {
      for (int b = 0; b < B; ++b) attn::decode(c.views[b], q.data(), out.data(), p, &pool, *c.ws);
    };
    for (auto& c : cases) call(c);  // warm up
    std::vector<double> probe_gbps;
    for (int r = 0; r < reps; ++r) {
      if (probe) probe_gbps.push_back(probe->pass());
      for (auto& c : cases) {
        const double t0 = now_seconds();
        call(c);
        c.us.push_back((now_seconds() - t0) * 1e6);
      }
      bar.update(++progress);
    }
    const double gbps = probe_gbps.empty() ? 0.0 : median(probe_gbps);
    all_probe.insert(all_probe.end(), probe_gbps.begin(), probe_gbps.end());
    double f16_us = 0;
    for (auto& c : cases) {
      Row row;
      row.format = describe_cache(c.cfg);
      row.ctx = static_cast<int>(ctx);
      row.threads = threads;
      row.batch = B;
      row.median_us = median(c.us);
      row.min_us = *std::min_element(c.us.begin(), c.us.end());
      row.bytes_read = 0;
      for (auto& cc : c.caches) row.bytes_read += cc->bytes_used();
      row.gbps = row.bytes_read / (row.median_us * 1e-6) / 1e9;
      row.probe_gbps = gbps;
      row.floor_us = gbps > 0 ? row.bytes_read / (gbps * 1e9) * 1e6 : 0.0;
      if (c.cfg.k.format == kv::Format::kF16 && c.cfg.v.format == kv::Format::kF16)
        f16_us = row.median_us;
      row.vs_f16 = 0;
      rows.push_back(row);
    }
    for (auto& r : rows) {
      if (r.ctx == ctx && f16_us > 0) r.vs_f16 = r.median_us / f16_us;
    }
  }
  BandwidthResult bw{};
  if (!all_probe.empty()) {
    bw.gbps_median = median(all_probe);
    bw.threads = threads;
    bw.bytes = probe->bytes();
    bw.reps = static_cast<int>(all_probe.size());
  }
  bar.finish();
  if (json) {
    JsonWriter j;
    j.begin_object();
    if (probe) {
      j.kv("probe_gbps", bw.gbps_median)
          .kv("probe_threads", bw.threads)
          .kv("probe_bytes", static_cast<uint64_t>(bw.bytes));
    } else {  // not measured: null, not 0
      j.key("probe_gbps").null().key("probe_threads").null().key("probe_bytes").null();
    }
    j.kv("simd", cpu::current_target_name()).kv("precision", attn::precision_name(prec));
    j.kv("heads", H).kv("kv_heads", Hkv).kv("head_dim", D);
    j.key("results").begin_array();
    for (const auto& r : rows) {
      j.begin_object()
          .kv("format", r.format)
          .kv("ctx", r.ctx)
          .kv("threads", r.threads)
          .kv("batch", r.batch);
      j.kv("median_us", r.median_us)
          .kv("min_us", r.min_us)
          .kv("bytes_read", r.bytes_read)
          .kv("gbps", r.gbps);
      if (probe) {
        j.kv("floor_us", r.floor_us).kv("probe_gbps", r.probe_gbps);
      } else {
        j.key("floor_us").null().key("probe_gbps").null();
      }
      if (r.vs_f16 > 0) {
        j.kv("vs_f16", r.vs_f16);
      } else {
        j.key("vs_f16").null();
      }
      j.end_object();
    }
    j.end_array().end_object();
    std::printf("%s\n", j.str().c_str());
    return 0;
  }
  std::printf(
      "decode attention: %d query heads, %d KV heads, head_dim %d, batch %d, %d threads, SIMD %s, "
      "%s\n",
      H, Hkv, D, B, threads, cpu::current_target_name().c_str(), attn::precision_name(prec));
  if (bw.gbps_median > 0) {
    std::printf(
        "memory read bandwidth probe: %.2f GB/s (median of %d reads of %s interleaved with the "
        "calls, %d threads;\n"
        "the floor of each row uses the probe passes of its own context length)\n",
        bw.gbps_median, bw.reps, sys::human_bytes(static_cast<double>(bw.bytes)).c_str(),
        bw.threads);
  }
  std::printf("%-46s %8s %12s %12s %8s %12s %9s %9s\n", "format", "ctx", "median us", "bytes read",
              "GB/s", "floor us", "% floor", "t/t(f16)");
  for (const auto& r : rows) {
    // Without the probe there is no floor: "n/a", not a floor of 0.
    const std::string floor = probe ? strfmt("%.1f", r.floor_us) : "n/a";
    const std::string pct =
        probe && r.floor_us > 0 ? strfmt("%.0f%%", 100.0 * r.floor_us / r.median_us) : "n/a";
    std::printf("%-46s %8d %12.1f %12llu %8.2f %12s %9s %9s\n", r.format.c_str(), r.ctx,
                r.median_us, static_cast<unsigned long long>(r.bytes_read), r.gbps, floor.c_str(),
                pct.c_str(), r.vs_f16 > 0 ? strfmt("%.3f", r.vs_f16).c_str() : "-");
  }
  if (!probe) std::printf("(no bandwidth probe: --no-probe)\n");
  return 0;
}

}  // namespace kivi::tools
