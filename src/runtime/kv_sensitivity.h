// Per-layer KV sensitivity: what quantizing one layer's keys or values costs in KL divergence
// against an f32 cache, measured as deployed (perplexity runs over a text), and a proposed
// per-layer mix (--kv-cache-layers) for a budget of bits per element.
//
// The sweep runs the text once with an f32 cache (the base distributions, kept in memory),
// then once per (layer, stream, format) with only that stream of that layer in the format and
// every other stream in f32, and once per format for every layer in it (the uniform caches a
// mix competes with). The proposal is greedy: every stream starts at its cheapest format and
// the upgrade with the most KL removed per added bit is taken while the average stays within
// the budget, treating the per-stream costs as additive (an approximation: quantization
// errors of several layers compound); the proposed mix is then run and its KL measured.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kv/format.h"
#include "runtime/perplexity.h"
#include "runtime/session.h"

namespace kivi::runtime {

struct SensitivityOptions {
  std::vector<kv::Format> formats;  // the candidates, at least one
  double budget_bits = 0;           // average bits per element of the proposal; 0: none
  EvalMode mode = EvalMode::kStreaming;
};

struct SensitivityCell {
  int layer = 0;
  bool key = true;
  kv::Format format = kv::Format::kF32;
  double bits = 0;  // bits per element of that stream (codes and parameters)
  double kl = 0;    // mean KL divergence against the f32 cache
  double ppl = 0;
};

struct SensitivityRun {  // a whole-cache configuration: a uniform format or the proposal
  std::string map;       // --kv-cache-layers
  double bits = 0;       // mean bits per element over the keys and values of every layer
  double kl = 0, ppl = 0;
  double predicted_kl = 0;  // the sum of its streams' cells (the proposal's estimate)
};

struct SensitivityReport {
  double base_ppl = 0;
  int64_t tokens = 0;
  std::vector<int> layers;  // the layers that store a cache
  std::vector<SensitivityCell> cells;
  std::vector<SensitivityRun> uniform;  // one per format
  bool proposed = false;
  SensitivityRun proposal;
};

// Runs the sweep over `tokens` with the options' model shape and cache policies (group size,
// residual, flush, key RoPE); progress(done, total) counts scored tokens over all runs.
SensitivityReport kv_sensitivity(const model::Model& m, const SessionOptions& base,
                                 const std::vector<int>& tokens, const SensitivityOptions& o,
                                 const std::function<void(int64_t, int64_t)>& progress = {});

}  // namespace kivi::runtime
