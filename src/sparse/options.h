// Block-sparse decode attention: which blocks of the cache a query attends, and how the
// choice is made. A layer past the first `dense_layers` attends, per KV head, the
// `sinks` first tokens, the `local` most recent ones (with every token the block
// summaries do not cover yet, KIVI's residual among them) and the blocks of `block`
// tokens ranked highest by their representative, up to `budget` tokens of blocks.
//
// Representatives:
//   quest:  per-channel min and max of the block's keys (Tang et al. 2024, Quest); the
//           score sum_c max(q_c min_c, q_c max_c) bounds q . k of every key in the block
//   max:    per-channel max; score q . max
//   mean:   per-channel mean; score q . mean
//   random: uniform random scores (seeded by layer, position, head and block): a
//           baseline at the same budget
// With GQA the scores of the query heads that share a KV head are summed.
#pragma once

#include <cstdint>
#include <string>

namespace kivi::sparse {

enum class Kind : uint8_t { kOff = 0, kQuest, kMax, kMean, kRandom };

struct Options {
  Kind kind = Kind::kOff;
  int block = 64;        // tokens per block (a multiple of the KIVI key group)
  int budget = 4096;     // tokens of selected blocks per KV head
  int sinks = 4;         // first tokens, always attended
  int local = 256;       // most recent tokens, always attended
  int dense_layers = 0;  // the first layers attend densely
  uint64_t seed = 1;     // random

  bool enabled() const { return kind != Kind::kOff; }
  // Throws kivi::Error naming the option and its valid range.
  void validate() const;
};

Kind parse_kind(const std::string& s);
const char* kind_name(Kind k);
// "quest, blocks of 64, budget 4096, sinks 4, local 256" (empty when off).
std::string describe(const Options& o);

// What the block summaries hold per block and KV head, by kind: quest [min][max], max
// [max], mean [mean] (D channels each, f16); random needs none.
enum class SummaryKind : uint8_t { kNone = 0, kMinMax, kMax, kMean };
SummaryKind summary_kind(Kind k);
int summary_vectors(SummaryKind s);

}  // namespace kivi::sparse
