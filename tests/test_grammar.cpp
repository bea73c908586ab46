// GBNF grammars: the parser's errors and positions, what the matcher takes, and the
// token mask against a token-by-token walk of the plain matcher.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/rng.h"
#include "grammar/gbnf.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/token_mask.h"
#include "runtime/sampler.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace kivi::grammar {
namespace {

std::shared_ptr<const Grammar> compile(const std::string& text) {
  return std::make_shared<const Grammar>(Grammar::parse(text));
}

// Whether the grammar takes all of `text` as a sentence.
bool whole(const std::string& grammar, const std::string& text) {
  Matcher m(compile(grammar));
  return m.accept(text) && m.accepting();
}

struct BadGrammar {
  std::string text;
  std::string message;
  int line, column;
};

TEST(GrammarParse, ErrorsNameTheProblemAndWhere) {
  const std::vector<BadGrammar> bad = {
      {"root ::= foo", "rule 'foo' is used but not defined", 1, 10},
      {"root = \"a\"", "expected '::='", 1, 6},
      {"root ::= \"abc", "unterminated string literal", 1, 10},
      {"x ::= \"a\"", "no rule 'root'", 1, 1},
      {"root ::= root \"a\"", "left-recursive", 1, 1},
      {"root ::= a\na ::= \"x\"? root", "left-recursive", 1, 1},
      {"root ::= \"a\"\nroot ::= \"b\"", "defined twice", 2, 1},
      {"root ::= [z-a]", "reversed", 1, 10},
      {"root ::= \"\\q\"", "unknown escape", 1, 11},
      {"root ::= \"a\"{3,1}", "n < m", 1, 13},
      {"root ::= \"a\"{999999}", "repetition count above", 1, 13},
      {"root ::= * \"a\"", "follows nothing", 1, 10},
      {"root ::= (\"a\"", "expected ')'", 1, 10},
      {"root ::= \"a\" )", "unexpected character after the rule", 1, 14},
      {"root ::= \"a\" ;", "unexpected character ';'", 1, 14},
      {"root ::= [abc", "unterminated character class", 1, 10},
      {"root ::= \"\\x4\"", "bad hexadecimal digit", 1, 11},
      {"root ::= \"\xff\"", "invalid UTF-8", 1, 11},
  };
  for (const BadGrammar& b : bad) {
    try {
      Grammar::parse(b.text);
      ADD_FAILURE() << "parsed: " << b.text;
    } catch (const GrammarError& e) {
      EXPECT_NE(std::string(e.what()).find(b.message), std::string::npos)
          << b.text << " -> " << e.what();
      EXPECT_EQ(e.line(), b.line) << b.text << " -> " << e.what();
      EXPECT_EQ(e.column(), b.column) << b.text << " -> " << e.what();
    }
  }
}

TEST(GrammarMatch, LiteralsClassesAndRepetition) {
  EXPECT_TRUE(whole(R"G(root ::= "ab" [0-9]+ "c"?)G", "ab123"));
  EXPECT_TRUE(whole(R"G(root ::= "ab" [0-9]+ "c"?)G", "ab1c"));
  EXPECT_FALSE(whole(R"G(root ::= "ab" [0-9]+ "c"?)G", "abc"));
  EXPECT_FALSE(whole(R"G(root ::= "ab" [0-9]+ "c"?)G", "ab"));
  EXPECT_TRUE(whole(R"G(root ::= [^"]* "\"")G", "x y\""));
  EXPECT_FALSE(whole(R"G(root ::= [^"]* "\"")G", "x\"y\""));
  const std::string rep = R"G(root ::= "x"{2,3} "y"{2} "z"{1,})G";
  EXPECT_FALSE(whole(rep, "xyyz"));
  EXPECT_TRUE(whole(rep, "xxyyz"));
  EXPECT_TRUE(whole(rep, "xxxyyzzz"));
  EXPECT_FALSE(whole(rep, "xxxxyyz"));
  EXPECT_FALSE(whole(rep, "xxyyyz"));
  EXPECT_TRUE(whole(R"G(root ::= . . "!")G", "é€!"));
  EXPECT_TRUE(whole("root ::= (\"a\" | \"b\" \"c\")* # a comment\n", "abca"));
  EXPECT_FALSE(whole("root ::= (\"a\" | \"b\" \"c\")*\n", "ab"));
  // Alternatives continuing on the next line, and a rule that refers to a later rule.
  EXPECT_TRUE(whole("root ::= yes\n     | no\nyes ::= \"y\"\nno ::= \"n\"", "n"));
  EXPECT_TRUE(whole("root ::= \"\\u00e9\\x41\\U0001F600\"", "éA😀"));
  EXPECT_TRUE(whole("root ::= [\\u0100-\\U0010FFFF]+", "ĀŻ😀"));
  EXPECT_FALSE(whole("root ::= [\\u0100-\\U0010FFFF]+", "é"));
}

TEST(GrammarMatch, PartialTextAndCharactersSplitAcrossFeeds) {
  Matcher m(compile(R"G(root ::= "{" [é-ë]+ "}")G"));
  EXPECT_FALSE(m.accepting());
  EXPECT_TRUE(m.accept("{"));
  const std::string e = "é";  // two bytes
  EXPECT_TRUE(m.accept(e.substr(0, 1)));
  EXPECT_FALSE(m.accept("}"));  // the character is unfinished
  EXPECT_TRUE(m.accept(e.substr(1)));
  EXPECT_FALSE(m.accept("a"));  // a failed feed leaves the state as it was
  EXPECT_TRUE(m.can_continue());
  EXPECT_TRUE(m.accept("}"));
  EXPECT_TRUE(m.accepting());
  EXPECT_FALSE(m.can_continue());
  // A lead byte no class can finish.
  Matcher m2(compile(R"G(root ::= [a-z]+)G"));
  EXPECT_FALSE(m2.accept("\xc3"));
  // Overlong forms of '{', surrogates and code points above U+10FFFF are not UTF-8.
  for (const char* bad : {"\xF0\x80\x81\xBB", "\xC1\xBB", "\xE0\x81\xBB"}) {
    Matcher m3(compile(R"G(root ::= "{")G"));
    EXPECT_FALSE(m3.accept(bad)) << bad;
  }
  for (const char* bad : {"\xED\xA0\x80", "\xF4\x90\x80\x80", "\xF5\x80"}) {
    Matcher m4(compile(R"G(root ::= .)G"));
    EXPECT_FALSE(m4.accept(bad));
  }
  Matcher m5(compile(R"G(root ::= .)G"));
  EXPECT_TRUE(m5.accept("\xF4\x8F\xBF\xBF"));  // U+10FFFF
}

// Arithmetic, recursive through parentheses.
const char* kArithmetic = R"G(
root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= [0-9]+ | "(" expr ")" | "-" factor
)G";

TEST(GrammarMatch, RecursiveGrammar) {
  EXPECT_TRUE(whole(kArithmetic, "1+2*(3-4)/-5"));
  EXPECT_TRUE(whole(kArithmetic, "((((7))))"));
  EXPECT_FALSE(whole(kArithmetic, "1+*2"));
  EXPECT_FALSE(whole(kArithmetic, "(1+2"));
  EXPECT_FALSE(whole(kArithmetic, "1)"));
  // Deep nesting grows the stack, not the time per character.
  std::string deep(2000, '(');
  deep += "1";
  deep += std::string(2000, ')');
  EXPECT_TRUE(whole(kArithmetic, deep));
}

// Text nested far deeper than any stack of calls: the arena is compacted on the way
// (without recursion) and the matcher still knows where it stands.
TEST(GrammarMatch, DeepNestingSurvivesCompaction) {
  Matcher m(compile(json_object_gbnf()));
  ASSERT_TRUE(m.accept("{\"a\": "));
  const int depth = 300000;
  const std::string open(1000, '['), close(1000, ']');
  for (int i = 0; i < depth; i += 1000) ASSERT_TRUE(m.accept(open)) << i;
  EXPECT_GT(m.epoch(), 0u);  // compacted at least once
  ASSERT_TRUE(m.accept("1"));
  for (int i = 0; i < depth; i += 1000) ASSERT_TRUE(m.accept(close)) << i;
  EXPECT_FALSE(m.accept("]"));
  ASSERT_TRUE(m.accept("}"));
  EXPECT_TRUE(m.accepting());
}

// A long bounded repetition makes one rule per optional copy.
TEST(GrammarParse, LongBoundedRepetition) {
  Matcher m(compile(R"G(root ::= "a"{0,20000} "b")G"));
  EXPECT_TRUE(m.accept(std::string(20000, 'a') + "b"));
  EXPECT_TRUE(m.accepting());
  Matcher m2(compile(R"G(root ::= "a"{0,20000} "b")G"));
  EXPECT_FALSE(m2.accept(std::string(20001, 'a')));
}

TEST(GrammarMatch, AmbiguousGrammarIsBoundedOrAccepted) {
  // Two parses of every prefix: the stacks are deduplicated, not multiplied.
  const std::string g = R"G(root ::= ("a" | "a")* "b")G";
  Matcher m(compile(g));
  EXPECT_TRUE(m.accept(std::string(5000, 'a') + "b"));
  EXPECT_TRUE(m.accepting());
}

const tok::Tokenizer& tk512() {
  static const tok::Tokenizer t = tok::Tokenizer::from_llama2c(test::tokenizer_path(), 512);
  return t;
}

// The mask of every step equals feeding each token's text to a copy of a plain matcher,
// along a seeded random walk through allowed tokens.
void check_mask_walk(const std::string& grammar, uint64_t seed, int steps) {
  const tok::Tokenizer& tk = tk512();
  auto trie = std::make_shared<const VocabTrie>(tk);
  const std::vector<int> ends = {tk.eos_id()};
  auto g = compile(grammar);
  TokenMask tm(g, trie, ends);
  Matcher ref(g);
  Rng rng(seed);
  for (int step = 0; step < steps; ++step) {
    const std::vector<char> mask = tm.mask();
    std::vector<int> allowed;
    for (int t = 0; t < tk.vocab_size(); ++t) {
      bool want;
      if (t == tk.eos_id()) {
        want = ref.accepting();
      } else {
        Matcher copy = ref;
        want = !trie->text(t).empty() && copy.accept(trie->text(t));
      }
      ASSERT_EQ(mask[t] != 0, want)
          << "step " << step << " token " << t << " '" << trie->text(t) << "'";
      ASSERT_EQ(tm.allows(t), want) << "step " << step << " token " << t;
      if (want) allowed.push_back(t);
    }
    ASSERT_FALSE(allowed.empty()) << "step " << step;
    const int t = allowed[rng.next_u64() % allowed.size()];
    if (t == tk.eos_id()) break;
    tm.accept(t);
    ASSERT_TRUE(ref.accept(trie->text(t)));
  }
}

TEST(TokenMask, EqualsTheMatcherTokenByToken) {
  KIVI_REQUIRE_MODEL();
  check_mask_walk(kArithmetic, 1, 40);
  check_mask_walk(R"G(root ::= "Once upon a time, " [a-z ]{0,30} "." )G", 2, 40);
  // Byte pieces split characters: the mask lets a lead byte through when a class can
  // finish it.
  check_mask_walk(R"G(root ::= ([a-z] | [à-ÿ] | " ")+ "!")G", 3, 60);
  check_mask_walk(R"G(root ::= "{\"a\": " ("true" | "false" | [0-9]{1,4}) "}")G", 4, 30);
  // JSON: strings loop on their own state, so whole subtrees are taken without a walk.
  for (uint64_t seed = 5; seed < 9; ++seed) check_mask_walk(json_object_gbnf(), seed, 80);
}

TEST(TokenMask, EndTokensOnlyWhenComplete) {
  KIVI_REQUIRE_MODEL();
  const tok::Tokenizer& tk = tk512();
  auto trie = std::make_shared<const VocabTrie>(tk);
  TokenMask tm(compile(R"G(root ::= "a")G"), trie, {tk.eos_id()});
  EXPECT_FALSE(tm.allows(tk.eos_id()));
  EXPECT_FALSE(tm.mask()[tk.eos_id()]);
  EXPECT_THROW(tm.accept(tk.eos_id()), Error);
  const int a = tk.find("a");
  ASSERT_GE(a, 0);
  tm.accept(a);
  EXPECT_TRUE(tm.allows(tk.eos_id()));
  const std::vector<char>& m = tm.mask();
  int n = 0;
  for (char c : m) n += c;
  EXPECT_EQ(n, 1);  // only the end
  EXPECT_THROW(tm.accept(a), Error);
}

// A filter that allows the even tokens, counting how often the sampler asks for a mask.
struct EvenTokens : runtime::TokenFilter {
  std::vector<char> m;
  int masks = 0;
  explicit EvenTokens(int n) : m(n) {
    for (int t = 0; t < n; t += 2) m[t] = 1;
  }
  bool allows(int token) override { return token % 2 == 0; }
  const std::vector<char>& mask() override {
    ++masks;
    return m;
  }
};

// The sampler's check-first shortcut: greedy picks the masked argmax, and sampling without
// truncation draws from the masked distribution p(t) / Z, with or without the shortcut.
TEST(SamplerFilter, GreedyAndSampledFollowTheMask) {
  const int n = 6;
  const float logits[n] = {0.5f, 3.0f, 1.0f, 0.0f, -1.0f, 2.0f};
  runtime::SamplerOptions greedy;
  runtime::Sampler g(greedy, n);
  EvenTokens f(n);
  EXPECT_EQ(g.sample(logits, &f), 2);  // token 1 is the argmax but odd
  EXPECT_EQ(f.masks, 1);
  runtime::SamplerOptions o;
  o.temperature = 1.0f;
  o.seed = 11;
  runtime::Sampler s(o, n);
  const int draws = 200000;
  std::vector<int> count(n);
  for (int i = 0; i < draws; ++i) ++count[s.sample(logits, &f)];
  double z = 0;
  for (int t = 0; t < n; t += 2) z += std::exp(logits[t]);
  for (int t = 0; t < n; ++t) {
    const double want = t % 2 ? 0.0 : std::exp(logits[t]) / z;
    EXPECT_NEAR(count[t] / double(draws), want, 0.005) << t;
  }
  // Only refused first draws asked for the mask (the odd tokens hold ~90% of p).
  EXPECT_GT(f.masks, draws / 2);
  EXPECT_LT(f.masks, draws);
}

}  // namespace
}  // namespace kivi::grammar
