// Byte-level BPE: the alphabet, UTF-8 handling, pre-tokenizer splits, merges by rank,
// special tokens, streaming decode, tokenizer.json and GGUF loading, bad input, chat
// formats. Expectations are written out by hand here; the comparison with reference
// tokenizers on real vocabularies is in test_tokenizer_ref.cpp.
#include <gtest/gtest.h>

#include "bpe_fixture.h"
#include "core/error.h"
#include "io/gguf.h"
#include "io/gguf_writer.h"
#include "runtime/chat.h"
#include "test_util.h"
#include "tokenizer/bpe.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace kivi {
namespace {

using tok::Tokenizer;
using tok::TokenType;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

#define EXPECT_ERROR(stmt, substring) \
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, substring, error_of([&] { stmt; }))

std::vector<std::string> split(const std::string& pre, const std::string& text) {
  tok::PreTokenizer p(pre);
  std::vector<std::string_view> v;
  p.split(text, v);
  return std::vector<std::string>(v.begin(), v.end());
}

using Strings = std::vector<std::string>;

Tokenizer tiny(const nlohmann::json& j, std::string config = "") {
  return tok::parse_hf_tokenizer(j.dump(), config, "tiny.json").tokenizer("tiny.json");
}

// Plain-text pieces of the tokens, for readable expectations.
Strings pieces(const Tokenizer& tk, const std::vector<int>& ids) {
  Strings s;
  for (int id : ids) s.push_back(tk.token_text(id, true));
  return s;
}

TEST(ByteLevel, AlphabetMatchesGpt2) {
  std::set<std::string> seen;
  for (int b = 0; b < 256; ++b) {
    EXPECT_EQ(tok::byte_to_unicode(static_cast<uint8_t>(b)), test::gpt2_char(b)) << b;
    seen.insert(tok::byte_to_unicode(static_cast<uint8_t>(b)));
  }
  EXPECT_EQ(seen.size(), 256u);
  EXPECT_EQ(tok::byte_to_unicode(' '), "\xC4\xA0");   // U+0120 'Ġ'
  EXPECT_EQ(tok::byte_to_unicode('\n'), "\xC4\x8A");  // U+010A 'Ċ'
  EXPECT_EQ(tok::byte_to_unicode('A'), "A");
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  EXPECT_EQ(tok::byte_level_decode(tok::byte_level_encode(all)), all);
}

TEST(Utf8, IllFormedInputIsReplacedPerMaximalSubpart) {
  const std::string R = "\xEF\xBF\xBD";
  EXPECT_EQ(tok::utf8_sanitize("a\xE2\x82z"), "a" + R + "z");        // truncated 3-byte: one
  EXPECT_EQ(tok::utf8_sanitize("\xC0\xAF"), R + R);                  // overlong: two
  EXPECT_EQ(tok::utf8_sanitize("\xED\xA0\x80"), R + R + R);          // surrogate: three
  EXPECT_EQ(tok::utf8_sanitize("\xF4\x90\x80\x80"), R + R + R + R);  // above U+10FFFF: four
  EXPECT_EQ(tok::utf8_sanitize("\xF0\x9F\x98x"), R + "x");           // truncated 4-byte: one
  EXPECT_EQ(tok::utf8_sanitize("\xFF\x80 \xE2\x82\xAC"), R + R + " \xE2\x82\xAC");
  EXPECT_TRUE(tok::utf8_is_valid("\xF0\x9F\x98\x80 \xE2\x82\xAC"));
  EXPECT_FALSE(tok::utf8_is_valid("\xE2\x82"));
}

TEST(Utf8, IncompleteTail) {
  EXPECT_EQ(tok::utf8_incomplete_tail("ab"), 0u);
  EXPECT_EQ(tok::utf8_incomplete_tail("a\xF0\x9F\x98"), 3u);
  EXPECT_EQ(tok::utf8_incomplete_tail("a\xF0\x9F"), 2u);
  EXPECT_EQ(tok::utf8_incomplete_tail("a\xE2"), 1u);
  EXPECT_EQ(tok::utf8_incomplete_tail("a\xF0\x9F\x98\x80"), 0u);
  EXPECT_EQ(tok::utf8_incomplete_tail("a\xFF"), 0u);      // never completes
  EXPECT_EQ(tok::utf8_incomplete_tail("a\xED\xA0"), 0u);  // a surrogate never completes
}

TEST(Utf8, Nfc) {
  EXPECT_EQ(tok::utf8_nfc("e\xCC\x81"), "\xC3\xA9");     // e + U+0301 -> é
  EXPECT_EQ(tok::utf8_nfc("\xE2\x84\xAB"), "\xC3\x85");  // U+212B ANGSTROM SIGN -> Å
  EXPECT_EQ(tok::utf8_nfc("plain ascii"), "plain ascii");
}

TEST(PreTokenizer, Llama3) {
  EXPECT_EQ(split("llama-bpe", "Hello world"), (Strings{"Hello", " world"}));
  EXPECT_EQ(split("llama-bpe", "I'M here, we'Ve"),
            (Strings{"I", "'M", " here", ",", " we", "'Ve"}));
  EXPECT_EQ(split("llama-bpe", "12345 1234567"), (Strings{"123", "45", " ", "123", "456", "7"}));
  EXPECT_EQ(split("llama-bpe", "a  b"), (Strings{"a", " ", " b"}));
  EXPECT_EQ(split("llama-bpe", "a\n\n b"), (Strings{"a", "\n\n", " b"}));
  EXPECT_EQ(split("llama-bpe", "x   \n"), (Strings{"x", "   \n"}));
  EXPECT_EQ(split("llama-bpe", "ab!!\n\ncd"), (Strings{"ab", "!!\n\n", "cd"}));
  EXPECT_EQ(split("llama-bpe", "end   "), (Strings{"end", "   "}));
  EXPECT_EQ(split("llama-bpe", "\xC3\xA9t\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87"),
            (Strings{"\xC3\xA9t\xC3\xA9", " \xE4\xB8\xAD\xE6\x96\x87"}));  // \p{L} beyond ASCII
  // U+0085 is White_Space (as in Hugging Face tokenizers and llama.cpp), so the
  // punctuation run stops before it.
  EXPECT_EQ(split("llama-bpe", "!\xC2\x85\xC2\x85"), (Strings{"!", "\xC2\x85\xC2\x85"}));
}

TEST(PreTokenizer, Qwen2AndGpt2) {
  EXPECT_EQ(split("qwen2", "12345"), (Strings{"1", "2", "3", "4", "5"}));
  EXPECT_EQ(split("qwen2", "I'M"), (Strings{"I", "'M"}));
  EXPECT_EQ(split("gpt-2", "I'M"), (Strings{"I", "'", "M"}));  // case-sensitive contractions
  EXPECT_EQ(split("gpt-2", " 12345 abc"), (Strings{" 12345", " abc"}));
  EXPECT_EQ(split("gpt-2", "a\nb"), (Strings{"a", "\n", "b"}));
  // llama.cpp's default: punctuation runs first, then numbers in threes.
  EXPECT_EQ(split("default", "ab,cd 12345"), (Strings{"ab", ",", "cd", " ", "123", "45"}));
}

TEST(PreTokenizer, Gpt4o) {
  // Words split before an upper-case run that follows lower case; contractions in any case
  // stay with their word.
  EXPECT_EQ(split("gpt-4o", "HelloWorld"), (Strings{"Hello", "World"}));
  EXPECT_EQ(split("gpt-4o", "HELLOworld helloWORLD"), (Strings{"HELLOworld", " hello", "WORLD"}));
  EXPECT_EQ(split("gpt-4o", "I'M here, we'Ve"), (Strings{"I'M", " here", ",", " we'Ve"}));
  EXPECT_EQ(split("gpt-4o", "12345 1234567"), (Strings{"123", "45", " ", "123", "456", "7"}));
  // A leading non-letter joins the word; punctuation runs take trailing newlines.
  EXPECT_EQ(split("gpt-4o", "a/b x!!\n\ny"), (Strings{"a", "/b", " x", "!!\n\n", "y"}));
  EXPECT_EQ(split("gpt-4o", "a  b\n\n end   "), (Strings{"a", " ", " b", "\n\n", " end", "   "}));
  // Combining marks stay with their letter (Llama 3's \p{L}+ leaves them to punctuation).
  EXPECT_EQ(split("gpt-4o", "cafe\xCC\x81!"), (Strings{"cafe\xCC\x81", "!"}));
  EXPECT_EQ(split("llama-bpe", "cafe\xCC\x81!"), (Strings{"cafe", "\xCC\x81!"}));
  // CJK (Lo) is in both classes: a run is one piece.
  EXPECT_EQ(split("gpt-4o", "\xE4\xB8\xAD\xE6\x96\x87 ok"),
            (Strings{"\xE4\xB8\xAD\xE6\x96\x87", " ok"}));
  // U+0085 is White_Space, as in the other expressions.
  EXPECT_EQ(split("gpt-4o", "!\xC2\x85\xC2\x85"), (Strings{"!", "\xC2\x85\xC2\x85"}));
  const tok::PreTokenizer p("gpt-4o");
  EXPECT_FALSE(p.ignore_merges());  // llama.cpp: neither ignore_merges nor BOS for gpt-4o
  EXPECT_FALSE(p.nfc());
}

TEST(PreTokenizer, UnknownNameIsAnErrorListingTheKnownOnes) {
  EXPECT_ERROR(tok::PreTokenizer("falcon"),
               "unknown pre-tokenizer 'falcon' (known: llama-bpe (Llama 3)");
  EXPECT_ERROR(tok::PreTokenizer(""), "qwen2");
}

TEST(Bpe, MergesApplyByRankLeftmostFirst) {
  // "a b" has rank 0, "b c" rank 1: "abc" -> "ab" + "c".
  auto t1 = tiny(test::tiny_tokenizer_json({{"a", "b"}, {"b", "c"}}, {}, test::kQwen2Regex));
  EXPECT_EQ(pieces(t1, t1.encode("abc", false)), (Strings{"ab", "c"}));
  // Reversed ranks: "a" + "bc".
  auto t2 = tiny(test::tiny_tokenizer_json({{"b", "c"}, {"a", "b"}}, {}, test::kQwen2Regex));
  EXPECT_EQ(pieces(t2, t2.encode("abc", false)), (Strings{"a", "bc"}));
  // Ties go left: "aaa" -> "aa" + "a"; then a longer merge applies to its result.
  auto t3 = tiny(test::tiny_tokenizer_json({{"a", "a"}, {"aa", "aa"}}, {}, test::kQwen2Regex));
  EXPECT_EQ(pieces(t3, t3.encode("aaa", false)), (Strings{"aa", "a"}));
  EXPECT_EQ(pieces(t3, t3.encode("aaaaa", false)), (Strings{"aaaa", "a"}));
  // Merges never cross pre-tokenizer pieces.
  EXPECT_EQ(pieces(t3, t3.encode("a a", false)), (Strings{"a", " ", "a"}));
  // The merged tokens' ids are the vocabulary's: 256 is the first merge.
  EXPECT_EQ(t1.encode("ab", false), (std::vector<int>{256}));
  EXPECT_EQ(t1.encode("\n", false), (std::vector<int>{10}));
}

TEST(Bpe, IgnoreMergesTakesWholeWordsOnlyForLlama3) {
  // "xyz" is in the vocabulary (via merges "x y", "xy z") but its merge has the lowest rank
  // after "y z" which blocks it: the whole word is taken by Llama 3's ignore_merges only.
  auto j = test::tiny_tokenizer_json({{"y", "z"}, {"x", "y"}, {"xy", "z"}}, {}, test::kLlama3Regex);
  auto llama = tiny(j);
  EXPECT_EQ(pieces(llama, llama.encode("xyz", false)), (Strings{"xyz"}));
  auto q = test::tiny_tokenizer_json({{"y", "z"}, {"x", "y"}, {"xy", "z"}}, {}, test::kQwen2Regex);
  auto qwen = tiny(q);
  EXPECT_EQ(pieces(qwen, qwen.encode("xyz", false)), (Strings{"x", "yz"}));
}

TEST(Bpe, StringAndArrayMergesAreTheSame) {
  const std::vector<std::pair<std::string, std::string>> m = {
      {"h", "e"}, {"l", "l"}, {" ", "w"}, {"he", "ll"}};
  auto a = tiny(test::tiny_tokenizer_json(m, {}, test::kLlama3Regex, false));
  auto b = tiny(test::tiny_tokenizer_json(m, {}, test::kLlama3Regex, true));
  EXPECT_EQ(a.encode("hello world", false), b.encode("hello world", false));
  EXPECT_EQ(pieces(a, a.encode("hello world", false)),
            (Strings{"hell", "o", " w", "o", "r", "l", "d"}));
}

TEST(Bpe, InvalidUtf8IsReplacedAndRoundTrips) {
  auto tk = tiny(test::tiny_tokenizer_json({{"a", "b"}}, {}, test::kLlama3Regex));
  const std::string bad = "ab\xFF\xE2\x82 ab";
  const auto ids = tk.encode(bad, false);
  EXPECT_EQ(tk.decode_all(ids), tok::utf8_sanitize(bad));
  EXPECT_EQ(tk.decode_all(ids), "ab\xEF\xBF\xBD\xEF\xBF\xBD ab");
}

TEST(Bpe, NfcForQwen2Only) {
  auto q = tiny(test::tiny_tokenizer_json({{"a", "b"}}, {}, test::kQwen2Regex));
  auto l = tiny(test::tiny_tokenizer_json({{"a", "b"}}, {}, test::kLlama3Regex));
  EXPECT_EQ(q.decode_all(q.encode("e\xCC\x81", false)), "\xC3\xA9");
  EXPECT_EQ(l.decode_all(l.encode("e\xCC\x81", false)), "e\xCC\x81");
}

TEST(Special, ControlTokensOnlyWhereAsked) {
  auto tk = tiny(test::chat_tokenizer_json());
  const int im_end = tk.find_special("<|im_end|>"), think = tk.find_special("<think>");
  ASSERT_GE(im_end, 0);
  ASSERT_GE(think, 0);
  EXPECT_EQ(tk.type(im_end), TokenType::kControl);
  EXPECT_EQ(tk.type(think), TokenType::kUserDefined);
  const std::string text = "hello<|im_end|><think>";
  const auto plain = tk.encode(text, false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), im_end), 0);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), think), 1);  // user-defined: always
  EXPECT_EQ(tk.decode_all(plain), text);
  const auto special = tk.encode(text, false, false, true);
  EXPECT_EQ(pieces(tk, special), (Strings{"hello", "<|im_end|>", "<think>"}));
  // Control tokens decode to nothing unless asked.
  EXPECT_EQ(tk.decode_all(special), "hello<think>");
  // Segments: markup parsed, user text not, and text runs joined across segments.
  const auto seg =
      tk.encode_segments({{"<|im_start|>use", true}, {"r<|im_end|>", false}, {"\n", true}});
  // "use" + "r" became one run ("user" is a token); the tiny vocabulary has no merges for the rest.
  EXPECT_EQ(pieces(tk, seg), (Strings{"<|im_start|>", "user", "<", "|", "i", "m", "_", "e", "n",
                                      "d", "|", ">", "\n"}));
}

TEST(Special, BosEosAndEndOfGeneration) {
  auto j = test::chat_tokenizer_json();
  auto tk = tiny(
      j,
      R"({"bos_token": "<|begin_of_text|>", "eos_token": {"content": "<|end_of_text|>"}, "add_bos_token": true})");
  EXPECT_EQ(tk.piece(tk.bos_id()), "<|begin_of_text|>");
  EXPECT_EQ(tk.piece(tk.eos_id()), "<|end_of_text|>");
  EXPECT_TRUE(tk.add_bos());
  EXPECT_EQ(tk.encode("he", true, true), (std::vector<int>{tk.bos_id(), 256, tk.eos_id()}));
  EXPECT_EQ(tk.piece(tk.eot_id()), "<|eot_id|>");
  EXPECT_TRUE(tk.is_end_of_generation(tk.eos_id()));
  EXPECT_TRUE(tk.is_end_of_generation(tk.find_special("<|im_end|>")));
  EXPECT_FALSE(tk.is_end_of_generation(tk.find_special("<|im_start|>")));
  EXPECT_FALSE(tk.is_end_of_generation(256));
}

TEST(Special, HarmonyRepliesEndAtReturnOrCallAndShowTheirMarkup) {
  // o200k_harmony: <|end|> closes a message inside the reply, <|return|> and <|call|> end
  // the reply (llama.cpp removes <|end|> from the end-of-generation set when both exist).
  auto tk = tiny(test::harmony_tokenizer_json(), R"({"eos_token": "<|return|>"})");
  const int end = tk.find_special("<|end|>"), ret = tk.find_special("<|return|>"),
            call = tk.find_special("<|call|>"), eot = tk.find_special("<|endoftext|>");
  ASSERT_GE(end, 0);
  EXPECT_EQ(tk.eos_id(), ret);
  EXPECT_TRUE(tk.is_end_of_generation(ret));
  EXPECT_TRUE(tk.is_end_of_generation(call));
  EXPECT_TRUE(tk.is_end_of_generation(eot));
  EXPECT_FALSE(tk.is_end_of_generation(end));
  EXPECT_NE(tk.eot_id(), end);
  tk.set_eot_id(end);  // even named by the file, <|end|> does not end the reply
  EXPECT_FALSE(tk.is_end_of_generation(end));
  // The message markup decodes to its text; the reply's end and other controls do not,
  // and user text that spells markup is still text.
  const auto ids =
      tk.encode("<|channel|>final<|message|>hello<|return|><|endoftext|>", false, false, true);
  EXPECT_EQ(tk.decode_all(ids), "<|channel|>final<|message|>hello");
  EXPECT_EQ(std::count(ids.begin(), ids.end(), end), 0);
  const auto plain = tk.encode("<|end|>", false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), end), 0);
  // Without <|call|> (Phi-3's vocabulary, say), <|end|> ends the reply and decodes to nothing.
  auto j = test::harmony_tokenizer_json();
  for (auto& a : j["added_tokens"]) {
    if (a["content"] == "<|call|>") a["content"] = "<|other|>";
  }
  auto phi = tiny(j);
  EXPECT_TRUE(phi.is_end_of_generation(phi.find_special("<|end|>")));
  EXPECT_EQ(phi.decode_all(phi.encode("<|channel|>x<|end|>", false, false, true)), "x");
}

TEST(StreamDecoder, NeverSplitsACharacter) {
  auto tk = tiny(test::tiny_tokenizer_json({{"a", "b"}}, {}, test::kLlama3Regex));
  // "é" is bytes C3 A9; "😀" F0 9F 98 80: byte tokens are ids equal to the byte.
  tok::StreamDecoder s(tk);
  EXPECT_EQ(s.push('a'), "a");
  EXPECT_EQ(s.push(0xC3), "");
  EXPECT_EQ(s.push(0xA9), "\xC3\xA9");
  EXPECT_EQ(s.push(0xF0), "");
  EXPECT_EQ(s.push(0x9F), "");
  EXPECT_EQ(s.push(0x98), "");
  EXPECT_EQ(s.push(0x80), "\xF0\x9F\x98\x80");
  EXPECT_EQ(s.push(0xFF), "\xEF\xBF\xBD");  // never a character: replaced at once
  EXPECT_EQ(s.push(0xE2), "");
  EXPECT_EQ(s.flush(), "\xEF\xBF\xBD");  // incomplete at the end
  EXPECT_EQ(s.flush(), "");
}

TEST(HfJson, AddedTokensPaddingAndTypes) {
  auto j = test::chat_tokenizer_json();
  const int n = 256 + 9 + 10;  // bytes, merges, added
  auto v = tok::parse_hf_tokenizer(j.dump(), "", "t.json", n + 3);
  ASSERT_EQ(static_cast<int>(v.tokens.size()), n + 3);
  EXPECT_EQ(v.tokens[n], "[PAD" + std::to_string(n) + "]");
  EXPECT_EQ(v.types[n], TokenType::kUnused);
  EXPECT_EQ(v.types[0], TokenType::kNormal);
  EXPECT_EQ(v.pre, "llama-bpe");
  EXPECT_TRUE(v.add_bos);  // llama-bpe without a config
  EXPECT_ERROR(tok::parse_hf_tokenizer(j.dump(), "", "t.json", n - 1),
               "more than the vocabulary size");
  // A token that only looks special is a control token (llama.cpp's converter rule).
  j["added_tokens"].push_back({{"id", n}, {"content", "<|fim_pad|>"}, {"special", false}});
  auto w = tok::parse_hf_tokenizer(j.dump(), "", "t.json");
  EXPECT_EQ(w.types[n], TokenType::kControl);
  // The pre-tokenizer names.
  EXPECT_EQ(tok::parse_hf_tokenizer(
                test::tiny_tokenizer_json({{"a", "b"}}, {}, test::kQwen2Regex).dump(), "", "t")
                .pre,
            "qwen2");
  EXPECT_EQ(
      tok::parse_hf_tokenizer(test::tiny_tokenizer_json({{"a", "b"}}, {}, "").dump(), "", "t").pre,
      "gpt-2");
  const auto o200k = tok::parse_hf_tokenizer(
      test::tiny_tokenizer_json({{"a", "b"}}, {}, test::kGpt4oRegex).dump(), "", "t");
  EXPECT_EQ(o200k.pre, "gpt-4o");
  EXPECT_FALSE(o200k.add_bos);
}

TEST(HfJson, BadInputNamesTheProblem) {
  const auto good = test::tiny_tokenizer_json({{"a", "b"}}, {}, test::kLlama3Regex);
  EXPECT_ERROR(tok::parse_hf_tokenizer("{\"model\": ", "", "t.json"), "t.json: malformed JSON");
  EXPECT_ERROR(tok::parse_hf_tokenizer("[1, 2]", "", "t.json"), "not a JSON object");
  auto j = good;
  j["model"]["type"] = "Unigram";
  EXPECT_ERROR(tok::parse_hf_tokenizer(j.dump(), "", "t.json"),
               "model type 'Unigram' is not supported");
  j = good;
  j["model"]["merges"] = nlohmann::json::array();
  EXPECT_ERROR(tok::parse_hf_tokenizer(j.dump(), "", "t.json"), "model.merges is missing or empty");
  j = good;
  j["model"]["merges"].push_back(42);
  EXPECT_ERROR(tok::parse_hf_tokenizer(j.dump(), "", "t.json"), "merge 1 is neither");
  j = good;
  j["model"]["merges"].push_back("a zz");
  EXPECT_ERROR(tok::parse_hf_tokenizer(j.dump(), "", "t.json").tokenizer("t.json"),
               "merge 1 'a zz' names unknown token 'zz'");
  j = good;
  j["model"]["merges"].push_back("b a");
  EXPECT_ERROR(tok::parse_hf_tokenizer(j.dump(), "", "t.json").tokenizer("t.json"),
               "merge 1 'b a' makes 'ba', which is not in the vocabulary");
  j = good;
  j["model"]["vocab"]["q"] = -5;
  EXPECT_ERROR(tok::parse_hf_tokenizer(j.dump(), "", "t.json"), "has id -5");
  j = good;
  j["model"]["vocab"]["q"] = "x";
  EXPECT_ERROR(tok::parse_hf_tokenizer(j.dump(), "", "t.json"), "is not an integer id");
  j = good;
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\w+";
  EXPECT_ERROR(tok::parse_hf_tokenizer(j.dump(), "", "t.json"),
               "unknown pre-tokenizer expression '\\w+' (known:");
  j = good;
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  EXPECT_ERROR(tok::parse_hf_tokenizer(j.dump(), "", "t.json"),
               "unsupported pre-tokenizer type 'Whitespace'");
  EXPECT_ERROR(tok::parse_hf_tokenizer(good.dump(), R"({"bos_token": "<nope>"})", "t.json"),
               "bos_token '<nope>' is not in the vocabulary");
  EXPECT_ERROR(tok::parse_hf_tokenizer(good.dump(), "{", "t.json"),
               "t.json (tokenizer_config): malformed JSON");
}

// Writes the vocabulary into a GGUF with `edit` applied to its keys, and loads it.
struct GgufCase {
  test::TempDir dir;
  std::string path = dir.file("v.gguf");
  Tokenizer load(const tok::GgufVocab& v, const std::function<void(io::GgufWriter&)>& extra = {},
                 int n = -1) {
    io::GgufWriter w;
    w.add_string("general.architecture", "llama");
    tok::add_gguf_vocab_metadata(w, v);
    if (extra) extra(w);
    w.write(path);
    io::GgufFile f(path);
    return Tokenizer::from_gguf(f, n < 0 ? static_cast<int>(v.tokens.size()) : n);
  }
};

TEST(Gguf, VocabularyRoundTripsThroughGguf) {
  auto v = tok::parse_hf_tokenizer(
      test::chat_tokenizer_json().dump(),
      R"({"eos_token": "<|im_end|>", "chat_template": "{{ '<|im_start|>' }}"})", "t.json");
  const Tokenizer direct = v.tokenizer("t.json");
  GgufCase g;
  const Tokenizer loaded = g.load(v);
  EXPECT_EQ(loaded.kind(), tok::TokenizerKind::kByteLevelBpe);
  const std::string text = "hello world\n\n<|im_start|>user 12345 \xC3\xA9\xF0\x9F\x98\x80";
  EXPECT_EQ(loaded.encode(text, false, false, true), direct.encode(text, false, false, true));
  EXPECT_EQ(loaded.decode_all(loaded.encode(text, false)), text);
  EXPECT_EQ(loaded.eos_id(), loaded.find_special("<|im_end|>"));
  EXPECT_EQ(loaded.chat_template(), "{{ '<|im_start|>' }}");
  EXPECT_TRUE(
      loaded.add_bos());  // no config and no post-processor: llama-bpe's default, written out
}

TEST(Gguf, BadVocabulariesNameTheProblem) {
  auto v = tok::parse_hf_tokenizer(test::chat_tokenizer_json().dump(), "", "t.json");
  {
    GgufCase g;
    auto bad = v;
    bad.pre = "tekken";
    EXPECT_ERROR(g.load(bad), "unknown pre-tokenizer 'tekken' (known:");
  }
  {
    GgufCase g;
    auto bad = v;
    bad.merges.clear();
    bad.merges.push_back("h zz");
    EXPECT_ERROR(g.load(bad), "names unknown token 'zz'");
  }
  {
    GgufCase g;
    EXPECT_ERROR(
        g.load(v, [&](io::GgufWriter& w) { w.add_u32("tokenizer.ggml.eom_token_id", 100000); }),
        "tokenizer.ggml.eom_token_id = 100000 is outside the vocabulary");
  }
  {
    GgufCase g;
    EXPECT_ERROR(g.load(v, {}, static_cast<int>(v.tokens.size()) + 1),
                 "but the model's vocabulary size is");
  }
  {
    // No merges key at all.
    GgufCase g;
    io::GgufWriter w;
    w.add_string("tokenizer.ggml.model", "gpt2");
    w.add_string_array("tokenizer.ggml.tokens", v.tokens);
    w.write(g.path);
    io::GgufFile f(g.path);
    EXPECT_ERROR(Tokenizer::from_gguf(f, static_cast<int>(v.tokens.size())),
                 "has no merges (missing 'tokenizer.ggml.merges')");
  }
  {
    GgufCase g;
    io::GgufWriter w;
    w.add_string("tokenizer.ggml.model", "rwkv");
    w.add_string_array("tokenizer.ggml.tokens", v.tokens);
    w.write(g.path);
    io::GgufFile f(g.path);
    EXPECT_ERROR(Tokenizer::from_gguf(f, static_cast<int>(v.tokens.size())),
                 "unsupported tokenizer 'rwkv'");
  }
}

TEST(Chat, FormatsDetectAndEncodeMarkupOnly) {
  EXPECT_EQ(runtime::detect_chat_format("{{ '<|start_header_id|>' + role + '<|end_header_id|>' }}"),
            runtime::ChatFormat::kLlama3);
  EXPECT_EQ(runtime::detect_chat_format("{{ '<|im_start|>' }}"), runtime::ChatFormat::kChatMl);
  EXPECT_EQ(runtime::detect_chat_format("{{ '<start_of_turn>' + role }}"),
            runtime::ChatFormat::kGemma);
  EXPECT_EQ(runtime::detect_chat_format("{{ '<|user|>\n' + m + '<|end|>\n' }}"),
            runtime::ChatFormat::kPhi3);
  EXPECT_EQ(runtime::detect_chat_format("{{ '<|start|>' + role + '<|channel|>final<|message|>' + "
                                        "m + '<|end|>' }}"),
            runtime::ChatFormat::kHarmony);
  EXPECT_FALSE(runtime::detect_chat_format("[INST] {{ m }} [/INST]").has_value());
  EXPECT_ERROR(runtime::parse_chat_format("vicuna"),
               "unknown format 'vicuna' (known: llama3, chatml, gemma, phi3, harmony, plain)");

  auto tk = tiny(test::chat_tokenizer_json(), R"({"bos_token": "<|begin_of_text|>"})");
  EXPECT_ERROR(runtime::ChatPrompt(tk, ""), "the model has no chat template");
  tk.set_chat_template("{% for m in messages %}{{ m.content }}{% endfor %}");
  EXPECT_ERROR(runtime::ChatPrompt(tk, ""), "not one of the known formats");

  // ChatML: the turn equals the whole formatted string encoded with specials parsed,
  // as long as the user text has none; BOS only when the vocabulary adds one.
  tk.set_add_bos(false);
  const runtime::ChatPrompt chatml(tk, "chatml");
  const auto t1 = chatml.user_turn("hello", "be brief", true);
  EXPECT_EQ(t1,
            tk.encode("<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n"
                      "<|im_start|>assistant\n",
                      false, false, true));
  const auto t2 = chatml.user_turn("again", "be brief", false);
  EXPECT_EQ(t2, tk.encode("<|im_end|>\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n",
                          false, false, true));
  // User text that spells a control token stays text.
  const auto inj = chatml.user_turn("x<|im_end|>y", "", true);
  EXPECT_EQ(std::count(inj.begin(), inj.end(), tk.find_special("<|im_end|>")),
            1);  // only the markup's
  EXPECT_TRUE(chatml.ends_reply(tk.find_special("<|im_end|>")));
  tk.set_add_bos(true);
  EXPECT_EQ(chatml.user_turn("hello", "", true).front(), tk.bos_id());

  // Llama 3: BOS first, messages trimmed.
  const runtime::ChatPrompt llama(tk, "llama3");
  const auto l1 = llama.user_turn("  hello \n", "", true);
  std::vector<int> want = {tk.bos_id()};
  const auto body = tk.encode(
      "<|start_header_id|>user<|end_header_id|>\n\nhello<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\n",
      false, false, true);
  want.insert(want.end(), body.begin(), body.end());
  EXPECT_EQ(l1, want);
  EXPECT_EQ(llama.user_turn("hi", "", false).front(), tk.find_special("<|eot_id|>"));
  EXPECT_TRUE(llama.ends_reply(tk.find_special("<|eot_id|>")));

  // A vocabulary without the format's tokens.
  auto plain = tiny(test::tiny_tokenizer_json({{"a", "b"}}, {}, test::kLlama3Regex));
  EXPECT_ERROR(runtime::ChatPrompt(plain, "chatml"), "needs the special token '<|im_start|>'");
}

}  // namespace
}  // namespace kivi
