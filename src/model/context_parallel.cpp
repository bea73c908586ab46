#include "model/context_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "attn/attention.h"
#include "core/error.h"

namespace kivi::model {

int cp_shard_tokens(int ctx, int n, int block) {
  const int64_t blocks = (static_cast<int64_t>(ctx) + block - 1) / block;
  if (blocks < n) {
    fail(
        "--dist cp=%d: a context of %d tokens fills %lld block(s) of %d tokens, fewer than the "
        "ranks (each rank holds whole blocks; use a larger --ctx or fewer ranks)",
        n, ctx, static_cast<long long>(blocks), block);
  }
  return static_cast<int>((blocks + n - 1) / n * block);
}

void cp_merge(const CpShard& cp, const float* states, int n, int H, int D, float* out,
              std::vector<float>& buf, const float* head_sinks) {
  const int N = cp.comm->size();
  const size_t per_rank = static_cast<size_t>(n) * H * (D + 2);
  buf.resize(per_rank * N + static_cast<size_t>(D));
  cp.comm->gather(states, per_rank, buf.data());
  float* acc_o = buf.data() + per_rank * N;
  for (int i = 0; i < n; ++i) {
    for (int h = 0; h < H; ++h) {
      const size_t at = (static_cast<size_t>(i) * H + h) * (D + 2);
      attn::State acc{-INFINITY, 0.0f, acc_o};
      std::fill(acc_o, acc_o + D, 0.0f);
      for (int r = 0; r < N; ++r) {
        const float* s = buf.data() + per_rank * r + at;
        attn::merge(acc, attn::State{s[D], s[D + 1], const_cast<float*>(s)}, D);
      }
      float* o = out + (static_cast<size_t>(i) * H + h) * D;
      std::copy(acc_o, acc_o + D, o);
      attn::normalize_state(o, D, acc.m, acc.d, head_sinks ? head_sinks + h : nullptr);
    }
  }
}

}  // namespace kivi::model
