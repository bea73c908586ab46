// The forward pass over several sequences at once, each with its own KV cache and
// position: one step of continuous batching. The rows of all sequences (one token of
// each decoding sequence, a chunk of each prefilling one) go through every matrix
// product together, so each weight matrix is read once per step for the whole batch;
// attention runs per sequence over its own cache.
//
// Every output row of ops::matmul is one dot product with a fixed accumulation order,
// and attn::decode's result does not depend on the thread count, so each sequence's
// logits are the same bits as model::forward gives for it alone.
//
// Attention is threaded in one of two ways, with the same result: across sequences
// (each worker takes whole sequences, with a workspace of its own) when there are at
// least two sequences per worker and each has one row; otherwise sequence after
// sequence, each split across (KV head, chunk) tasks by attn::decode, or across (KV
// head, query tile) tasks by attn::prefill for a chunk of a prefilling sequence (then
// equal to model::forward's tiled path for it, up to float rounding).
#pragma once

#include <vector>

#include "attn/attention.h"
#include "core/aligned.h"
#include "kv/kv_cache.h"
#include "model/forward.h"
#include "model/model.h"

namespace kivi {
class ThreadPool;
}

namespace kivi::model {

struct BatchSequence {
  kv::KvCache* cache = nullptr;
  const int* tokens = nullptr;  // [n] tokens at positions cache->n_tokens(0), +1, ...
  int n = 0;
  float* logits = nullptr;  // [vocab]: the logits of the last token, or null to skip
  // Logits of every token ([n][vocab] at `logits`), each as decoding the tokens one at a
  // time gives them, bit for bit: the rows attend one by one (a speculative verification).
  bool all_logits = false;
};

class BatchForward {
 public:
  // Up to max_rows tokens per step in up to max_seqs sequences of up to ctx tokens each;
  // n_threads sizes the per-worker attention workspaces.
  BatchForward(const ModelConfig& c, int max_rows, int max_seqs, int ctx, int n_threads,
               int kv_block);

  int max_rows() const { return st_.max_batch; }
  int max_seqs() const { return max_seqs_; }

  // Runs one step. Throws kivi::Error (before touching any cache) for a batch that
  // does not fit or a token outside the vocabulary.
  void run(const Model& m, const BatchSequence* seqs, int n_seqs, ThreadPool* pool,
           const ForwardOptions& opt);

 private:
  void attend(const Model& m, int layer, const BatchSequence* seqs, int n_seqs, ThreadPool* pool,
              const attn::Params& ap, bool per_sequence, attn::PrefillMode prefill);

  int max_seqs_, ctx_;
  ForwardState st_;                         // activations [max_rows], RoPE, attention workspace
  std::vector<attn::Workspace> worker_ws_;  // [n_threads] for sequence-parallel attention
  std::vector<int> first_row_;              // [max_seqs + 1] first row of each sequence
  std::vector<int> pos0_;                   // [max_seqs] position of each sequence's first row
  AlignedBuffer<float> last_;               // [rows out, dim] normed rows that want logits
  AlignedBuffer<float> logits_;             // [rows out, vocab]
  int out_rows_ = 0;                        // rows last_ and logits_ hold
};

}  // namespace kivi::model
