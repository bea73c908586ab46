// Tiled prefill attention (attn/prefill.h) against the token-by-token reference: the
// chunk's tokens appended one at a time, each query attended by decode_reference over the
// cache as it stood right after its own token (KIVI's residual as it was then), on every
// SIMD target, every cache format, residual and flush policy, and every attention option.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "attn/attention.h"
#include "attn/prefill.h"
#include "core/cpu.h"
#include "core/rng.h"
#include "core/threadpool.h"
#include "kv/kv_cache.h"
#include "model/forward.h"
#include "runtime/session.h"
#include "test_util.h"

namespace kivi {
namespace {

using test::FormatCase;

struct Case {
  int n_heads = 8, n_kv_heads = 2, D = 64;
  int G = 32, R = 32, block = 0;
  kv::KeyFlush flush = kv::KeyFlush::kBatch;
  int history = 150, chunk = 70;
  bool alibi = false, pre_rope = false, head_sinks = false;
  float softcap = 0.0f;
  int window = 0, sinks = 0;
};

std::string describe(const FormatCase& f, const Case& c) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "%s H=%d/%d D=%d G=%d R=%d block=%d flush=%s history=%d chunk=%d alibi=%d "
                "pre_rope=%d head_sinks=%d softcap=%g window=%d sinks=%d",
                f.name.c_str(), c.n_heads, c.n_kv_heads, c.D, c.G, c.R, c.block,
                kv::key_flush_name(c.flush), c.history, c.chunk, c.alibi, c.pre_rope, c.head_sinks,
                c.softcap, c.window, c.sinks);
  return buf;
}

// The largest error of the tiled chunk against the reference, relative to the largest
// output of each query; also whether a 1-thread and a 2-thread run give the same bits.
struct Outcome {
  std::string target;
  double err = 0.0;
  bool same_bits = true;
};

std::vector<Outcome> run_case(const FormatCase& f, const Case& c, uint64_t seed) {
  kv::CacheConfig cfg;
  cfg.n_layers = 1;
  cfg.n_kv_heads = c.n_kv_heads;
  cfg.head_dim = c.D;
  cfg.ctx = c.history + c.chunk;
  cfg.k = f.k;
  cfg.rotate = f.rotate;
  cfg.v = f.v;
  cfg.group_size = c.G;
  cfg.residual = c.R;
  cfg.key_flush = c.flush;
  cfg.block_tokens = c.block;
  const int kvd = c.n_kv_heads * c.D, qd = c.n_heads * c.D, total = c.history + c.chunk;
  Rng r(seed);
  std::vector<float> k(static_cast<size_t>(total) * kvd), v(k.size()),
      q(static_cast<size_t>(total) * qd);
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = r.normal() * ((i % c.D) % 13 == 1 ? 8.0f : 1.0f);
    v[i] = r.normal();
  }
  for (float& x : q) x = r.normal();
  std::vector<float> rope;
  std::vector<float> slopes = attn::alibi_slopes(c.n_heads), sink_logits(c.n_heads);
  for (float& s : sink_logits) s = r.normal();
  attn::Params p;
  p.n_heads = c.n_heads;
  p.scale = 1.0f / std::sqrt(static_cast<float>(c.D));
  p.alibi_slopes = c.alibi ? slopes.data() : nullptr;
  p.softcap = c.softcap;
  p.window = c.window;
  p.sinks = c.sinks;
  p.head_sinks = c.head_sinks ? sink_logits.data() : nullptr;
  if (c.pre_rope) {
    cfg.key_rope = kv::KeyRope::kPre;
    rope.resize(static_cast<size_t>(total) * c.D);
    model::fill_rope_table(rope.data(), total, c.D, 10000.0f);
    p.rope = rope.data();
  }
  auto fresh = [&] {
    auto cache = std::make_unique<kv::KvCache>(cfg);
    cache->calibrate(0, k.data(), v.data(), 1);
    for (int t = 0; t < c.history; ++t)
      cache->append(0, k.data() + static_cast<size_t>(t) * kvd,
                    v.data() + static_cast<size_t>(t) * kvd);
    return cache;
  };
  // Reference: token by token.
  auto ref_cache = fresh();
  std::vector<float> ref(static_cast<size_t>(c.chunk) * qd);
  for (int i = 0; i < c.chunk; ++i) {
    const size_t t = static_cast<size_t>(c.history + i);
    ref_cache->append(0, k.data() + t * kvd, v.data() + t * kvd);
    attn::decode_reference(ref_cache->view(0), q.data() + t * qd,
                           ref.data() + i * static_cast<size_t>(qd), p);
  }
  // Tiled on every SIMD target, with one and with two threads (the reference does not
  // depend on the target: computed once).
  std::vector<Outcome> outcomes;
  for (const auto& target : test::simd_targets()) {
    cpu::force_target_bits(target.bits);
    Outcome o;
    o.target = target.name;
    std::vector<float> out1, out2;
    for (int threads : {1, 2}) {
      auto cache = fresh();
      ThreadPool pool(threads);
      attn::PrefillWorkspace ws(threads, c.n_heads, c.n_kv_heads, c.D);
      std::vector<float> out(ref.size(), -1.0f);
      const size_t t0 = static_cast<size_t>(c.history);
      attn::append_and_prefill(*cache, 0, k.data() + t0 * kvd, v.data() + t0 * kvd, c.chunk,
                               q.data() + t0 * qd, out.data(), p, &pool, ws);
      (threads == 1 ? out1 : out2) = out;
    }
    o.same_bits = out1 == out2;
    for (int i = 0; i < c.chunk; ++i) {
      double num = 0, den = 1e-30;
      for (int j = 0; j < qd; ++j) {
        const size_t at = static_cast<size_t>(i) * qd + j;
        num = std::max(num, std::fabs(static_cast<double>(out1[at]) - ref[at]));
        den = std::max(den, std::fabs(static_cast<double>(ref[at])));
      }
      o.err = std::max(o.err, num / den);
    }
    outcomes.push_back(o);
  }
  cpu::reset_target();
  return outcomes;
}

constexpr double kBound = 2e-5;

// Every format, head grouping, residual and flush policy, on every SIMD target.
TEST(Prefill, EveryFormatMatchesTokenByToken) {
  double worst = 0.0;
  {
    for (const FormatCase& f : test::all_formats()) {
      for (const auto& [H, Hkv] : {std::pair{8, 2}, std::pair{4, 4}, std::pair{8, 1}}) {
        for (int R : {0, 32}) {
          for (kv::KeyFlush flush : {kv::KeyFlush::kBatch, kv::KeyFlush::kGroup}) {
            if (flush == kv::KeyFlush::kGroup && R == 0) continue;
            // Every grouping for a few formats; grouped-query attention for all of them.
            if (Hkv != 2 && f.name != "f16" && f.name != "kivi2" && f.name != "K int8 / V kivi4")
              continue;
            Case c;
            c.n_heads = H;
            c.n_kv_heads = Hkv;
            c.R = R;
            c.flush = flush;
            for (const Outcome& o : run_case(f, c, 11 + R)) {
              worst = std::max(worst, o.err);
              EXPECT_LT(o.err, kBound) << o.target << " " << describe(f, c);
              EXPECT_TRUE(o.same_bits) << o.target << " " << describe(f, c);
            }
          }
        }
      }
    }
  }
  std::printf("worst relative error %.3g (bound %.0e)\n", worst, kBound);
}

// Windows and sinks, ALiBi, soft capping, head sinks, keys before RoPE, small blocks, a
// head size that is not a multiple of the widest vector pair, a chunk from an empty cache.
TEST(Prefill, AttentionOptionsMatchTokenByToken) {
  std::vector<std::pair<std::string, Case>> variants;
  auto add = [&](const std::string& name, auto edit) {
    Case c;
    edit(c);
    variants.emplace_back(name, c);
  };
  add("window", [](Case& c) { c.window = 40; });
  add("window+sinks", [](Case& c) {
    c.window = 60;
    c.sinks = 4;
  });
  add("window shorter than chunk", [](Case& c) {
    c.window = 17;
    c.sinks = 2;
  });
  add("alibi", [](Case& c) { c.alibi = true; });
  add("softcap", [](Case& c) { c.softcap = 1.5f; });
  add("head sinks", [](Case& c) { c.head_sinks = true; });
  add("pre-rope", [](Case& c) { c.pre_rope = true; });
  add("block 32", [](Case& c) { c.block = 32; });
  add("D=80", [](Case& c) {
    c.D = 80;
    c.G = 16;
    c.R = 16;
  });
  add("empty history", [](Case& c) {
    c.history = 0;
    c.chunk = 100;
  });
  add("chunk of 5", [](Case& c) { c.chunk = 5; });
  add("R=64 G=32 long chunk", [](Case& c) {
    c.R = 64;
    c.chunk = 200;
  });
  const char* formats[] = {"f16", "int8/group", "kivi2", "K kivi4 / V kivi2", "K f16 / V kivi2"};
  for (const auto& [name, c] : variants) {
    for (const char* fname : formats) {
      for (const Outcome& o : run_case(test::format_named(fname), c, 5)) {
        EXPECT_LT(o.err, kBound) << o.target << " " << name << ": "
                                 << describe(test::format_named(fname), c);
        EXPECT_TRUE(o.same_bits) << o.target << " " << name;
      }
    }
  }
}

// The mean negative log-likelihood of tokens[1..] given the logits of every position.
double mean_nll(const std::vector<float>& logits, const std::vector<int>& tokens, int V) {
  double sum = 0.0;
  for (size_t i = 0; i + 1 < tokens.size(); ++i) {
    const float* l = logits.data() + i * V;
    double mx = l[0], z = 0.0;
    for (int j = 1; j < V; ++j) mx = std::max(mx, static_cast<double>(l[j]));
    for (int j = 0; j < V; ++j) z += std::exp(l[j] - mx);
    sum += mx + std::log(z) - l[tokens[i + 1]];
  }
  return sum / static_cast<double>(tokens.size() - 1);
}

// stories260K prefilling a text in chunks: the tiled path scores it as the stream path
// does, to 1e-4 relative in perplexity (quantized caches: the codes of later tokens
// may round differently once activations differ in their last bits), and the logits of
// the f32 cache within 1e-4.
TEST(Prefill, ModelPerplexityMatchesStream) {
  KIVI_REQUIRE_MODEL();
  const auto& m = test::stories();
  const std::vector<uint8_t> bytes = test::read_file(test::text_path());
  const std::string text(bytes.begin(), bytes.begin() + std::min<size_t>(bytes.size(), 2500));
  std::vector<int> tokens = m.tokenizer().encode(text, true);
  ASSERT_GT(tokens.size(), 400u);
  tokens.resize(std::min<size_t>(tokens.size(), 500));  // the model's context: 512
  const int V = m.config().vocab_size;
  struct Config {
    const char* name;
    const char* k;
    const char* v;
    int R;
    kv::KeyFlush flush;
    kv::KeyRope rope;
  };
  const Config configs[] = {
      {"f32", "f32", "f32", 0, kv::KeyFlush::kBatch, kv::KeyRope::kPost},
      {"f16", "f16", "f16", 0, kv::KeyFlush::kBatch, kv::KeyRope::kPost},
      {"int8", "int8", "int8", 0, kv::KeyFlush::kBatch, kv::KeyRope::kPost},
      {"kivi2 R=32", "kivi2", "kivi2", 32, kv::KeyFlush::kBatch, kv::KeyRope::kPost},
      {"kivi4 R=64 group flush", "kivi4", "kivi4", 64, kv::KeyFlush::kGroup, kv::KeyRope::kPost},
      {"K kivi2 / V f16 pre-RoPE", "kivi2", "f16", 32, kv::KeyFlush::kBatch, kv::KeyRope::kPre},
  };
  for (const Config& c : configs) {
    std::vector<std::vector<float>> logits;
    for (auto mode : {attn::PrefillMode::kStream, attn::PrefillMode::kTiled}) {
      runtime::SessionOptions o;
      o.threads = 2;
      o.ctx = 512;
      o.cache.k = {kv::parse_format(c.k), kv::Int8Granularity::kHead};
      o.cache.v = {kv::parse_format(c.v), kv::Int8Granularity::kHead};
      o.cache.residual = c.R;
      o.cache.key_flush = c.flush;
      o.cache.key_rope = c.rope;
      o.forward.prefill = mode;
      runtime::Session s(m, o);
      logits.emplace_back(tokens.size() * V);
      s.prefill(tokens, logits.back().data());
    }
    const double a = mean_nll(logits[0], tokens, V), b = mean_nll(logits[1], tokens, V);
    EXPECT_LT(std::fabs(std::exp(b) / std::exp(a) - 1.0), 1e-4) << c.name << " " << a << " " << b;
    if (std::string(c.name) == "f32") {
      double worst = 0.0;
      for (size_t i = 0; i < logits[0].size(); ++i)
        worst = std::max(worst, std::fabs(static_cast<double>(logits[0][i]) - logits[1][i]));
      EXPECT_LT(worst, 1e-4) << "f32 logits";
    }
  }
}

TEST(Prefill, ModeNames) {
  EXPECT_EQ(attn::parse_prefill_mode("tiled"), attn::PrefillMode::kTiled);
  EXPECT_EQ(attn::parse_prefill_mode("stream"), attn::PrefillMode::kStream);
  EXPECT_STREQ(attn::prefill_mode_name(attn::PrefillMode::kStream), "stream");
  try {
    attn::parse_prefill_mode("tiles");
    FAIL() << "accepted an unknown mode";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--prefill"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kivi
