// KV cache formats side by side on one model (`kivi bench`): prefill and decode speed,
// cache bytes, and agreement of greedy tokens with the f32 cache.
//
// Every format gets its own session over the same model and the same worker threads.
// A throwaway session first prefills the prompt once (the mapped weights are read on
// first touch; that is not charged to the first format). Each session is filled
// (optionally), then prefills the same prompt (timed per format),
// then the decode steps run round-robin: step i runs one token of every format in turn,
// starting with a different format each step, and every step is timed on its own. A
// slow moment of a noisy machine therefore lands on all formats alike, and speeds are
// reported as medians over the steps.
//
// Fills place the decode steps at a long context:
//   text:   the fill tokens are prefilled like a prompt (every format sees the same
//           tokens, so greedy agreement stays meaningful);
//   random: seeded random keys and values are appended straight into every layer of
//           every cache through its format's own quantizer (KvCache::append), without a
//           forward pass. Fast, for speed only: the model never produced that history,
//           so the tokens that follow (and their agreement) mean nothing.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kv/kv_cache.h"
#include "model/context_parallel.h"
#include "model/forward.h"
#include "sparse/options.h"
#include "model/model.h"

namespace kivi {
class ThreadPool;
}

namespace kivi::runtime {

struct BenchConfig {
  std::vector<std::string> names;       // one per format, for display
  std::vector<kv::CacheConfig> caches;  // caches[0] is the reference (f32 unless told otherwise)
  // [formats] (optional) 1: run without a cache: every step recomputes every position
  // with the no-cache oracle (model::forward_no_cache), as a cacheless decoder does.
  std::vector<char> no_cache;
  std::vector<int> fill;    // text fill tokens (BOS first), or empty
  int fill_random = 0;      // positions of random keys and values instead of a text fill
  uint64_t seed = 1234;     // random fill
  std::vector<int> prompt;  // fed after the fill (BOS first when there is no fill)
  int n_gen = 200;          // greedy tokens per format = timed decode steps
  int ctx = 0;              // session capacity; 0 = exactly fill + prompt + n_gen
  int threads = 0;          // 0 = all cores
  model::ForwardOptions forward;
  sparse::Options sparse;         // block-sparse attention for every format but the reference
  bool sparse_reference = false;  // ... and for the reference too (when it is not f32)
  int fill_chunk = 256;           // text fill prefilled this many tokens at a time
  // Context parallelism (--dist cp): every session holds this rank's shard of the
  // positions; a random fill writes only the shard's positions.
  model::CpComm* cp = nullptr;
};

struct BenchFormatResult {
  std::string name;
  kv::CacheConfig cache;
  double prefill_seconds = 0, prefill_tps = 0;
  std::vector<double> step_seconds;  // [n_gen] one decode step each
  std::vector<double> attn_seconds;  // [n_gen] of which in attn::decode
  double decode_seconds = 0;         // median step
  double decode_tps = 0;             // 1 / median step
  double attn_share = 0;             // median over steps of attention time / step time
  bool no_cache = false;             // ran without a cache
  uint64_t kv_bytes = 0;             // bytes_used() after the run
  std::vector<int> tokens;           // [n_gen] greedy tokens
  double token_match = 0;            // percent of positions equal to the reference's token
  int first_divergence = -1;         // first position that differs, -1 if none
  double compression_vs_f32 = 0;     // bytes of an f32 cache at the same length / kv_bytes
  double compression_vs_f16 = 0;
  double overhead_pct = 0;  // median step relative to the reference's, minus 1, in percent
};

struct BenchResult {
  int ctx = 0;   // tokens in the cache when decoding starts (fill + prompt)
  int fill = 0;  // fill positions
  bool fill_random = false;
  int prompt_tokens = 0;
  int threads = 0;
  std::vector<BenchFormatResult> formats;  // [0] is the reference
};

// Runs the benchmark; `progress(done, total)` counts tokens over all formats.
BenchResult run_bench(const model::Model& m, const BenchConfig& cfg,
                      const std::function<void(int64_t, int64_t)>& progress = {});

// Appends n_tokens positions of seeded random keys and values to every layer of every
// cache (the same data for all): keys N(0, 1) with every 16th channel (from channel 3)
// scaled by 6, like the outlier channels of real keys; values N(0, 1). Each layer draws
// from its own stream (seeded by `seed` and the layer), so with a pool the layers fill in
// parallel (caches over a shared block pool fill one layer at a time: mapping a block
// touches every layer) and the data do not depend on the thread count.
// `progress(tokens)` reports tokens completed in every layer, on the calling thread.
void fill_random(const std::vector<kv::KvCache*>& caches, int n_tokens, uint64_t seed,
                 const std::function<void(int64_t)>& progress = {}, ThreadPool* pool = nullptr);

// Tokens for a text fill of n positions: BOS, then `text` tokenized once and repeated.
std::vector<int> fill_tokens(const tok::Tokenizer& tk, const std::string& text, int n);

// A paragraph in plain English for text fills.
extern const char* const kFillText;

}  // namespace kivi::runtime
