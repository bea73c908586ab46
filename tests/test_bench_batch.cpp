// `kivi bench-batch` on a tiny synthetic model: every format's batched steps over
// random-filled caches in a shared pool give each sequence the logits a session gives
// it alone with the same fill, bit for bit; the summaries are consistent; bad options
// are one clear error.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "kv/format.h"
#include "model/model.h"
#include "model/synth.h"
#include "runtime/bench.h"
#include "runtime/bench_batch.h"
#include "runtime/session.h"
#include "test_util.h"

namespace kivi {
namespace {

using test::kivi_cmd;
using test::run;

// A tiny llama shape (GQA, two layers) with seeded random weights.
const std::string& tiny_path() {
  static test::TempDir dir;
  static const std::string path = [] {
    model::SynthSpec s;
    model::ModelConfig& c = s.config;
    c.n_layers = 2;
    c.dim = 64;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.hidden_dim = 128;
    c.vocab_size = 300;
    c.ctx = 1024;
    c.rope_theta = 10000.0f;
    c.synthetic = true;
    s.label = "tiny";
    s.outtype = "f16";
    s.seed = 3;
    const std::string p = dir.file("tiny.gguf");
    model::write_synthetic_gguf(s, p);
    return p;
  }();
  return path;
}

const model::Model& tiny() {
  static auto m = model::Model::load(tiny_path());
  return *m;
}

kv::CacheConfig cache(kv::Format k, kv::Format v) {
  kv::CacheConfig c;
  c.k.format = k;
  c.v.format = v;
  c.group_size = 32;
  c.residual = 32;
  return c;
}

runtime::BatchBenchConfig config() {
  runtime::BatchBenchConfig b;
  b.names = {"f16", "int8", "kivi2", "kivi4/kivi2"};
  b.caches = {
      cache(kv::Format::kF16, kv::Format::kF16), cache(kv::Format::kInt8, kv::Format::kInt8),
      cache(kv::Format::kKivi2, kv::Format::kKivi2), cache(kv::Format::kKivi4, kv::Format::kKivi2)};
  b.batches = {1, 5, 2};
  b.fill = 150;  // not a whole number of blocks or key groups
  b.steps = 4;
  b.threads = 2;  // batch 5 attends sequence-parallel, batches 1 and 2 head-parallel
  b.probe = false;
  b.record = true;
  return b;
}

// Every sequence's logits, replayed alone: a session whose cache holds the same random
// fill decodes the tokens the sequence was fed, in order, and gives the same bits.
TEST(BenchBatch, EverySequenceGetsTheLogitsItGetsAlone) {
  const auto& m = tiny();
  const auto cfg = config();
  const auto r = runtime::run_bench_batch(m, cfg);
  const int V = m.config().vocab_size;
  ASSERT_EQ(r.records.size(), cfg.caches.size());
  EXPECT_EQ(r.ctx, cfg.fill + (cfg.steps + 1) * 3);
  for (size_t f = 0; f < cfg.caches.size(); ++f) {
    ASSERT_EQ(r.records[f].size(), 5u);
    for (int s = 0; s < 5; ++s) {
      const auto& rec = r.records[f][s];
      // Sequence s takes part in every batch larger than s, once per round and warm-up.
      int batches = 0;
      for (int b : cfg.batches) batches += b > s;
      ASSERT_EQ(rec.tokens.size(), static_cast<size_t>((cfg.steps + 1) * batches));
      ASSERT_EQ(rec.logits.size(), rec.tokens.size() * V);
      runtime::SessionOptions o;
      o.ctx = r.ctx;
      o.threads = 1;
      o.cache = cfg.caches[f];
      runtime::Session alone(m, o);
      runtime::fill_random({&alone.cache()}, cfg.fill, cfg.seed + s);
      for (size_t i = 0; i < rec.tokens.size(); ++i) {
        const float* l = alone.decode(rec.tokens[i]);
        ASSERT_EQ(std::memcmp(l, &rec.logits[i * V], V * sizeof(float)), 0)
            << cfg.names[f] << " sequence " << s << " step " << i;
      }
    }
  }
}

TEST(BenchBatch, SummariesAreConsistent) {
  const auto& m = tiny();
  auto cfg = config();
  cfg.record = false;
  cfg.probe = true;
  cfg.probe_bytes = 4 << 20;
  const auto r = runtime::run_bench_batch(m, cfg);
  ASSERT_EQ(r.rows.size(), cfg.caches.size() * cfg.batches.size());
  EXPECT_GT(r.probe_gbps, 0);
  EXPECT_EQ(r.weight_bytes_step, runtime::step_weight_bytes(m));
  // Two layers of q, k, v, o (64x64, 2x 32x64, 64x64), gate, up, down (128x64 each) and
  // the classifier (300x64), all F16.
  EXPECT_EQ(r.weight_bytes_step,
            2u * (64 * 64 * 2 + 32 * 64 * 2 + 3 * 128 * 64) * 2 + 300 * 64 * 2);
  for (const auto& x : r.rows) {
    ASSERT_EQ(x.step_seconds.size(), static_cast<size_t>(cfg.steps));
    EXPECT_GT(x.step_median, 0);
    EXPECT_GE(x.attn_median, 0);
    EXPECT_LE(x.attn_median, x.step_median);
    EXPECT_DOUBLE_EQ(x.agg_tps, x.batch / x.step_median);
    EXPECT_DOUBLE_EQ(x.seq_tps, 1.0 / x.step_median);
    EXPECT_GT(x.kv_bytes_per_seq, 0u);
    EXPECT_GE(x.cache_bytes_step, x.kv_bytes_per_seq * x.batch);
    EXPECT_NEAR(x.roofline_seconds,
                (r.weight_bytes_step + x.cache_bytes_step) / (r.probe_gbps * 1e9), 1e-12);
    if (x.batch == 1) {
      EXPECT_DOUBLE_EQ(x.vs_batch1, 1.0);
    }
    if (x.format == 0) {
      EXPECT_DOUBLE_EQ(x.vs_f16, 1.0);
    }
    EXPECT_GT(x.vs_batch1, 0);
    EXPECT_GT(x.vs_f16, 0);
  }
  // Per sequence, the compressed formats hold fewer bytes than f16 (the same batch).
  for (const auto& x : r.rows) {
    if (x.format == 0) continue;
    for (const auto& f16 : r.rows) {
      if (f16.format == 0 && f16.batch == x.batch) {
        EXPECT_LT(x.kv_bytes_per_seq, f16.kv_bytes_per_seq) << x.name;
      }
    }
  }
}

TEST(BenchBatch, BadConfigurationsAreErrors) {
  const auto& m = tiny();
  auto expect_error = [&](runtime::BatchBenchConfig c, const char* what) {
    try {
      runtime::run_bench_batch(m, c);
      ADD_FAILURE() << "no error for " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  auto c = config();
  c.batches = {};
  expect_error(c, "no batch sizes");
  c = config();
  c.batches = {2, 0};
  expect_error(c, "batch size 0");
  c = config();
  c.batches = {2, 2};
  expect_error(c, "listed twice");
  c = config();
  c.steps = 0;
  expect_error(c, "steps");
  c = config();
  c.names.pop_back();
  expect_error(c, "names");
  c = config();
  c.caches[1].share_every = 2;
  expect_error(c, "cross-layer sharing");
}

TEST(BenchBatch, CommandLine) {
  const std::string m = "-m '" + tiny_path() + "' ";
  const auto ok = run(kivi_cmd("bench-batch " + m +
                               "--batch 1,3 --ctx-fill 64 -n 2 --threads 1 --kv-cache f16,kivi2 "
                               "--no-probe --json"));
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_NE(ok.out.find("\"results\":["), std::string::npos) << ok.out;
  EXPECT_NE(ok.out.find("\"format\":\"kivi2\",\"kv_cache\""), std::string::npos) << ok.out;
  EXPECT_NE(ok.out.find("\"roofline_ms\":null"), std::string::npos) << ok.out;
  const auto table =
      run(kivi_cmd("bench-batch " + m + "--batch 2 --ctx-fill 1k -n 1 --threads 1 --kv-cache f16"));
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_NE(table.out.find("1024 random positions"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("roofline"), std::string::npos) << table.out;

  struct Bad {
    std::string args, message;
  };
  const std::vector<Bad> bad = {
      {"--batch 0", "--batch = 0 is out of range"},
      {"--batch 2,x", "--batch: 'x' is not an integer"},
      {"--batch 4,4", "--batch lists 4 twice"},
      {"--ctx-fill 1,2", "--ctx-fill '1,2': expected one number"},
      {"--ctx-fill -5", "--ctx-fill = -5 is out of range"},
      {"-n 0", "--n = 0 is out of range"},
      {"--kv-cache f16,f16", "--kv-cache lists f16 twice"},
      {"--kv-cache f17", "f17"},
      {"--kv-cache f16 --kv-share 2", "cross-layer sharing"},
      {"--ctx 100", "--ctx has no effect"},
      {"--bogus", "bogus"},
  };
  for (const auto& b : bad) {
    const auto r = run(kivi_cmd("bench-batch " + m + b.args + " --no-probe"));
    EXPECT_EQ(r.exit_code, 1) << b.args << ": " << r.err;
    EXPECT_EQ(r.err.rfind("kivi: error: ", 0), 0u) << b.args << ": " << r.err;
    EXPECT_NE(r.err.find(b.message), std::string::npos) << b.args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << b.args << ": " << r.err;
  }
}

}  // namespace
}  // namespace kivi
