// Running a retrieval prompt through a session: prefill, then greedy decoding until
// the answer appears, an end-of-generation token, or `max_tokens`.
#pragma once

#include "eval/prompt.h"
#include "eval/score.h"

namespace kivi::runtime {
class Session;
}

namespace kivi::eval {

// Resets the session, runs the prompt and scores the answer. The session's context
// must hold the prompt and max_tokens more tokens.
Outcome run_prompt(runtime::Session& s, const Prompt& p, int max_tokens);

}  // namespace kivi::eval
