// Needle in a haystack: one sentence hidden in a longer text (Kamradt 2023; the "magic
// number" needle of RULER, Hsieh et al. 2024).
#include "core/error.h"
#include "core/rng.h"
#include "eval/tasks.h"
#include "tokenizer/tokenizer.h"

namespace kivi::eval {

namespace {

const char* const kWords[] = {
    "apple",  "river",  "candle", "garden",  "silver",  "window", "rabbit", "forest",
    "pepper", "castle", "button", "meadow",  "violin",  "anchor", "harbor", "lantern",
    "marble", "pillow", "saddle", "tunnel",  "velvet",  "walnut", "yellow", "zebra",
    "basket", "copper", "dragon", "feather", "glacier", "island", "jungle", "kettle"};

}  // namespace

Prompt make_needle(const tok::Tokenizer& t, const Haystack& haystack, int ctx, double depth,
                   uint64_t seed) {
  if (haystack.size() == 0) fail("needle: the haystack is empty");
  Rng rng(seed);
  const std::string word = kWords[rng.next_u64() % (sizeof(kWords) / sizeof(kWords[0]))];
  const std::string number = std::to_string(1000000 + rng.next_u64() % 9000000);
  const auto& starts = haystack.sentences();
  const int offset = starts[rng.next_u64() % starts.size()];
  Prompt p;
  p.task = "needle";
  p.ctx = ctx;
  p.depth = depth;
  p.expected = number;
  const std::vector<int> header = t.encode(
      "A special magic number is hidden within the following text. Make sure to memorize it. I "
      "will quiz you about the number afterwards.",
      t.add_bos());
  const std::vector<int> item =
      encode_continuation(t, " The special magic number for " + word + " is: " + number + ".");
  const std::vector<int> question =
      encode_continuation(t, " What is the special magic number for " + word +
                                 " mentioned in the text? The special magic number for " + word +
                                 " mentioned in the text is:");
  p.answer_tokens = static_cast<int>(encode_continuation(t, " " + number + ".").size());
  assemble(t, "needle", ctx, depth, header, haystack.take(offset, ctx), item, question, p);
  return p;
}

}  // namespace kivi::eval
