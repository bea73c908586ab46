// kivi bench-comm: what tensor parallelism's collectives cost between the ranks of an
// mpirun job (on one machine: loopback through shared memory; across machines: the
// network), per call and per generated token.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "common.h"
#include "core/error.h"
#include "core/json.h"
#include "core/timer.h"
#include "dist/dist.h"
#include "model/tensor_parallel.h"

namespace kivi::tools {

namespace {

struct Timing {
  double median_us = 0, p90_us = 0;
};

// Times `iters` calls of f after a few to warm up; every rank calls it as often.
template <typename F>
Timing time_calls(int iters, F&& f) {
  for (int i = 0; i < std::min(iters, 20); ++i) f();
  std::vector<double> t(static_cast<size_t>(iters));
  for (int i = 0; i < iters; ++i) {
    const double t0 = now_seconds();
    f();
    t[static_cast<size_t>(i)] = (now_seconds() - t0) * 1e6;
  }
  std::sort(t.begin(), t.end());
  return {t[t.size() / 2], t[t.size() * 9 / 10]};
}

}  // namespace

int cmd_bench_comm(int argc, char** argv) {
  Args a("bench-comm", "[--dim D] [--layers L] [--vocab V] [--iters N] [--json]",
         "Run under mpirun -np N: times the collectives of --dist tp between the ranks. Per\n"
         "layer a decode step adds two partial sums of D floats over the ranks (each rank\n"
         "gathers every rank's D floats and adds them in rank order); the classifier's slices\n"
         "of V logits are gathered once per token. Prints the time of each, the communication\n"
         "time per token (2 x L sums + 1 gather) and the bytes each rank receives per token.");
  a.add("dim", 0, "D", "Embedding width (Llama-3.2-1B: 2048; 8B: 4096; 70B: 8192).", "2048");
  a.add("layers", 0, "L", "Layers (1B: 16; 8B: 32; 70B: 80).", "16");
  a.add("vocab", 0, "V", "Vocabulary (Llama 3: 128256).", "128256");
  a.add("iters", 0, "N", "Timed calls of each collective.", "2000");
  a.add_flag("json", 0, "Print one JSON object.");
  if (!parse_command_line(a, argc, argv)) return 0;
  const int dim = static_cast<int>(a.integer("dim", 1, 1 << 20));
  const int layers = static_cast<int>(a.integer("layers", 1, 4096));
  const int vocab = static_cast<int>(a.integer("vocab", 1, 1 << 24));
  const int iters = static_cast<int>(a.integer("iters", 10, 1000000));
  const int N = dist::size();
  if (N < 2) {
    fail(
        "bench-comm measures collectives between ranks: run it as mpirun -np N kivi bench-comm "
        "(N >= 2)");
  }
  dist::setup(dist::Layout{N, 1});
  model::TpComm* comm = dist::tp_comm();
  std::vector<float> x(static_cast<size_t>(dim), 1.0f);
  const Timing sum = time_calls(iters, [&] { comm->sum(x.data(), x.size()); });
  std::vector<int> counts(static_cast<size_t>(N));
  for (int r = 0; r < N; ++r) counts[r] = vocab / N + (r < vocab % N ? 1 : 0);
  std::vector<float> part(static_cast<size_t>(counts[dist::rank()]), 0.5f), all(vocab);
  const Timing gather =
      time_calls(std::max(10, iters / 10), [&] { comm->gather(part.data(), counts, all.data()); });
  const double per_token_us = 2.0 * layers * sum.median_us + gather.median_us;
  const double bytes_in = (2.0 * layers * dim * (N - 1) + (vocab - counts[0])) * sizeof(float);
  if (!dist::is_root()) return 0;
  if (a.flag("json")) {
    JsonWriter j;
    j.begin_object();
    j.kv("ranks", N).kv("dim", dim).kv("layers", layers).kv("vocab", vocab);
    j.kv("sum_us_median", sum.median_us).kv("sum_us_p90", sum.p90_us);
    j.kv("gather_us_median", gather.median_us).kv("gather_us_p90", gather.p90_us);
    j.kv("comm_us_per_token", per_token_us).kv("bytes_received_per_token", bytes_in);
    j.end_object();
    std::printf("%s\n", j.str().c_str());
    return 0;
  }
  std::printf("%d ranks, dim %d, %d layers, vocab %d\n", N, dim, layers, vocab);
  std::printf("  partial sum of %d floats:   median %8.1f us, p90 %8.1f us\n", dim, sum.median_us,
              sum.p90_us);
  std::printf("  logits gather of %d:    median %8.1f us, p90 %8.1f us\n", vocab, gather.median_us,
              gather.p90_us);
  std::printf("  per token: %.2f ms of collectives (2 x %d sums + 1 gather), %.1f KiB received\n",
              per_token_us / 1e3, layers, bytes_in / 1024.0);
  return 0;
}

}  // namespace kivi::tools
