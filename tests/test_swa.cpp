// Model-declared sliding-window attention: the GGUF keys are read (and bad values are
// one-line errors naming the key), cached decoding matches the no-cache oracle with the
// same mask, every cache format runs past the window with a per-layer memory that does
// not grow with the context, evicting blocks changes nothing but rounding, and the
// combinations the engine refuses say so. The logits are checked against the numpy
// reference by tests/reference/check_arch.py (its sliding-window case).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/threadpool.h"
#include "io/gguf_writer.h"
#include "kv/kv_cache.h"
#include "model/config.h"
#include "model/convert.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/synth.h"
#include "runtime/scheduler.h"
#include "runtime/session.h"
#include "runtime/session_file.h"
#include "test_util.h"

namespace kivi {
namespace {

constexpr int kWindow = 20;

model::ModelConfig small(const std::string& arch, int window, int pattern) {
  model::ModelConfig c;
  model::apply_arch_defaults(c, arch);
  c.n_layers = 4;
  c.dim = 64;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.hidden_dim = 96;
  c.vocab_size = 300;
  c.ctx = 512;
  c.rope_theta = 10000.0f;
  c.sliding_window = window;
  if (window > 0) c.set_swa_pattern(pattern);
  return c;
}

// A GGUF of shape `c` with random weights.
std::string synth(const test::TempDir& t, const std::string& name, const model::ModelConfig& c) {
  return test::synth_model(t, name, c, 5);
}

// A model file without window keys of its own, with metadata added by `meta`.
std::string write_with(const test::TempDir& t, const std::string& name,
                       const std::function<void(io::GgufWriter&)>& meta) {
  return test::write_model(t, name, small("llama", 0, 0), {}, meta);
}

std::vector<int> token_stream(int n) {
  std::vector<int> t = {1};
  for (int i = 1; i < n; ++i) t.push_back(3 + (i * 37 + i * i * 11) % 290);
  return t;
}

kv::CacheConfig cache_of(kv::Format f, kv::KeyRope rope) {
  kv::CacheConfig cc;
  cc.k.format = cc.v.format = f;
  cc.group_size = 8;
  cc.residual = 16;
  cc.block_tokens = 8;
  cc.key_rope = rope;
  return cc;
}

runtime::SessionOptions session_of(const kv::CacheConfig& cc, int ctx) {
  runtime::SessionOptions o;
  o.ctx = ctx;
  o.threads = 2;
  o.max_batch = 16;
  o.cache = cc;
  return o;
}

double max_diff(const float* a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < b.size(); ++i)
    d = std::max(d, std::fabs(static_cast<double>(a[i]) - b[i]));
  return d;
}

TEST(Swa, MetadataIsReadWithAndWithoutPattern) {
  test::TempDir t;
  const auto all = model::Model::load(synth(t, "all", small("llama", 12, 0)));
  EXPECT_EQ(all->config().sliding_window, 12);
  for (int l = 0; l < 4; ++l) EXPECT_EQ(all->config().layer_window(l), 12) << l;
  // Period 3: layers 0, 1 windowed, 2 full, 3 windowed (l % 3 < 2).
  const auto p3 = model::Model::load(synth(t, "p3", small("qwen2", 12, 3)));
  EXPECT_EQ(p3->config().layer_windows(), (std::vector<int>{12, 12, 0, 12}));
  // A pattern that no period reproduces is written and read as one integer per layer.
  model::ModelConfig odd = small("qwen3", 7, 0);
  odd.swa_layers = {0, 1, 1, 0};
  const auto arr = model::Model::load(synth(t, "arr", odd));
  EXPECT_EQ(arr->config().layer_windows(), (std::vector<int>{0, 7, 7, 0}));
  // An array of bools, llama.cpp's other spelling.
  const auto bools = model::Model::load(write_with(t, "bools", [](io::GgufWriter& w) {
    w.add_u32("llama.attention.sliding_window", 9);
    w.add_i32_array("llama.attention.sliding_window_pattern", {1, 0, 1, 0});
  }));
  EXPECT_EQ(bools->config().layer_windows(), (std::vector<int>{9, 0, 9, 0}));
  const auto none = model::Model::load(synth(t, "none", small("llama", 0, 0)));
  EXPECT_TRUE(none->config().layer_windows().empty());
}

TEST(Swa, BadMetadataIsAOneLineErrorNamingTheKey) {
  test::TempDir t;
  struct Case {
    const char* name;
    std::function<void(io::GgufWriter&)> meta;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"zero", [](io::GgufWriter& w) { w.add_u32("llama.attention.sliding_window", 0); },
       "llama.attention.sliding_window' = 0"},
      {"float", [](io::GgufWriter& w) { w.add_f32("llama.attention.sliding_window", 4.0f); },
       "llama.attention.sliding_window"},
      {"short",
       [](io::GgufWriter& w) {
         w.add_u32("llama.attention.sliding_window", 8);
         w.add_i32_array("llama.attention.sliding_window_pattern", {1, 0, 1});
       },
       "sliding_window_pattern' has 3 elements, expected one per layer (4)"},
      {"period0",
       [](io::GgufWriter& w) {
         w.add_u32("llama.attention.sliding_window", 8);
         w.add_u32("llama.attention.sliding_window_pattern", 0);
       },
       "sliding_window_pattern' = 0"},
      {"floats",
       [](io::GgufWriter& w) {
         w.add_u32("llama.attention.sliding_window", 8);
         w.add_f32_array("llama.attention.sliding_window_pattern", {1, 0, 1, 0});
       },
       "expected bools or integers"},
      {"orphan", [](io::GgufWriter& w) { w.add_u32("llama.attention.sliding_window_pattern", 2); },
       "without 'llama.attention.sliding_window'"},
  };
  for (const auto& c : cases) {
    const std::string msg = test::load_error(write_with(t, c.name, c.meta));
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.name << ": " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << c.name << ": " << msg;
  }
}

// Cached decoding over a context six times the window equals the no-cache oracle with
// the same mask, with and without a pattern, keys cached after and before RoPE.
TEST(Swa, CachedDecodingEqualsTheNoCacheOracle) {
  test::TempDir t;
  ThreadPool pool(2);
  const std::vector<int> tokens = token_stream(120);
  double worst = 0;
  for (const auto& [arch, pattern] :
       std::vector<std::pair<std::string, int>>{{"llama", 0}, {"llama", 2}, {"qwen3", 2}}) {
    const auto m =
        model::Model::load(synth(t, arch + std::to_string(pattern), small(arch, kWindow, pattern)));
    const model::ModelConfig& c = m->config();
    for (kv::KeyRope rope : {kv::KeyRope::kPost, kv::KeyRope::kPre}) {
      const std::string what =
          arch + " pattern " + std::to_string(pattern) + " keys " + kv::key_rope_name(rope);
      runtime::Session s(*m, session_of(cache_of(kv::Format::kF32, rope), 128));
      // A batched prefill of 30 tokens (past the window), then one token at a time; the
      // logits after n tokens against the oracle's over the same n.
      const float* got = s.prefill(std::vector<int>(tokens.begin(), tokens.begin() + 30));
      for (int n = 30; n <= static_cast<int>(tokens.size()); ++n) {
        if (n > 30) got = s.decode(tokens[n - 1]);
        if (n != 30 && n != 31 && n % 23 != 0 && n != 120) continue;
        const std::vector<int> prefix(tokens.begin(), tokens.begin() + n);
        const auto oracle = model::forward_no_cache(*m, prefix, &pool);
        const double d = max_diff(got, oracle);
        worst = std::max(worst, d);
        EXPECT_LT(d, 1e-5) << what << " at " << n;
      }
      EXPECT_EQ(s.pos(), 120) << what;
      for (int l = 0; l < c.n_layers; ++l) {
        if (c.layer_window(l) > 0) {
          // The whole stored blocks before the window are gone: at most W + B tokens held.
          EXPECT_GT(s.cache().evicted(l), 0) << what << " layer " << l;
          EXPECT_LE(s.cache().n_tokens(l), kWindow + 8) << what << " layer " << l;
        } else {
          EXPECT_EQ(s.cache().evicted(l), 0) << what << " layer " << l;
        }
        EXPECT_EQ(s.cache().position(l), 120) << what << " layer " << l;
      }
    }
  }
  std::printf("cached decoding against the no-cache oracle: largest logit difference %.3g\n",
              worst);
  // The oracle masks: without the window the logits differ.
  const auto m = model::Model::load(synth(t, "llama0", small("llama", kWindow, 0)));
  const auto full = model::Model::load(synth(t, "full", small("llama", 0, 0)));
  const auto a = model::forward_no_cache(*m, tokens, &pool);
  const auto b = model::forward_no_cache(*full, tokens, &pool);
  std::printf("the window's effect on the oracle's logits: %.3g\n", max_diff(a.data(), b));
  EXPECT_GT(max_diff(a.data(), b), 1e-3);
}

// Every format runs far past the window; a windowed layer's reservation does not depend
// on the context, the cache's accounting is exact, and evicting blocks gives the logits
// of a cache that keeps every token and only masks (the same weights without the window
// keys, attended with ForwardOptions::window): equal within 1e-5 (summation order).
TEST(Swa, EveryFormatStaysBoundedAndEvictionChangesNothing) {
  test::TempDir t;
  const auto m = model::Model::load(synth(t, "swa", small("llama", kWindow, 2)));
  const auto full = model::Model::load(synth(t, "full", small("llama", 0, 0)));
  const std::vector<int> tokens = token_stream(200);
  struct Fmt {
    kv::Format f;
    kv::KeyRope rope;
    int residual;  // KIVI: 32 holds more tokens than the window of 20 in the ring
  };
  for (const Fmt& f : std::vector<Fmt>{{kv::Format::kF16, kv::KeyRope::kPost, 16},
                                       {kv::Format::kInt8, kv::KeyRope::kPre, 16},
                                       {kv::Format::kKivi2, kv::KeyRope::kPost, 16},
                                       {kv::Format::kKivi4, kv::KeyRope::kPre, 16},
                                       {kv::Format::kKivi2, kv::KeyRope::kPre, 32}}) {
    const std::string what = kv::format_name(f.f) + std::string(" R ") + std::to_string(f.residual);
    kv::CacheConfig cc = cache_of(f.f, f.rope);
    cc.residual = f.residual;
    uint64_t window_reserved = 0, full_reserved = 0;
    for (int ctx : {256, 512}) {
      runtime::Session s(*m, session_of(cc, ctx));
      const float* logits = s.prefill(std::vector<int>(tokens.begin(), tokens.begin() + 24));
      for (int n = 24; n < static_cast<int>(tokens.size()); ++n) logits = s.decode(tokens[n]);
      for (int v = 0; v < 300; ++v) ASSERT_TRUE(std::isfinite(logits[v])) << what;
      EXPECT_EQ(s.pos(), 200) << what;
      EXPECT_EQ(s.cache().bytes_reserved(), kv::expected_bytes_reserved(s.cache().config()))
          << what;
      EXPECT_EQ(s.cache().bytes_used(), kv::expected_bytes_used(s.cache().config(), 200)) << what;
      // Layer 0 is windowed: its reservation is the same at both contexts; layer 1 is full.
      if (ctx == 256) {
        window_reserved = s.cache().bytes_reserved(0);
        full_reserved = s.cache().bytes_reserved(1);
      } else {
        EXPECT_EQ(s.cache().bytes_reserved(0), window_reserved) << what;
        EXPECT_GT(s.cache().bytes_reserved(1), full_reserved) << what;
      }
      // A windowed layer holds its window, the residual ring and one block being filled.
      EXPECT_LT(s.cache().bytes_reserved(0), s.cache().bytes_reserved(1) / 2) << what;
      EXPECT_GT(s.cache().evicted(0), 0) << what;
      EXPECT_EQ(s.cache().evicted(1), 0) << what;
    }
  }
  // Eviction against masking only, on a model whose every layer is windowed.
  const auto every = model::Model::load(synth(t, "every", small("llama", kWindow, 0)));
  for (kv::Format f : {kv::Format::kF32, kv::Format::kF16, kv::Format::kInt8, kv::Format::kKivi2,
                       kv::Format::kKivi4}) {
    for (kv::KeyRope rope : {kv::KeyRope::kPost, kv::KeyRope::kPre}) {
      for (int residual : {16, 32}) {
        if (residual == 32 && !kv::is_kivi(f)) continue;  // a ring longer than the window
        const std::string what = std::string(kv::format_name(f)) + " keys " +
                                 kv::key_rope_name(rope) + " R " + std::to_string(residual);
        kv::CacheConfig cc = cache_of(f, rope);
        cc.residual = residual;
        runtime::Session s(*every, session_of(cc, 256));
        runtime::SessionOptions ro = session_of(cc, 256);
        ro.forward.window = kWindow;
        runtime::Session r(*full, ro);
        const float* a = s.prefill(std::vector<int>(tokens.begin(), tokens.begin() + 24));
        const float* b = r.prefill(std::vector<int>(tokens.begin(), tokens.begin() + 24));
        double d = max_diff(a, std::vector<float>(b, b + 300));
        for (int n = 24; n < 150; ++n) {
          a = s.decode(tokens[n]);
          b = r.decode(tokens[n]);
          d = std::max(d, max_diff(a, std::vector<float>(b, b + 300)));
        }
        EXPECT_LT(d, 1e-5) << what;
        std::printf("%s: eviction against masking only, largest logit difference %.3g\n",
                    what.c_str(), d);
        EXPECT_GT(s.cache().evicted(0), 100) << what;
        EXPECT_EQ(r.cache().evicted(0), 0) << what;
      }
    }
  }
}

TEST(Swa, SparseSelectsInTheGlobalLayersOnly) {
  // Layers 0 and 2 windowed, 1 and 3 global. With a budget that covers the context every
  // global layer attends every block, so the logits equal dense attention's; a small
  // budget selects (the logits move) and the windowed layers keep their windows.
  test::TempDir t;
  const auto m = model::Model::load(synth(t, "swa", small("llama", kWindow, 2)));
  const kv::CacheConfig cc = cache_of(kv::Format::kF16, kv::KeyRope::kPost);
  std::vector<int> prompt = {1};
  for (int i = 0; i < 300; ++i) prompt.push_back(3 + (i * 53) % 290);
  auto run = [&](int budget) {
    runtime::SessionOptions o = session_of(cc, 512);
    o.forward.prefill = attn::PrefillMode::kStream;  // as the sparse layers attend
    if (budget > 0) {
      o.sparse.kind = sparse::Kind::kQuest;
      o.sparse.block = 16;
      o.sparse.budget = budget;
    }
    runtime::Session s(*m, o);
    const float* l = s.prefill(prompt);
    return std::vector<float>(l, l + m->config().vocab_size);
  };
  const auto dense = run(0);
  EXPECT_EQ(max_diff(run(512).data(), dense), 0.0);
  EXPECT_GT(max_diff(run(32).data(), dense), 1e-4);
}

TEST(Swa, RefusedCombinationsSaySo) {
  test::TempDir t;
  const auto m = model::Model::load(synth(t, "swa", small("llama", kWindow, 2)));
  auto error_of = [&](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  const kv::CacheConfig cc = cache_of(kv::Format::kF16, kv::KeyRope::kPost);
  for (auto overflow : {runtime::ContextOverflow::kShift, runtime::ContextOverflow::kWindow}) {
    runtime::SessionOptions o = session_of(cc, 128);
    o.overflow = overflow;
    const std::string e = error_of([&] { runtime::Session s(*m, o); });
    EXPECT_NE(e.find("not supported with the model's sliding-window attention"), std::string::npos)
        << e;
  }
  // Block-sparse attention: reusing a selection across layers is refused (a windowed
  // layer selects nothing), and so is a model whose every layer is windowed.
  runtime::SessionOptions sp = session_of(cc, 128);
  sp.sparse.kind = sparse::Kind::kQuest;
  sp.sparse.reuse_layers = 2;
  EXPECT_NE(error_of([&] { runtime::Session s(*m, sp); }).find("--sparse-reuse-layers 2"),
            std::string::npos);
  sp.sparse.reuse_layers = 1;
  const auto all = model::Model::load(synth(t, "swa_all", small("llama", kWindow, 0)));
  EXPECT_NE(error_of([&] { runtime::Session s(*all, sp); }).find("nothing to select"),
            std::string::npos);
  runtime::SessionOptions sh = session_of(cc, 128);
  sh.cache.share_every = 2;  // layer 1 (full) would read layer 0 (windowed)
  EXPECT_NE(error_of([&] { runtime::Session s(*m, sh); }).find("sliding-window layers"),
            std::string::npos);
  // KV files do not record evicted blocks.
  {
    runtime::Session s(*m, session_of(cc, 128));
    s.prefill({1, 5, 9});
    EXPECT_NE(error_of([&] {
                runtime::save_session(s, {1, 5, 9}, 3, 0.0, t.file("swa.kv"));
              }).find("--kv-save: models with sliding-window layers"),
              std::string::npos);
    EXPECT_NE(error_of([&] {
                runtime::load_session(s, t.file("swa.kv"));
              }).find("--kv-load: models with sliding-window layers"),
              std::string::npos);
  }
  // A shared block pool.
  kv::CacheConfig shaped = cc;
  shaped.n_layers = 4;
  shaped.n_kv_heads = 2;
  shaped.head_dim = 16;
  shaped.ctx = 128;
  shaped.layer_window = m->config().layer_windows();
  kv::BlockPool bp(shaped, 16);
  EXPECT_NE(error_of([&] { kv::KvCache c(bp, 128); }).find("shared block pool"), std::string::npos);
}

TEST(Swa, ServingGivesTheTokensOfOneSession) {
  // The server keeps every block of a windowed layer (the pool shares them by prefix) and
  // masks attention to the window: three concurrent requests get the greedy tokens a
  // session with an evicting cache gives each alone.
  test::TempDir t;
  const auto m = model::Model::load(synth(t, "swa", small("llama", kWindow, 2)));
  const kv::CacheConfig cc = cache_of(kv::Format::kF32, kv::KeyRope::kPost);
  runtime::SchedulerOptions so;
  so.ctx = 256;
  so.parallel = 3;
  so.cache = cc;
  so.threads = 2;
  runtime::Scheduler sched(*m, so);
  std::vector<std::shared_ptr<runtime::RequestHandle>> handles(3);
  std::vector<std::vector<int>> prompts, want;
  for (int i = 0; i < 3; ++i) {
    std::vector<int> p = {1};
    for (int j = 0; j < 30 + 11 * i; ++j) p.push_back(3 + (j * 31 + i * 7) % 290);
    prompts.push_back(p);
    runtime::Session s(*m, session_of(cc, 256));
    const float* l = s.prefill(p);
    std::vector<int> gen;
    for (int k = 0; k < 40; ++k) {
      int best = 3;  // ids 0-2 (unknown, BOS, EOS) would end the request
      for (int v = 4; v < m->config().vocab_size; ++v) best = l[v] > l[best] ? v : best;
      gen.push_back(best);
      l = s.decode(best);
    }
    want.push_back(gen);
    runtime::GenerationRequest r;
    r.prompt = p;
    r.max_tokens = 40;
    r.sampling.temperature = 0.0f;
    r.ignore_eos = true;
    ASSERT_EQ(sched.submit(r, &handles[i]), runtime::Scheduler::Submit::kQueued);
  }
  for (int i = 0; i < 3; ++i) {
    std::vector<int> got;
    for (;;) {
      auto u = handles[i]->wait(std::chrono::milliseconds(100));
      got.insert(got.end(), u.tokens.begin(), u.tokens.end());
      if (u.finished) break;
    }
    EXPECT_EQ(got, want[i]) << "request " << i;
  }
  sched.stop();
}

TEST(Swa, SynthWritesItAndInfoShowsIt) {
  test::TempDir t;
  const std::string path = t.file("cli.gguf");
  auto r =
      test::run(test::kivi_cmd("synth --preset tiny --layers 4 --sliding-window 24 "
                               "--sliding-window-pattern 2 -o '" +
                               path + "'"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = test::run(test::kivi_cmd("info '" + path + "' --json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("\"sliding_window\":24"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"sliding_window_layers\":[true,false,true,false]"), std::string::npos)
      << r.out;
  r = test::run(test::kivi_cmd("info '" + path + "'"));
  EXPECT_NE(r.out.find("sliding window   24 tokens in 2 of 4 layers"), std::string::npos) << r.out;
  r = test::run(test::kivi_cmd("synth --preset tiny --sliding-window-pattern 2 -o '" + path + "'"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--sliding-window-pattern needs --sliding-window"), std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace kivi
