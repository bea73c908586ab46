// Prefill attention over query tiles: the n queries of a prompt chunk attend the cache
// together, a tile of consecutive positions of one KV head's query group against each
// run of stored tokens, so that every stored block is dequantized once per tile (not
// once per query) and the products run as small matrix multiplications with an online
// softmax per query (FlashAttention's loop order, over compressed blocks).
//
// The result is what appending and attending the chunk's tokens one at a time gives
// (model::forward's stream path, attn::decode per token), up to float rounding: query i
// (cache index pos0 + i) sees tokens [0, pos0 + i] (and the window/sink mask of
// Params); token t in the quantized form the cache stores if it was stored (quantized)
// when query i's token was appended, t < k_stored[i] (v_stored[i] for values), and in
// full precision otherwise, exactly as KIVI's residual window served it then.
//
// Scores and values are computed in float from dequantized rows, whatever
// Params::precision says (the fast integer paths serve decoding). Bound (tests): the
// outputs match the stream path within 2e-5 relative to the largest value; perplexity
// of the reference text within 1e-4 relative.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "attn/attention.h"
#include "core/aligned.h"
#include "kv/kv_cache.h"

namespace kivi {
class ThreadPool;
}

namespace kivi::attn {

// How a prompt chunk attends: tiled (prefill()), or stream (append and decode() one
// token at a time: the exact reference).
enum class PrefillMode : uint8_t { kTiled = 0, kStream = 1 };
const char* prefill_mode_name(PrefillMode m);
PrefillMode parse_prefill_mode(const std::string& s);

// Tokens of one key/value run a tile reads at a time (within one block).
inline constexpr int kPrefillKeys = 64;
// Query vectors (positions x query heads of one KV head) per tile, at most.
inline constexpr int kPrefillQueries = 128;
// Chunks shorter than this attend token by token (nothing to share).
inline constexpr int kPrefillMinRows = 4;

// One chunk of queries and where the full-precision rows of its history come from.
struct PrefillChunk {
  int pos0 = 0;              // cache index of the chunk's first token
  int n = 0;                 // its tokens: [pos0, pos0 + n), all appended
  const float* q = nullptr;  // [n][q_stride] rotated queries (n_heads x D used)
  size_t q_stride = 0;
  float* out = nullptr;  // [n][out_stride] normalized outputs
  size_t out_stride = 0;
  const int* k_stored = nullptr;  // [n] stored keys right after token pos0 + i was appended
  const int* v_stored = nullptr;  // [n] the same for values
  // Full-precision rows [kv_heads x D] of tokens [fp_first, pos0 + n): those before pos0
  // at pre_k/pre_v + (t - fp_first) * kv_stride, the chunk's own at new_k/new_v + (t -
  // pos0) * kv_stride (the rows that were appended).
  int fp_first = 0;
  const float* pre_k = nullptr;
  const float* pre_v = nullptr;
  const float* new_k = nullptr;
  const float* new_v = nullptr;
  size_t kv_stride = 0;
};

// Scratch of the tiled prefill, sized once per session; the residual rows and the
// storage schedule of a chunk grow on first use (append_and_prefill).
class PrefillWorkspace {
 public:
  PrefillWorkspace() = default;
  PrefillWorkspace(int n_threads, int n_heads, int n_kv_heads, int head_dim);
  float* thread_scratch(int thread) {
    return scratch_.data() + static_cast<size_t>(thread) * stride_;
  }
  int threads() const { return threads_; }
  int head_dim() const { return D_; }
  std::vector<float> pre_k, pre_v;      // full-precision history rows of a chunk
  std::vector<int> k_stored, v_stored;  // a chunk's storage schedule

 private:
  AlignedBuffer<float> scratch_;
  size_t stride_ = 0;
  int threads_ = 0, D_ = 0;
};

// Floats of one thread's scratch for query tiles of up to `rows` vectors of head size D.
size_t prefill_scratch_floats(int rows, int D);

// out = attention of the chunk's queries over `kv` (the cache after the whole chunk was
// appended), with p's scale, soft cap, ALiBi, window and sinks, head sinks and RoPE of
// pre-RoPE keys (p.rope: row t rotates cache index t). Tasks are (KV head, query tile);
// the result does not depend on the thread count.
void prefill(const kv::LayerView& kv, const PrefillChunk& c, const Params& p, ThreadPool* pool,
             PrefillWorkspace& ws);

// Appends the chunk's keys and values k, v [n][kv_dim] to `layer` of `cache` and
// attends its queries q [n][q_dim] (rotated) into out [n][q_dim] by prefill(),
// recording the storage schedule and the residual rows the queries saw. The cache must
// not evict during the chunk (no window of its own) and the layer must own its cache.
// p.rope, for pre-RoPE keys, is the table row of cache index 0.
void append_and_prefill(kv::KvCache& cache, int layer, const float* k, const float* v, int n,
                        const float* q, float* out, const Params& p, ThreadPool* pool,
                        PrefillWorkspace& ws);

namespace detail {
// One task: query rows [i0, i1) of the chunk and KV head h (prefill_task.cpp).
struct PrefillTask {
  const kv::LayerView* kv;
  const PrefillChunk* c;
  const Params* p;
  int h, i0, i1;
  float* scratch;
};
void prefill_tile(const PrefillTask& t);
}  // namespace detail

}  // namespace kivi::attn
