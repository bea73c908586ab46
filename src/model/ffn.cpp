#include "model/ffn.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/error.h"
#include "ops/ops.h"

namespace kivi::model {

MoeScratch::MoeScratch(const ModelConfig& c, int rows) : max_rows(rows) {
  if (c.n_experts == 0) return;
  const size_t R = static_cast<size_t>(rows), K = static_cast<size_t>(c.n_experts_used);
  logits.reset(R * c.n_experts);
  picked.resize(R * K);
  weight.resize(R * K);
  first.resize(static_cast<size_t>(c.n_experts) + 1);
  order.resize(R * K);
  cursor.resize(static_cast<size_t>(c.n_experts));
  xe.reset(R * c.dim);
  ye.reset(R * K * c.dim);
}

// hb = act(hb) * hb2 with the model's activation.
static void gate(const ModelConfig& c, float* hb, const float* hb2, int n) {
  if (c.ffn_act == Activation::kGeluTanh) {
    ops::gelu_tanh_mul(hb, hb2, n);
  } else if (c.ffn_act == Activation::kSwigluOai) {
    ops::swiglu_oai_mul(hb, hb2, n);
  } else {
    ops::silu_mul(hb, hb2, n);
  }
}

void route(const float* logits, int n_experts, int used, int* picked, float* weight) {
  // Selection of the `used` largest by insertion (used is small: 2 to 8).
  int n = 0;
  for (int e = 0; e < n_experts; ++e) {
    const float v = logits[e];
    if (n == used && !(v > logits[picked[n - 1]])) continue;
    int i = n < used ? n++ : n - 1;
    while (i > 0 && v > logits[picked[i - 1]]) {
      picked[i] = picked[i - 1];
      --i;
    }
    picked[i] = e;
  }
  const float top = logits[picked[0]];
  double sum = 0.0;
  for (int j = 0; j < used; ++j) {
    weight[j] = std::exp(logits[picked[j]] - top);
    sum += weight[j];
  }
  for (int j = 0; j < used; ++j) weight[j] = static_cast<float>(weight[j] / sum);
}

void ffn(const ModelConfig& c, const LayerWeights& L, const float* xb, int n, float* out, float* hb,
         float* hb2, MoeScratch& moe, ThreadPool* pool) {
  const int dim = c.dim, hid = c.hidden_dim;
  if (c.n_experts == 0) {
    ops::matmul(L.w_gate, xb, n, hb, pool);
    ops::matmul(L.w_up, xb, n, hb2, pool);
    gate(c, hb, hb2, n * hid);
    ops::matmul(L.w_down, hb, n, out, pool);
    return;
  }
  if (n > moe.max_rows) fail("mixture of experts: %d rows, scratch for %d", n, moe.max_rows);
  const int E = c.n_experts, K = c.n_experts_used;
  ops::matmul(L.router, xb, n, moe.logits.data(), pool);
  if (!L.router_bias.empty())
    for (int i = 0; i < n; ++i)
      ops::add_inplace(moe.logits.data() + static_cast<size_t>(i) * E, L.router_bias.data(), E);
  std::fill(moe.first.begin(), moe.first.end(), 0);
  for (int i = 0; i < n; ++i) {
    int* p = moe.picked.data() + static_cast<size_t>(i) * K;
    route(moe.logits.data() + static_cast<size_t>(i) * E, E, K, p,
          moe.weight.data() + static_cast<size_t>(i) * K);
    for (int j = 0; j < K; ++j) ++moe.first[p[j] + 1];
  }
  // Entries grouped by expert (counting sort; rows ascending within an expert).
  std::partial_sum(moe.first.begin(), moe.first.end(), moe.first.begin());
  std::vector<int>& at = moe.order;
  std::copy(moe.first.begin(), moe.first.end() - 1, moe.cursor.begin());
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < K; ++j)
      at[moe.cursor[moe.picked[static_cast<size_t>(i) * K + j]]++] = i * K + j;
  for (int e = 0; e < E; ++e) {
    const int b = moe.first[e], cnt = moe.first[e + 1] - b;
    if (cnt == 0) continue;
    for (int r = 0; r < cnt; ++r) {
      std::memcpy(moe.xe.data() + static_cast<size_t>(r) * dim,
                  xb + static_cast<size_t>(at[b + r] / K) * dim, sizeof(float) * dim);
    }
    ops::matmul(L.gate_exps[e], moe.xe.data(), cnt, hb, pool);
    ops::matmul(L.up_exps[e], moe.xe.data(), cnt, hb2, pool);
    const bool bias = !L.gate_exps_bias.empty();
    for (int r = 0; bias && r < cnt; ++r) {
      ops::add_inplace(hb + static_cast<size_t>(r) * hid, &L.gate_exps_bias[size_t(e) * hid], hid);
      ops::add_inplace(hb2 + static_cast<size_t>(r) * hid, &L.up_exps_bias[size_t(e) * hid], hid);
    }
    gate(c, hb, hb2, cnt * hid);
    ops::matmul(L.down_exps[e], hb, cnt, moe.xe.data(), pool);
    // The down projection's bias is added once over tensor-parallel ranks (rank 0's).
    for (int r = 0; bias && c.tp.rank == 0 && r < cnt; ++r) {
      ops::add_inplace(moe.xe.data() + static_cast<size_t>(r) * dim,
                       &L.down_exps_bias[size_t(e) * dim], dim);
    }
    for (int r = 0; r < cnt; ++r) {
      std::memcpy(moe.ye.data() + static_cast<size_t>(at[b + r]) * dim,
                  moe.xe.data() + static_cast<size_t>(r) * dim, sizeof(float) * dim);
    }
  }
  // Each row: its experts' outputs weighted, in the order they were picked.
  for (int i = 0; i < n; ++i) {
    float* o = out + static_cast<size_t>(i) * dim;
    const float* w = moe.weight.data() + static_cast<size_t>(i) * K;
    const float* y = moe.ye.data() + static_cast<size_t>(i) * K * dim;
    for (int d = 0; d < dim; ++d) o[d] = w[0] * y[d];
    for (int j = 1; j < K; ++j) {
      const float* yj = y + static_cast<size_t>(j) * dim;
      for (int d = 0; d < dim; ++d) o[d] += w[j] * yj[d];
    }
  }
}

}  // namespace kivi::model
