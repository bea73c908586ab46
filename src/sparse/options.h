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
//   fix:    fixed representative tokens (KTransformers' "fix": tokens at fixed intervals
//           within the block): the keys at offsets 0, B/4, B/2 and 3B/4 (every key when
//           B < 4); score q . (their mean), InfLLM's sum over representative tokens
//           divided by their count
//   random: uniform random scores (seeded by layer, position, head and block): a
//           baseline at the same budget
// With GQA the scores of the query heads that share a KV head are summed.
//
// Policies (KTransformers' head_select_mode, token_step, layer_step and preselection):
//   heads shared: the scores of all KV heads are summed and every head attends the same
//           blocks;
//   reselect N: a layer selects every N decode steps and reuses its blocks in between;
//           the local window then reaches back to where it began at the selection, so
//           it covers every token since;
//   reuse-layers N: of every N consecutive sparse layers the first selects and the
//           others attend its blocks (with the same local window rule);
//   preselect W: after a prefill, the attention of its last W queries (summed over the
//           query heads of a KV head and over the W tokens, per block, then max-pooled
//           over each block and its two neighbours, as SnapKV pools) picks `candidates`
//           tokens of blocks per KV head; until the next prefill, selection ranks those
//           blocks and the blocks filled since the prefill, nothing else.
#pragma once

#include <cstdint>
#include <string>

namespace kivi::sparse {

enum class Kind : uint8_t { kOff = 0, kQuest, kMax, kMean, kRandom, kFix };
enum class Heads : uint8_t { kPer = 0, kShared };

struct Options {
  Kind kind = Kind::kOff;
  int block = 64;        // tokens per block (a multiple of the KIVI key group)
  int budget = 4096;     // tokens of selected blocks per KV head
  int sinks = 4;         // first tokens, always attended
  int local = 256;       // most recent tokens, always attended
  int dense_layers = 0;  // the first layers attend densely
  uint64_t seed = 1;     // random
  Heads heads = Heads::kPer;
  int reselect = 1;        // decode steps between selections of a layer
  int reuse_layers = 1;    // sparse layers per selection (the first selects)
  int preselect = 0;       // observation window after a prefill (0 = off)
  int candidates = 16384;  // tokens of candidate blocks per KV head kept by preselection

  bool enabled() const { return kind != Kind::kOff; }
  // Throws kivi::Error naming the option and its valid range.
  void validate() const;
};

Kind parse_kind(const std::string& s);
const char* kind_name(Kind k);
Heads parse_heads(const std::string& s);
const char* heads_name(Heads h);
// "quest, blocks of 64, budget 4096, sinks 4, local 256" (empty when off).
std::string describe(const Options& o);

// What the block summaries hold per block and KV head, by kind: quest [min][max], max
// [max], mean [mean], fix [mean of the fixed representatives] (D channels each, f16);
// random needs none.
enum class SummaryKind : uint8_t { kNone = 0, kMinMax, kMax, kMean, kFixed };
// The offset within a block of B tokens of fixed representative j < fixed_count(B).
int fixed_count(int B);
int fixed_offset(int B, int j);
SummaryKind summary_kind(Kind k);
int summary_vectors(SummaryKind s);

}  // namespace kivi::sparse
