// The feed-forward block of a layer: one SwiGLU FFN, or a mixture of experts
// (ModelConfig::n_experts > 0) as Qwen3-MoE and Mixtral define it:
//   logits = router . x                      [n_experts]
//   picked = the n_experts_used largest logits (ties: the lower expert first)
//   w_j    = softmax over the picked logits  (= softmax over all, top-k, renormalized)
//   out    = sum_j w_j * down_j(silu(gate_j . x) * (up_j . x)), summed in the order picked
// A batch of rows is grouped by expert, so each chosen expert's weights are read once per
// batch with every row that chose it; a row's result does not depend on the others in
// its batch (matmul's rows are bit-identical to matvec's).
#pragma once

#include <vector>

#include "core/aligned.h"
#include "model/config.h"
#include "model/model.h"

namespace kivi {
class ThreadPool;
}

namespace kivi::model {

// Scratch of the mixture of experts for up to max_rows rows, allocated once.
struct MoeScratch {
  MoeScratch() = default;
  MoeScratch(const ModelConfig& c, int max_rows);
  int max_rows = 0;
  AlignedBuffer<float> logits;  // [rows][n_experts]
  std::vector<int> picked;      // [rows][used] expert of each slot, by falling logit
  std::vector<float> weight;    // [rows][used]
  std::vector<int> first;       // [n_experts + 1] first entry of each expert in `order`
  std::vector<int> order;       // [rows * used] entries (row * used + slot) by expert
  std::vector<int> cursor;      // [n_experts] filling `order`
  AlignedBuffer<float> xe;      // [rows][dim] the rows of one expert, then its outputs
  AlignedBuffer<float> ye;      // [rows * used][dim] every entry's expert output
};

// out[n, dim] = the FFN of layer L over xb[n, dim] (already normed). hb, hb2: [n, hidden]
// scratch; moe: scratch for a mixture of experts (unused otherwise).
void ffn(const ModelConfig& c, const LayerWeights& L, const float* xb, int n, float* out, float* hb,
         float* hb2, MoeScratch& moe, ThreadPool* pool);

// The router's choice for one row of logits: the `used` largest (ties: lower index
// first) into picked[used] and their softmax weights into weight[used].
void route(const float* logits, int n_experts, int used, int* picked, float* weight);

}  // namespace kivi::model
