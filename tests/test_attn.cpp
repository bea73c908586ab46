// Decode attention over every cache format against the double-precision reference
// (dequantize with the codec, then attend), on every SIMD target.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "attn/attention.h"
#include "attn/task.h"
#include "core/cpu.h"
#include "core/rng.h"
#include "core/threadpool.h"
#include "kv/kv_cache.h"
#include "test_util.h"

namespace kivi {
namespace {

using kv::Format;
using kv::Int8Granularity;
using test::all_formats;
using test::FormatCase;
using test::rel_error;

struct Shape {
  const char* name;
  int n_heads, n_kv_heads;
};
const Shape kShapes[] = {{"MHA", 4, 4}, {"GQA 4:1", 8, 2}, {"MQA", 8, 1}};

// Fills a cache with n tokens of random keys/values (a few outlier channels, as
// real keys have) and returns it.
std::unique_ptr<kv::KvCache> filled_cache(const FormatCase& c, int Hkv, int D, int n, int G, int R,
                                          uint64_t seed) {
  kv::CacheConfig cfg;
  cfg.n_layers = 1;
  cfg.n_kv_heads = Hkv;
  cfg.head_dim = D;
  cfg.ctx = std::max(n, G);
  cfg.k = c.k;
  cfg.rotate = c.rotate;
  cfg.v = c.v;
  cfg.group_size = G;
  cfg.residual = R;
  auto cache = std::make_unique<kv::KvCache>(cfg);
  Rng r(seed);
  std::vector<float> k(Hkv * D), v(Hkv * D);
  for (int t = 0; t < n; ++t) {
    for (int i = 0; i < Hkv * D; ++i) {
      k[i] = r.normal() * ((i % D) % 13 == 1 ? 8.0f : 1.0f);
      v[i] = r.normal();
    }
    if (t == 0) cache->calibrate(0, k.data(), v.data(), 1);
    cache->append(0, k.data(), v.data());
  }
  return cache;
}

// Attention over shape s with head size D and the usual 1/sqrt(D) scale; ALiBi when slopes is set.
attn::Params params_for(const Shape& s, int D, const float* slopes) {
  attn::Params p;
  p.n_heads = s.n_heads;
  p.scale = 1.0f / std::sqrt(static_cast<float>(D));
  p.alibi_slopes = slopes;
  return p;
}

// Largest relative error check() has seen (printed by the tests that use it).
double g_worst_exact = 0.0;

void check(const FormatCase& c, const Shape& s, int D, int n, int G, int R, bool alibi, int window,
           ThreadPool* pool, const std::string& target) {
  auto cache = filled_cache(c, s.n_kv_heads, D, n, G, R, n * 7 + D);
  Rng r(n);
  std::vector<float> q(s.n_heads * D), out(q.size()), ref(q.size());
  for (auto& x : q) x = r.normal();
  const auto slopes = attn::alibi_slopes(s.n_heads);
  attn::Params p = params_for(s, D, alibi ? slopes.data() : nullptr);
  p.window = window;
  attn::Workspace ws(pool ? pool->size() : 1, s.n_heads, s.n_kv_heads, D, cache->config().block(),
                     cache->capacity());
  const auto view = cache->view(0);
  attn::decode(view, q.data(), out.data(), p, pool, ws);
  attn::decode_reference(view, q.data(), ref.data(), p);
  const double e = rel_error(out, ref);
  g_worst_exact = std::max(g_worst_exact, e);
  EXPECT_LT(e, 1e-5) << target << " " << c.name << " " << s.name << " D=" << D << " n=" << n
                     << " G=" << G << " R=" << R << (alibi ? " alibi" : "") << " window=" << window;
}

TEST(Attention, EveryFormatShapeAndLengthOnEveryTarget) {
  const int D = 64, G = 32, R = 64;
  ThreadPool pool(2);
  for (const auto& target : test::simd_targets()) {
    cpu::force_target_bits(target.bits);
    for (const auto& c : all_formats()) {
      for (const auto& s : kShapes) {
        for (int n : {1, G - 1, G, R, R + 1, 1000}) {
          for (bool alibi : {false, true}) check(c, s, D, n, G, R, alibi, 0, &pool, target.name);
        }
      }
    }
  }
  cpu::reset_target();
  std::printf("worst exact-path relative error so far: %.3g (bound 1e-05)\n", g_worst_exact);
}

TEST(Attention, LongContextsAndWindows) {
  ThreadPool pool(2);
  for (const auto& c : all_formats()) {
    check(c, kShapes[1], 128, 5000, 32, 128, false, 0, &pool, "best");
    check(c, kShapes[2], 128, 5000, 32, 128, true, 0, &pool, "best");
    check(c, kShapes[1], 64, 1500, 32, 128, false, 700, &pool, "best");
  }
  std::printf("worst exact-path relative error so far: %.3g (bound 1e-05)\n", g_worst_exact);
}

TEST(Attention, SmallHeadsAndOddGroups) {
  // stories260K has head_dim 8; G larger than head_dim caps value groups at head_dim.
  ThreadPool pool(1);
  for (const auto& c : all_formats()) {
    for (int n : {1, 7, 8, 33, 300}) {
      check(c, kShapes[1], 8, n, 32, 32, false, 0, &pool, "best");
      check(c, kShapes[0], 16, n, 8, 0, true, 0, &pool, "best");
    }
  }
}

// The KIVI key group kernels (AVX2/AVX3) take G tokens per pass, 2 vectors at a time:
// groups of 16 (256-bit vectors on AVX3 too), 64 and 128, window starts inside a group
// (a partial first group), and every head grouping, on every target; exact path within
// the reference bound, fast path within its own.
TEST(Attention, KiviKeyGroupSizesAndWindows) {
  ThreadPool pool(2);
  const auto formats = all_formats();
  double worst_fast = 0.0;
  for (const auto& target : test::simd_targets()) {
    cpu::force_target_bits(target.bits);
    for (const auto& c : formats) {
      if (!kv::is_kivi(c.k.format)) continue;
      for (int G : {16, 64, 128}) {
        for (const auto& s : kShapes) {
          for (int D : {32, 128}) {
            for (int window : {0, 301}) {
              check(c, s, D, 700, G, G, window == 0, window, &pool, target.name);
              auto cache = filled_cache(c, s.n_kv_heads, D, 700, G, G, 7 + G);
              Rng r(G + D);
              std::vector<float> q(s.n_heads * D), out(q.size()), ref(q.size());
              for (auto& x : q) x = r.normal();
              attn::Params p = params_for(s, D, nullptr);
              p.window = window;
              p.precision = attn::Precision::kFast;
              attn::Workspace ws(2, s.n_heads, s.n_kv_heads, D, cache->config().block(),
                                 cache->capacity());
              attn::decode(cache->view(0), q.data(), out.data(), p, &pool, ws);
              attn::decode_reference(cache->view(0), q.data(), ref.data(), p);
              const double e = rel_error(out, ref);
              worst_fast = std::max(worst_fast, e);
              EXPECT_LT(e, 2e-3) << target.name << " fast " << c.name << " " << s.name << " D=" << D
                                 << " G=" << G << " window=" << window;
            }
          }
        }
      }
    }
  }
  cpu::reset_target();
  std::printf(
      "worst exact-path relative error so far: %.3g (bound 1e-05); fast path here: %.3g (bound "
      "2e-3)\n",
      g_worst_exact, worst_fast);
}

TEST(Attention, ResultDoesNotDependOnThreadCount) {
  for (const auto& c : all_formats()) {
    auto cache = filled_cache(c, 2, 64, 3000, 32, 128, 1);
    std::vector<float> q(8 * 64), a(q.size()), b(q.size());
    Rng r(3);
    for (auto& x : q) x = r.normal();
    attn::Params p;
    p.n_heads = 8;
    p.scale = 0.125f;
    ThreadPool p1(1), p3(3);
    attn::Workspace w1(1, 8, 2, 64, cache->config().block(), 3000),
        w3(3, 8, 2, 64, cache->config().block(), 3000);
    attn::decode(cache->view(0), q.data(), a.data(), p, &p1, w1);
    attn::decode(cache->view(0), q.data(), b.data(), p, &p3, w3);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << c.name;
  }
}

// On AVX3 the exact path's scores and KIVI values run on 512-bit vectors. The 512-bit
// KIVI value kernel does the 256-bit kernel's products per output channel in the same
// order, so the two give the same bits; the scores are summed in another order, so
// both widths are held to the reference's bound. Runs only where the CPU has AVX3 (the
// general tests cover the 512-bit kernels there and the 256-bit ones on AVX2).
TEST(Attention, WideAndNarrowExactKernelsOnAvx3) {
  int64_t avx3 = 0;
  for (const auto& t : test::simd_targets())
    if (t.name == "AVX3") avx3 = t.bits;
  if (avx3 == 0) GTEST_SKIP() << "needs a CPU with AVX-512 (AVX3)";
  cpu::force_target_bits(avx3);
  ThreadPool pool(2);
  int compared = 0;
  for (const auto& c : all_formats()) {
    for (int D : {64, 128}) {
      for (int n : {31, 200, 1000}) {
        auto cache = filled_cache(c, 2, D, n, 32, n == 200 ? 0 : 128, n + D);
        std::vector<float> q(8 * D), wide(q.size()), narrow_v(q.size()), narrow(q.size()),
            ref(q.size());
        Rng r(n + 11);
        for (auto& x : q) x = r.normal();
        const auto slopes = attn::alibi_slopes(8);
        attn::Params p = params_for(kShapes[1], D, n == 1000 ? slopes.data() : nullptr);
        attn::Workspace ws(2, 8, 2, D, cache->config().block(), cache->capacity());
        attn::decode(cache->view(0), q.data(), wide.data(), p, &pool, ws);
        attn::set_wide_exact_kernels(true, false);
        attn::decode(cache->view(0), q.data(), narrow_v.data(), p, &pool, ws);
        attn::set_wide_exact_kernels(false, false);
        attn::decode(cache->view(0), q.data(), narrow.data(), p, &pool, ws);
        attn::set_wide_exact_kernels(true, true);
        const std::string what = c.name + " D=" + std::to_string(D) + " n=" + std::to_string(n);
        EXPECT_EQ(std::memcmp(wide.data(), narrow_v.data(), wide.size() * 4), 0) << what;
        attn::decode_reference(cache->view(0), q.data(), ref.data(), p);
        EXPECT_LT(rel_error(wide, ref), 1e-5) << what;
        EXPECT_LT(rel_error(narrow, ref), 1e-5) << what;
        ++compared;
      }
    }
  }
  cpu::reset_target();
  EXPECT_EQ(compared, static_cast<int>(all_formats().size()) * 2 * 3);
}

TEST(Attention, ChunkLengthFollowsContextAndHeads) {
  for (int block : {1, 32, 128, 256, 3000}) {
    const int lo = attn::min_chunk_tokens(block), hi = attn::chunk_tokens(block);
    EXPECT_EQ(lo % block, 0);
    EXPECT_EQ(hi % block, 0);
    EXPECT_GE(lo, 512);
    EXPECT_GE(hi, 2048);
    for (int heads : {1, 2, 8, 32}) {
      for (int range : {1, 100, 4096, 16384, 65536, 1 << 20}) {
        const int C = attn::chunk_tokens_for(block, heads, range);
        EXPECT_EQ(C % block, 0);
        EXPECT_GE(C, lo);
        EXPECT_LE(C, hi);
        // Shorter than the longest only when the longest would give fewer than 32 tasks.
        if (C < hi) {
          EXPECT_LT(static_cast<long>(heads) * ((range + 2 * C - 1) / (2 * C)), 32);
        }
      }
    }
  }
  // 8 KV heads at 64K: the longest chunks; at 2K: the shortest.
  EXPECT_EQ(attn::chunk_tokens_for(32, 8, 65536), 2048);
  EXPECT_EQ(attn::chunk_tokens_for(32, 8, 2048), 512);
  EXPECT_EQ(attn::chunk_tokens_for(32, 8, 4096), 1024);
}

TEST(Attention, MergeOfSplitStatesEqualsOnePass) {
  // (m, d, o) states of two halves merge into the state of the whole.
  const int D = 4;
  std::vector<float> s = {0.5f, -1.0f, 2.0f, 0.0f, 1.5f};
  std::vector<std::vector<float>> v = {
      {1, 2, 3, 4}, {0, 1, 0, 1}, {2, 2, 2, 2}, {-1, 0, 1, 0}, {3, 1, 4, 1}};
  auto state = [&](int a, int b, std::vector<float>& o) {
    float m = -INFINITY, d = 0;
    for (int i = a; i < b; ++i) m = std::max(m, s[i]);
    o.assign(D, 0.0f);
    for (int i = a; i < b; ++i) {
      const float w = std::exp(s[i] - m);
      d += w;
      for (int j = 0; j < D; ++j) o[j] += w * v[i][j];
    }
    return attn::State{m, d, o.data()};
  };
  std::vector<float> o1, o2, oa;
  attn::State a = state(0, 2, o1);
  const attn::State b = state(2, 5, o2);
  const attn::State all = state(0, 5, oa);
  attn::merge(a, b, D);
  EXPECT_FLOAT_EQ(a.m, all.m);
  EXPECT_NEAR(a.d, all.d, 1e-6);
  for (int j = 0; j < D; ++j) EXPECT_NEAR(o1[j], oa[j], 1e-5);
}

TEST(Attention, AlibiSlopes) {
  const auto s8 = attn::alibi_slopes(8);
  EXPECT_FLOAT_EQ(s8[0], 0.5f);
  EXPECT_FLOAT_EQ(s8[7], 1.0f / 256);
  const auto s12 = attn::alibi_slopes(12);
  EXPECT_FLOAT_EQ(s12[8], std::pow(2.0f, -0.5f));  // interleaved extension
}

TEST(Attention, ExpOfNonPositive) {
  // The softmax's vector exp against a double exp: within 3 ulp (relative 3 x 2^-23)
  // where e^x is a normal float, 0 below -87.3 and for -inf.
  std::vector<float> x;
  for (int i = 0; i <= 400000; ++i) x.push_back(-87.0f * static_cast<float>(i) / 400000.0f);
  for (float v : {-0.0f, -1e-30f, -1e-7f, -0.34657359f, -0.34657362f, -0.6931472f, -1.0f, -86.99f})
    x.push_back(v);
  const size_t n_normal = x.size();
  for (float v : {-87.31f, -88.0f, -100.0f, -1e30f, -std::numeric_limits<float>::infinity()})
    x.push_back(v);
  for (const auto& target : test::simd_targets()) {
    cpu::force_target_bits(target.bits);
    // Every length up to 20 covers the vector tail of every width.
    for (int len = 1; len <= 20; ++len) {
      std::vector<float> y(len, -1.0f);
      attn::exp_nonpositive(x.data() + 1000, y.data(), len);
      for (int i = 0; i < len; ++i) EXPECT_GT(y[i], 0.0f) << target.name << " len=" << len;
    }
    std::vector<float> y(x.size(), -1.0f);
    attn::exp_nonpositive(x.data(), y.data(), static_cast<int>(x.size()));
    double worst = 0.0;
    for (size_t i = 0; i < n_normal; ++i) {
      const double ref = std::exp(static_cast<double>(x[i]));
      worst = std::max(worst, std::abs(y[i] - ref) / ref);
    }
    EXPECT_LT(worst, 3.0 * 0x1p-23) << target.name;
    std::printf("%s: worst relative error of the softmax exp: %.3g (%.2f ulp)\n",
                target.name.c_str(), worst, worst / 0x1p-23);
    for (size_t i = n_normal; i < x.size(); ++i)
      EXPECT_EQ(y[i], 0.0f) << target.name << " x=" << x[i];
  }
  cpu::reset_target();
}

}  // namespace
}  // namespace kivi

namespace kivi {
namespace {

// The fast path rounds the query (keys) and the weights (values) to 16 bits; its output
// stays within a stated relative error of dequantize-then-attend (docs/KERNELS.md), and
// formats it does not apply to (f32, f16, int8/group, small heads) give the exact bits.
double fast_error(const FormatCase& c, const Shape& s, int D, int n, bool alibi, int window = 0) {
  auto cache = filled_cache(c, s.n_kv_heads, D, n, 32, 128, n * 3 + 1);
  Rng r(n + 5);
  std::vector<float> q(s.n_heads * D), out(q.size()), ref(q.size()), exact(q.size());
  for (auto& x : q) x = r.normal();
  const auto slopes = attn::alibi_slopes(s.n_heads);
  attn::Params p = params_for(s, D, alibi ? slopes.data() : nullptr);
  p.window = window;  // a window start off the group and quad boundaries: partial groups and quads
  ThreadPool pool(2);
  attn::Workspace ws(2, s.n_heads, s.n_kv_heads, D, cache->config().block(), cache->capacity());
  const auto view = cache->view(0);
  attn::decode_reference(view, q.data(), ref.data(), p);
  attn::decode(view, q.data(), exact.data(), p, &pool, ws);
  p.precision = attn::Precision::kFast;
  attn::decode(view, q.data(), out.data(), p, &pool, ws);
  auto plain = [](const kv::StreamFormat& f) {
    return f.format == Format::kF32 || f.format == Format::kF16 ||
           (f.format == Format::kInt8 && f.granularity == Int8Granularity::kGroup);
  };
  // D < 16 (the callers' n leave every KIVI token in the residual): no integer kernel applies.
  if ((plain(c.k) && plain(c.v)) || D < 16) {
    EXPECT_EQ(std::memcmp(out.data(), exact.data(), out.size() * 4), 0) << c.name << " D=" << D;
  }
  return rel_error(out, ref);
}

// The longest caches of the fast-path tests: under the sanitizers (whose scalar reference
// takes most of the suite's time) a third as long, with the same partial blocks and tails.
#ifdef KIVI_SANITIZE
constexpr int kLongN = 1000;
#else
constexpr int kLongN = 3000;
#endif

TEST(Attention, FastPathErrorBound) {
  // Measured worst case on these inputs: 7.0e-4 (docs/KERNELS.md); the bound leaves ~3x.
  const double kBound = 2e-3;
  double worst = 0.0;
  for (const auto& target : test::simd_targets()) {
    cpu::force_target_bits(target.bits);
    for (const auto& c : all_formats()) {
      for (const auto& s : kShapes) {
        for (int n : {1, 31, 200, kLongN}) {
          const double e = fast_error(c, s, 128, n, n % 2 == 1);
          worst = std::max(worst, e);
          EXPECT_LT(e, kBound) << target.name << " " << c.name << " " << s.name << " n=" << n;
        }
        for (int window : {0, 333}) {
          const double e = fast_error(c, s, 64, 500, false, window);
          worst = std::max(worst, e);
          EXPECT_LT(e, kBound) << target.name << " " << c.name << " D=64 window=" << window;
        }
        const double ew = fast_error(c, s, 128, 1000, true, 555);
        worst = std::max(worst, ew);
        EXPECT_LT(ew, kBound) << target.name << " " << c.name << " D=128 window=555";
        // Head sizes whose code rows are 16-byte multiples but not 32 (two rows per
        // vector on AVX2) or whose query blocks end in a half block.
        for (int D : {16, 32, 96}) {
          const double e = fast_error(c, s, D, 200, false);
          worst = std::max(worst, e);
          EXPECT_LT(e, kBound) << target.name << " " << c.name << " D=" << D;
        }
        fast_error(c, s, 8, 100, false);  // too small for the integer kernels: exact bits
      }
    }
  }
  cpu::reset_target();
  std::printf("worst fast-path relative error: %.3g (bound %.3g)\n", worst, kBound);
}

// Keys stored before RoPE: attention rotates each stored or residual key by its
// position before the dot products. Against the reference (dequantize, rotate in
// double, attend) for every format, shape and target, on the exact path within its
// bound and on the fast path (whose value kernels still apply) within its own.
TEST(Attention, KeysBeforeRopeOnEveryTarget) {
  ThreadPool pool(2);
  double worst = 0.0;
  for (const auto& target : test::simd_targets()) {
    cpu::force_target_bits(target.bits);
    for (const auto& c : all_formats()) {
      for (const auto& s : kShapes) {
        for (int D : {16, 64}) {
          for (int n : {1, 37, 300, 1100}) {
            std::vector<float> rope(static_cast<size_t>(n) * D);
            for (int t = 0; t < n; ++t) {
              for (int i = 0; i < D / 2; ++i) {  // RoPE angles t theta^(-2i/D), theta = 10000
                const double a = t * std::pow(10000.0, -2.0 * i / D);
                rope[static_cast<size_t>(t) * D + 2 * i] = static_cast<float>(std::cos(a));
                rope[static_cast<size_t>(t) * D + 2 * i + 1] = static_cast<float>(std::sin(a));
              }
            }
            for (auto style : {attn::RopeStyle::kAdjacent, attn::RopeStyle::kNeox}) {
              auto cache = filled_cache(c, s.n_kv_heads, D, n, 32, 64, n + D);
              Rng r(n + 3);
              std::vector<float> q(s.n_heads * D), out(q.size()), ref(q.size());
              for (auto& x : q) x = r.normal();
              attn::Params p = params_for(s, D, nullptr);
              p.rope = rope.data();
              p.rope_style = style;
              p.window = n == 1100 ? 700 : 0;
              attn::Workspace ws(2, s.n_heads, s.n_kv_heads, D, cache->config().block(),
                                 cache->capacity());
              attn::decode_reference(cache->view(0), q.data(), ref.data(), p);
              attn::decode(cache->view(0), q.data(), out.data(), p, &pool, ws);
              const double e = rel_error(out, ref);
              worst = std::max(worst, e);
              const std::string what = target.name + " " + c.name + " " + s.name +
                                       " D=" + std::to_string(D) + " n=" + std::to_string(n) +
                                       (style == attn::RopeStyle::kNeox ? " neox" : "");
              EXPECT_LT(e, 1e-5) << what;
              p.precision = attn::Precision::kFast;
              attn::decode(cache->view(0), q.data(), out.data(), p, &pool, ws);
              EXPECT_LT(rel_error(out, ref), 2e-3) << "fast " << what;
            }
          }
        }
      }
    }
  }
  cpu::reset_target();
  std::printf("keys before RoPE: worst exact-path relative error %.3g (bound 1e-05)\n", worst);
}

// Attention sinks (StreamingLLM): with a window, the first `sinks` tokens are attended
// too, as one more task merged first; against the reference on every format and target.
TEST(Attention, SinksBeforeTheWindow) {
  ThreadPool pool(2);
  for (const auto& target : test::simd_targets()) {
    cpu::force_target_bits(target.bits);
    for (const auto& c : all_formats()) {
      for (int sinks : {1, 4, 40}) {
        auto cache = filled_cache(c, 2, 64, 1500, 32, 64, sinks + 3);
        Rng r(sinks);
        std::vector<float> q(8 * 64), out(q.size()), ref(q.size()), no_sinks(q.size());
        for (auto& x : q) x = r.normal() * 3.0f;
        attn::Params p = params_for(kShapes[1], 64, nullptr);
        p.window = 600;
        attn::Workspace ws(2, 8, 2, 64, cache->config().block(), cache->capacity());
        attn::decode(cache->view(0), q.data(), no_sinks.data(), p, &pool, ws);
        p.sinks = sinks;
        attn::decode(cache->view(0), q.data(), out.data(), p, &pool, ws);
        attn::decode_reference(cache->view(0), q.data(), ref.data(), p);
        const std::string what = target.name + " " + c.name + " sinks=" + std::to_string(sinks);
        EXPECT_LT(rel_error(out, ref), 1e-5) << what;
        EXPECT_GT(rel_error(no_sinks, ref), 1e-6) << what << ": the sinks changed nothing";
      }
    }
  }
  cpu::reset_target();
}

// Learned sink logits (gpt-oss): each head's output is the sinkless one times d / (d +
// exp(sink - m)), with m, d the head's softmax state; a very negative sink changes
// nothing and a dominant one drives the output to zero. Every format and target, against
// the double reference, and through a window with StreamingLLM sinks too.
TEST(Attention, HeadSinksJoinTheDenominator) {
  ThreadPool pool(2);
  const int H = 8, Hkv = 2, D = 64;
  const std::vector<float> head_sinks = {-3.0f, 0.0f, 1.5f, 3.0f, -1e30f, 6.0f, 0.5f, 40.0f};
  for (const auto& target : test::simd_targets()) {
    cpu::force_target_bits(target.bits);
    for (const auto& c : all_formats()) {
      for (int window : {0, 300}) {
        auto cache = filled_cache(c, Hkv, D, 700, 32, 64, 11 + window);
        Rng r(5 + window);
        std::vector<float> q(H * D), out(q.size()), ref(q.size()), plain(q.size());
        std::vector<float> states(static_cast<size_t>(H) * (D + 2));
        for (auto& x : q) x = r.normal();
        attn::Params p = params_for(kShapes[1], D, nullptr);
        p.window = window;
        p.sinks = window > 0 ? 4 : 0;
        attn::Workspace ws(2, H, Hkv, D, cache->config().block(), cache->capacity());
        const auto view = cache->view(0);
        attn::decode(view, q.data(), plain.data(), p, &pool, ws);
        attn::decode_state(view, q.data(), states.data(), p, &pool, ws);
        p.head_sinks = head_sinks.data();
        attn::decode(view, q.data(), out.data(), p, &pool, ws);
        attn::decode_reference(view, q.data(), ref.data(), p);
        const std::string what = target.name + " " + c.name + " window=" + std::to_string(window);
        EXPECT_LT(rel_error(out, ref), 1e-5) << what;
        for (int h = 0; h < H; ++h) {
          const float m = states[h * (D + 2) + D], d = states[h * (D + 2) + D + 1];
          const double keep = d / (d + std::exp(static_cast<double>(head_sinks[h]) - m));
          for (int i = 0; i < D; ++i) {
            EXPECT_NEAR(out[h * D + i], plain[h * D + i] * keep,
                        1e-5 * (1.0 + std::fabs(plain[h * D + i])))
                << what << " head " << h;
          }
        }
        EXPECT_EQ(std::memcmp(&out[4 * D], &plain[4 * D], D * sizeof(float)), 0) << what;
        for (int i = 0; i < D; ++i) EXPECT_LT(std::fabs(out[7 * D + i]), 1e-9f) << what;
      }
    }
  }
  cpu::reset_target();
}

// On a CPU with AVX512-VNNI the AVX3 fast path uses vpdpwssd; CPUs with AVX-512 but
// without VNNI run the vpmaddwd sequence instead. Forcing that variant here runs it on
// a VNNI machine too, against the same bound. Runs only where the CPU has AVX3.
TEST(Attention, FastPathWithoutVnniOnAvx3) {
  int64_t avx3 = 0;
  for (const auto& t : test::simd_targets())
    if (t.name == "AVX3") avx3 = t.bits;
  if (avx3 == 0) GTEST_SKIP() << "needs a CPU with AVX-512 (AVX3)";
  cpu::force_target_bits(avx3);
  attn::set_vnni_kernels(false);
  double worst = 0.0;
  int cases = 0;
  for (const auto& c : all_formats()) {
    for (const auto& s : kShapes) {
      for (int n : {31, 203, 3001}) {
        const double e = fast_error(c, s, 128, n, n % 2 == 1);
        worst = std::max(worst, e);
        EXPECT_LT(e, 2e-3) << "no VNNI " << c.name << " " << s.name << " n=" << n;
        ++cases;
      }
      const double e = fast_error(c, s, 64, 500, false, 333);
      EXPECT_LT(e, 2e-3) << "no VNNI " << c.name << " D=64 window=333";
      ++cases;
    }
  }
  attn::set_vnni_kernels(true);
  cpu::reset_target();
  EXPECT_EQ(cases, static_cast<int>(all_formats().size() * std::size(kShapes)) * 4);
  std::printf("worst fast-path relative error without VNNI: %.3g (bound 2e-3)\n", worst);
}

}  // namespace
}  // namespace kivi

namespace kivi {
namespace {

// (m, d, o) of scores s[a..b) over values v, computed directly.
struct DirectState {
  float m = -INFINITY, d = 0.0f;
  std::vector<float> o;
};
DirectState direct_state(const std::vector<float>& s, const std::vector<std::vector<float>>& v,
                         int a, int b, int D) {
  DirectState st;
  st.o.assign(D, 0.0f);
  for (int i = a; i < b; ++i) st.m = std::max(st.m, s[i]);
  for (int i = a; i < b; ++i) {
    const float w = std::exp(s[i] - st.m);
    st.d += w;
    for (int j = 0; j < D; ++j) st.o[j] += w * v[i][j];
  }
  return st;
}

// Merging the states of s[0..k) and s[k..n) gives the state of s[0..n) whichever half
// holds the larger maximum, when the maxima are equal, and when either half is empty
// (d = 0; its m and o are then ignored, even if not finite).
TEST(Attention, MergeCoversBothOrdersEqualMaximaAndEmptyStates) {
  const int D = 4;
  const std::vector<std::vector<float>> v = {
      {1, 2, 3, 4}, {0, 1, 0, 1}, {2, 2, 2, 2}, {-1, 0, 1, 0}, {3, 1, 4, 1}};
  struct Case {
    const char* name;
    std::vector<float> s;
    int split;
  };
  const Case cases[] = {
      {"larger maximum second", {0.5f, -1.0f, 2.0f, 0.0f, 1.5f}, 2},
      {"larger maximum first", {2.0f, -1.0f, 0.5f, 0.0f, 1.5f}, 2},
      {"equal maxima", {1.0f, -1.0f, 0.0f, 1.0f, 0.25f}, 2},
      {"far apart maxima", {-30.0f, -31.0f, 4.0f, 3.0f, 2.0f}, 2},
      {"empty first half", {0.5f, -1.0f, 2.0f, 0.0f, 1.5f}, 0},
      {"empty second half", {0.5f, -1.0f, 2.0f, 0.0f, 1.5f}, 5},
  };
  for (const auto& c : cases) {
    const DirectState all = direct_state(c.s, v, 0, 5, D);
    DirectState a = direct_state(c.s, v, 0, c.split, D), b = direct_state(c.s, v, c.split, 5, D);
    // An empty state's output is whatever the buffer held: NaN here.
    if (c.split == 0) a.o.assign(D, std::numeric_limits<float>::quiet_NaN());
    if (c.split == 5) b.o.assign(D, std::numeric_limits<float>::quiet_NaN());
    attn::State sa{a.m, a.d, a.o.data()};
    const attn::State sb{b.m, b.d, b.o.data()};
    attn::merge(sa, sb, D);
    EXPECT_FLOAT_EQ(sa.m, all.m) << c.name;
    EXPECT_NEAR(sa.d, all.d, 1e-6 * all.d) << c.name;
    for (int j = 0; j < D; ++j)
      EXPECT_NEAR(a.o[j], all.o[j], 1e-5 * std::max(1.0f, std::fabs(all.o[j])))
          << c.name << " o[" << j << "]";
    // The normalized output, as attention uses it.
    for (int j = 0; j < D; ++j) EXPECT_NEAR(a.o[j] / sa.d, all.o[j] / all.d, 1e-6) << c.name;
  }
  // Both empty: still empty.
  std::vector<float> oa(D, 0.0f), ob(D, 0.0f);
  attn::State ea{-INFINITY, 0.0f, oa.data()};
  const attn::State eb{-INFINITY, 0.0f, ob.data()};
  attn::merge(ea, eb, D);
  EXPECT_EQ(ea.d, 0.0f);
}

// The fast path's value kernels take quantized tokens 8 (or 16) at a time and finish
// with a scalar tail. Without a window, R = 128 leaves n - 128 quantized values; lengths
// such as 203 (75 quantized), 1001 (873) and 3001 (2873) end in a partial block of 8 (and
// of 16) on every target.
TEST(Attention, FastPathValueTailWithoutWindow) {
  const double kBound = 2e-3;
  double worst = 0.0;
  for (const auto& target : test::simd_targets()) {
    cpu::force_target_bits(target.bits);
    for (const auto& c : all_formats()) {
      for (const auto& s : kShapes) {
        for (int n : {203, kLongN + 1}) {
          for (int D : {64, 128}) {
            const double e = fast_error(c, s, D, n, false);
            worst = std::max(worst, e);
            EXPECT_LT(e, kBound) << target.name << " " << c.name << " " << s.name << " D=" << D
                                 << " n=" << n;
          }
        }
        const double e = fast_error(c, s, 128, 133, true);  // 5 quantized values: the tail alone
        worst = std::max(worst, e);
        EXPECT_LT(e, kBound) << target.name << " " << c.name << " " << s.name << " n=133";
      }
    }
  }
  cpu::reset_target();
  std::printf("worst fast-path relative error with a value tail: %.3g (bound %.3g)\n", worst,
              kBound);
}

}  // namespace
}  // namespace kivi
