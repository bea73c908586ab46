// The front door every command, the server, Python and eval share: the session options
// table and its parser (runtime/engine_options.h), and generation's stop rule, sampling,
// streaming UTF-8 and stop strings (runtime/generation.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/suggest.h"
#include "runtime/engine_options.h"
#include "runtime/generation.h"
#include "test_util.h"

namespace kivi {
namespace {

using runtime::OptionSpelling;
using runtime::OptionValues;
using runtime::parse_session_options;

std::string error_of(const OptionValues& v, OptionSpelling s = OptionSpelling::kFlag) {
  try {
    parse_session_options(v, s);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(EngineOptions, DefaultsAreTheLibrarysOwn) {
  const runtime::SessionOptions parsed = parse_session_options({});
  const runtime::SessionOptions plain;
  EXPECT_EQ(parsed.ctx, 0);
  EXPECT_EQ(parsed.threads, 0);
  EXPECT_TRUE(parsed.cache.k == plain.cache.k);
  EXPECT_TRUE(parsed.cache.v == plain.cache.v);
  EXPECT_EQ(parsed.cache.group_size, plain.cache.group_size);
  EXPECT_EQ(parsed.cache.residual, plain.cache.residual);
  EXPECT_EQ(parsed.cache.share_every, 1);
  EXPECT_EQ(parsed.overflow, runtime::ContextOverflow::kStop);
  EXPECT_EQ(parsed.sinks, plain.sinks);
  EXPECT_FALSE(parsed.sparse.enabled());
  // Every option in the table has help, and each name appears once.
  std::vector<std::string> names;
  for (const auto& s : runtime::session_option_specs()) {
    EXPECT_GT(std::string(s.help).size(), 10u) << s.name;
    for (const auto& n : names) EXPECT_NE(n, s.name);
    names.push_back(s.name);
  }
}

TEST(EngineOptions, EveryOptionReachesItsField) {
  const runtime::SessionOptions o = parse_session_options({{"ctx", "300"},
                                                           {"kv-cache", "kivi2"},
                                                           {"kv-cache-k", "kivi4"},
                                                           {"group-size", "16"},
                                                           {"residual", "64"},
                                                           {"key-flush", "group"},
                                                           {"key-rope", "pre"},
                                                           {"kv-share", "2"},
                                                           {"kv-share-map", "3:1"},
                                                           {"scale-dtype", "f32"},
                                                           {"attn-precision", "fast"},
                                                           {"window", "128"},
                                                           {"context-overflow", "shift"},
                                                           {"sinks", "8"},
                                                           {"sparse", "fix"},
                                                           {"sparse-block", "32"},
                                                           {"sparse-budget", "256"}});
  EXPECT_EQ(o.ctx, 300);
  EXPECT_EQ(o.cache.k.format, kv::Format::kKivi4);
  EXPECT_EQ(o.cache.v.format, kv::Format::kKivi2);
  EXPECT_EQ(o.cache.group_size, 16);
  EXPECT_EQ(o.cache.residual, 64);
  EXPECT_EQ(o.cache.key_flush, kv::KeyFlush::kGroup);
  EXPECT_EQ(o.cache.key_rope, kv::KeyRope::kPre);
  EXPECT_EQ(o.cache.share_every, 2);
  ASSERT_EQ(o.cache.share_map.size(), 1u);
  EXPECT_EQ(o.cache.share_map[0], std::make_pair(3, 1));
  EXPECT_EQ(o.cache.param_type, kv::ParamType::kF32);
  EXPECT_EQ(o.forward.precision, attn::Precision::kFast);
  EXPECT_EQ(o.forward.window, 128);
  EXPECT_EQ(o.overflow, runtime::ContextOverflow::kShift);
  EXPECT_EQ(o.sinks, 8);
  EXPECT_EQ(o.sparse.kind, sparse::Kind::kFix);
  EXPECT_EQ(o.sparse.block, 32);
  EXPECT_EQ(o.sparse.budget, 256);
  // Policies attached to a format (benchmark lists) set the same fields.
  const runtime::SessionOptions p = parse_session_options({{"kv-cache", "kivi2+share2+pre"}});
  EXPECT_EQ(p.cache.share_every, 2);
  EXPECT_EQ(p.cache.key_rope, kv::KeyRope::kPre);
}

TEST(EngineOptions, ErrorsNameTheOptionAsTheFrontEndSpellsIt) {
  EXPECT_NE(error_of({{"residual", "x"}}).find("--residual: 'x' is not an integer"),
            std::string::npos);
  EXPECT_NE(error_of({{"residual", "x"}}, OptionSpelling::kKeyword)
                .find("residual: 'x' is not an integer"),
            std::string::npos);
  EXPECT_NE(error_of({{"sparse-block", "99999999"}}, OptionSpelling::kKeyword)
                .find("sparse_block needs sparse=KIND"),
            std::string::npos);
  EXPECT_NE(error_of({{"ctx", "0"}}).find("--ctx = 0 is out of range (valid: 1 to"),
            std::string::npos);
  const std::string typo = error_of({{"kv-cach", "f16"}});
  EXPECT_NE(typo.find("unknown session option '--kv-cach' (did you mean '--kv-cache'?)"),
            std::string::npos)
      << typo;
  const std::string kw = error_of({{"key-ropes", "pre"}}, OptionSpelling::kKeyword);
  EXPECT_NE(kw.find("unknown session option 'key_ropes' (did you mean 'key_rope'?)"),
            std::string::npos)
      << kw;
  EXPECT_NE(error_of({{"kv-cache", "kivi3"}}).find("kivi3"), std::string::npos);
  EXPECT_NE(error_of({{"context-overflow", "wrap"}}).find("wrap"), std::string::npos);
  EXPECT_NE(error_of({{"kv-share-map", "3-1"}}).find("'3-1' is not BORROWER:OWNER"),
            std::string::npos);
}

TEST(EngineOptions, KvOptionNamesCoverEveryCachePolicy) {
  const std::vector<std::string> kv = runtime::kv_option_names();
  for (const char* n : {"kv-cache", "kv-share", "key-rope", "context-overflow", "sinks", "sparse",
                        "sparse-candidates", "window"}) {
    EXPECT_NE(std::find(kv.begin(), kv.end(), n), kv.end()) << n;
  }
  for (const char* n : {"ctx", "threads"}) EXPECT_EQ(std::find(kv.begin(), kv.end(), n), kv.end());
}

TEST(EngineOptions, ContextIsCheckedAgainstMemory) {
  KIVI_REQUIRE_MODEL();
  runtime::SessionOptions o;
  o.ctx = 512;
  EXPECT_EQ(runtime::resolve_context(test::stories(), o).ctx, 512);
  o.ctx = 0;
  EXPECT_EQ(runtime::resolve_context(test::stories(), o).ctx, test::stories().config().ctx);
  o.ctx = 513;
  EXPECT_THROW(runtime::resolve_context(test::stories(), o), Error);  // past the model's context
}

TEST(EngineOptions, GenerationOptionsHaveOneParserAndOneWording) {
  const runtime::GenerationOptions d = runtime::parse_generation_options({});
  EXPECT_EQ(d.max_tokens, 256);
  EXPECT_FLOAT_EQ(d.sampler.temperature, 0.8f);
  EXPECT_EQ(d.sampler.top_k, 40);
  EXPECT_FLOAT_EQ(d.sampler.top_p, 0.95f);
  EXPECT_EQ(d.sampler.seed, 42u);
  EXPECT_FALSE(d.ignore_eos);
  const runtime::GenerationOptions g = runtime::parse_generation_options(
      {{"max-tokens", "-1"}, {"temp", "0"}, {"top-k", "5"}, {"seed", "7"}, {"ignore-eos", "1"}});
  EXPECT_EQ(g.max_tokens, -1);
  EXPECT_EQ(g.sampler.temperature, 0.0f);
  EXPECT_EQ(g.sampler.top_k, 5);
  EXPECT_EQ(g.sampler.seed, 7u);
  EXPECT_TRUE(g.ignore_eos);
  auto err = [](const OptionValues& v, OptionSpelling s) -> std::string {
    try {
      runtime::parse_generation_options(v, s);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  // The command line's and Python's names, the same words after them.
  EXPECT_EQ(err({{"temp", "-1"}}, OptionSpelling::kFlag),
            "--temp = -1 is out of range (valid: 0 to 100)");
  EXPECT_EQ(err({{"temp", "-1"}}, OptionSpelling::kKeyword),
            "temperature = -1 is out of range (valid: 0 to 100)");
  EXPECT_EQ(err({{"top-p", "0"}}, OptionSpelling::kKeyword),
            "top_p = 0 is out of range (valid: greater than 0, up to 1)");
  EXPECT_NE(err({{"max-tokens", "-2"}}, OptionSpelling::kKeyword).find("max_tokens = -2"),
            std::string::npos);
  EXPECT_NE(err({{"temprature", "1"}}, OptionSpelling::kKeyword).find("did you mean 'temperature'"),
            std::string::npos);
  // seed -1: a random seed, different between calls (a 2^-64 chance of a false failure).
  EXPECT_NE(runtime::parse_generation_options({{"seed", "-1"}}).sampler.seed,
            runtime::parse_generation_options({{"seed", "-1"}}).sampler.seed);
}

TEST(Suggest, ClosestNames) {
  EXPECT_EQ(edit_distance("kv-cach", "kv-cache"), 1);
  EXPECT_EQ(edit_distance("geneate", "generate"), 1);
  EXPECT_EQ(edit_distance("abc", "acb"), 1);  // a swap of neighbours
  EXPECT_EQ(closest_name("generat", {"generate", "chat", "serve"}), "generate");
  EXPECT_EQ(closest_name("xyz", {"generate", "chat", "serve"}), "");
  EXPECT_EQ(did_you_mean("sevre", {"serve"}), " (did you mean 'serve'?)");
}

// --- generation ----------------------------------------------------------------------

// Logits that make `token` the most likely, then `second`.
std::vector<float> favour(int vocab, int token, int second = -1) {
  std::vector<float> l(vocab, 0.0f);
  l[token] = 10.0f;
  if (second >= 0) l[second] = 5.0f;
  return l;
}

int byte_token(uint8_t b) { return 3 + b; }  // tok512: <0x00> is id 3

runtime::GenerationOptions greedy(int max_tokens) {
  runtime::GenerationOptions g;
  g.max_tokens = max_tokens;
  g.sampler.temperature = 0.0f;
  return g;
}

TEST(Generation, EndTokensStopTheReply) {
  KIVI_REQUIRE_MODEL();
  const tok::Tokenizer& tk = test::stories().tokenizer();
  const int V = tk.vocab_size();
  for (int end : {tk.eos_id(), tk.bos_id()}) {
    runtime::Continuation c(tk, greedy(10), 1);
    const auto s = c.next(favour(V, 300).data());
    EXPECT_EQ(s.token, 300);
    EXPECT_FALSE(s.done);
    const auto e = c.next(favour(V, end).data());
    EXPECT_TRUE(e.done);
    EXPECT_EQ(e.token, -1);
    EXPECT_EQ(e.reason, runtime::StopReason::kEnd);
    EXPECT_EQ(c.generated(), 1);
  }
  // A chat format's marker ends it too.
  runtime::GenerationOptions g = greedy(10);
  g.end_tokens = {400};
  runtime::Continuation c(tk, g, 1);
  EXPECT_TRUE(c.next(favour(V, 400).data()).done);
}

TEST(Generation, IgnoreEosNeverSamplesAnEndToken) {
  KIVI_REQUIRE_MODEL();
  const tok::Tokenizer& tk = test::stories().tokenizer();
  const int V = tk.vocab_size();
  for (float temp : {0.0f, 1.0f}) {
    runtime::GenerationOptions g = greedy(3);
    g.ignore_eos = true;
    g.sampler.temperature = temp;
    g.sampler.top_k = 0;
    g.end_tokens = {300};
    runtime::Continuation c(tk, g, 1);
    // EOS, BOS and the extra end token are the most likely; they are never chosen.
    std::vector<float> l(V, 0.0f);
    l[tk.eos_id()] = l[tk.bos_id()] = l[300] = 50.0f;
    l[301] = 5.0f;
    for (int i = 0; i < 3; ++i) {
      const auto s = c.next(l.data());
      EXPECT_NE(s.token, tk.eos_id());
      EXPECT_NE(s.token, tk.bos_id());
      EXPECT_NE(s.token, 300);
      if (temp == 0.0f) {
        EXPECT_EQ(s.token, 301);
      }
      EXPECT_EQ(s.done, i == 2);
    }
    EXPECT_EQ(c.reason(), runtime::StopReason::kLength);
  }
}

TEST(Generation, ReleasesWholeUtf8CharactersOnly) {
  KIVI_REQUIRE_MODEL();
  const tok::Tokenizer& tk = test::stories().tokenizer();
  const int V = tk.vocab_size();
  runtime::Continuation c(tk, greedy(3), 1);
  // "é" is C3 A9: the first byte alone releases nothing.
  const auto a = c.next(favour(V, byte_token(0xC3)).data());
  EXPECT_EQ(a.text, "");
  const auto b = c.next(favour(V, byte_token(0xA9)).data());
  EXPECT_EQ(b.text, "\xC3\xA9");
  // A reply cut after half a character ends with the replacement character, never with
  // half of one.
  const auto d = c.next(favour(V, byte_token(0xE2)).data());
  EXPECT_TRUE(d.done);
  EXPECT_EQ(d.text, "\xEF\xBF\xBD");
}

TEST(Generation, StopStringsEndTheTextBeforeThem) {
  KIVI_REQUIRE_MODEL();
  const tok::Tokenizer& tk = test::stories().tokenizer();
  const int V = tk.vocab_size();
  runtime::GenerationOptions g = greedy(-1);
  g.stop = {"ab"};
  runtime::Continuation c(tk, g, 1);
  EXPECT_EQ(c.next(favour(V, byte_token('x')).data()).text, "x");
  EXPECT_EQ(c.next(favour(V, byte_token('a')).data()).text, "");  // could start "ab"
  const auto s = c.next(favour(V, byte_token('b')).data());
  EXPECT_TRUE(s.done);
  EXPECT_EQ(s.reason, runtime::StopReason::kStopString);
  EXPECT_EQ(c.text(), "x");
}

TEST(Generation, GeneratorMatchesStepByStepDecoding) {
  KIVI_REQUIRE_MODEL();
  const model::Model& m = test::stories();
  runtime::SessionOptions so;
  so.threads = 1;
  so.ctx = 64;
  const std::vector<int> prompt = m.tokenizer().encode("Once upon a time", true);
  // By hand: greedy argmax until the context is full.
  runtime::Session a(m, so);
  std::vector<int> want;
  const float* l = a.prefill(prompt);
  for (;;) {
    const int t = runtime::argmax(l, a.vocab());
    if (t == m.tokenizer().eos_id() || t == m.tokenizer().bos_id()) break;
    want.push_back(t);
    if (a.pos() >= a.ctx()) break;
    l = a.decode(t);
  }
  runtime::Session b(m, so);
  runtime::Generator gen(b, greedy(-1), prompt.back());
  gen.prefill(prompt);
  std::vector<int> got;
  while (!gen.continuation().done()) {
    const auto s = gen.next();
    if (s.token >= 0) got.push_back(s.token);
  }
  EXPECT_EQ(got, want);
  EXPECT_EQ(gen.continuation().reason(), runtime::StopReason::kContext);
  EXPECT_EQ(b.pos(), 64);
}

}  // namespace
}  // namespace kivi
