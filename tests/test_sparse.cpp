// Block-sparse attention: the scoring kernel against its reference on every SIMD target,
// top-k and ranges, the summaries' bound on every cache format, sparse = dense with a
// budget covering the context, sparse = a double reference over the selected tokens,
// a planted needle found at every depth, and errors for bad options.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "attn/attention.h"
#include "core/cpu.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/threadpool.h"
#include "kv/kv_cache.h"
#include "model/forward.h"
#include "model/model.h"
#include "runtime/session.h"
#include "sparse/options.h"
#include "sparse/score.h"
#include "sparse/select.h"
#include "sparse/sparse_attention.h"
#include "sparse/summaries.h"
#include "sparse_test_util.h"
#include "test_util.h"

namespace kivi {
namespace {

using namespace sparse_test;
using kv::Int8Granularity;

// --- Kernels and helpers -------------------------------------------------------------

TEST(Sparse, ScoreRowsMatchReferenceOnEveryTarget) {
  Rng r(5);
  for (const auto& target : test::simd_targets()) {
    cpu::force_target_bits(target.bits);
    for (size_t len : {1, 7, 16, 64, 100, 128, 256}) {
      for (size_t n : {1, 3, 4, 5, 37}) {
        const size_t stride = len + 3;
        std::vector<f16_t> x(n * stride);
        std::vector<float> w(len), out(n), ref(n);
        for (auto& e : x) e = f32_to_f16(r.normal() * 4.0f);
        for (auto& e : w) e = r.normal();
        sparse::dot_f16_rows(x.data(), stride, n, w.data(), len, out.data());
        sparse::dot_f16_rows_ref(x.data(), stride, n, w.data(), len, ref.data());
        for (size_t i = 0; i < n; ++i) {
          double mag = 0;
          for (size_t j = 0; j < len; ++j) mag += std::fabs(w[j] * f16_to_f32(x[i * stride + j]));
          EXPECT_LE(std::fabs(out[i] - ref[i]), 1e-6 * mag + 1e-30)
              << target.name << " len=" << len << " n=" << n;
        }
      }
    }
  }
  cpu::reset_target();
}

TEST(Sparse, TopKMatchesSorting) {
  Rng r(9);
  for (int n : {1, 2, 10, 100, 1000, 5000}) {
    for (int k : {0, 1, 3, 32, n / 2, n, n + 5}) {
      std::vector<float> s(n);
      for (auto& e : s) e = std::floor(r.uniform() * 20.0f);  // many ties
      if (n > 4) s[3] = NAN;
      if (n > 100) {  // late NaNs and infinities, past the first runs of 16
        s[n - 7] = NAN;
        for (int i = n / 2; i < n / 2 + 20; ++i) s[i] = INFINITY;
      }
      std::vector<int> idx(n);
      for (int i = 0; i < n; ++i) idx[i] = i;
      auto key = [&](int i) { return std::isnan(s[i]) ? INFINITY : s[i]; };
      std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return key(a) > key(b); });
      const int want = std::max(0, std::min(k, n));
      std::vector<int> expect(idx.begin(), idx.begin() + want);
      std::sort(expect.begin(), expect.end());
      std::vector<int> got(std::max(1, n));
      std::vector<std::pair<float, int>> heap(std::max(1, k));
      const int m = sparse::top_k(s.data(), n, k, got.data(), heap.data());
      ASSERT_EQ(m, want) << "n=" << n << " k=" << k;
      got.resize(m);
      EXPECT_EQ(got, expect) << "n=" << n << " k=" << k;
    }
  }
}

TEST(Sparse, RangesMergeAndSplit) {
  sparse::Range out[8], pieces[16];
  const int blocks[] = {0, 2, 3, 6};
  // sinks [0, 4), blocks 0, 2, 3 of 16 tokens, block 6 cut by the local window at 100.
  int m = sparse::attended_ranges(blocks, 4, 16, 4, 100, 130, out);
  ASSERT_EQ(m, 3);
  EXPECT_EQ(out[0].t0, 0);
  EXPECT_EQ(out[0].t1, 16);
  EXPECT_EQ(out[1].t0, 32);
  EXPECT_EQ(out[1].t1, 64);
  EXPECT_EQ(out[2].t0, 96);
  EXPECT_EQ(out[2].t1, 130);
  const int p = sparse::split_ranges(out, m, 40, pieces);
  // [0,16) [32,40) [40,64) [96,120) [120,130)
  ASSERT_EQ(p, 5);
  EXPECT_EQ(pieces[1].t1, 40);
  EXPECT_EQ(pieces[2].t0, 40);
  EXPECT_EQ(pieces[3].t1, 120);
  // Everything selected: one range.
  const int all[] = {0, 1, 2, 3, 4, 5, 6};
  m = sparse::attended_ranges(all, 7, 16, 4, 100, 130, out);
  ASSERT_EQ(m, 1);
  EXPECT_EQ(out[0].t1, 130);
}

// --- Summaries -------------------------------------------------------------------------

// For every block of a random cache, every format and both key placements: each key's
// channels lie within [min, max] of its block, so the Quest bound is at least every
// key's score for any query (checked on random queries too); max bounds the channels
// from above; mean is the mean. KIVI keys stored after RoPE, whose summaries come from
// the group parameters, must also be tight (within f16 rounding of the extreme keys).
TEST(Sparse, SummaryBoundNeverBelowTrueScores) {
  const int D = 64, Hkv = 2, G = 16, R = 32, B = 32, n = 300;
  int checked = 0;
  for (const auto& c : all_formats()) {
    for (auto kr : {kv::KeyRope::kPost, kv::KeyRope::kPre}) {
      const auto cfg = config_for(c, Hkv, D, 512, G, R, kr);
      const auto cache = filled_cache(cfg, n, 77 + static_cast<int>(kr));
      const auto view = cache->view(0);
      const auto rope = rope_table(512, D);
      const float* rp = kr == kv::KeyRope::kPre ? rope.data() : nullptr;
      sparse::BlockSummaries mm(cfg, B, sparse::SummaryKind::kMinMax, {1});
      sparse::BlockSummaries mx(cfg, B, sparse::SummaryKind::kMax, {1});
      sparse::BlockSummaries me(cfg, B, sparse::SummaryKind::kMean, {1});
      mm.update(0, view, rp, attn::RopeStyle::kAdjacent);
      mx.update(0, view, rp, attn::RopeStyle::kAdjacent);
      me.update(0, view, rp, attn::RopeStyle::kAdjacent);
      ASSERT_EQ(mm.summarized(0), std::min(view.k.n_stored, n) / B * B) << c.name;
      ASSERT_GT(mm.summarized(0), 0) << c.name;
      const bool from_params = kv::is_kivi(c.k.format) && kr == kv::KeyRope::kPost;
      Rng r(3);
      for (int h = 0; h < Hkv; ++h) {
        for (int b = 0; b < mm.summarized(0) / B; ++b) {
          const f16_t* s = mm.head(0, h) + static_cast<size_t>(b) * 2 * D;
          const f16_t* smax = mx.head(0, h) + static_cast<size_t>(b) * D;
          const f16_t* smean = me.head(0, h) + static_cast<size_t>(b) * D;
          std::vector<std::vector<double>> keys;
          for (int t = b * B; t < (b + 1) * B; ++t) keys.push_back(true_key(view, t, h, rp));
          for (int d = 0; d < D; ++d) {
            double lo = 1e300, hi = -1e300, sum = 0;
            for (const auto& k : keys) {
              lo = std::min(lo, k[d]);
              hi = std::max(hi, k[d]);
              sum += k[d];
            }
            ASSERT_LE(f16_to_f32(s[d]), lo) << c.name << " h=" << h << " b=" << b << " d=" << d;
            ASSERT_GE(f16_to_f32(s[D + d]), hi) << c.name << " h=" << h << " b=" << b << " d=" << d;
            ASSERT_GE(f16_to_f32(smax[d]), hi) << c.name;
            EXPECT_NEAR(f16_to_f32(smean[d]), sum / B, 1e-3 * (std::fabs(sum / B) + 1)) << c.name;
            if (from_params) {
              const double tol = 2e-3 * (std::fabs(lo) + std::fabs(hi)) + 1e-3;
              EXPECT_NEAR(f16_to_f32(s[d]), lo, tol) << c.name << " (not tight)";
              EXPECT_NEAR(f16_to_f32(s[D + d]), hi, tol) << c.name << " (not tight)";
            }
          }
          for (int trial = 0; trial < 20; ++trial) {
            std::vector<float> q(D);
            for (auto& x : q) x = r.normal() * (trial % 2 ? 10.0f : 0.1f);
            double bound = 0;
            for (int d = 0; d < D; ++d) {
              bound +=
                  std::max(double(q[d]) * f16_to_f32(s[d]), double(q[d]) * f16_to_f32(s[D + d]));
            }
            for (const auto& k : keys) {
              double dot = 0;
              for (int d = 0; d < D; ++d) dot += q[d] * k[d];
              ASSERT_GE(bound, dot) << c.name << " h=" << h << " b=" << b;
            }
            ++checked;
          }
        }
      }
    }
  }
  std::printf("bound checked on %d (block, query) pairs\n", checked);
}

TEST(Sparse, SummariesAreCountedAndAllocatedUpFront) {
  const auto cfg = config_for(format_named("kivi2"), 4, 64, 4096, 32, 128, kv::KeyRope::kPost);
  sparse::Options o;
  o.kind = sparse::Kind::kQuest;
  o.block = 64;
  sparse::SparseAttention sa(o, cfg, 16);
  // 64 blocks x 4 heads x (min, max) x 64 channels x 2 bytes.
  EXPECT_EQ(sa.bytes_reserved(), 64ull * 4 * 2 * 64 * 2);
  EXPECT_EQ(sparse::SparseAttention::summary_bytes(o, cfg), sa.bytes_reserved());
  EXPECT_EQ(sa.summaries().bytes_used(), 0u);
}

// --- Sparse attention ---------------------------------------------------------------------

struct SparseRun {
  std::vector<float> out;
  std::vector<std::vector<sparse::Range>> ranges;
  std::vector<std::vector<int>> blocks;
};

SparseRun run_sparse(const kv::CacheConfig& cfg, const kv::KvCache& cache, const sparse::Options& o,
                     int n_heads, const std::vector<float>& q, const float* rope,
                     ThreadPool* pool) {
  sparse::SparseAttention sa(o, cfg, n_heads);
  attn::Workspace ws(pool ? pool->size() : 1, n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.block(),
                     cfg.ctx);
  SparseRun r;
  r.out.resize(q.size());
  sa.decode(0, 0, cache.view(0), q.data(), r.out.data(), params(n_heads, cfg.head_dim, rope), pool,
            ws);
  for (int h = 0; h < cfg.n_kv_heads; ++h) {
    r.ranges.push_back(sa.last_ranges(h));
    r.blocks.push_back(sa.last_blocks(h));
  }
  return r;
}

TEST(Sparse, FullBudgetEqualsDenseOnEveryFormatAndTarget) {
  const int D = 64, G = 32, R = 64;
  ThreadPool pool(2);
  double worst = 0;
#ifdef KIVI_SANITIZE
  const std::vector<int> lengths = {1, 40, 700};  // (3000 tokens: minutes under ASan)
#else
  const std::vector<int> lengths = {1, 40, 200, 3000};
#endif
  for (const auto& target : test::simd_targets()) {
    cpu::force_target_bits(target.bits);
    for (const auto& c : all_formats()) {
      for (auto kr : {kv::KeyRope::kPost, kv::KeyRope::kPre}) {
        for (int n : lengths) {
          for (auto [nh, hkv] : {std::pair{8, 2}, std::pair{4, 4}}) {
            const auto cfg = config_for(c, hkv, D, 4096, G, R, kr);
            const auto cache = filled_cache(cfg, n, n + 11);
            const auto rope = rope_table(4096, D);
            const float* rp = kr == kv::KeyRope::kPre ? rope.data() : nullptr;
            std::vector<float> q(static_cast<size_t>(nh) * D), dense(q.size());
            Rng r(n);
            for (auto& x : q) x = r.normal();
            attn::Workspace ws(2, nh, hkv, D, cfg.block(), cfg.ctx);
            attn::decode(cache->view(0), q.data(), dense.data(), params(nh, D, rp), &pool, ws);
            for (auto kind : {sparse::Kind::kQuest, sparse::Kind::kMax, sparse::Kind::kRandom}) {
              sparse::Options o;
              o.kind = kind;
              o.block = 64;
              o.budget = 4096;
              o.local = 16;
              const SparseRun s = run_sparse(cfg, *cache, o, nh, q, rp, &pool);
              const double e = rel_error(s.out, dense);
              worst = std::max(worst, e);
              EXPECT_LE(e, 1e-6) << target.name << " " << c.name << " n=" << n << " "
                                 << sparse::kind_name(kind);
              ASSERT_EQ(s.ranges[0].size(), 1u);
              EXPECT_EQ(s.ranges[0][0].t1, n);
            }
          }
        }
      }
    }
  }
  cpu::reset_target();
  std::printf("worst relative difference to dense: %.3g (bound 1e-6)\n", worst);
}

TEST(Sparse, SmallBudgetEqualsReferenceOverSelectedTokens) {
  const int D = 64, G = 32, R = 64, nh = 8, hkv = 2, n = 2000;
  ThreadPool pool(2);
  double worst = 0;
  for (const auto& c : all_formats()) {
    for (auto kr : {kv::KeyRope::kPost, kv::KeyRope::kPre}) {
      const auto cfg = config_for(c, hkv, D, 2048, G, R, kr);
      const auto cache = filled_cache(cfg, n, 5);
      const auto rope = rope_table(2048, D);
      const float* rp = kr == kv::KeyRope::kPre ? rope.data() : nullptr;
      std::vector<float> q(static_cast<size_t>(nh) * D);
      Rng r(1);
      for (auto& x : q) x = r.normal();
      for (auto kind :
           {sparse::Kind::kQuest, sparse::Kind::kMean, sparse::Kind::kFix, sparse::Kind::kRandom}) {
        sparse::Options o;
        o.kind = kind;
        o.block = 64;
        o.budget = 256;
        o.sinks = 4;
        o.local = 100;
        const SparseRun s = run_sparse(cfg, *cache, o, nh, q, rp, &pool);
        for (int h = 0; h < hkv; ++h) {
          EXPECT_EQ(s.blocks[h].size(), 4u) << c.name;
          int64_t tokens = 0;
          for (const auto& rg : s.ranges[h]) tokens += rg.t1 - rg.t0;
          EXPECT_LE(tokens, 4 + 256 + std::max(100, n - cache->view(0).k.n_stored / 64 * 64))
              << c.name;
        }
        const auto ref =
            restricted_reference(cache->view(0), q, nh, 1.0f / std::sqrt(float(D)), rp, s.ranges);
        const double e = rel_error(s.out, ref);
        worst = std::max(worst, e);
        EXPECT_LT(e, 1e-5) << c.name << " " << sparse::kind_name(kind) << " rope " << int(kr);
      }
    }
  }
  std::printf("worst relative error against the restricted reference: %.3g (bound 1e-5)\n", worst);
}

// A random kivi2 cache in which KV head h's keys in one block (at a depth of its own)
// point along that head's query direction: at every length and depth, Quest selects
// the needle's block for every head, and the output is attention over the selected
// tokens.
TEST(Sparse, PlantedNeedleIsFoundAtEveryDepth) {
  const int D = 64, hkv = 8, rep = 4, nh = hkv * rep, G = 32, R = 128, B = 64;
  ThreadPool pool(2);
  const FormatCase& kivi2 = format_named("kivi2");
  int found = 0;
  for (int n : {4096, 16384, 65536}) {
    const auto cfg = config_for(kivi2, hkv, D, n, G, R, kv::KeyRope::kPost);
    kv::KvCache cache(cfg);
    Rng r(n);
    // Unit query directions per KV head.
    std::vector<float> u(static_cast<size_t>(hkv) * D);
    for (int h = 0; h < hkv; ++h) {
      double norm = 0;
      for (int d = 0; d < D; ++d) norm += std::pow(u[h * D + d] = r.normal(), 2);
      for (int d = 0; d < D; ++d) u[h * D + d] /= std::sqrt(norm);
    }
    // Head h's needle block at depth (h + 0.5) / hkv of the summarized tokens.
    const int stored_blocks = (n - R) / B;
    std::vector<int> needle(hkv);
    for (int h = 0; h < hkv; ++h) needle[h] = static_cast<int>((h + 0.5) / hkv * stored_blocks);
    std::vector<float> k(static_cast<size_t>(hkv) * D), v(k.size());
    for (int t = 0; t < n; ++t) {
      for (int h = 0; h < hkv; ++h) {
        const bool in = t / B == needle[h];
        for (int d = 0; d < D; ++d) {
          k[h * D + d] = in ? 40.0f * u[h * D + d] + 0.3f * r.normal() : r.normal();
          v[h * D + d] = r.normal();
        }
      }
      cache.append(0, k.data(), v.data());
    }
    std::vector<float> q(static_cast<size_t>(nh) * D);
    for (int h = 0; h < hkv; ++h)
      for (int i = 0; i < rep; ++i)
        for (int d = 0; d < D; ++d) q[(h * rep + i) * D + d] = u[h * D + d] + 0.05f * r.normal();
    sparse::Options o;
    o.kind = sparse::Kind::kQuest;
    o.block = B;
    o.budget = 4 * B;
    o.sinks = 4;
    o.local = 64;
    const SparseRun s = run_sparse(cfg, cache, o, nh, q, nullptr, &pool);
    for (int h = 0; h < hkv; ++h) {
      const auto& b = s.blocks[h];
      EXPECT_TRUE(std::find(b.begin(), b.end(), needle[h]) != b.end())
          << "n=" << n << " head " << h << " needle block " << needle[h];
      found += std::find(b.begin(), b.end(), needle[h]) != b.end();
    }
    const auto ref =
        restricted_reference(cache.view(0), q, nh, 1.0f / std::sqrt(float(D)), nullptr, s.ranges);
    EXPECT_LT(rel_error(s.out, ref), 1e-5) << "n=" << n;
  }
  EXPECT_EQ(found, 3 * hkv);
}

// Through a session on stories260K (prefill, then decoding): a budget covering the
// context gives dense attention's logits bit for bit, for f16 and kivi2 with keys after
// and before RoPE and the first layers dense; a small budget changes them (the layers
// select), and the summaries are counted with the cache.
TEST(Sparse, SessionWithFullBudgetGivesDenseLogits) {
  KIVI_REQUIRE_MODEL();
  auto m = model::Model::load(test::model_path(), test::tokenizer_path());
  const auto prompt =
      m->tokenizer().encode("Once upon a time, there was a little girl named Lily.", true);
  for (const char* f : {"f16", "kivi2"}) {
    for (auto kr : {kv::KeyRope::kPost, kv::KeyRope::kPre}) {
      auto run = [&](const sparse::Options& so, double* attended) {
        runtime::SessionOptions o;
        o.threads = 2;
        o.ctx = 512;
        o.cache.k = o.cache.v = {kv::parse_format(f), Int8Granularity::kHead};
        o.cache.group_size = 16;
        o.cache.residual = 16;
        o.cache.key_rope = kr;
        o.sparse = so;
        o.forward.prefill = attn::PrefillMode::kStream;  // as the sparse layers attend
        runtime::Session s(*m, o);
        std::vector<float> all;
        const float* lg = s.prefill(prompt);
        int t = 0;
        for (int i = 0; i < 300; ++i) {
          all.insert(all.end(), lg, lg + s.vocab());
          t = (t * 7 + 13 + static_cast<int>(std::fabs(lg[i % s.vocab()]) * 100)) % s.vocab();
          lg = s.decode(t);
        }
        if (s.sparse()) {
          EXPECT_EQ(s.kv_bytes_reserved(),
                    s.cache().bytes_reserved() + s.sparse()->bytes_reserved());
          EXPECT_GT(s.sparse()->bytes_reserved(), 0u);
          *attended =
              double(s.sparse()->stats().tokens_attended) / s.sparse()->stats().tokens_context;
        }
        return all;
      };
      double attended = 0;
      const auto dense = run(sparse::Options{}, &attended);
      sparse::Options so;
      so.kind = sparse::Kind::kQuest;
      so.block = 16;
      so.budget = 512;
      so.local = 16;
      so.dense_layers = 1;
      const auto full = run(so, &attended);
      EXPECT_EQ(attended, 1.0) << f;
      EXPECT_EQ(rel_error(full, dense), 0.0) << f << " rope " << int(kr);
      so.budget = 32;
      const auto small = run(so, &attended);
      EXPECT_LT(attended, 0.5) << f;
      EXPECT_GT(rel_error(small, dense), 1e-3) << f << " rope " << int(kr);
    }
  }
}

// --- Bad options ---------------------------------------------------------------------------

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Sparse, BadOptionsGiveClearErrors) {
  EXPECT_NE(error_of([] { sparse::parse_kind("fast"); }).find("--sparse: unknown value 'fast'"),
            std::string::npos);
  sparse::Options o;
  o.kind = sparse::Kind::kQuest;
  o.block = 0;
  EXPECT_NE(error_of([&] { o.validate(); }).find("--sparse-block 0"), std::string::npos);
  o.block = 64;
  o.local = 0;
  EXPECT_NE(error_of([&] { o.validate(); }).find("--sparse-local 0"), std::string::npos);
  o.local = 16;
  o.block = 48;
  const auto cfg = config_for(format_named("kivi2"), 2, 64, 1024, 32, 64, kv::KeyRope::kPost);
  EXPECT_NE(error_of([&] {
              sparse::SparseAttention(o, cfg, 8);
            }).find("multiple of the KIVI key group G=32"),
            std::string::npos);

  KIVI_REQUIRE_MODEL();
  test::expect_cli_errors(
      "generate " + test::model_args() + " -p hi -n 2",
      {
          {"--sparse fast", "--sparse: unknown value 'fast'"},
          {"--sparse quest --sparse-block 0", "--sparse-block"},
          {"--sparse-budget 64", "--sparse-budget needs --sparse KIND"},
          {"--sparse quest --sparse-budget -1", "--sparse-budget"},
          {"--sparse quest --kv-cache kivi2 --sparse-block 48", "multiple of the KIVI key group"},
          {"--sparse quest --sparse-dense-layers 99", "--sparse-dense-layers 99"},
          {"--sparse quest --window 64", "--window"},
          {"--sparse quest --context-overflow shift", "--context-overflow"},
      });
}

}  // namespace
}  // namespace kivi
