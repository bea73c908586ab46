// End to end on the real stories260K model.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "attn/attention.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/threadpool.h"
#include "kv/format.h"
#include "model/convert.h"
#include "model/forward.h"
#include "model/model.h"
#include "runtime/engine_options.h"
#include "runtime/sampler.h"
#include "runtime/session.h"
#include "test_util.h"

// Counts heap allocations while `g_count_allocs` is set (the per-token path must make none).
static std::atomic<bool> g_count_allocs{false};
static std::atomic<long> g_allocs{0};
void* operator new(std::size_t n) {
  if (g_count_allocs.load(std::memory_order_relaxed))
    g_allocs.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
// The nothrow forms (std::stable_sort's buffer) must pair with the free below too.
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  if (g_count_allocs.load(std::memory_order_relaxed))
    g_allocs.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n ? n : 1);
}
void* operator new[](std::size_t n, const std::nothrow_t& t) noexcept { return operator new(n, t); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
// The replaced operator new allocates with malloc, so free is the matching release. GCC
// cannot see that through the replacement and warns where it inlines a delete of memory
// from new (-Wmismatched-new-delete); the pairing is correct by construction.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace kivi {
namespace {

using runtime::Session;
using runtime::SessionOptions;

using test::greedy;
using test::stories;

SessionOptions options(const std::string& k, const std::string& v, int G = 32, int R = 32,
                       kv::KeyFlush flush = kv::KeyFlush::kBatch,
                       kv::ParamType pt = kv::ParamType::kF16,
                       kv::Int8Granularity gran = kv::Int8Granularity::kHead, int threads = 2) {
  SessionOptions o;
  o.threads = threads;
  // These tests hold prefill to decoding bit for bit: the stream path (test_prefill
  // checks the tiled one against it).
  o.forward.prefill = attn::PrefillMode::kStream;
  o.cache.k = {kv::parse_format(k), gran};
  o.cache.v = {kv::parse_format(v), gran};
  o.cache.group_size = G;
  o.cache.residual = R;
  o.cache.key_flush = flush;
  o.cache.param_type = pt;
  return o;
}

TEST(Model, GreedyTextMatchesTheTextLlama2cPublishes) {
  KIVI_REQUIRE_MODEL();
  const auto& m = stories();
  Session s(m, options("f32", "f32"));
  const auto prompt = m.tokenizer().encode("Once upon a time", true);
  const auto out = greedy(s, prompt, 56);
  std::vector<int> all(prompt.begin() + 1, prompt.end());
  all.insert(all.end(), out.begin(), out.end());
  EXPECT_EQ(m.tokenizer().decode_all(all, prompt[0]), test::kPublishedText);
}

TEST(Model, CachedAndNoCacheGreedyAgree) {
  KIVI_REQUIRE_MODEL();
  const auto& m = stories();
  Session s(m, options("f32", "f32"));
  auto tokens = m.tokenizer().encode("Once upon a time", true);
  const auto out = greedy(s, tokens, 150);
  ThreadPool pool(2);
  for (int i = 0; i < 150; ++i) {
    const auto logits = model::forward_no_cache(m, tokens, &pool);
    const int t = runtime::argmax(logits.data(), m.config().vocab_size);
    ASSERT_EQ(t, out[i]) << "step " << i;
    tokens.push_back(t);
  }
}

TEST(Model, CachedLogitsMatchNoCacheLogits) {
  KIVI_REQUIRE_MODEL();
  const auto& m = stories();
  Session s(m, options("f32", "f32"));
  const auto tokens =
      m.tokenizer().encode("Lily and Ben went to the park to play with a red ball.", true);
  std::vector<float> all(tokens.size() * m.config().vocab_size);
  s.prefill(tokens, all.data());
  ThreadPool pool(1);
  for (size_t n = 1; n <= tokens.size(); ++n) {
    const auto ref =
        model::forward_no_cache(m, std::vector<int>(tokens.begin(), tokens.begin() + n), &pool);
    for (int v = 0; v < m.config().vocab_size; ++v) {
      ASSERT_NEAR(all[(n - 1) * m.config().vocab_size + v], ref[v], 1e-4) << "position " << n - 1;
    }
  }
}

// Keys stored before RoPE and rotated inside attention give the logits of keys stored
// rotated: within float rounding for f32; for f16, whose rounding of a key differs
// before and after the rotation, within twice the whole effect of f16 against f32.
// The greedy text of f32 is the published one.
TEST(Model, KeysBeforeRopeMatchKeysAfterRope) {
  KIVI_REQUIRE_MODEL();
  const auto& m = stories();
  const auto tokens =
      m.tokenizer().encode("Lily and Ben went to the park to play with a red ball.", true);
  const int V = m.config().vocab_size;
  auto logits = [&](const char* f, kv::KeyRope where) {
    SessionOptions o = options(f, f);
    o.cache.key_rope = where;
    Session s(m, o);
    std::vector<float> all(tokens.size() * V);
    s.prefill(tokens, all.data());
    return all;
  };
  auto max_diff = [](const std::vector<float>& a, const std::vector<float>& b) {
    double worst = 0.0;
    for (size_t i = 0; i < a.size(); ++i)
      worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - b[i]));
    return worst;
  };
  const auto f32_post = logits("f32", kv::KeyRope::kPost),
             f32_pre = logits("f32", kv::KeyRope::kPre);
  const auto f16_post = logits("f16", kv::KeyRope::kPost),
             f16_pre = logits("f16", kv::KeyRope::kPre);
  const double f32_diff = max_diff(f32_post, f32_pre), f16_diff = max_diff(f16_post, f16_pre);
  const double f16_effect = max_diff(f32_post, f16_post);
  // f32 keys rotated as attention reads them can give the very bits RoPE gave before
  // storing (the scalar rotation at head_dim 8 does, on AVX-512); f16 keys rounded
  // before the rotation cannot, so the f16 difference shows the pre-RoPE path ran.
  EXPECT_LT(f32_diff, 1e-4);
  EXPECT_GT(f16_diff, 0.0) << "the pre-RoPE path did not run";
  EXPECT_LT(f16_diff, 2 * f16_effect);
  std::printf(
      "largest logit difference pre/post RoPE: f32 %.3g, f16 %.3g (f16 against f32: %.3g)\n",
      f32_diff, f16_diff, f16_effect);
  SessionOptions pre = options("f32", "f32");
  pre.cache.key_rope = kv::KeyRope::kPre;
  Session s(m, pre);
  const auto prompt = m.tokenizer().encode("Once upon a time", true);
  const auto out = greedy(s, prompt, 56);
  std::vector<int> all(prompt.begin() + 1, prompt.end());
  all.insert(all.end(), out.begin(), out.end());
  EXPECT_EQ(m.tokenizer().decode_all(all, prompt[0]), test::kPublishedText);
}

// Cross-layer sharing (--kv-share 2 on the 5-layer model): 3 layers store a cache; the
// cached logits match the no-cache oracle with the same sharing; prefilling gives the
// bits that decoding token by token gives, for formats with and without a residual.
TEST(Model, CrossLayerSharing) {
  KIVI_REQUIRE_MODEL();
  const auto& m = stories();
  ASSERT_EQ(m.config().n_layers, 5);
  const auto tokens = m.tokenizer().encode(
      "Lily and Ben went to the park to play with a red ball. They ran.", true);
  const int N = static_cast<int>(tokens.size()), V = m.config().vocab_size;
  SessionOptions o = options("f32", "f32");
  o.cache.share_every = 2;
  Session s(m, o);
  int stored = 0;
  for (int l = 0; l < 5; ++l) stored += s.cache().bytes_reserved(l) > 0;
  EXPECT_EQ(stored, 3);
  std::vector<float> all(static_cast<size_t>(N) * V);
  s.prefill(tokens, all.data());
  ThreadPool pool(1);
  const auto owners = kv::layer_owners(s.cache().config());
  for (int n = 1; n <= N; n += 5) {
    const auto ref = model::forward_no_cache(
        m, std::vector<int>(tokens.begin(), tokens.begin() + n), &pool, owners);
    for (int v = 0; v < V; ++v)
      ASSERT_NEAR(all[static_cast<size_t>(n - 1) * V + v], ref[v], 1e-4) << "position " << n - 1;
  }
  for (const char* f : {"f32", "int8", "kivi2", "kivi4"}) {
    SessionOptions so = options(f, f, 8, 16);
    so.cache.share_map = {{2, 0}, {4, 3}};
    Session stream(m, so), batch(m, so);
    std::vector<float> ls(static_cast<size_t>(N) * V), lb(ls.size());
    for (int i = 0; i < N; ++i)
      std::memcpy(&ls[static_cast<size_t>(i) * V], stream.decode(tokens[i]), V * 4);
    batch.prefill(tokens, lb.data());
    EXPECT_EQ(std::memcmp(ls.data(), lb.data(), ls.size() * 4), 0) << f;
  }
}

// Generation past the context: with the window policy, greedy tokens through a
// 256-token window (ctx 384) for every format and both key placements (5,000 for kivi2
// with keys before RoPE, 1,500 for the others); the cache's bytes stop growing once it
// is full.
TEST(Model, WindowPolicyGeneratesPastTheContext) {
  KIVI_REQUIRE_MODEL();
  const auto& m = stories();
  for (const char* f : {"f32", "f16", "int8", "kivi2", "kivi4"}) {
    for (auto where : {kv::KeyRope::kPost, kv::KeyRope::kPre}) {
      SessionOptions o = options(f, f, 32, 64, kv::KeyFlush::kBatch, kv::ParamType::kF16,
                                 kv::Int8Granularity::kHead, 1);
      o.ctx = 384;
      o.overflow = runtime::ContextOverflow::kWindow;
      o.forward.window = 256;
      o.cache.key_rope = where;
      Session s(m, o);
      const float* logits = s.prefill(m.tokenizer().encode("Once upon a time", true));
      const int steps = std::string(f) == "kivi2" && where == kv::KeyRope::kPre ? 5000 : 1500;
      uint64_t most =
          0;  // the most bytes used over the first 1,000 steps (the cache fills at ~380)
      for (int i = 0; i < steps; ++i) {
        logits = s.decode(runtime::argmax(logits, s.vocab()));
        if (i < 1000) most = std::max(most, s.cache().bytes_used());
        if (i >= 1000) {
          ASSERT_LE(s.cache().bytes_used(), most) << f << " step " << i;
        }
        ASSERT_LE(s.pos(), 384);
      }
      EXPECT_LE(most, s.cache().bytes_reserved());
      EXPECT_GT(s.dropped(), steps - 400) << f;
      EXPECT_EQ(s.window(), 256);
    }
  }
}

// After a shift, positions are consistent: the next token's logits equal those of a
// fresh f32 session whose cache holds the kept tokens' keys and values (dequantized from
// the shifted cache) at their new positions, 0 .. kept - 1. (The kept tokens' keys and
// values in deeper layers depend on the dropped ones, so re-feeding the kept tokens
// would compute other vectors.) Keys after RoPE are re-rotated by the shift: f32 keys
// after RoPE then give the logits of f32 keys before RoPE.
TEST(Model, ShiftKeepsPositionsConsistent) {
  KIVI_REQUIRE_MODEL();
  const auto& m = stories();
  std::string text =
      "Once upon a time, there was a little boy named Tim. Tim had a red kite. He liked to fly his "
      "kite in the big green park near his house. One windy day, Tim ran fast and the kite went "
      "up.";
  text += " " + text + " " + text;
  const auto tokens = m.tokenizer().encode(text, true);
  ASSERT_GT(tokens.size(), 210u);
  const int V = m.config().vocab_size, L = m.config().n_layers, H = m.config().n_kv_heads;
  const int D = m.config().head_dim();
  auto shifted = [&](const char* f, kv::KeyRope where) {
    SessionOptions o = options(f, f, 32, 32);
    o.ctx = 192;
    o.overflow = runtime::ContextOverflow::kShift;
    o.cache.key_rope = where;
    auto s = std::make_unique<Session>(m, o);
    for (size_t i = 0; i < 200; ++i) s->decode(tokens[i]);
    return s;
  };
  auto max_diff = [&](const float* a, const float* b) {
    double w = 0.0;
    for (int v = 0; v < V; ++v) w = std::max(w, std::fabs(static_cast<double>(a[v]) - b[v]));
    return w;
  };
  for (const char* f : {"f32", "f16", "int8", "kivi4", "kivi2"}) {
    auto s = shifted(f, kv::KeyRope::kPre);
    ASSERT_EQ(s->dropped(), 64) << f;  // [64, 128): half of the 128 tokens after the sink block
    // The fresh cache stores what it is given as is: f32 for KIVI (whose new token stays
    // in full precision), the same format for f16 and int8 (storing their own
    // dequantized rows again gives the same codes).
    const std::string ff = std::string(f).rfind("kivi", 0) == 0 ? "f32" : f;
    SessionOptions fo = options(ff, ff);
    fo.ctx = 192;
    fo.cache.key_rope = kv::KeyRope::kPre;
    Session fresh(m, fo);
    std::vector<float> k(static_cast<size_t>(H) * D), v(k.size());
    for (int l = 0; l < L; ++l) {
      const auto view = s->cache().view(l);
      for (int t = 0; t < view.n_tokens; ++t) {
        for (int h = 0; h < H; ++h) {
          attn::dequantize_key(view.k, t, h, k.data() + static_cast<size_t>(h) * D);
          attn::dequantize_value(view.v, t, h, v.data() + static_cast<size_t>(h) * D);
        }
        fresh.cache().append(l, k.data(), v.data());
      }
    }
    ASSERT_EQ(fresh.pos(), s->pos()) << f;
    // Attention over every layer of the shifted cache equals attention over the fresh
    // one (the kernels read the recycled blocks and the renumbered residual ring).
    std::vector<float> rope(static_cast<size_t>(192) * D);
    model::fill_rope_table(rope.data(), 192, D, m.config().rope_theta);
    ThreadPool pool(2);
    attn::Workspace ws(2, m.config().n_heads, H, D, s->cache().config().block(), 192);
    attn::Workspace wf(2, m.config().n_heads, H, D, fresh.cache().config().block(), 192);
    Rng r(7);
    std::vector<float> q(static_cast<size_t>(m.config().n_heads) * D), oa(q.size()), ob(q.size());
    for (int l = 0; l < L; ++l) {
      for (auto& x : q) x = r.normal();
      attn::Params p;
      p.n_heads = m.config().n_heads;
      p.scale = 1.0f / std::sqrt(static_cast<float>(D));
      p.rope = rope.data();
      attn::decode(s->cache().view(l), q.data(), oa.data(), p, &pool, ws);
      attn::decode(fresh.cache().view(l), q.data(), ob.data(), p, &pool, wf);
      for (size_t i = 0; i < oa.size(); ++i)
        ASSERT_NEAR(oa[i], ob[i], 1e-5 * (1.0 + std::fabs(ob[i]))) << f << " layer " << l;
    }
    // For the formats that round a new token as the fresh cache does, the next token too.
    if (ff == f) {
      const float* ls = s->decode(tokens[200]);
      const std::vector<float> shifted_logits(ls, ls + V);
      const double d = max_diff(shifted_logits.data(), fresh.decode(tokens[200]));
      EXPECT_LT(d, 1e-4) << f;
      std::printf(
          "shift, %s keys before RoPE: next-token logits against the fresh cache differ by %.3g\n",
          f, d);
    }
  }
  // f32 keys after RoPE, re-rotated by the shift, against f32 keys before RoPE.
  auto post = shifted("f32", kv::KeyRope::kPost), pre = shifted("f32", kv::KeyRope::kPre);
  const float* lp = post->decode(tokens[200]);
  const std::vector<float> post_logits(lp, lp + V);
  const double d = max_diff(post_logits.data(), pre->decode(tokens[200]));
  EXPECT_LT(d, 1e-4);
  EXPECT_GT(d, 0.0);  // different arithmetic: the keys were rotated twice
  std::printf("shift, f32 keys after RoPE (re-rotated) against before RoPE: %.3g\n", d);
  // Quantized keys after RoPE cannot move.
  SessionOptions bad = options("kivi2", "kivi2");
  bad.ctx = 192;
  bad.overflow = runtime::ContextOverflow::kShift;
  try {
    Session refused(m, bad);
    ADD_FAILURE() << "kivi2 keys after RoPE with shift were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--key-rope pre"), std::string::npos) << e.what();
  }
}

TEST(Model, GgufConversionGeneratesTheSameTokens) {
  KIVI_REQUIRE_MODEL();
  test::TempDir t;
  const auto r = model::convert_llama2c_to_gguf(test::model_path(), test::tokenizer_path(),
                                                t.file("s.gguf"), false);
  EXPECT_EQ(r.n_tensors, 47);
  const auto g = model::Model::load(t.file("s.gguf"));
  EXPECT_EQ(g->format(), "gguf");
  EXPECT_EQ(g->tokenizer().pieces(), stories().tokenizer().pieces());
  const auto prompt = stories().tokenizer().encode("Once upon a time", true);
  EXPECT_EQ(g->tokenizer().encode("Once upon a time", true), prompt);
  Session a(stories(), options("f32", "f32")), b(*g, options("f32", "f32"));
  EXPECT_EQ(greedy(a, prompt, 200), greedy(b, prompt, 200));
  // F16 weights: a different model numerically; it still loads and runs.
  model::convert_llama2c_to_gguf(test::model_path(), test::tokenizer_path(), t.file("h.gguf"),
                                 true);
  const auto h = model::Model::load(t.file("h.gguf"));
  Session c(*h, options("f32", "f32"));
  const auto out = greedy(c, prompt, 20);
  EXPECT_EQ(out.size(), 20u);
}

// Streaming equivalence: prefilling P tokens then decoding the rest leaves the same
// cache, bit for bit, and the same logits, as feeding every token one at a time.
void expect_same_cache(const kv::KvCache& a, const kv::KvCache& b, const std::string& what) {
  for (int l = 0; l < a.config().n_layers; ++l) {
    for (auto s : {kv::Stream::kKey, kv::Stream::kValue}) {
      const auto ra = a.raw(l, s), rb = b.raw(l, s);
      ASSERT_EQ(ra.n_stored, rb.n_stored) << what;
      ASSERT_EQ(ra.tensor_scale, rb.tensor_scale) << what;
      auto same = [](const auto* x, const auto* y) {
        return x->bytes() == y->bytes() &&
               (x->bytes() == 0 || std::memcmp(x->data(), y->data(), x->bytes()) == 0);
      };
      ASSERT_TRUE(same(ra.codes, rb.codes)) << what << " layer " << l;
      ASSERT_TRUE(same(ra.scales, rb.scales)) << what << " layer " << l;
      ASSERT_TRUE(same(ra.zeros, rb.zeros)) << what << " layer " << l;
      ASSERT_TRUE(same(ra.ring, rb.ring)) << what << " layer " << l;
    }
  }
}

TEST(Model, PrefillThenDecodeEqualsStreamingForEveryFormat) {
  KIVI_REQUIRE_MODEL();
  const auto& m = stories();
  std::string text =
      "Once upon a time, there was a little boy named Tim. Tim had a red kite. He liked to fly "
      "his kite in the big green park near his house. One windy day, Tim ran fast and the kite "
      "went "
      "up high in the sky. It flew over the trees and the pond. Tim laughed and held the string.";
  text += " " + text;
  const auto tokens = m.tokenizer().encode(text, true);
  const int N = static_cast<int>(tokens.size());
  ASSERT_GT(N, 200);
  const int V = m.config().vocab_size;
  struct Cfg {
    std::string k, v;
    int G, R;
    kv::KeyFlush flush;
    kv::ParamType pt;
    kv::Int8Granularity gran;
  };
  std::vector<Cfg> cfgs;
  for (auto f : {kv::KeyFlush::kBatch, kv::KeyFlush::kGroup}) {
    for (auto [G, R] : {std::pair{32, 128}, {32, 0}, {64, 64}, {8, 24}}) {
      cfgs.push_back({"kivi2", "kivi2", G, R, f, kv::ParamType::kF16, kv::Int8Granularity::kHead});
      cfgs.push_back({"kivi4", "kivi4", G, R, f, kv::ParamType::kF32, kv::Int8Granularity::kHead});
    }
    cfgs.push_back({"kivi4", "kivi2", 32, 32, f, kv::ParamType::kF16, kv::Int8Granularity::kHead});
  }
  for (auto g :
       {kv::Int8Granularity::kToken, kv::Int8Granularity::kHead, kv::Int8Granularity::kGroup}) {
    cfgs.push_back({"int8", "int8", 8, 0, kv::KeyFlush::kBatch, kv::ParamType::kF16, g});
  }
  cfgs.push_back(
      {"f32", "f32", 32, 0, kv::KeyFlush::kBatch, kv::ParamType::kF16, kv::Int8Granularity::kHead});
  cfgs.push_back(
      {"f16", "f16", 32, 0, kv::KeyFlush::kBatch, kv::ParamType::kF16, kv::Int8Granularity::kHead});
  cfgs.push_back({"kivi8", "f16", 32, 32, kv::KeyFlush::kGroup, kv::ParamType::kF16,
                  kv::Int8Granularity::kHead});
  for (const auto& c : cfgs) {
    const std::string what = c.k + "/" + c.v + " G=" + std::to_string(c.G) +
                             " R=" + std::to_string(c.R) + " " + kv::key_flush_name(c.flush) + " " +
                             kv::granularity_name(c.gran);
    Session stream(m, options(c.k, c.v, c.G, c.R, c.flush, c.pt, c.gran));
    std::vector<float> ls(static_cast<size_t>(N) * V);
    for (int i = 0; i < N; ++i)
      std::memcpy(&ls[static_cast<size_t>(i) * V], stream.decode(tokens[i]), V * 4);
    for (int P : {1, 2, 7, 31, 32, 33, 63, 64, 65, 127, 128, 129, 200, N}) {
      Session s(m, options(c.k, c.v, c.G, c.R, c.flush, c.pt, c.gran));
      std::vector<float> lp(static_cast<size_t>(N) * V);
      s.prefill(std::vector<int>(tokens.begin(), tokens.begin() + P), lp.data());
      for (int i = P; i < N; ++i)
        std::memcpy(&lp[static_cast<size_t>(i) * V], s.decode(tokens[i]), V * 4);
      expect_same_cache(s.cache(), stream.cache(), what + " P=" + std::to_string(P));
      ASSERT_EQ(std::memcmp(lp.data(), ls.data(), ls.size() * 4), 0) << what << " P=" << P;
    }
  }
}

// int8 with a per-tensor scale: the scale comes from the first prefill, so the
// invariant holds for the same first batch, whatever happens after it.
TEST(Model, Int8TensorEquivalenceGivenTheSameFirstBatch) {
  KIVI_REQUIRE_MODEL();
  const auto& m = stories();
  const auto tokens = m.tokenizer().encode(
      "Tim had a red kite. He liked to fly his kite in the big green park.", true);
  auto o = options("int8", "int8", 8, 0, kv::KeyFlush::kBatch, kv::ParamType::kF16,
                   kv::Int8Granularity::kTensor);
  Session a(m, o), b(m, o);
  const int P = 6;
  a.prefill(std::vector<int>(tokens.begin(), tokens.begin() + P));
  b.prefill(std::vector<int>(tokens.begin(), tokens.begin() + P));
  a.prefill(std::vector<int>(tokens.begin() + P, tokens.end()));
  for (size_t i = P; i < tokens.size(); ++i) b.decode(tokens[i]);
  expect_same_cache(a.cache(), b.cache(), "int8/tensor");
}

runtime::SamplerOptions sampler_options(float temp, int top_k, float top_p, uint64_t seed) {
  runtime::SamplerOptions o;
  o.temperature = temp;
  o.top_k = top_k;
  o.top_p = top_p;
  o.seed = seed;
  return o;
}

TEST(Model, DecodeMakesNoHeapAllocations) {
  KIVI_REQUIRE_MODEL();
  const auto& m = stories();
  for (const char* f : {"f32", "f16", "int8", "kivi4", "kivi2"}) {
    Session s(m, options(f, f));
    runtime::Sampler sampler(sampler_options(0.8f, 40, 0.95f, 1), m.config().vocab_size);
    const float* logits = s.prefill(m.tokenizer().encode("Once upon a time", true));
    for (int i = 0; i < 5; ++i) logits = s.decode(sampler.sample(logits));  // warm up
    g_allocs = 0;
    g_count_allocs = true;
    for (int i = 0; i < 200; ++i) logits = s.decode(sampler.sample(logits));
    g_count_allocs = false;
    EXPECT_EQ(g_allocs.load(), 0) << f;
  }
}

TEST(Sampler, SeededSamplingIsReproducible) {
  KIVI_REQUIRE_MODEL();
  const auto& m = stories();
  auto run = [&](uint64_t seed, float temp, int top_k, float top_p) {
    Session s(m, options("f32", "f32"));
    runtime::Sampler sampler(sampler_options(temp, top_k, top_p, seed), m.config().vocab_size);
    std::vector<int> out;
    const float* logits = s.prefill(m.tokenizer().encode("Once upon a time", true));
    for (int i = 0; i < 60; ++i) {
      out.push_back(sampler.sample(logits));
      logits = s.decode(out.back());
    }
    return out;
  };
  EXPECT_EQ(run(7, 1.0f, 0, 1.0f), run(7, 1.0f, 0, 1.0f));
  EXPECT_NE(run(7, 1.0f, 0, 1.0f), run(8, 1.0f, 0, 1.0f));
  EXPECT_EQ(run(7, 0.9f, 20, 0.9f), run(7, 0.9f, 20, 0.9f));
  // top-k 1 is greedy whatever the temperature and seed.
  Session g(m, options("f32", "f32"));
  const auto prompt = m.tokenizer().encode("Once upon a time", true);
  EXPECT_EQ(run(3, 1.5f, 1, 1.0f), greedy(g, prompt, 60));
}

TEST(Sampler, TopKAndTopPRestrictTheChoice) {
  std::vector<float> logits = {1.0f, 5.0f, 4.9f, -3.0f, 0.0f};
  for (uint64_t seed = 0; seed < 200; ++seed) {
    runtime::Sampler k2(sampler_options(1.0f, 2, 1.0f, seed), 5);
    const int t = k2.sample(logits.data());
    ASSERT_TRUE(t == 1 || t == 2);
    runtime::Sampler p(sampler_options(1.0f, 0, 0.5f, seed), 5);
    ASSERT_EQ(p.sample(logits.data()), 1);  // token 1 alone holds >= 50%
  }
  EXPECT_THROW(runtime::Sampler(sampler_options(-1.0f, 0, 1.0f, 0), 5), Error);
  EXPECT_THROW(runtime::Sampler(sampler_options(1.0f, 0, 0.0f, 0), 5), Error);
}

// min-p keeps the tokens of at least P times the top probability. With logits {0, ln 4,
// ln 2, ln 1.5, -inf-ish} the probabilities are proportional to 1, 4, 2, 1.5: min_p 0.4
// keeps 4 and 2 (>= 1.6), 0.3 adds 1.5 (>= 1.2) but not 1; 0.6 keeps 4 alone.
TEST(Sampler, MinPKeepsTokensNearTheTop) {
  const std::vector<float> logits = {0.0f, std::log(4.0f), std::log(2.0f), std::log(1.5f), -30.0f};
  auto seen = [&](float min_p) {
    std::vector<int> count(5);
    for (uint64_t seed = 0; seed < 400; ++seed) {
      auto o = sampler_options(1.0f, 0, 1.0f, seed);
      o.min_p = min_p;
      runtime::Sampler s(o, 5);
      ++count[s.sample(logits.data())];
    }
    return count;
  };
  auto c = seen(0.4f);
  EXPECT_EQ(c[0] + c[3] + c[4], 0);
  EXPECT_GT(c[1], c[2]);
  EXPECT_GT(c[2], 0);
  c = seen(0.3f);
  EXPECT_EQ(c[0] + c[4], 0);
  EXPECT_GT(c[3], 0);
  c = seen(0.6f);
  EXPECT_EQ(c[1], 400);
  auto bad = sampler_options(1.0f, 0, 1.0f, 0);
  bad.min_p = 1.5f;
  EXPECT_THROW(runtime::Sampler(bad, 5), Error);
}

// Logit bias, repeat, presence and frequency penalties, each against logits worked out by
// hand: greedy choices show which adjusted logit leads.
TEST(Sampler, BiasAndPenaltiesAdjustTheLogits) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.5f, -1.0f, 0.5f};
  auto greedy = [&](const runtime::SamplerOptions& o, const std::vector<int>& prompt,
                    const std::vector<int>& gen) {
    runtime::Sampler s(o, 5);
    s.observe_prompt(prompt);
    for (int t : gen) s.accept(t);
    return s.sample(logits.data());
  };
  auto o = sampler_options(0.0f, 0, 1.0f, 0);
  EXPECT_EQ(greedy(o, {}, {}), 1);
  // Bias: token 3 from -1 to 4.5 leads; -100 on token 1 leaves 2 (2.5) ahead.
  o.logit_bias = {{3, 5.5f}};
  EXPECT_EQ(greedy(o, {}, {}), 3);
  o.logit_bias = {{1, -100.0f}};
  EXPECT_EQ(greedy(o, {}, {}), 2);
  // Repeat penalty 1.5 on token 1 (in the prompt's window): 3 / 1.5 = 2 < 2.5, so 2 leads;
  // with a window of 1 token that is not token 1, token 1 keeps 3.
  o = sampler_options(0.0f, 0, 1.0f, 0);
  o.repeat_penalty = 1.5f;
  EXPECT_EQ(greedy(o, {1, 4}, {}), 2);
  o.repeat_last_n = 1;
  EXPECT_EQ(greedy(o, {1, 4}, {}), 1);
  // A negative logit is multiplied: token 3 at -1 * 1.5 stays last; token 2 at 2.5 / 1.5 =
  // 1.67 and token 1 at 2: token 1 leads when both are penalized.
  o.repeat_last_n = 64;
  EXPECT_EQ(greedy(o, {1, 2, 3}, {}), 1);
  // Presence 0.4 on generated token 1 (3 - 0.4 = 2.6 > 2.5) keeps it; frequency 0.3 over
  // two occurrences (3 - 0.6 = 2.4) hands the lead to token 2.
  o = sampler_options(0.0f, 0, 1.0f, 0);
  o.presence_penalty = 0.4f;
  EXPECT_EQ(greedy(o, {}, {1, 1}), 1);
  o.presence_penalty = 0.0f;
  o.frequency_penalty = 0.3f;
  EXPECT_EQ(greedy(o, {}, {1, 1}), 2);
  EXPECT_EQ(greedy(o, {}, {1}), 1);  // 2.7 > 2.5
  // The prompt does not count for presence or frequency (OpenAI's rule).
  EXPECT_EQ(greedy(o, {1, 1, 1}, {}), 1);
  // Out of range, or a biased token outside the vocabulary: errors naming the option.
  o = sampler_options(0.0f, 0, 1.0f, 0);
  o.logit_bias = {{7, 1.0f}};
  EXPECT_THROW(runtime::Sampler(o, 5), Error);
  o.logit_bias = {{1, 101.0f}};
  EXPECT_THROW(runtime::Sampler(o, 5), Error);
  o = sampler_options(0.0f, 0, 1.0f, 0);
  o.frequency_penalty = 2.5f;
  EXPECT_THROW(runtime::Sampler(o, 5), Error);
  o.frequency_penalty = 0.0f;
  o.repeat_penalty = 0.0f;
  EXPECT_THROW(runtime::Sampler(o, 5), Error);
  EXPECT_EQ(runtime::parse_logit_bias("15:-100,3:2.5"),
            (std::vector<std::pair<int, float>>{{15, -100.0f}, {3, 2.5f}}));
  for (const char* bad : {"", "15", ":3", "x:1", "3:", "3:1,", "-2:1", "3:1x"})
    EXPECT_THROW(runtime::parse_logit_bias(bad), Error) << bad;
}

}  // namespace
}  // namespace kivi
