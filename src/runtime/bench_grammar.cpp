#include "runtime/bench_grammar.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "core/timer.h"
#include "grammar/token_mask.h"
#include "runtime/generation.h"

namespace kivi::runtime {

GrammarBenchResult bench_grammar(Session& s, std::shared_ptr<const grammar::Grammar> g,
                                 const std::string& sample, int decode_steps) {
  const tok::Tokenizer& tk = s.model().tokenizer();
  GrammarBenchResult r;
  r.vocab = tk.vocab_size();
  double t0 = now_seconds();
  auto trie = std::make_shared<const grammar::VocabTrie>(tk);
  r.trie_build_ms = (now_seconds() - t0) * 1e3;
  r.trie_nodes = trie->nodes();
  const std::vector<int> tokens = tk.encode_continuation(sample);
  if (tokens.empty()) fail("bench-grammar: the sample text has no tokens");
  grammar::TokenMask tm(g, trie, StopRule(tk).all(tk.vocab_size()));
  std::vector<double> masks;
  double check_s = 0;
  double allowed = 0;
  std::vector<char> mask;
  for (size_t i = 0; i < tokens.size(); ++i) {
    t0 = now_seconds();
    tm.compute(mask);
    masks.push_back(now_seconds() - t0);
    for (char c : mask) allowed += c;
    t0 = now_seconds();
    const bool ok = tm.allows(tokens[i]);
    check_s += now_seconds() - t0;
    if (!ok || !mask[tokens[i]]) {
      fail(
          "bench-grammar: the sample is not a sentence of the grammar: token %zu ('%s') is "
          "refused after '%s'",
          i, tk.token_text(tokens[i]).c_str(),
          tk.decode_all(std::vector<int>(tokens.begin(), tokens.begin() + i)).c_str());
    }
    tm.accept(tokens[i]);
  }
  r.steps = static_cast<int>(tokens.size());
  double sum = 0;
  for (double m : masks) sum += m;
  r.mask_mean_ms = sum / r.steps * 1e3;
  r.mask_p50_ms = median(masks) * 1e3;
  r.mask_max_ms = *std::max_element(masks.begin(), masks.end()) * 1e3;
  r.check_mean_us = check_s / r.steps * 1e6;
  r.allowed_mean = static_cast<int>(allowed / r.steps);
  // Decode steps after a short prompt.
  s.reset();
  const float* logits = s.prefill(tk.encode("Once upon a time", tk.add_bos()));
  std::vector<double> steps;
  for (int i = 0; i < decode_steps && s.pos() < s.ctx(); ++i) {
    const int next = argmax(logits, tk.vocab_size());
    t0 = now_seconds();
    logits = s.decode(next);
    steps.push_back(now_seconds() - t0);
  }
  if (!steps.empty()) r.decode_ms = median(steps) * 1e3;
  return r;
}

}  // namespace kivi::runtime
