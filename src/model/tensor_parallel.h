// Tensor parallelism (Shoeybi et al. 2019, Megatron-LM): N processes each hold a slice
// of every layer and run the same forward pass on it.
//
//   attention  the query heads of n_kv_heads / N KV heads (wq, wk, wv rows and their
//              biases), and the matching columns of wo: each process attends its heads
//              over its own KV cache, which therefore holds 1/N of the keys and values;
//   FFN        a contiguous range of the hidden channels (w_gate, w_up rows, w_down
//              columns);
//   classifier a contiguous range of the vocabulary (output rows).
//
// The products through wo and w_down leave partial sums; they are added across the
// processes in rank order (TpComm::sum), two reductions per layer, so a run on N
// processes gives the same bits every time. The classifier's slices are concatenated.
// The token embedding, the norms and everything else stay whole on every process.
//
// Column slices of a block-quantized matrix must start on a block boundary: a slice of
// wo holds n_heads / N heads, so Q4_K's 256-value blocks need (n_heads / N) * head_dim
// to be a multiple of 256; shard_tensor_parallel names the tensor that does not fit.
#pragma once

#include <cstddef>
#include <vector>

#include "model/model.h"

namespace kivi {
class ThreadPool;
}

namespace kivi::model {

// The collectives a tensor-parallel forward pass needs; dist/ implements them over MPI,
// tests over threads.
class TpComm {
 public:
  virtual ~TpComm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // x[n] = the sum over the ranks of every rank's x[n], added in rank order, so that
  // every rank gets the same bits and every run the same result.
  virtual void sum(float* x, size_t n) = 0;
  // out = the concatenation in rank order of every rank's part (counts[r] floats each).
  virtual void gather(const float* part, const std::vector<int>& counts, float* out) = 0;
  // The largest of every rank's x.
  virtual float max(float x) = 0;
};

// Turns a whole model into this process's slice for comm->size() processes (1: no
// change). Throws kivi::Error naming the constraint when the model cannot be split that
// way (the KV heads do not divide, a quantized column slice misses a block boundary, a
// slice would be empty). The comm must outlive the model.
void shard_tensor_parallel(Model& m, TpComm* comm);

// After a product through wo or w_down: the partial sums x[n] of every process, added.
void tp_reduce(const Model& m, float* x, size_t n);

// The classifier over n rows of normed activations x [n, dim] into logits [n, vocab]:
// this process's rows of the output matrix, then the slices of every process.
void classify(const Model& m, const float* x, int n, float* logits, ThreadPool* pool);

// The largest |value| of every process's x (int8 per-tensor scales under tensor
// parallelism see all the heads); max_abs of x alone without it.
float tp_max(const Model& m, float local_max);

}  // namespace kivi::model
