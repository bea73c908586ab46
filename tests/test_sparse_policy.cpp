// Block-sparse selection policies: heads sharing one selection, reselection every N
// steps and selections reused by the following layers, the fix representative, and
// SnapKV-style preselection. Each against an independent reference: dense attention,
// fresh selections, attention in double over the attended ranges, the summed bound.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "attn/attention.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/threadpool.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "runtime/session.h"
#include "sparse/options.h"
#include "sparse/sparse_attention.h"
#include "sparse/summaries.h"
#include "sparse_test_util.h"
#include "test_util.h"

namespace kivi {
namespace {

using namespace sparse_test;

// Appends one random token to every layer of `cache` (outlier channels as real keys).
void append_token(kv::KvCache& cache, Rng& r) {
  const auto& cfg = cache.config();
  const int HD = cfg.n_kv_heads * cfg.head_dim;
  std::vector<float> k(HD), v(HD);
  for (int l = 0; l < cfg.n_layers; ++l) {
    for (int i = 0; i < HD; ++i) {
      k[i] = r.normal() * ((i % cfg.head_dim) % 13 == 1 ? 8.0f : 1.0f) + 0.5f;
      v[i] = r.normal();
    }
    if (cache.n_tokens(l) == 0) cache.calibrate(l, k.data(), v.data(), 1);
    cache.append(l, k.data(), v.data());
  }
}

std::vector<float> random_query(int n_heads, int D, Rng& r) {
  std::vector<float> q(static_cast<size_t>(n_heads) * D);
  for (auto& x : q) x = r.normal();
  return q;
}

// --- Heads sharing one selection ------------------------------------------------------------

TEST(SparsePolicy, SharedFullBudgetEqualsDense) {
  const int D = 64, nh = 8, hkv = 2;
  ThreadPool pool(2);
  for (const char* f : {"f16", "int8/head", "kivi2"}) {
    for (int n : {40, 200, 3000}) {
      const auto cfg = config_for(format_named(f), hkv, D, 4096, 32, 64, kv::KeyRope::kPost);
      const auto cache = filled_cache(cfg, n, n + 3);
      Rng r(n);
      const auto q = random_query(nh, D, r);
      std::vector<float> dense(q.size()), out(q.size());
      attn::Workspace ws(2, nh, hkv, D, cfg.block(), cfg.ctx);
      attn::decode(cache->view(0), q.data(), dense.data(), params(nh, D, nullptr), &pool, ws);
      for (auto kind : {sparse::Kind::kQuest, sparse::Kind::kFix, sparse::Kind::kRandom}) {
        sparse::Options o;
        o.kind = kind;
        o.block = 64;
        o.budget = 4096;
        o.local = 16;
        o.heads = sparse::Heads::kShared;
        sparse::SparseAttention sa(o, cfg, nh);
        sa.decode(0, 0, cache->view(0), q.data(), out.data(), params(nh, D, nullptr), &pool, ws);
        EXPECT_LE(rel_error(out, dense), 1e-6) << f << " n=" << n << " " << sparse::kind_name(kind);
        for (int h = 0; h < hkv; ++h) {
          ASSERT_EQ(sa.last_ranges(h).size(), 1u) << f;
          EXPECT_EQ(sa.last_ranges(h)[0].t1, n);
        }
      }
    }
  }
}

// With a small budget every head attends the same blocks, the top ones by the Quest
// bound summed over all query heads (computed here in double from the summaries), and
// the output is attention in double over the attended ranges.
TEST(SparsePolicy, SharedSelectsTopBySummedBound) {
  const int D = 64, nh = 8, hkv = 4, rep = nh / hkv, n = 2000, B = 32;
  ThreadPool pool(2);
  for (const char* f : {"f16", "kivi2"}) {
    const auto cfg = config_for(format_named(f), hkv, D, 2048, 32, 64, kv::KeyRope::kPost);
    const auto cache = filled_cache(cfg, n, 17);
    Rng r(4);
    const auto q = random_query(nh, D, r);
    sparse::Options o;
    o.kind = sparse::Kind::kQuest;
    o.block = B;
    o.budget = 6 * B;
    o.local = 64;
    o.heads = sparse::Heads::kShared;
    sparse::SparseAttention sa(o, cfg, nh);
    attn::Workspace ws(2, nh, hkv, D, cfg.block(), cfg.ctx);
    std::vector<float> out(q.size());
    const auto view = cache->view(0);
    sa.decode(0, 0, view, q.data(), out.data(), params(nh, D, nullptr), &pool, ws);
    const auto blocks = sa.last_blocks(0);
    ASSERT_EQ(blocks.size(), 6u) << f;
    std::vector<std::vector<sparse::Range>> ranges;
    for (int h = 0; h < hkv; ++h) {
      EXPECT_EQ(sa.last_blocks(h), blocks) << f << " head " << h;
      ranges.push_back(sa.last_ranges(h));
    }
    const int local_start = std::min(n - o.local, sa.summaries().summarized(0));
    const int cand = (local_start + B - 1) / B;
    std::vector<double> bound(cand, 0.0);
    for (int h = 0; h < hkv; ++h) {
      for (int b = 0; b < cand; ++b) {
        const f16_t* s = sa.summaries().head(0, h) + static_cast<size_t>(b) * 2 * D;
        for (int i = 0; i < rep; ++i) {
          const float* qr = q.data() + static_cast<size_t>(h * rep + i) * D;
          for (int c = 0; c < D; ++c)
            bound[b] +=
                std::max(double(qr[c]) * f16_to_f32(s[c]), double(qr[c]) * f16_to_f32(s[D + c]));
        }
      }
    }
    double worst_kept = 1e300, best_dropped = -1e300;
    for (int b = 0; b < cand; ++b) {
      const bool kept = std::find(blocks.begin(), blocks.end(), b) != blocks.end();
      (kept ? worst_kept : best_dropped) =
          kept ? std::min(worst_kept, bound[b]) : std::max(best_dropped, bound[b]);
    }
    EXPECT_GE(worst_kept, best_dropped - 1e-4 * std::fabs(best_dropped)) << f;
    const auto ref = restricted_reference(view, q, nh, 1.0f / std::sqrt(float(D)), nullptr, ranges);
    EXPECT_LT(rel_error(out, ref), 1e-5) << f;
  }
}

// --- Reselection and reuse -----------------------------------------------------------------

// A 4-layer cache grows token by token; at each step every layer decodes through one
// long-lived SparseAttention. With reselect 1 and reuse 1 its outputs equal, bit for
// bit, those of a fresh SparseAttention per call (a selection from scratch each time).
TEST(SparsePolicy, ReselectOneEqualsFreshSelectionBitForBit) {
  const int D = 32, nh = 4, hkv = 2, L = 4;
  ThreadPool pool(2);
  for (const char* f : {"f16", "kivi2"}) {
    auto cfg = config_for(format_named(f), hkv, D, 1024, 16, 32, kv::KeyRope::kPre);
    cfg.n_layers = L;
    Rng rq(9);
    const auto rope = rope_table(1024, D);
    for (auto kind : {sparse::Kind::kQuest, sparse::Kind::kFix}) {
      sparse::Options o;
      o.kind = kind;
      o.block = 32;
      o.budget = 96;
      o.local = 32;
      o.dense_layers = 1;
      sparse::SparseAttention kept(o, cfg, nh);
      attn::Workspace ws(2, nh, hkv, D, cfg.block(), cfg.ctx);
      std::vector<float> a(static_cast<size_t>(nh) * D), b(a.size());
      kv::KvCache grow(cfg);
      Rng rg(8);
      for (int t = 0; t < 300; ++t) append_token(grow, rg);
      for (int step = 0; step < 40; ++step) {
        append_token(grow, rg);
        for (int l = 1; l < L; ++l) {
          const auto q = random_query(nh, D, rq);
          kept.decode(l, l, grow.view(l), q.data(), a.data(), params(nh, D, rope.data()), &pool,
                      ws);
          sparse::SparseAttention fresh(o, cfg, nh);
          fresh.decode(l, l, grow.view(l), q.data(), b.data(), params(nh, D, rope.data()), &pool,
                       ws);
          ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
              << f << " " << sparse::kind_name(kind) << " step " << step << " layer " << l;
        }
      }
      EXPECT_EQ(kept.stats().selections, kept.stats().calls);
    }
  }
}

// Reselect 4 and reuse over 2 layers (dense layer 0; 1 selects, 2 reuses; 3 selects):
// at every call the ranges lie within the cache, every token since the selecting
// layer's last selection and its local window then is attended, a reusing layer
// attends its selector's blocks, and the output is attention in double over the
// ranges. A shorter cache afterwards (a new sequence without reset) reselects and
// reads nothing past its end.
TEST(SparsePolicy, ReselectAndReuseStayInRangeAndCoverNewTokens) {
  const int D = 32, nh = 4, hkv = 2, L = 4, local = 24, N = 4;
  ThreadPool pool(2);
  for (const char* f : {"f16", "kivi2"}) {
    for (auto heads : {sparse::Heads::kPer, sparse::Heads::kShared}) {
      auto cfg = config_for(format_named(f), hkv, D, 1024, 16, 32, kv::KeyRope::kPost);
      cfg.n_layers = L;
      sparse::Options o;
      o.kind = sparse::Kind::kQuest;
      o.block = 16;
      o.budget = 64;
      o.local = local;
      o.dense_layers = 1;
      o.reselect = N;
      o.reuse_layers = 2;
      o.heads = heads;
      sparse::SparseAttention sa(o, cfg, nh);
      EXPECT_EQ(sa.selector(2), 1);
      EXPECT_EQ(sa.selector(3), 3);
      attn::Workspace ws(2, nh, hkv, D, cfg.block(), cfg.ctx);
      std::vector<float> out(static_cast<size_t>(nh) * D);
      Rng r(21), rq(22);
      auto check = [&](const kv::KvCache& cache, int l, int since, const std::string& where) {
        const auto view = cache.view(l);
        const int n = view.n_tokens;
        const auto q = random_query(nh, D, rq);
        sa.decode(l, l, view, q.data(), out.data(), params(nh, D, nullptr), &pool, ws);
        std::vector<std::vector<sparse::Range>> ranges;
        for (int h = 0; h < hkv; ++h) {
          const auto rg = sa.last_ranges(h);
          int prev = 0;
          for (const auto& x : rg) {
            ASSERT_GE(x.t0, prev) << where;
            ASSERT_LT(x.t0, x.t1) << where;
            ASSERT_LE(x.t1, n) << where;
            prev = x.t1;
          }
          for (int t = std::max(0, since); t < n; ++t) {
            const bool in = std::any_of(rg.begin(), rg.end(), [&](const sparse::Range& x) {
              return x.t0 <= t && t < x.t1;
            });
            ASSERT_TRUE(in) << where << " token " << t << " of " << n << " not attended";
          }
          ranges.push_back(rg);
        }
        const auto ref =
            restricted_reference(view, q, nh, 1.0f / std::sqrt(float(D)), nullptr, ranges);
        EXPECT_LT(rel_error(out, ref), 1e-5) << where;
      };
      kv::KvCache cache(cfg);
      for (int t = 0; t < 200; ++t) append_token(cache, r);
      int sel1 = -1, sel3 = -1;  // tokens at the last selections of layers 1 and 3
      for (int step = 0; step < 13; ++step) {
        append_token(cache, r);
        const int n = cache.n_tokens(1);
        const std::string where = std::string(f) + " step " + std::to_string(step);
        if (sel1 < 0 || n - sel1 >= N) sel1 = n;
        if (sel3 < 0 || n - sel3 >= N) sel3 = n;
        const int64_t before = sa.stats().selections;
        check(cache, 1, sel1 - local, where + " layer 1");
        const auto blocks1 = sa.last_blocks(0);
        check(cache, 2, sel1 - local, where + " layer 2");
        EXPECT_EQ(sa.last_blocks(0), blocks1) << where << ": layer 2 reuses layer 1's blocks";
        check(cache, 3, sel3 - local, where + " layer 3");
        EXPECT_EQ(sa.stats().selections - before, (sel1 == n) + (sel3 == n)) << where;
      }
      kv::KvCache shorter(cfg);
      for (int t = 0; t < 70; ++t) append_token(shorter, r);
      for (int l = 1; l < L; ++l) check(shorter, l, 70 - local, std::string(f) + " shorter");
    }
  }
}

// --- The fix representative ----------------------------------------------------------------

TEST(SparsePolicy, FixSummaryIsTheMeanOfTheFixedKeys) {
  const int D = 64, Hkv = 2, B = 32, n = 300;
  EXPECT_EQ(sparse::fixed_count(32), 4);
  EXPECT_EQ(sparse::fixed_offset(32, 3), 24);
  EXPECT_EQ(sparse::fixed_count(2), 2);
  for (const char* f : {"f16", "int8/token", "kivi2"}) {
    for (auto kr : {kv::KeyRope::kPost, kv::KeyRope::kPre}) {
      const auto cfg = config_for(format_named(f), Hkv, D, 512, 16, 32, kr);
      const auto cache = filled_cache(cfg, n, 5);
      const auto view = cache->view(0);
      const auto rope = rope_table(512, D);
      const float* rp = kr == kv::KeyRope::kPre ? rope.data() : nullptr;
      sparse::BlockSummaries fx(cfg, B, sparse::SummaryKind::kFixed, {1});
      fx.update(0, view, rp, attn::RopeStyle::kAdjacent);
      ASSERT_GT(fx.summarized(0), 0);
      for (int h = 0; h < Hkv; ++h) {
        for (int b = 0; b < fx.summarized(0) / B; ++b) {
          std::vector<double> mean(D, 0.0);
          for (int j : {0, 8, 16, 24}) {
            const auto k = true_key(view, b * B + j, h, rp);
            for (int d = 0; d < D; ++d) mean[d] += k[d] / 4;
          }
          const f16_t* s = fx.head(0, h) + static_cast<size_t>(b) * D;
          for (int d = 0; d < D; ++d)
            ASSERT_NEAR(f16_to_f32(s[d]), mean[d], 1e-3 * (std::fabs(mean[d]) + 1))
                << f << " b=" << b;
        }
      }
    }
  }
}

// --- Preselection ----------------------------------------------------------------------------

// A prefill of `prompt` tokens (the last `window` observed) then `steps` decode steps,
// through sa; returns every call's output.
std::vector<float> prefill_and_decode(sparse::SparseAttention& sa, const kv::CacheConfig& cfg,
                                      int prompt, int steps, uint64_t seed, ThreadPool* pool) {
  const int nh = 8, D = cfg.head_dim;
  kv::KvCache cache(cfg);
  Rng r(seed), rq(seed + 1);
  attn::Workspace ws(2, nh, cfg.n_kv_heads, D, cfg.block(), cfg.ctx);
  std::vector<float> all, out(static_cast<size_t>(nh) * D);
  sa.begin_prefill(0, prompt);
  for (int t = 0; t < prompt + steps; ++t) {
    append_token(cache, r);
    const auto q = random_query(nh, D, rq);
    sa.decode(0, 0, cache.view(0), q.data(), out.data(), params(nh, D, nullptr), pool, ws);
    all.insert(all.end(), out.begin(), out.end());
  }
  return all;
}

TEST(SparsePolicy, PreselectionCoveringEverythingEqualsPlainSelection) {
  ThreadPool pool(2);
  for (const char* f : {"f16", "kivi2"}) {
    for (auto heads : {sparse::Heads::kPer, sparse::Heads::kShared}) {
      const auto cfg = config_for(format_named(f), 2, 32, 1024, 16, 32, kv::KeyRope::kPost);
      sparse::Options o;
      o.kind = sparse::Kind::kQuest;
      o.block = 16;
      o.budget = 64;
      o.local = 16;
      o.heads = heads;
      sparse::SparseAttention plain(o, cfg, 8);
      o.preselect = 8;
      o.candidates = 1024;
      sparse::SparseAttention pre(o, cfg, 8);
      const auto a = prefill_and_decode(plain, cfg, 400, 30, 3, &pool);
      const auto b = prefill_and_decode(pre, cfg, 400, 30, 3, &pool);
      ASSERT_TRUE(pre.has_candidates(0)) << f;
      EXPECT_EQ(static_cast<size_t>(pre.candidate_limit(0)), pre.candidates(0, 0).size()) << f;
      ASSERT_EQ(a.size(), b.size());
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << f;
    }
  }
}

// KV head h's keys in one block point along u_h, and the observation window's queries
// of that head along u_h too: preselection keeps the needle's block (4 candidate blocks of
// about 123) for every head, and later selections (random queries) rank only
// candidates and blocks filled since.
TEST(SparsePolicy, PreselectionKeepsAPlantedNeedle) {
  const int D = 32, hkv = 4, rep = 2, nh = hkv * rep, B = 16, prompt = 2000, W = 8;
  ThreadPool pool(2);
  for (const char* f : {"f16", "kivi2"}) {
    const auto cfg = config_for(format_named(f), hkv, D, 4096, 16, 32, kv::KeyRope::kPost);
    sparse::Options o;
    o.kind = sparse::Kind::kQuest;
    o.block = B;
    o.budget = 2 * B;
    o.local = 16;
    o.preselect = W;
    o.candidates = 4 * B;
    sparse::SparseAttention sa(o, cfg, nh);
    kv::KvCache cache(cfg);
    Rng r(31), rq(32);
    std::vector<float> u(static_cast<size_t>(hkv) * D);
    for (int h = 0; h < hkv; ++h) {
      double norm = 0;
      for (int d = 0; d < D; ++d) norm += std::pow(u[h * D + d] = r.normal(), 2);
      for (int d = 0; d < D; ++d) u[h * D + d] /= std::sqrt(norm);
    }
    std::vector<int> needle(hkv);
    for (int h = 0; h < hkv; ++h) needle[h] = 10 + 30 * h;
    attn::Workspace ws(2, nh, hkv, D, cfg.block(), cfg.ctx);
    std::vector<float> k(static_cast<size_t>(hkv) * D), v(k.size()),
        out(static_cast<size_t>(nh) * D);
    std::vector<float> q(out.size());
    sa.begin_prefill(0, prompt);
    for (int t = 0; t < prompt + 20; ++t) {
      for (int h = 0; h < hkv; ++h) {
        for (int d = 0; d < D; ++d) {
          k[h * D + d] = t / B == needle[h] ? 6.0f * u[h * D + d] + 0.2f * r.normal() : r.normal();
          v[h * D + d] = r.normal();
        }
      }
      if (t == 0) cache.calibrate(0, k.data(), v.data(), 1);
      cache.append(0, k.data(), v.data());
      const bool observed = t >= prompt - W && t < prompt;
      for (int h = 0; h < hkv; ++h)
        for (int i = 0; i < rep; ++i)
          for (int d = 0; d < D; ++d)
            q[(h * rep + i) * D + d] =
                observed ? 2.0f * u[h * D + d] + 0.1f * rq.normal() : rq.normal();
      sa.decode(0, 0, cache.view(0), q.data(), out.data(), params(nh, D, nullptr), &pool, ws);
      if (t < prompt - 1) {
        EXPECT_FALSE(sa.has_candidates(0));
        continue;
      }
      ASSERT_TRUE(sa.has_candidates(0)) << f;
      for (int h = 0; h < hkv; ++h) {
        const auto c = sa.candidates(0, h);
        EXPECT_EQ(c.size(), 4u) << f;
        if (t == prompt - 1) {
          EXPECT_TRUE(std::find(c.begin(), c.end(), needle[h]) != c.end())
              << f << " head " << h << " needle block " << needle[h];
        }
        for (int b : sa.last_blocks(h)) {
          EXPECT_TRUE(b >= sa.candidate_limit(0) || std::find(c.begin(), c.end(), b) != c.end())
              << f << " head " << h << " block " << b << " neither candidate nor new";
        }
      }
    }
  }
}

// --- Through a session -----------------------------------------------------------------------

// stories260K: a budget covering the context gives dense attention's logits bit for bit
// with shared heads, reselection every 3 steps, one selection per 2 layers and
// preselection whose candidates cover everything (prompt prefilled, then decoding).
TEST(SparsePolicy, SessionPoliciesWithFullBudgetGiveDenseLogits) {
  KIVI_REQUIRE_MODEL();
  auto m = model::Model::load(test::model_path(), test::tokenizer_path());
  const auto prompt =
      m->tokenizer().encode("Once upon a time, there was a little girl named Lily.", true);
  for (const char* f : {"f16", "kivi2"}) {
    auto run = [&](const sparse::Options& so) {
      runtime::SessionOptions o;
      o.threads = 2;
      o.ctx = 256;
      o.cache.k = o.cache.v = {kv::parse_format(f), kv::Int8Granularity::kHead};
      o.cache.group_size = 16;
      o.cache.residual = 16;
      o.sparse = so;
      o.forward.prefill = attn::PrefillMode::kStream;  // as the sparse layers attend
      runtime::Session s(*m, o);
      std::vector<float> all;
      const float* lg = s.prefill(prompt);
      if (s.sparse()) {
        EXPECT_TRUE(s.sparse()->has_candidates(1)) << f << ": the prefill preselected";
        EXPECT_FALSE(s.sparse()->has_candidates(2)) << f << ": layer 2 reuses layer 1's blocks";
      }
      for (int i = 0; i < 120; ++i) {
        all.insert(all.end(), lg, lg + s.vocab());
        lg = s.decode((i * 37 + 11) % s.vocab());
      }
      return all;
    };
    const auto dense = run(sparse::Options{});
    sparse::Options so;
    so.kind = sparse::Kind::kQuest;
    so.block = 16;
    so.budget = 256;
    so.local = 16;
    so.dense_layers = 1;
    so.heads = sparse::Heads::kShared;
    so.reselect = 3;
    so.reuse_layers = 2;
    so.preselect = 4;
    so.candidates = 256;
    EXPECT_EQ(rel_error(run(so), dense), 0.0) << f;
  }
}

TEST(SparsePolicy, BadOptionsGiveClearErrors) {
  KIVI_REQUIRE_MODEL();
  test::expect_cli_errors(
      "generate " + test::model_args() + " -p hi -n 2",
      {
          {"--sparse quest --sparse-heads all", "--sparse-heads: unknown value 'all'"},
          {"--sparse quest --sparse-reselect 0", "--sparse-reselect"},
          {"--sparse quest --sparse-candidates 64", "--sparse-candidates needs --sparse-preselect"},
          {"--sparse-reuse-layers 2", "--sparse-reuse-layers needs --sparse KIND"},
      });
}

}  // namespace
}  // namespace kivi
