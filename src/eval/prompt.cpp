#include "eval/prompt.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace kivi::eval {

std::vector<int> encode_continuation(const tok::Tokenizer& t, const std::string& text) {
  if (t.kind() == tok::TokenizerKind::kSentencePiece && t.add_dummy_prefix() && !text.empty() &&
      text[0] == ' ') {
    return t.encode(text.substr(1), false);
  }
  return t.encode(text, false);
}

bool word_start(const tok::Tokenizer& t, const std::vector<int>& tokens, int i) {
  if (i <= 0 || i >= static_cast<int>(tokens.size())) return true;
  const std::string cur = t.token_text(tokens[i]), prev = t.token_text(tokens[i - 1]);
  return (!cur.empty() && (cur[0] == ' ' || cur[0] == '\n')) ||
         (!prev.empty() && prev.back() == '\n');
}

bool sentence_start(const tok::Tokenizer& t, const std::vector<int>& tokens, int i) {
  if (i <= 0 || i >= static_cast<int>(tokens.size())) return true;
  if (!word_start(t, tokens, i)) return false;
  std::string prev = t.token_text(tokens[i - 1]);
  while (!prev.empty() &&
         (prev.back() == '"' || prev.back() == '\'' || prev.back() == '\n' || prev.back() == ' '))
    prev.pop_back();
  return !prev.empty() && (prev.back() == '.' || prev.back() == '!' || prev.back() == '?');
}

Haystack::Haystack(const tok::Tokenizer& t, const std::string& text) {
  unit_ = encode_continuation(t, " " + text);
  if (unit_.empty()) fail("the haystack text encodes to no tokens");
  for (int i = 0; i < size(); ++i) {
    if (i == 0 || sentence_start(t, unit_, i)) sentences_.push_back(i);
  }
}

std::vector<int> Haystack::take(int64_t offset, int n) const {
  std::vector<int> out(static_cast<size_t>(std::max(n, 0)));
  const int64_t u = size();
  for (int i = 0; i < n; ++i) out[i] = unit_[static_cast<size_t>((offset + i) % u)];
  return out;
}

const char* passkey_filler() {
  return "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back "
         "again.";
}

namespace {

// The boundary nearest `target` within [lo, hi] and `reach` tokens of it, or -1.
template <typename Pred>
int nearest(int target, int lo, int hi, int reach, Pred is_boundary) {
  for (int d = 0; d <= reach; ++d) {
    if (target - d >= lo && target - d <= hi && is_boundary(target - d)) return target - d;
    if (target + d >= lo && target + d <= hi && is_boundary(target + d)) return target + d;
  }
  return -1;
}

}  // namespace

void assemble(const tok::Tokenizer& t, const std::string& what, int ctx, double depth,
              const std::vector<int>& header, const std::vector<int>& filler,
              const std::vector<int>& item, const std::vector<int>& question, Prompt& p) {
  const int fixed = static_cast<int>(header.size() + item.size() + question.size());
  if (ctx <= fixed) {
    fail("--ctx %d: a %s prompt needs more than %d tokens (header, hidden item and question)", ctx,
         what.c_str(), fixed);
  }
  int b = std::min(ctx - fixed, static_cast<int>(filler.size()));
  // The filler ends with a sentence, else a word, within reach; else where it must.
  const int end = b;
  for (auto boundary : {sentence_start, word_start}) {
    int c = end;
    while (c >= std::max(1, end - kWordSlack) && !boundary(t, filler, c)) --c;
    if (c >= std::max(1, end - kWordSlack)) {
      b = c;
      break;
    }
  }
  const int target = static_cast<int>(std::lround(std::clamp(depth, 0.0, 1.0) * b));
  auto is_sentence = [&](int i) { return i == 0 || i == b || sentence_start(t, filler, i); };
  auto is_word = [&](int i) { return i == 0 || i == b || word_start(t, filler, i); };
  int a = nearest(target, 0, b, std::max(64, b / 16), is_sentence);
  if (a < 0) a = nearest(target, 0, b, kWordSlack, is_word);
  if (a < 0) a = target;
  p.tokens.clear();
  p.tokens.reserve(static_cast<size_t>(fixed + b));
  p.tokens.insert(p.tokens.end(), header.begin(), header.end());
  p.tokens.insert(p.tokens.end(), filler.begin(), filler.begin() + a);
  p.item_pos = static_cast<int>(p.tokens.size());
  p.item_len = static_cast<int>(item.size());
  p.tokens.insert(p.tokens.end(), item.begin(), item.end());
  p.tokens.insert(p.tokens.end(), filler.begin() + a, filler.begin() + b);
  p.tokens.insert(p.tokens.end(), question.begin(), question.end());
}

uint64_t prompt_seed(uint64_t seed, const std::string& task, int ctx, int depth_index, int trial) {
  uint64_t h = 1469598103934665603ull ^ seed;
  auto mix = [&](uint64_t x) {
    h ^= x + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    h *= 1099511628211ull;
  };
  for (char c : task) mix(static_cast<unsigned char>(c));
  mix(static_cast<uint64_t>(ctx));
  mix(static_cast<uint64_t>(depth_index));
  mix(static_cast<uint64_t>(trial));
  return h;
}

}  // namespace kivi::eval
