#include "eval/run.h"

#include "core/error.h"
#include "core/timer.h"
#include "runtime/sampler.h"
#include "runtime/session.h"

namespace kivi::eval {

Outcome run_prompt(runtime::Session& s, const Prompt& p, int max_tokens) {
  const int n = static_cast<int>(p.tokens.size());
  if (n + max_tokens > s.ctx()) {
    fail("a %s prompt of %d tokens and %d answer tokens do not fit the context of %d tokens",
         p.task.c_str(), n, max_tokens, s.ctx());
  }
  const tok::Tokenizer& t = s.model().tokenizer();
  Outcome o;
  o.task = p.task;
  o.ctx = p.ctx;
  o.depth = p.depth;
  o.prompt_tokens = n;
  const double t0 = now_seconds();
  s.reset();
  const float* logits = s.prefill(p.tokens);
  int prev = p.tokens.back();
  for (int i = 0; i < max_tokens; ++i) {
    const int token = runtime::argmax(logits, s.vocab());
    if (t.is_end_of_generation(token)) break;
    o.generated += t.decode(prev, token);
    ++o.generated_tokens;
    prev = token;
    if (exact_match(o.generated, p.expected) || i + 1 == max_tokens) break;
    logits = s.decode(token);
  }
  o.seconds = now_seconds() - t0;
  o.correct = exact_match(o.generated, p.expected);
  return o;
}

}  // namespace kivi::eval
