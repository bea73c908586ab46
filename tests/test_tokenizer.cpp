#include <string>
#include <vector>

#include "core/rng.h"
#include "tokenizer/tokenizer.h"
#include "test_util.h"

namespace kivi {
namespace {

using tok::Tokenizer;

const Tokenizer& tk512() {
  static const Tokenizer t = Tokenizer::from_llama2c(test::tokenizer_path(), 512);
  return t;
}

// byte pieces are not in find()'s index; resolve them the way the tokenizer does.
int byte_piece_id(const Tokenizer& t, unsigned char b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "<0x%02X>", b);
  for (int i = 0; i < t.vocab_size(); ++i) {
    if (t.piece(i) == buf) return i;
  }
  return -1;
}

// The merge loop exactly as llama2.c's run.c writes it: rescan all pairs, take the
// best score (first on ties), merge, repeat. O(n^2); the oracle for the heap version.
std::vector<int> naive_encode(const Tokenizer& t, const std::string& text) {
  std::vector<int> ids = {t.bos_id()};
  std::string norm = tok::to_sentencepiece(text);
  if (!text.empty()) norm.insert(0, tok::kSpaceMark);
  std::vector<std::string> pieces;
  std::vector<bool> mergeable;
  for (size_t i = 0; i < norm.size();) {
    const unsigned char c = static_cast<unsigned char>(norm[i]);
    size_t len = c < 0x80             ? 1
                 : (c & 0xE0) == 0xC0 ? 2
                 : (c & 0xF0) == 0xE0 ? 3
                 : (c & 0xF8) == 0xF0 ? 4
                                      : 1;
    if (i + len > norm.size()) len = 1;
    const std::string ch = norm.substr(i, len);
    if (t.find(ch) >= 0) {
      pieces.push_back(ch);
      mergeable.push_back(true);
    } else {
      for (size_t k = 0; k < len; ++k) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "<0x%02X>", static_cast<unsigned char>(norm[i + k]));
        pieces.push_back(buf);
        mergeable.push_back(false);
      }
    }
    i += len;
  }
  for (;;) {
    float best = -1e30f;
    int best_i = -1;
    for (size_t i = 0; i + 1 < pieces.size(); ++i) {
      if (!mergeable[i] || !mergeable[i + 1]) continue;
      const int id = t.find(pieces[i] + pieces[i + 1]);
      if (id >= 0 && t.score(id) > best) {
        best = t.score(id);
        best_i = static_cast<int>(i);
      }
    }
    if (best_i < 0) break;
    pieces[best_i] += pieces[best_i + 1];
    pieces.erase(pieces.begin() + best_i + 1);
    mergeable.erase(mergeable.begin() + best_i + 1);
  }
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (mergeable[i]) {
      ids.push_back(t.find(pieces[i]));
    } else {
      ids.push_back(byte_piece_id(
          t, static_cast<unsigned char>(std::stoi(pieces[i].substr(3, 2), nullptr, 16))));
    }
  }
  return ids;
}

TEST(Tokenizer, LoadsLlama2cVocabulary) {
  KIVI_REQUIRE_MODEL();
  const auto& t = tk512();
  EXPECT_EQ(t.vocab_size(), 512);
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.eos_id(), 2);
  EXPECT_EQ(t.n_byte_pieces(), 256);
  EXPECT_EQ(t.piece(265), "\xE2\x96\x81the");  // " the" in SentencePiece form
}

TEST(Tokenizer, RoundTripsText) {
  KIVI_REQUIRE_MODEL();
  const auto& t = tk512();
  for (const std::string s :
       {"Once upon a time", "Hello, World!", "  two  spaces ", "line\nbreak\ttab",
        "caf\xC3\xA9 \xF0\x9F\x90\xB1 \xE4\xB8\xAD\xE6\x96\x87", "a", "12345 + 678 = ?"}) {
    const auto ids = t.encode(s, true);
    ASSERT_EQ(ids.front(), 1);
    EXPECT_EQ(t.decode_all(std::vector<int>(ids.begin() + 1, ids.end()), ids.front()), s) << s;
  }
  EXPECT_EQ(t.encode("", true), std::vector<int>{1});
  EXPECT_EQ(t.encode("", false), std::vector<int>{});
  EXPECT_EQ(t.encode("x", false, true).back(), 2);
}

TEST(Tokenizer, ByteFallbackForUnknownCharacters) {
  KIVI_REQUIRE_MODEL();
  const auto& t = tk512();
  const auto ids = t.encode("\xF0\x9F\x90\xB1", false);  // U+1F431, not a piece
  // dummy prefix + four byte pieces
  ASSERT_EQ(ids.size(), 5u);
  EXPECT_EQ(ids[1], byte_piece_id(t, 0xF0));
  EXPECT_EQ(ids[4], byte_piece_id(t, 0xB1));
  EXPECT_EQ(t.decode(ids[0], ids[1]), "\xF0");
}

TEST(Tokenizer, HeapMergeMatchesTheNaiveLoop) {
  KIVI_REQUIRE_MODEL();
  const auto& t = tk512();
  const std::string alphabet = "abcdefghijklmnopqrstuvwxyz  ,.!?'\"LTOS\n\xC3\xA9";
  Rng rng(3);
  for (int trial = 0; trial < 300; ++trial) {
    std::string s;
    const int len = 1 + static_cast<int>(rng.next_u64() % 80);
    for (int i = 0; i < len; ++i) s += alphabet[rng.next_u64() % alphabet.size()];
    // Keep the string valid UTF-8 (the two-byte é must stay paired).
    std::string clean;
    for (size_t i = 0; i < s.size(); ++i) {
      if (static_cast<unsigned char>(s[i]) == 0xC3) {
        clean += "\xC3\xA9";
      } else if (static_cast<unsigned char>(s[i]) != 0xA9) {
        clean += s[i];
      }
    }
    EXPECT_EQ(t.encode(clean, true), naive_encode(t, clean)) << "text: " << clean;
  }
  // Real text, the perplexity corpus's first lines.
  const std::string story =
      "Once upon a time, there was a little boy named Tim. Tim had a red kite. He liked to fly his "
      "kite in "
      "the big green park near his house.";
  EXPECT_EQ(t.encode(story, true), naive_encode(t, story));
}

TEST(Tokenizer, DecodeDropsTheDummySpaceOnlyAfterBos) {
  KIVI_REQUIRE_MODEL();
  const auto& t = tk512();
  const int the = t.find("\xE2\x96\x81the");
  ASSERT_GE(the, 0);
  EXPECT_EQ(t.decode(1, the), "the");
  EXPECT_EQ(t.decode(5, the), " the");
  EXPECT_EQ(t.decode(5, 1), "");  // control tokens print nothing
}

}  // namespace
}  // namespace kivi
