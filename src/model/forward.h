// The Llama forward pass (Touvron et al. 2023): RMSNorm, RoPE, grouped-query
// attention over the KV cache, SwiGLU feed-forward, tied or separate classifier;
// with Qwen2's Q/K/V biases and Qwen3's per-head Q/K RMSNorm where the
// architecture has them (model/config.h), both applied before RoPE.
//
// Prefill of n tokens runs every matrix product batched over the tokens and appends
// the tokens one at a time, so that the cache ends in exactly the state that feeding
// them one at a time leaves. Attention runs over query tiles (attn/prefill.h: each
// stored block read once per tile, what each query saw at its own append honoured, the
// result equal to token-by-token decoding up to float rounding), or, with
// ForwardOptions::prefill = kStream, token by token with the decode kernel, bit for bit
// what decoding the tokens one at a time gives. Layers that evict within a chunk (their
// own sliding window), borrow another layer's cache, attend block-sparsely, run context
// parallel or are observed always take the stream path.
#pragma once

#include <vector>

#include "attn/attention.h"
#include "attn/prefill.h"
#include "core/aligned.h"
#include "kv/kv_cache.h"
#include "model/context_parallel.h"
#include "model/ffn.h"
#include "model/model.h"

namespace kivi {
class ThreadPool;
}
namespace kivi::sparse {
class SparseAttention;
}

namespace kivi::model {

// Activations for up to `max_batch` tokens, allocated once.
struct ForwardState {
  ForwardState(const ModelConfig& c, int max_batch, int ctx, int n_threads, int kv_block);
  int max_batch;
  AlignedBuffer<float> x;               // [max_batch, dim] residual stream
  AlignedBuffer<float> xb;              // [max_batch, dim] normed input
  AlignedBuffer<float> xb2;             // [max_batch, dim] projection output
  AlignedBuffer<float> q;               // [max_batch, q_dim]
  AlignedBuffer<float> k;               // [max_batch, kv_dim]
  AlignedBuffer<float> v;               // [max_batch, kv_dim]
  AlignedBuffer<float> att;             // [max_batch, q_dim]
  AlignedBuffer<float> hb;              // [max_batch, hidden]
  AlignedBuffer<float> hb2;             // [max_batch, hidden]
  MoeScratch moe;                       // a mixture of experts' (model/ffn.h)
  AlignedBuffer<float> rope;            // [ctx, head_dim / 2, 2] cos, sin
  AlignedBuffer<float> rope_local;      // the same for sliding-window layers' own RoPE, or empty
  int rope_rows;                        // positions in `rope`
  AlignedBuffer<float> rope_batch;      // [2 max_batch, head_dim] rows of positions past the table
  std::vector<const float*> rope_ptrs;  // [2 max_batch] each token's RoPE row, then its local one
  // Keys stored after RoPE in a cache that has dropped tokens (a sliding window): the
  // absolute position of the next token is its cache position plus this.
  int64_t position_offset = 0;
  std::vector<float> slopes;  // [n_heads] ALiBi slopes (when enabled)
  attn::Workspace ws;
  attn::PrefillWorkspace pws;  // the tiled prefill's
  // Context parallelism (ForwardOptions::cp): the positions fed so far over every shard,
  // and the attention states of a batch [max_batch][n_heads][head_dim + 2] with scratch.
  int64_t cp_pos = 0;
  std::vector<float> cp_states, cp_buf;
};

// Sees every token's attention input in every layer (evaluation probes such as
// eval/attn_recall.h): called after the token's keys and values are stored and it has
// attended, with the layer, the layer whose cache it reads, the cache as the token saw
// it, the token's rotated queries q [n_heads, head_dim] and the attention parameters.
class AttentionObserver {
 public:
  virtual ~AttentionObserver() = default;
  virtual void attended(int layer, int owner, const kv::LayerView& kv, const float* q,
                        const attn::Params& p) = 0;
};

struct ForwardOptions {
  attn::Precision precision = attn::Precision::kExact;
  int window = 0;                  // sliding-window attention (0 = full)
  int sinks = 0;                   // with a window: also attend to the first `sinks` tokens
  double* attn_seconds = nullptr;  // when set, the time spent in attn::decode is added to it
  sparse::SparseAttention* sparse =
      nullptr;  // block-sparse attention for the layers it selects in, or null
  AttentionObserver* observer = nullptr;                  // or null
  attn::PrefillMode prefill = attn::PrefillMode::kTiled;  // how a chunk of tokens attends
  // [n][dim]: every row's final hidden state after the output norm (embeddings), or null.
  float* hidden = nullptr;
  // Context parallelism (model/context_parallel.h): the cache holds only this rank's
  // shard of the positions; cp.comm null: the whole context.
  CpShard cp;
};

// Runs tokens[0..n) at positions pos, pos+1, ... (pos == cache.n_tokens(l) for all l),
// n <= st.max_batch. Writes logits [n, vocab] if all_logits, else only the last
// token's [vocab]. `logits` may be null to skip the classifier. Throws kivi::Error naming
// the layer when the residual stream or the logits stop being finite (model/finite.h).
void forward(const Model& m, ForwardState& st, kv::KvCache& cache, const int* tokens, int n,
             float* logits, bool all_logits, ThreadPool* pool, const ForwardOptions& opt);

// The no-cache oracle: recomputes every position of `tokens` from scratch with plain
// attention over freshly computed keys and values (no kv/ or attn/ code) and
// returns the logits of the last position. RoPE is the model's at its full context
// (ModelConfig::ctx: LongRoPE's factors chosen by it).
// layer_owner (optional, kv::layer_owners): a layer whose owner is another layer uses
// that layer's keys and values (cross-layer sharing).
std::vector<float> forward_no_cache(const Model& m, const std::vector<int>& tokens,
                                    ThreadPool* pool, const std::vector<int>& layer_owner = {});

// RoPE on one vector of `n_heads` heads at position pos: pair i (channels (2i, 2i+1),
// llama2.c's and GGUF llama's layout, or (i, i + D/2) with kNeox) turns by the angle
// of rope_row[2i], rope_row[2i+1] = cos, sin.
void apply_rope(float* x, int n_heads, int head_dim, const float* rope_row,
                attn::RopeStyle style = attn::RopeStyle::kAdjacent);
// Angles pos * freq_scale * theta^(-2i/head_dim) / freq_factors[i] (factors optional:
// rope_freqs.weight, as llama.cpp divides by them), as [head_dim / 2][cos, sin].
void fill_rope_row(float* row, int64_t pos, int head_dim, float theta, float freq_scale = 1.0f,
                   const float* freq_factors = nullptr);
void fill_rope_table(float* table, int ctx, int head_dim, float theta, float freq_scale = 1.0f,
                     const float* freq_factors = nullptr);
// YaRN's row (ModelConfig::yarn_orig_ctx): each pair's angle blends pos * freq_scale *
// theta^(-2i/head_dim) and the unscaled angle by a ramp over the pairs, cos and sin times
// 1 + 0.1 ln(1 / freq_scale).
void fill_yarn_row(float* row, int64_t pos, int head_dim, float theta, float freq_scale,
                   int orig_ctx, float beta_fast, float beta_slow);
// The same with the model's RoPE parameters; local: those of its sliding-window layers
// (ModelConfig::rope_theta_swa).
// `ctx`: the context the rows serve (it picks LongRoPE's factors).
void fill_rope_row(float* row, int64_t pos, const ModelConfig& c, int ctx, bool local = false);
void fill_rope_table(float* table, int ctx, const ModelConfig& c, bool local = false);
// The same row as a pure rotation (each pair's cos, sin of unit length: LongRoPE's attention
// factor and YaRN's magnitude divided out), for turning keys that carry them already.
void fill_rope_rotation(float* row, int64_t pos, const ModelConfig& c, int ctx, bool local = false);
// Gemma's embedding scale: x [n, dim] times sqrt(dim) when the model has it.
void scale_embedding(const ModelConfig& c, float* x, int n);
// Gemma's RMSNorm of a sublayer's output x [n, dim] before the residual add, in place,
// when the model has post-norms.
void post_norm(const ModelConfig& c, const std::vector<float>& weight, float* x, int n);
// The output projection's bias on x [n, dim] when the model has one (once over
// tensor-parallel ranks: rank 0 adds it before the sum).
void output_bias(const ModelConfig& c, const LayerWeights& L, float* x, int n);
// Biases, then per-head RMSNorm (qwen2, qwen3) of the projections of n tokens:
// q [n, q_dim], and k, v [n, kv_dim] unless null.
void finish_projections(const ModelConfig& c, const LayerWeights& L, float* q, float* k, float* v,
                        int n);

}  // namespace kivi::model
