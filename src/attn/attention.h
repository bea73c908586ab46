// Decode attention: one query token (all its heads) over a layer's KV cache, reading
// every cache format in place. Dequantization is fused into the dot products and
// the weighted sum of values; no full-precision copy of the history is made.
//
// Work is split into tasks of (KV head, chunk of the sequence). All query heads of
// a KV head (GQA/MQA) are processed together, so each cached byte is read once per
// step. Each task keeps an online-softmax state (m, d, o) (Milakov & Gimelshein 2018;
// FlashAttention); chunk states are merged in a fixed order. Chunks have a fixed
// length, so results do not depend on the thread count.
#pragma once

#include <cstdint>
#include <vector>

#include "core/aligned.h"
#include "kv/kv_cache.h"

namespace kivi {
class ThreadPool;
}

namespace kivi::attn {

// How quantized formats are read.
//   kExact: float arithmetic on dequantized codes; matches dequantize-then-attend to
//           float rounding (tests: relative error < 1e-5).
//   kFast:  integer dot products (x86): KIVI and int8 keys against the query rounded
//           to int16 per head (and KIVI key group), KIVI values against the softmax
//           weights rounded to int16 per head, channel group and tile; stated error
//           bound in docs/KERNELS.md.
enum class Precision : uint8_t { kExact = 0, kFast = 1 };
const char* precision_name(Precision p);
Precision parse_precision(const std::string& s);

// How RoPE pairs the channels of a head: (2i, 2i + 1) (Llama's GGUF layout and
// llama2.c), or (i, i + D/2) (NeoX: Qwen2 and Hugging Face's rotate_half).
enum class RopeStyle : uint8_t { kAdjacent = 0, kNeox = 1 };

struct Params {
  int n_heads = 0;       // query heads (a multiple of the KV heads)
  float scale = 1.0f;    // softmax scale, usually 1/sqrt(head_dim)
  float softcap = 0.0f;  // scaled scores s -> softcap * tanh(s / softcap) (Gemma 2); 0: none
  const float* alibi_slopes = nullptr;  // [n_heads] ALiBi slopes, or null
  int window = 0;                       // attend to the last `window` tokens only; 0 = all
  int sinks = 0;  // with a window: also the first `sinks` tokens (StreamingLLM)
  // [n_heads] a learned logit per query head added to the softmax's denominator (exp(s -
  // m)), a token whose value is zero (gpt-oss's attention sinks), or null.
  const float* head_sinks = nullptr;
  Precision precision = Precision::kExact;
  // Keys stored before RoPE: key t is rotated by position t as attention reads it, with
  // rope[t][i] = (cos, sin) of pair i ([positions][D/2][2], the model's table). Null
  // when the cache holds rotated keys.
  const float* rope = nullptr;
  RopeStyle rope_style = RopeStyle::kAdjacent;
};

// Rotates x[D] by one position's RoPE row ([D/2][2] cos, sin) in place (scalar; the
// reference, and the model's queries and keys).
void rotate_rope(float* x, int D, const float* rope_row, RopeStyle style);

// ALiBi slopes (Press et al. 2022): 2^(-8 i / n) for a power-of-two n, with the
// interleaved extension for other head counts.
std::vector<float> alibi_slopes(int n_heads);

// The mergeable softmax state of one query head: running max m, denominator d and
// unnormalized output o[D].
struct State {
  float m;
  float d;
  float* o;
};
// a <- a (+) b over the same query; exact up to float rounding.
void merge(State& a, const State& b, int head_dim);
// The outputs out [rep][D] of `count` (>= 1) partial states of rep query heads, in token
// order: state c of head r is partials[c * stride + r * (D + 2) ...], o[0..D), then m, d.
// head_sinks [rep] (or null): each head's sink logit joins its denominator.
void merge_partials(const float* partials, size_t stride, int count, int rep, int D, float* out,
                    const float* head_sinks = nullptr);
// o[D] / (d + exp(sink - m)) of one merged state, in place (no sink: o / d; d = 0: zeros).
void normalize_state(float* o, int D, float m, float d, const float* sink);
// The same without the final division: out [rep][D + 2] holds each head's merged state
// (o unnormalized, then m, d), for merging with states computed elsewhere.
void merge_partial_states(const float* partials, size_t stride, int count, int rep, int D,
                          float* out);

// Scratch memory, allocated once per session.
class Workspace {
 public:
  Workspace() = default;
  Workspace(int n_threads, int n_heads, int n_kv_heads, int head_dim, int block, int ctx);
  float* partial(int task) { return partial_.data() + static_cast<size_t>(task) * task_stride_; }
  float* thread_scratch(int thread) {
    return scratch_.data() + static_cast<size_t>(thread) * scratch_stride_;
  }
  int max_tasks() const { return max_tasks_; }
  size_t task_stride() const { return task_stride_; }
  // Whether every thread's scratch guard still holds its pattern (checked by debug builds).
  bool scratch_guards_intact() const;

 private:
  static constexpr size_t kGuardFloats = 16;
  static constexpr uint32_t kGuardBits = 0x7fc0dead;  // a quiet NaN no kernel writes
  AlignedBuffer<float> partial_, scratch_;
  size_t task_stride_ = 0, scratch_stride_ = 0, scratch_floats_ = 0;
  int max_tasks_ = 0;
};

// Tokens per sequence chunk (multiples of the block size): the longest (it sizes the
// score scratch), the shortest (it bounds the number of tasks), and the one decode()
// uses for n_kv_heads heads and `range` tokens (independent of the thread count).
int chunk_tokens(int block);
int min_chunk_tokens(int block);
int chunk_tokens_for(int block, int n_kv_heads, int range);

// Asks the cache hierarchy (L2) for every byte a task over tokens [t0, t1) of KV head h
// reads: its key and value codes, their quantization parameters and residual rows.
// Callers that attend scattered ranges (block-sparse attention) issue it for the next
// range while attending this one, so that the next range's first misses do not wait.
void prefetch_range(const kv::LayerView& kv, int h, int t0, int t1);

// out[n_heads, D] = softmax(cap(q K^T * scale) + alibi) V over the tokens in `kv`.
// q: [n_heads, D]. The query sits at position kv.n_tokens - 1.
void decode(const kv::LayerView& kv, const float* q, float* out, const Params& p, ThreadPool* pool,
            Workspace& ws);

// decode() without the final normalization (nor head sinks): states [n_heads][D + 2] hold
// each query head's merged state (o unnormalized, m, d); an empty cache gives m = -inf, d = 0.
// Context parallelism merges the states of every rank's shard of the tokens
// (model/context_parallel.h).
void decode_state(const kv::LayerView& kv, const float* q, float* states, const Params& p,
                  ThreadPool* pool, Workspace& ws);
// states [n_heads][D + 2] of attention over no token: o = 0, m = -inf, d = 0.
void empty_states(float* states, int n_heads, int D);

// Reference: dequantizes every token with kv/codec.h, then attends in double.
void decode_reference(const kv::LayerView& kv, const float* q, float* out, const Params& p);
// The softmax weights of the query heads of KV head h over every token of `kv`, as
// decode_reference weighs them (in double, without a window): w[r * n + t] for query
// head h * rep + r, rep = p.n_heads / n_kv_heads, n = kv.n_tokens. For measuring what a
// selection of tokens captures (eval/attn_recall.h).
void attention_weights_reference(const kv::LayerView& kv, const float* q, const Params& p, int h,
                                 double* w);

// Dequantized key / value rows of token t, head h (reference path and tests).
void dequantize_key(const kv::StreamView& s, int t, int h, float* out);
void dequantize_value(const kv::StreamView& s, int t, int h, float* out);

}  // namespace kivi::attn
