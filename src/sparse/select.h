// Choosing blocks and turning the choice into token ranges.
#pragma once

#include <cstdint>
#include <utility>

namespace kivi::sparse {

// Tokens [t0, t1) of one KV head.
struct Range {
  int t0 = 0, t1 = 0;
};

// The indices of the k highest of scores[0, n) (a NaN counts as +inf; ties go to the
// lower index), in ascending order, written to out; returns how many (min(k, n)).
// heap: scratch for k entries. Runs in O(n log k), one comparison per score that does
// not enter the top k.
int top_k(const float* scores, int n, int k, int* out, std::pair<float, int>* heap);

// The ranges a KV head attends, sorted and disjoint: the sinks [0, min(sinks, n)), each
// selected block b (ascending) as [b B, (b + 1) B), and [local_start, n), merged where
// they touch or overlap. out needs n_blocks + 2 entries; returns the count.
int attended_ranges(const int* blocks, int n_blocks, int B, int sinks, int local_start, int n,
                    Range* out);

// Splits ranges at the multiples of `chunk` (attention's chunk length, so that ranges
// covering everything give dense attention's tasks). out needs
// n + total / chunk + 1 entries; returns the count.
int split_ranges(const Range* in, int n, int chunk, Range* out);

// A uniform score in [0, 1) from its coordinates (the random baseline).
float random_score(uint64_t seed, int layer, int step, int head, int block);

}  // namespace kivi::sparse
