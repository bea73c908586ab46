// Context parallelism (ring-attention style, without the ring): N processes each hold the
// whole model (or a tensor-parallel slice of it) and a contiguous shard of the context's
// positions: rank r stores the keys and values of positions [r * S, (r + 1) * S) in its
// own KV cache of S tokens, so a context N times longer than one machine's memory fits.
//
// Every rank runs every token through every layer (the projections and the FFN are
// replicated); the rank whose shard holds the token's position stores its keys and
// values. Each rank attends the query over its shard, keeping the online-softmax state
// (m, d, o) (attn::decode_state); the states are gathered and merged in rank order, the
// merge the attention kernel uses between its chunks, and every rank continues with the
// same output. A prefill batch gathers the states of all its tokens at once: one
// collective per layer and batch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kivi::model {

// The collective context parallelism needs; dist/ implements it over MPI.
class CpComm {
 public:
  virtual ~CpComm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // out [size * n] = every rank's n floats, in rank order.
  virtual void gather(const float* mine, size_t n, float* out) = 0;
};

// This process's shard of the context.
struct CpShard {
  CpComm* comm = nullptr;  // null: the whole context is here
  int start = 0;           // first position stored here
  int size = 0;            // positions per shard
  int ctx = 0;             // positions over all shards
  bool owns(int64_t pos) const { return pos >= start && pos < static_cast<int64_t>(start) + size; }
  // Tokens of this shard among the first `n` positions.
  int local_count(int64_t n) const {
    const int64_t c = n - start;
    return c <= 0 ? 0 : c >= size ? size : static_cast<int>(c);
  }
};

// Positions per shard for a context of ctx positions over n ranks: ctx / n rounded up to
// whole blocks of `block` tokens. Throws kivi::Error when some rank would get none.
int cp_shard_tokens(int ctx, int n, int block);

// Merges every rank's attention states of n tokens ([n][H][D + 2]: o unnormalized, m, d)
// in rank order into out [n][H * D]; `buf` is scratch; head_sinks [H] (or null): the
// heads' sink logits (attn::Params::head_sinks).
void cp_merge(const CpShard& cp, const float* states, int n, int H, int D, float* out,
              std::vector<float>& buf, const float* head_sinks = nullptr);

}  // namespace kivi::model
