// Batched decoding at long contexts (`kivi bench-batch`): the step continuous batching
// runs (model::BatchForward over caches drawing on one shared kv::BlockPool, as the
// scheduler serves), timed per cache format and batch size, without prefilling.
//
// Preparation: per format, one shared pool holds max(batches) sequences; sequence s of
// every format gets the same seeded random keys and values (fill_random, seed + s)
// through its format's own quantizer, so every format attends over the same history.
// Sequences fill in parallel on the worker threads.
// A configuration (format, batch B) decodes sequences 0 .. B-1 of its format's pool.
// Each sequence feeds its own greedy token (the argmax of its last logits; the first
// one is drawn from the seed), so the rows of a step differ as in serving.
//
// Timing: one untimed round runs every configuration once (weights read on first
// touch, blocks mapped). Then round i times one step of every configuration in turn,
// starting with configuration i % C, plus one pass of the memory-bandwidth probe, so a
// slow moment of a shared machine lands on all of them and on the probe alike. The
// step time is split into attention (attn::decode over the caches) and the rest (the
// matrix products, which read the weights once per step for the whole batch, plus
// norms and RoPE). Speeds are medians over the rounds.
//
// Sequences shared between batch sizes grow by one token per step they take part in:
// after the warm-up and R rounds sequence 0 holds fill + (R + 1) x (number of batch
// sizes) tokens, little beside the fill at the lengths this measures.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kv/kv_cache.h"
#include "model/forward.h"
#include "model/model.h"

namespace kivi::runtime {

struct BatchBenchConfig {
  std::vector<std::string> names;       // one per format, for display
  std::vector<kv::CacheConfig> caches;  // formats; the shape comes from the model
  std::vector<int> batches;             // batch sizes, each >= 1
  int fill = 0;                         // random positions per sequence before decoding
  uint64_t seed = 1234;                 // sequence s is filled with seed + s
  int steps = 16;                       // timed rounds
  int threads = 0;                      // 0 = all cores
  model::ForwardOptions forward;        // precision, window (attn_seconds is set here)
  bool probe = true;                    // run the bandwidth probe beside the steps
  uint64_t probe_bytes = uint64_t{512} << 20;
  // Keep every sequence's fed tokens and logits (tests replay them alone).
  bool record = false;
};

struct BatchBenchRow {  // one configuration: a format at a batch size
  int format = 0;       // index into the configuration's formats
  std::string name;
  kv::CacheConfig cache;
  int batch = 0;
  std::vector<double> step_seconds;  // [steps]
  std::vector<double> attn_seconds;  // [steps] of which in attention
  double step_median = 0;            // seconds
  double attn_median = 0;            // seconds, median of the attention part
  double rest_median = 0;            // seconds, median of step - attention
  double agg_tps = 0;                // batch / step_median
  double seq_tps = 0;                // 1 / step_median
  uint64_t kv_bytes_per_seq = 0;     // mean bytes_used of the batch's caches at the end
  uint64_t cache_bytes_step = 0;     // bytes_used of all the batch's caches (what a step reads)
  double roofline_seconds = 0;       // (weights + cache bytes) / probe bandwidth; 0 without
  double vs_batch1 = 0;              // agg_tps / agg_tps of the same format at batch 1; 0: none
  double vs_f16 = 0;                 // agg_tps / agg_tps of f16 at the same batch; 0: none
};

struct BatchBenchRecord {     // one sequence of one format, when recording
  std::vector<int> tokens;    // fed, in order
  std::vector<float> logits;  // [tokens][vocab] after each
};

struct BatchBenchResult {
  int fill = 0;
  int ctx = 0;  // capacity of every sequence
  int threads = 0;
  int max_batch = 0;
  uint64_t weight_bytes_step = 0;  // matrices read by one step (layers and classifier)
  double probe_gbps = 0;           // median of the passes; 0 without the probe
  double fill_seconds = 0;
  std::vector<BatchBenchRow> rows;                     // format-major, batches in order
  std::vector<std::vector<BatchBenchRecord>> records;  // [formats][max_batch] when recording
};

// Weight bytes one decode step reads: every layer's matrices and the classifier (the
// token embedding rows a step copies are negligible).
uint64_t step_weight_bytes(const model::Model& m);

// Runs the benchmark. `progress(phase, done, total)` reports "fill" (positions over all
// sequences) and then "decode" (timed steps over all configurations).
BatchBenchResult run_bench_batch(
    const model::Model& m, const BatchBenchConfig& cfg,
    const std::function<void(const char*, int64_t, int64_t)>& progress = {});

// Bytes the run allocates for caches: every format's pool for max(batches) sequences
// of `ctx` tokens, with their rings and block tables.
uint64_t bench_batch_cache_bytes(const model::Model& m, const BatchBenchConfig& cfg, int ctx);

// The capacity of every sequence: fill + (steps + 1) x (number of batch sizes).
int bench_batch_ctx(const BatchBenchConfig& cfg);

}  // namespace kivi::runtime
