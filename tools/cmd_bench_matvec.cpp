#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common.h"
#include "core/aligned.h"
#include "core/bandwidth.h"
#include "core/cpu.h"
#include "core/error.h"
#include "core/json.h"
#include "core/progress.h"
#include "core/rng.h"
#include "core/sysinfo.h"
#include "core/threadpool.h"
#include "core/timer.h"
#include "ops/ops.h"
#include "quant/quantize.h"

namespace kivi::tools {

namespace {

// One weight type under test: `copies` copies of the same matrix, so that successive
// calls read memory, not cache, as a decode step does when it moves from layer to layer.
struct Case {
  quant::Type type;
  size_t bytes = 0;  // one matrix
  int copies = 0;
  AlignedBuffer<uint8_t> data;
  std::vector<double> us;
  std::vector<double> round_ratio;  // per round: GB/s (median of the round's calls) / probe GB/s
};

}  // namespace

int cmd_bench_matvec(int argc, char** argv) {
  Args a(
      "bench-matvec", "[--type LIST] [--rows R] [--cols C] [--batch N] [--threads N] [--json]",
      "Benchmarks the weight kernels: y = W x for a random matrix of each type (matrix-vector, "
      "the\n"
      "decode step's product; with --batch N > 1 the batched product of prefill). Each type's\n"
      "matrix is copied until the copies exceed --footprint, and successive calls cycle through\n"
      "the copies, so the weights come from memory as in a decode step. A memory-read bandwidth\n"
      "probe runs in the same process at the same thread count; rounds alternate one probe pass\n"
      "and a series of calls of every type, so ratios compare the same moments. Reported per\n"
      "type: median time per call, GB/s of weight bytes read, and that rate as a fraction of the\n"
      "probe's (the memory-bandwidth bound of a decode step).");
  a.section("Benchmark");
  a.add("type", 0, "LIST",
        "Weight types: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k .. q6_k.",
        "f32,f16,bf16,q8_0,q4_0,q4_k,q6_k");
  a.add("rows", 0, "R", "Matrix rows (outputs).", "2048");
  a.add("cols", 0, "C", "Matrix columns (inputs); a multiple of 256 for the K-quants.", "8192");
  a.add("batch", 0, "N", "Tokens per call (1 = matrix-vector).", "1");
  a.add("rounds", 0, "N", "Rounds (each: one probe pass, then every type's calls).", "10");
  a.add("calls", 0, "N", "Timed calls per type and round.", "8");
  a.add("footprint", 0, "MIB",
        "Bytes of copies per type, past the last-level cache (0: twice its size, at least 256).",
        "0");
  add_threads_options(a);
  a.add("simd", 0, "TARGET", "Force a SIMD target (avx3, avx2, sse4, scalar).");
  a.add_flag("no-probe", 0, "Skip the bandwidth probe.");
  a.add_flag("json", 0,
             "Print {\"probe_gbps\", \"results\": [{type, rows, cols, batch, threads, bytes, "
             "median_us, min_us, gbps, "
             "vs_probe, gflops}]}.");
  if (!parse_command_line(a, argc, argv)) return 0;  // --help printed
  const bool json = a.flag("json");
  const int64_t rows = a.integer("rows", 1, 1 << 20), cols = a.integer("cols", 1, 1 << 20);
  const int batch = static_cast<int>(a.integer("batch", 1, 4096));
  const int rounds = static_cast<int>(a.integer("rounds", 1, 100000));
  const int calls = static_cast<int>(a.integer("calls", 1, 100000));
  uint64_t footprint = static_cast<uint64_t>(a.integer("footprint", 0, 1 << 20)) << 20;
  if (footprint == 0) footprint = std::max<uint64_t>(256u << 20, 2 * sys::last_level_cache_bytes());
  const int threads = threads_option(a);

  std::vector<Case> cases;
  uint64_t need = 0;
  for (const auto& name : a.list("type")) {
    quant::Type t;
    if (!quant::parse_type(name, &t) || !quant::info(t).weight) {
      fail("--type: unknown weight type '%s' (valid: %s)", name.c_str(),
           quant::supported_weight_types());
    }
    const int block = quant::info(t).block;
    if (cols % block != 0)
      fail("--cols %lld is not a multiple of %s's block of %d", static_cast<long long>(cols),
           quant::info(t).name, block);
    Case c;
    c.type = t;
    c.bytes = quant::row_bytes(t, static_cast<uint64_t>(cols)) * static_cast<size_t>(rows);
    c.copies = static_cast<int>(std::max<uint64_t>(1, (footprint + c.bytes - 1) / c.bytes));
    need += c.bytes * static_cast<uint64_t>(c.copies);
    cases.push_back(std::move(c));
  }
  if (cases.empty()) fail("--type: give at least one type");
  need += static_cast<uint64_t>(rows * cols) * 4 + (a.flag("no-probe") ? 0 : (512u << 20));
  const uint64_t avail = sys::available_memory_bytes();
  if (avail > 0 && need > avail * 8 / 10) {
    fail(
        "the benchmark needs %s but only %s of memory is available; lower --footprint, --rows or "
        "--cols",
        sys::human_bytes(static_cast<double>(need)).c_str(),
        sys::human_bytes(static_cast<double>(avail)).c_str());
  }

  ThreadPool pool(threads);
  Progress bar("bench-matvec", static_cast<int64_t>(cases.size()) + rounds, "step",
               !json && Progress::stderr_is_terminal());
  int64_t progress = 0;
  {
    // One random matrix (normal values, N(0, 0.02^2) like the synthetic models),
    // quantized to each type and copied.
    std::vector<float> src(static_cast<size_t>(rows * cols));
    pool.parallel_for(rows, [&](int64_t r0, int64_t r1, int) {
      for (int64_t r = r0; r < r1; ++r) {
        Rng rng(static_cast<uint64_t>(r) * 7919 + 1);
        for (int64_t c = 0; c < cols; ++c)
          src[static_cast<size_t>(r * cols + c)] = 0.02f * rng.normal();
      }
    });
    for (auto& c : cases) {
      c.data.reset(c.bytes * static_cast<size_t>(c.copies), false);
      quant::quantize_parallel(c.type, src.data(), c.data.data(), rows * cols, &pool);
      pool.parallel_for(c.copies - 1, [&](int64_t k0, int64_t k1, int) {
        for (int64_t k = k0; k < k1; ++k)
          std::memcpy(c.data.data() + (k + 1) * c.bytes, c.data.data(), c.bytes);
      });
      bar.update(++progress);
    }
  }
  std::vector<float> x(static_cast<size_t>(cols) * batch), y(static_cast<size_t>(rows) * batch);
  {
    Rng rng(42);
    for (auto& v : x) v = rng.normal();
  }
  std::unique_ptr<BandwidthProbe> probe;
  if (!a.flag("no-probe")) {
    probe = std::make_unique<BandwidthProbe>(pool);
    probe->pass();  // warm-up
  }
  auto call = [&](Case& c, int k) {
    const ops::Matrix m{c.data.data() + static_cast<size_t>(k) * c.bytes, c.type, rows, cols};
    ops::matmul(m, x.data(), batch, y.data(), &pool);
  };
  for (auto& c : cases) {
    for (int k = 0; k < c.copies; ++k) call(c, k);  // warm-up: page faults, activation buffers
  }
  std::vector<double> probe_gbps;
  std::vector<int> next(cases.size(), 0);
  for (int r = 0; r < rounds; ++r) {
    if (probe) probe_gbps.push_back(probe->pass());
    for (size_t i = 0; i < cases.size(); ++i) {
      Case& c = cases[i];
      std::vector<double> round_us;
      for (int k = 0; k < calls; ++k) {
        const double t0 = now_seconds();
        call(c, next[i]);
        round_us.push_back((now_seconds() - t0) * 1e6);
        next[i] = (next[i] + 1) % c.copies;
      }
      c.us.insert(c.us.end(), round_us.begin(), round_us.end());
      if (probe)
        c.round_ratio.push_back(static_cast<double>(c.bytes) / (median(round_us) * 1e-6) / 1e9 /
                                probe_gbps.back());
    }
    bar.update(++progress);
  }
  bar.finish();
  const double pg = probe_gbps.empty() ? 0.0 : median(probe_gbps);

  struct Row {
    std::string type;
    double median_us, min_us, gbps, vs_probe, gflops;
    size_t bytes;
  };
  std::vector<Row> out;
  for (auto& c : cases) {
    Row r;
    r.type = quant::info(c.type).name;
    r.bytes = c.bytes;
    r.median_us = median(c.us);
    r.min_us = *std::min_element(c.us.begin(), c.us.end());
    r.gbps = static_cast<double>(c.bytes) / (r.median_us * 1e-6) / 1e9;
    // Median over rounds of the round's ratio: a round's calls and its probe pass share
    // the machine's state of that moment.
    r.vs_probe = c.round_ratio.empty() ? 0.0 : median(c.round_ratio);
    r.gflops = 2.0 * static_cast<double>(rows) * static_cast<double>(cols) * batch /
               (r.median_us * 1e-6) / 1e9;
    out.push_back(r);
  }
  if (json) {
    JsonWriter j;
    j.begin_object();
    j.kv("probe_gbps", pg)
        .kv("probe_passes", static_cast<int>(probe_gbps.size()))
        .kv("threads", threads);
    j.kv("simd", cpu::current_target_name()).kv("rows", rows).kv("cols", cols).kv("batch", batch);
    j.key("results").begin_array();
    for (const auto& r : out) {
      j.begin_object()
          .kv("type", r.type)
          .kv("rows", rows)
          .kv("cols", cols)
          .kv("batch", batch)
          .kv("threads", threads);
      j.kv("bytes", static_cast<uint64_t>(r.bytes))
          .kv("median_us", r.median_us)
          .kv("min_us", r.min_us);
      j.kv("gbps", r.gbps);
      if (pg > 0) {
        j.kv("vs_probe", r.vs_probe);
      } else {
        j.key("vs_probe").null();
      }
      j.kv("gflops", r.gflops).end_object();
    }
    j.end_array().end_object();
    std::printf("%s\n", j.str().c_str());
    return 0;
  }
  std::printf("weights %lld x %lld, batch %d, %d threads, SIMD %s\n", static_cast<long long>(rows),
              static_cast<long long>(cols), batch, threads, cpu::current_target_name().c_str());
  if (pg > 0) {
    std::printf(
        "memory read bandwidth probe: %.2f GB/s (median of %zu passes interleaved with the "
        "calls)\n",
        pg, probe_gbps.size());
  }
  std::printf("%-6s %12s %12s %12s %9s %9s %9s\n", "type", "bytes", "median us", "min us", "GB/s",
              "vs probe", "GFLOP/s");
  for (const auto& r : out) {
    std::printf("%-6s %12zu %12.1f %12.1f %9.2f %8.0f%% %9.1f\n", r.type.c_str(), r.bytes,
                r.median_us, r.min_us, r.gbps, 100.0 * r.vs_probe, r.gflops);
  }
  return 0;
}

}  // namespace kivi::tools
