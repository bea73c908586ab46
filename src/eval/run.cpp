#include "eval/run.h"

#include "core/error.h"
#include "core/timer.h"
#include "runtime/generation.h"
#include "runtime/session.h"

namespace kivi::eval {

Outcome run_prompt(runtime::Session& s, const Prompt& p, int max_tokens) {
  const int n = static_cast<int>(p.tokens.size());
  if (n + max_tokens > s.ctx()) {
    fail("a %s prompt of %d tokens and %d answer tokens do not fit the context of %d tokens",
         p.task.c_str(), n, max_tokens, s.ctx());
  }
  Outcome o;
  o.task = p.task;
  o.ctx = p.ctx;
  o.depth = p.depth;
  o.prompt_tokens = n;
  const double t0 = now_seconds();
  s.reset();
  // Greedy, with the stop rule every front end uses; it ends early once the answer is there.
  runtime::GenerationOptions go;
  go.max_tokens = max_tokens;
  go.sampler.temperature = 0.0f;
  runtime::Generator gen(s, go, p.tokens.empty() ? -1 : p.tokens.back());
  gen.prefill(p.tokens);
  while (!gen.done()) {
    const runtime::Continuation::Step st = gen.next();
    o.generated += st.text;
    if (st.token >= 0) ++o.generated_tokens;
    if (exact_match(o.generated, p.expected)) break;
  }
  o.seconds = now_seconds() - t0;
  o.correct = exact_match(o.generated, p.expected);
  return o;
}

}  // namespace kivi::eval
