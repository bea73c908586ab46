// What structured output costs per token (`kivi bench-grammar`). A sample sentence of the
// grammar is walked token by token, as a model that follows the grammar would write it;
// at every step the bench times
//   the full mask   every token of the vocabulary checked through the trie (what the
//                   sampler pays when the token it would pick is refused);
//   the check       allows() of the token the walk takes next (what it pays otherwise);
// and compares both with the time of one decode step of the model (median of several).
#pragma once

#include <memory>
#include <string>

#include "grammar/gbnf.h"
#include "runtime/session.h"

namespace kivi::runtime {

struct GrammarBenchResult {
  int vocab = 0;
  size_t trie_nodes = 0;
  double trie_build_ms = 0;
  int steps = 0;  // tokens of the sample
  double mask_mean_ms = 0, mask_p50_ms = 0, mask_max_ms = 0;
  double check_mean_us = 0;
  double decode_ms = 0;  // median decode step
  int allowed_mean = 0;  // tokens the mask allows, on average over the steps
};

// Throws kivi::Error when the sample is not a sentence of the grammar.
GrammarBenchResult bench_grammar(Session& s, std::shared_ptr<const grammar::Grammar> g,
                                 const std::string& sample, int decode_steps);

}  // namespace kivi::runtime
