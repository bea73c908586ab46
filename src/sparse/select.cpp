#include "sparse/select.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace kivi::sparse {

int top_k(const float* scores, int n, int k, int* out, std::pair<float, int>* heap) {
  if (k <= 0) return 0;
  if (k >= n) {
    for (int i = 0; i < n; ++i) out[i] = i;
    return n;
  }
  // "a before b" in the heap order: a is the better one, so the heap's front is the
  // worst of the k kept.
  auto better = [](const std::pair<float, int>& a, const std::pair<float, int>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  auto value = [&](int i) {
    const float s = scores[i];
    return std::isnan(s) ? std::numeric_limits<float>::infinity() : s;
  };
  for (int i = 0; i < k; ++i) heap[i] = {value(i), i};
  std::make_heap(heap, heap + k, better);
  for (int i = k; i < n; ++i) {
    const std::pair<float, int> c{value(i), i};
    if (better(c, heap[0])) {
      std::pop_heap(heap, heap + k, better);
      heap[k - 1] = c;
      std::push_heap(heap, heap + k, better);
    }
  }
  for (int i = 0; i < k; ++i) out[i] = heap[i].second;
  std::sort(out, out + k);
  return k;
}

int attended_ranges(const int* blocks, int n_blocks, int B, int sinks, int local_start, int n,
                    Range* out) {
  int m = 0;
  auto add = [&](int t0, int t1) {
    t1 = std::min(t1, n);
    if (t0 >= t1) return;
    if (m > 0 && t0 <= out[m - 1].t1) {
      out[m - 1].t1 = std::max(out[m - 1].t1, t1);
    } else {
      out[m++] = {t0, t1};
    }
  };
  add(0, std::min(sinks, local_start));
  for (int i = 0; i < n_blocks; ++i) {
    const int t0 = blocks[i] * B;
    if (t0 >= local_start) break;
    add(t0, std::min(t0 + B, local_start));
  }
  add(local_start, n);
  return m;
}

int split_ranges(const Range* in, int n, int chunk, Range* out) {
  int m = 0;
  for (int i = 0; i < n; ++i) {
    for (int t = in[i].t0; t < in[i].t1;) {
      const int e = std::min(in[i].t1, (t / chunk + 1) * chunk);
      out[m++] = {t, e};
      t = e;
    }
  }
  return m;
}

float random_score(uint64_t seed, int layer, int step, int head, int block) {
  uint64_t z = seed ^ (static_cast<uint64_t>(layer) << 48) ^ (static_cast<uint64_t>(head) << 32) ^
               (static_cast<uint64_t>(static_cast<uint32_t>(step)) * 0x9E3779B97F4A7C15ull) ^
               static_cast<uint64_t>(static_cast<uint32_t>(block));
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
}

}  // namespace kivi::sparse
