// The passkey test (Mohtashami & Jaggi 2023, Landmark Attention).
#include "core/rng.h"
#include "core/error.h"
#include "eval/tasks.h"
#include "tokenizer/tokenizer.h"

namespace kivi::eval {

Prompt make_passkey(const tok::Tokenizer& t, const Haystack& filler, int ctx, double depth,
                    uint64_t seed) {
  Rng rng(seed);
  const int key = 10000 + static_cast<int>(rng.next_u64() % 90000);
  const std::string k = std::to_string(key);
  Prompt p;
  p.task = "passkey";
  p.ctx = ctx;
  p.depth = depth;
  p.expected = k;
  std::vector<int> header = t.encode(
      "There is an important piece of information hidden inside a lot of irrelevant text. Find "
      "it and memorize it. I will quiz you about it.",
      t.add_bos());
  const std::vector<int> item =
      encode_continuation(t, " The pass key is " + k + ". Remember it. " + k + " is the pass key.");
  const std::vector<int> question =
      encode_continuation(t, " What is the pass key? The pass key is");
  p.answer_tokens = static_cast<int>(encode_continuation(t, " " + k + ".").size());
  assemble(t, "passkey", ctx, depth, header, filler.take(0, ctx), item, question, p);
  return p;
}

}  // namespace kivi::eval
