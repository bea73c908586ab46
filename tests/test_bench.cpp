// `kivi bench`: formats side by side on stories260K. The f32 reference agrees with
// itself, compression matches the cache's accounting and `kivi info`, the random fill
// advances every layer and is labelled, and the JSON carries every field.
#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.h"
#include "kv/format.h"
#include "model/model.h"
#include "runtime/bench.h"
#include "runtime/session.h"
#include "test_util.h"

namespace kivi {
namespace {

using test::kivi_cmd;
using test::run;

using test::stories;

kv::CacheConfig cache(kv::Format f) {
  kv::CacheConfig c;
  c.k.format = c.v.format = f;
  c.group_size = 32;
  c.residual = 32;
  return c;
}

runtime::BenchConfig config(int n_gen) {
  runtime::BenchConfig b;
  b.names = {"f32", "f16", "kivi2"};
  b.caches = {cache(kv::Format::kF32), cache(kv::Format::kF16), cache(kv::Format::kKivi2)};
  b.prompt = stories().tokenizer().encode("Once upon a time", true);
  b.n_gen = n_gen;
  b.threads = 2;
  return b;
}

// The number after "key": in a JSON object's text.
double number(const std::string& obj, const std::string& key) {
  const size_t p = obj.find("\"" + key + "\":");
  if (p == std::string::npos) {
    ADD_FAILURE() << "no " << key << " in " << obj;
    return -1;
  }
  return std::strtod(obj.c_str() + p + key.size() + 3, nullptr);
}

// The objects of the "results" array, by their "format".
std::vector<std::string> results(const std::string& json) {
  std::vector<std::string> out;
  size_t p = json.find("\"results\":[");
  while (p != std::string::npos && (p = json.find("{\"format\":", p + 1)) != std::string::npos) {
    out.push_back(json.substr(p, json.find('}', p) - p + 1));
  }
  return out;
}

TEST(Bench, ReferenceAgreesAndFormatsAreAccounted) {
  KIVI_REQUIRE_MODEL();
  auto b = config(40);
  b.fill = runtime::fill_tokens(stories().tokenizer(), runtime::kFillText, 100);
  const auto r = runtime::run_bench(stories(), b);
  ASSERT_EQ(r.formats.size(), 3u);
  EXPECT_EQ(r.ctx, 100 + static_cast<int>(b.prompt.size()) - 1 + 1);
  const int n_tokens = r.ctx + b.n_gen;
  for (const auto& f : r.formats) {
    EXPECT_EQ(f.tokens.size(), 40u);
    EXPECT_EQ(f.step_seconds.size(), 40u);
    EXPECT_GT(f.decode_tps, 0);
    EXPECT_GT(f.prefill_tps, 0);
    EXPECT_GT(f.attn_share, 0);
    EXPECT_LT(f.attn_share, 1);
    kv::CacheConfig c = f.cache;
    EXPECT_EQ(f.kv_bytes, kv::expected_bytes_used(c, n_tokens)) << f.name;
  }
  const auto& ref = r.formats[0];
  EXPECT_EQ(ref.token_match, 100.0);
  EXPECT_EQ(ref.first_divergence, -1);
  EXPECT_EQ(ref.overhead_pct, 0.0);
  EXPECT_DOUBLE_EQ(ref.compression_vs_f32, 1.0);
  EXPECT_DOUBLE_EQ(ref.compression_vs_f16, 0.5);
  EXPECT_DOUBLE_EQ(r.formats[1].compression_vs_f32, 2.0);
  EXPECT_DOUBLE_EQ(r.formats[1].compression_vs_f16, 1.0);
  // kivi2 past its residual (head_dim 8: a value group is 8 channels with two f16 parameters).
  EXPECT_GT(r.formats[2].compression_vs_f16, 1.5);
  // f16 on this model follows f32 greedily for a while.
  EXPECT_GT(r.formats[1].token_match, 50.0);
  // The same run again gives the same tokens (greedy, deterministic).
  const auto again = runtime::run_bench(stories(), b);
  for (size_t i = 0; i < r.formats.size(); ++i)
    EXPECT_EQ(again.formats[i].tokens, r.formats[i].tokens);
}

TEST(Bench, RandomFillAdvancesEveryLayer) {
  KIVI_REQUIRE_MODEL();
  const auto& c = stories().config();
  std::vector<std::unique_ptr<kv::KvCache>> owned;
  std::vector<kv::KvCache*> caches;
  for (auto f : {kv::Format::kF32, kv::Format::kInt8, kv::Format::kKivi4}) {
    kv::CacheConfig cc = cache(f);
    cc.n_layers = c.n_layers;
    cc.n_kv_heads = c.n_kv_heads;
    cc.head_dim = c.head_dim();
    cc.ctx = 300;
    owned.push_back(std::make_unique<kv::KvCache>(cc));
    caches.push_back(owned.back().get());
  }
  runtime::fill_random(caches, 200, 9);
  for (auto* k : caches) {
    for (int l = 0; l < c.n_layers; ++l) EXPECT_EQ(k->n_tokens(l), 200);
    EXPECT_EQ(k->bytes_used(), kv::expected_bytes_used(k->config(), 200));
  }
  // A session over a filled cache decodes at the following positions.
  auto b = config(10);
  b.fill_random = 200;
  b.prompt = stories().tokenizer().encode("Once upon a time", false);
  const auto r = runtime::run_bench(stories(), b);
  EXPECT_TRUE(r.fill_random);
  EXPECT_EQ(r.ctx, 200 + static_cast<int>(b.prompt.size()));
  EXPECT_EQ(r.formats[0].token_match, 100.0);
  EXPECT_EQ(r.formats[0].kv_bytes, kv::expected_bytes_used(r.formats[0].cache, r.ctx + 10));
}

TEST(BenchCli, JsonHasEveryFieldAndMatchesInfo) {
  KIVI_REQUIRE_MODEL();
  const std::string m = test::model_args();
  const auto r = run(kivi_cmd("bench " + m + " -n 20 --ctx-fill 150 --kv-cache f16,kivi2 --json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  for (const char* k : {"\"model\":", "\"ctx_fill\":150", "\"ctx_fill_random\":false", "\"n\":20",
                        "\"threads\":"}) {
    EXPECT_NE(r.out.find(k), std::string::npos) << k;
  }
  const auto res = results(r.out);
  ASSERT_EQ(res.size(), 3u) << r.out;  // the f32 reference (not listed) first
  EXPECT_NE(res[0].find("\"format\":\"f32\""), std::string::npos);
  EXPECT_NE(res[0].find("\"listed\":false"), std::string::npos);
  EXPECT_NE(res[2].find("\"format\":\"kivi2\""), std::string::npos);
  for (const auto& o : res) {
    for (const char* k : {"ctx", "prefill_tps", "decode_tps", "kv_bytes", "compression_vs_f32",
                          "compression_vs_f16", "token_match", "overhead_pct", "attn_share"}) {
      EXPECT_GE(number(o, k), k == std::string("overhead_pct") ? -100.0 : 0.0) << k << " in " << o;
    }
    EXPECT_NE(o.find("\"first_divergence\":"), std::string::npos);
  }
  EXPECT_EQ(number(res[0], "token_match"), 100.0);
  EXPECT_NE(res[0].find("\"first_divergence\":null"), std::string::npos);
  // KV bytes equal what `kivi info` computes for the same number of tokens.
  const int ctx = static_cast<int>(number(res[0], "ctx"));
  const int tokens = ctx + 20;
  const auto info = run(kivi_cmd("info " + m + " --kv-cache f32,f16,kivi2 --ctx " +
                                 std::to_string(tokens) + " --json"));
  ASSERT_EQ(info.exit_code, 0) << info.err;
  std::vector<double> at_ctx;
  for (size_t p = 0; (p = info.out.find("\"bytes_at_ctx\":", p + 1)) != std::string::npos;) {
    at_ctx.push_back(std::strtod(info.out.c_str() + p + 15, nullptr));
  }
  ASSERT_EQ(at_ctx.size(), 3u) << info.out;
  for (int i = 0; i < 3; ++i) EXPECT_EQ(number(res[i], "kv_bytes"), at_ctx[i]) << res[i];
  EXPECT_NEAR(number(res[2], "compression_vs_f32"), at_ctx[0] / at_ctx[2],
              1e-6);  // JSON prints 9 digits
  EXPECT_NEAR(number(res[2], "compression_vs_f16"), at_ctx[1] / at_ctx[2], 1e-6);
}

TEST(BenchCli, RandomFillIsLabelled) {
  KIVI_REQUIRE_MODEL();
  const std::string m = test::model_args();
  const auto j = run(kivi_cmd(
      "bench " + m + " -n 10 --ctx-fill 300 --ctx-fill-random --kv-cache f32,int8 --json"));
  ASSERT_EQ(j.exit_code, 0) << j.err;
  EXPECT_NE(j.out.find("\"ctx_fill_random\":true"), std::string::npos);
  EXPECT_NE(j.out.find("\"token_match_meaningful\":false"), std::string::npos);
  EXPECT_NE(j.out.find("random fill (speed only; token match not meaningful)"), std::string::npos);
  const auto res = results(j.out);
  ASSERT_EQ(res.size(), 2u);
  EXPECT_GE(number(res[0], "ctx"), 300);
  const auto t =
      run(kivi_cmd("bench " + m + " -n 10 --ctx-fill 300 --ctx-fill-random --kv-cache f32,int8"));
  ASSERT_EQ(t.exit_code, 0) << t.err;
  EXPECT_NE(t.out.find("random fill (speed only; token match not meaningful)"), std::string::npos);
  const auto md = run(kivi_cmd("bench " + m + " -n 5 --kv-cache kivi4 --markdown"));
  ASSERT_EQ(md.exit_code, 0) << md.err;
  EXPECT_NE(md.out.find("| f32 (reference, not listed) |"), std::string::npos) << md.out;
  EXPECT_NE(md.out.find("| :--"), std::string::npos);
}

TEST(BenchCli, Errors) {
  KIVI_REQUIRE_MODEL();
  const std::string m = test::model_args();
  auto expect_error = [](const test::RunResult& r, const std::string& needle) {
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find("kivi: error: "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
  };
  expect_error(run(kivi_cmd("bench " + m + " --ctx-fill-random")),
               "--ctx-fill-random needs --ctx-fill");
  expect_error(run(kivi_cmd("bench " + m + " --ctx-fill 600")),
               "exceed the model's context of 512");
  expect_error(run(kivi_cmd("bench " + m + " -n 100 --ctx 50")), "do not fit in --ctx 50");
  expect_error(run(kivi_cmd("bench " + m + " --kv-cache f16,q3")), "q3");
  expect_error(run(kivi_cmd("bench " + m + " --kv-cache f16,f16")), "twice");
  expect_error(run(kivi_cmd("bench " + m + " --json --markdown")), "not both");
  expect_error(run(kivi_cmd("bench " + m + " --configs f32+share0")), "+shareN with N >= 1");
  expect_error(run(kivi_cmd("bench " + m + " --configs f32+wide")), "unknown cache policy");
  expect_error(run(kivi_cmd("bench " + m + " --configs f32 --kv-cache f16")), "not both");
  expect_error(run(kivi_cmd("bench " + m + " --configs no-cache --ctx-fill 100 --ctx-fill-random")),
               "no-cache needs a text fill");
  expect_error(run(kivi_cmd("generate " + m + " -p hi --kv-share-map 2:3")),
               "owner must be an earlier layer");
  expect_error(run(kivi_cmd("generate " + m + " -p hi --kv-share-map 2-3")),
               "is not BORROWER:OWNER");
}

// The cache-engineering configurations side by side: no cache, cache, int8, sharing,
// int8 + sharing. A decoder without a cache generates the f32 cache's tokens; sharing
// halves (5 layers: 3 of 5) the KV bytes; perplexity is reported per configuration.
TEST(BenchCli, CacheConfigurationsSideBySide) {
  KIVI_REQUIRE_MODEL();
  const std::string m = test::model_args();
  const auto r = run(kivi_cmd(
      "bench " + m + " -n 30 --configs no-cache,f32,int8,f32+share2,int8+share2 --ppl-text '" +
      test::shared_dir() + "/data/tinytales.txt' --ppl-ctx 128 --json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string& j = r.out;
  auto field = [&](const std::string& format, const std::string& key) {
    const size_t at = j.find("\"format\":\"" + format + "\"");
    EXPECT_NE(at, std::string::npos) << format;
    const size_t k = j.find("\"" + key + "\":", at);
    return std::strtod(j.c_str() + k + key.size() + 3, nullptr);
  };
  EXPECT_EQ(field("no-cache", "token_match"), 100.0);
  EXPECT_EQ(field("no-cache", "kv_bytes"), 0.0);
  EXPECT_NE(j.find("\"no_cache\":true,\"ppl\":null"), std::string::npos) << j;
  EXPECT_NEAR(field("f32+share2", "kv_bytes") / field("f32", "kv_bytes"), 3.0 / 5.0, 1e-9);
  EXPECT_NEAR(field("int8/head+share2", "kv_bytes") / field("int8/head", "kv_bytes"), 3.0 / 5.0,
              1e-9);
  const double p32 = field("f32", "ppl"), p8 = field("int8/head", "ppl"),
               ps = field("f32+share2", "ppl");
  EXPECT_GT(p32, 1.0);
  EXPECT_NEAR(p8 / p32, 1.0, 0.01);  // int8 costs little
  EXPECT_GT(ps, p32);                // sharing costs quality on a model not trained for it
}

// A format that differs from the reference: its match, first divergence and overhead are
// what the tokens and step times say, computed here independently.
TEST(Bench, AgreementAndOverheadOfAFormatThatDiffers) {
  KIVI_REQUIRE_MODEL();
  runtime::BenchConfig b;
  kv::CacheConfig k2 = cache(kv::Format::kKivi2);
  k2.residual = 0;  // every token quantized to 2 bits: greedy text departs from f32's early
  b.names = {"f32", "kivi2"};
  b.caches = {cache(kv::Format::kF32), k2};
  b.prompt = stories().tokenizer().encode("Once upon a time", true);
  b.n_gen = 60;
  b.threads = 1;
  const auto r = runtime::run_bench(stories(), b);
  ASSERT_EQ(r.formats.size(), 2u);
  const auto& ref = r.formats[0];
  const auto& f = r.formats[1];
  int same = 0, first = -1;
  for (int i = 0; i < b.n_gen; ++i) {
    if (f.tokens[i] == ref.tokens[i]) {
      ++same;
    } else if (first < 0) {
      first = i;
    }
  }
  ASSERT_GE(first, 0) << "kivi2 with R = 0 should depart from f32 within 60 tokens";
  EXPECT_LT(same, b.n_gen);
  EXPECT_DOUBLE_EQ(f.token_match, 100.0 * same / b.n_gen);
  EXPECT_EQ(f.first_divergence, first);
  auto median_of = [](std::vector<double> x) {
    std::sort(x.begin(), x.end());
    const size_t n = x.size();
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
  };
  const double m_ref = median_of(ref.step_seconds), m_f = median_of(f.step_seconds);
  EXPECT_DOUBLE_EQ(ref.decode_seconds, m_ref);
  EXPECT_DOUBLE_EQ(f.decode_seconds, m_f);
  EXPECT_NE(m_f, m_ref);  // two timed runs never take the same nanoseconds
  EXPECT_NEAR(f.overhead_pct, 100.0 * (m_f / m_ref - 1.0), 1e-9);
  EXPECT_EQ(ref.token_match, 100.0);
  EXPECT_EQ(ref.overhead_pct, 0.0);
}

TEST(BenchCli, AFormatThatDiffersIsReported) {
  KIVI_REQUIRE_MODEL();
  const std::string m = test::model_args();
  const auto r =
      run(kivi_cmd("bench " + m + " -n 60 --kv-cache f32,kivi2 -R 0 --threads 1 --json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto res = results(r.out);
  ASSERT_EQ(res.size(), 2u) << r.out;
  EXPECT_EQ(number(res[0], "token_match"), 100.0);
  EXPECT_LT(number(res[1], "token_match"), 100.0) << res[1];
  EXPECT_EQ(res[1].find("\"first_divergence\":null"), std::string::npos) << res[1];
  EXPECT_NE(number(res[1], "overhead_pct"), 0.0) << res[1];
}

}  // namespace
}  // namespace kivi
