// Key-value retrieval (Liu et al. 2023, Lost in the Middle): a JSON object of random
// UUIDs and the question for one key's value.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "core/rng.h"
#include "eval/tasks.h"
#include "tokenizer/tokenizer.h"

namespace kivi::eval {

namespace {

// "xxxxxxxx-xxxx-4xxx-yxxx-xxxxxxxxxxxx" in lowercase hex (a version-4 UUID's form).
std::string uuid(Rng& rng) {
  const uint64_t a = rng.next_u64(), b = rng.next_u64();
  char s[40];
  std::snprintf(s, sizeof(s), "%08x-%04x-4%03x-%04x-%012llx", static_cast<unsigned>(a >> 32),
                static_cast<unsigned>((a >> 16) & 0xffff), static_cast<unsigned>(a & 0xfff),
                static_cast<unsigned>(0x8000 | ((b >> 48) & 0x3fff)),
                static_cast<unsigned long long>(b & 0xffffffffffffull));
  return s;
}

}  // namespace

Prompt make_kv_retrieval(const tok::Tokenizer& t, int ctx, double depth, uint64_t seed) {
  Rng rng(seed);
  Prompt p;
  p.task = "kv-retrieval";
  p.ctx = ctx;
  p.depth = depth;
  const std::vector<int> header = t.encode(
      "Extract the value corresponding to the specified key in the JSON object below.\n\nJSON "
      "data:\n{",
      t.add_bos());
  // Pairs until the next would not fit beside the question (whose key is one of them:
  // its length is that of any key, bounded here by the longest seen).
  std::vector<std::string> keys, values;
  std::vector<std::vector<int>> pairs;
  auto question_for = [&](const std::string& key) {
    return encode_continuation(t, " }\n\nKey: \"" + key + "\"\nCorresponding value:");
  };
  size_t question_max = question_for(uuid(rng)).size() + 8;
  int used = static_cast<int>(header.size());
  while (true) {
    const std::string k = uuid(rng), v = uuid(rng);
    std::vector<int> pair = encode_continuation(t, " \"" + k + "\": \"" + v + "\",");
    if (used + static_cast<int>(pair.size() + question_max) > ctx) break;
    used += static_cast<int>(pair.size());
    keys.push_back(k);
    values.push_back(v);
    pairs.push_back(std::move(pair));
  }
  if (pairs.size() < 1) {
    fail("--ctx %d: a kv-retrieval prompt needs more tokens (header %zu, a pair and the question)",
         ctx, header.size());
  }
  // The last pair has no comma.
  pairs.back() = encode_continuation(t, " \"" + keys.back() + "\": \"" + values.back() + "\"");
  const int n = static_cast<int>(pairs.size());
  const int at = static_cast<int>(std::lround(std::clamp(depth, 0.0, 1.0) * (n - 1)));
  p.expected = values[at];
  p.tokens = header;
  for (int i = 0; i < n; ++i) {
    if (i == at) {
      p.item_pos = static_cast<int>(p.tokens.size());
      p.item_len = static_cast<int>(pairs[i].size());
    }
    p.tokens.insert(p.tokens.end(), pairs[i].begin(), pairs[i].end());
  }
  const std::vector<int> q = question_for(keys[at]);
  p.tokens.insert(p.tokens.end(), q.begin(), q.end());
  p.answer_tokens = static_cast<int>(encode_continuation(t, " \"" + p.expected + "\"").size());
  return p;
}

}  // namespace kivi::eval
