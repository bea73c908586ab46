// KV cache files (runtime/kv_file.h, runtime/session_file.h) on stories260K: continuing
// from a loaded cache gives the bits of continuing the session that saved it, and every
// kind of bad file is refused with one line naming the problem.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "core/checksum.h"
#include "core/error.h"
#include "kv/format.h"
#include "model/context_parallel.h"
#include "model/model.h"
#include "model/presets.h"
#include "model/synth.h"
#include "runtime/kv_file.h"
#include "runtime/session.h"
#include "runtime/session_file.h"
#include "test_util.h"

namespace kivi {
namespace {

using runtime::Session;
using runtime::SessionOptions;

using test::stories;

struct Case {
  const char* name;
  const char* k;
  const char* v;
  int group = 32, residual = 32;
  kv::Int8Granularity gran = kv::Int8Granularity::kHead;
  kv::KeyRope rope = kv::KeyRope::kPost;
  kv::KeyFlush flush = kv::KeyFlush::kBatch;
  sparse::Kind sparse = sparse::Kind::kOff;
  int ctx = 256;            // 128: the prompt overflows it (window policy)
  const char* layers = "";  // --kv-cache-layers
  kv::KvRotate rotate = kv::KvRotate::kNone;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

SessionOptions options(const Case& c, int ctx = 0) {
  SessionOptions o;
  o.threads = 2;
  o.ctx = ctx ? ctx : c.ctx;
  if (c.ctx < 150) {  // no sinks: a window of 64 tokens after one block of 64 dropped at a time
    o.overflow = runtime::ContextOverflow::kWindow;
    o.sinks = 0;
  }
  o.cache.k = {kv::parse_format(c.k), c.gran};
  o.cache.v = {kv::parse_format(c.v), c.gran};
  o.cache.group_size = c.group;
  o.cache.residual = c.residual;
  o.cache.key_rope = c.rope;
  o.cache.key_flush = c.flush;
  o.cache.layer_map = c.layers;
  o.cache.rotate = c.rotate;
  if (c.sparse != sparse::Kind::kOff) {
    o.sparse.kind = c.sparse;
    o.sparse.block = 32;
    o.sparse.budget = 32;
    o.sparse.sinks = 4;
    o.sparse.local = 32;
  }
  return o;
}

// Token ids 1..n-ish from the model's tokenizer, deterministic.
std::vector<int> text_tokens(const std::string& s, bool bos) {
  return stories().tokenizer().encode(s, bos);
}

// Feeds `follow` then greedy-decodes `steps` tokens; returns every logit seen.
std::vector<float> continue_greedy(Session& s, const std::vector<int>& follow, int steps) {
  const int V = s.vocab();
  const float* lg = s.prefill(follow);
  std::vector<float> out(lg, lg + V);
  for (int i = 0; i < steps; ++i) {
    int best = 0;
    for (int t = 1; t < V; ++t) best = lg[t] > lg[best] ? t : best;
    lg = s.decode(best);
    out.insert(out.end(), lg, lg + V);
  }
  return out;
}

// The first 150 tokens of the shared text: several storage blocks of 32-token key groups,
// with 22 tokens left in a KIVI residual window of 32.
std::vector<int> long_prompt() {
  const std::vector<uint8_t> bytes = test::read_file(test::text_path());
  const std::string text(bytes.begin(), bytes.begin() + std::min<size_t>(bytes.size(), 4000));
  std::vector<int> t = text_tokens(text, true);
  t.resize(150);
  return t;
}

class KvFileContinue : public ::testing::TestWithParam<Case> {};

TEST_P(KvFileContinue, LoadedCacheContinuesBitForBit) {
  KIVI_REQUIRE_MODEL();
  const Case c = GetParam();
  test::TempDir dir;
  const std::string path = dir.file("cache.kv");
  const std::vector<int> prompt = long_prompt();
  const std::vector<int> follow1 = text_tokens("One day", false),
                         follow2 = text_tokens("The dog ran", false);

  Session a(stories(), options(c));
  a.prefill(prompt);
  const int saved_pos = a.pos();
  const int64_t saved_dropped = a.dropped();
  runtime::save_session(a, prompt, static_cast<int64_t>(prompt.size()), 0.25, path);
  if (c.ctx < 150) {
    ASSERT_GT(a.dropped(), 0);  // the window moved during the prefill
  } else if (kv::is_kivi(a.cache().config().k.format)) {
    // The prompt leaves the residual window partly filled.
    const kv::LayerState st = a.cache().layer_state(0);
    ASSERT_GT(st.n - st.k.n_stored, 0);
    ASSERT_LT(st.n - st.k.n_stored, 32);
  }
  const std::vector<float> want1 = continue_greedy(a, follow1, 6);
  if (c.sparse != sparse::Kind::kOff) {
    // Block selection skipped some of the context.
    const auto& st = a.sparse()->stats();
    EXPECT_LT(st.tokens_attended, st.tokens_context);
  }
  a.reset();
  a.prefill(prompt);
  const std::vector<float> want2 = continue_greedy(a, follow2, 6);

  // One session loads the file twice, continuing with different follow-ups.
  Session b(stories(), options(c));
  for (int round = 0; round < 2; ++round) {
    const runtime::LoadedSession got = runtime::load_session(b, path);
    EXPECT_EQ(got.n_tokens, saved_pos);
    EXPECT_EQ(got.tokens, prompt);
    EXPECT_EQ(got.prefill_tokens, static_cast<int64_t>(prompt.size()));
    EXPECT_EQ(got.prefill_seconds, 0.25);
    EXPECT_EQ(b.pos(), saved_pos);
    EXPECT_EQ(b.dropped(), saved_dropped);
    const std::vector<float> gotl = continue_greedy(b, round ? follow2 : follow1, 6);
    const std::vector<float>& want = round ? want2 : want1;
    ASSERT_EQ(gotl.size(), want.size());
    EXPECT_EQ(std::memcmp(gotl.data(), want.data(), want.size() * sizeof(float)), 0)
        << c.name << " round " << round;
  }
  if (c.ctx < 150) return;  // the window policy needs the same context
  // A session with a larger context takes the file too.
  Session big(stories(), options(c, 512));
  runtime::load_session(big, path);
  EXPECT_EQ(big.pos(), static_cast<int>(prompt.size()));
}

INSTANTIATE_TEST_SUITE_P(
    Formats, KvFileContinue,
    ::testing::Values(Case{"f16", "f16", "f16"}, Case{"int8_head", "int8", "int8"},
                      Case{"int8_tensor", "int8", "int8", 32, 32, kv::Int8Granularity::kTensor},
                      Case{"int8_token", "int8", "int8", 32, 32, kv::Int8Granularity::kToken},
                      Case{"kivi2", "kivi2", "kivi2"},
                      Case{"kivi4_group_flush", "kivi4", "kivi4", 32, 32,
                           kv::Int8Granularity::kHead, kv::KeyRope::kPost, kv::KeyFlush::kGroup},
                      Case{"kivi2_pre_rope", "kivi2", "kivi2", 32, 32, kv::Int8Granularity::kHead,
                           kv::KeyRope::kPre},
                      Case{"tq3", "tq3", "tq3"},
                      Case{"per_layer", "f32", "f32", 32, 32, kv::Int8Granularity::kHead,
                           kv::KeyRope::kPost, kv::KeyFlush::kBatch, sparse::Kind::kOff, 256,
                           "0:kivi2/tq3;1-2:int8/kivi4;*:tq2.5/f16"},
                      Case{"rotated", "int8", "kivi2", 32, 32, kv::Int8Granularity::kToken,
                           kv::KeyRope::kPost, kv::KeyFlush::kBatch, sparse::Kind::kOff, 256, "",
                           kv::KvRotate::kHadamard},
                      Case{"kivi2_pre_rope_tq2_5", "kivi2", "tq2.5", 32, 32,
                           kv::Int8Granularity::kHead, kv::KeyRope::kPre},
                      Case{"tq4_sparse_quest", "tq4", "tq2", 32, 32, kv::Int8Granularity::kHead,
                           kv::KeyRope::kPost, kv::KeyFlush::kBatch, sparse::Kind::kQuest},
                      Case{"tq3_window", "tq3", "tq3", 32, 32, kv::Int8Granularity::kHead,
                           kv::KeyRope::kPost, kv::KeyFlush::kBatch, sparse::Kind::kOff, 128},
                      // Every selection kind, so that every summary kind is written and read.
                      Case{"f16_sparse_quest", "f16", "f16", 32, 32, kv::Int8Granularity::kHead,
                           kv::KeyRope::kPost, kv::KeyFlush::kBatch, sparse::Kind::kQuest},
                      Case{"kivi2_sparse_quest", "kivi2", "kivi2", 32, 32,
                           kv::Int8Granularity::kHead, kv::KeyRope::kPost, kv::KeyFlush::kBatch,
                           sparse::Kind::kQuest},
                      Case{"kivi2_sparse_max", "kivi2", "kivi2", 32, 32, kv::Int8Granularity::kHead,
                           kv::KeyRope::kPost, kv::KeyFlush::kBatch, sparse::Kind::kMax},
                      Case{"f16_sparse_mean", "f16", "f16", 32, 32, kv::Int8Granularity::kHead,
                           kv::KeyRope::kPost, kv::KeyFlush::kBatch, sparse::Kind::kMean},
                      Case{"kivi2_sparse_fix", "kivi2", "kivi2", 32, 32, kv::Int8Granularity::kHead,
                           kv::KeyRope::kPost, kv::KeyFlush::kBatch, sparse::Kind::kFix},
                      Case{"f16_sparse_random", "f16", "f16", 32, 32, kv::Int8Granularity::kHead,
                           kv::KeyRope::kPost, kv::KeyFlush::kBatch, sparse::Kind::kRandom},
                      Case{"kivi2_window", "kivi2", "kivi2", 32, 32, kv::Int8Granularity::kHead,
                           kv::KeyRope::kPost, kv::KeyFlush::kBatch, sparse::Kind::kOff, 128},
                      Case{"f16_pre_rope_window", "f16", "f16", 32, 32, kv::Int8Granularity::kHead,
                           kv::KeyRope::kPre, kv::KeyFlush::kBatch, sparse::Kind::kOff, 128}),
    [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

// Recomputes every checksum of a KV file (after a test edits it on purpose), so that
// the loader's other checks are reached.
void reseal(std::vector<uint8_t>& f) {
  uint32_t n;
  std::memcpy(&n, f.data() + 12, 4);
  for (uint32_t i = 0; i < n; ++i) {
    uint8_t* t = f.data() + 64 + 32 * i;
    uint64_t off, bytes;
    std::memcpy(&off, t + 8, 8);
    std::memcpy(&bytes, t + 16, 8);
    const uint64_t sum = Checksum::of(f.data() + off, bytes);
    std::memcpy(t + 24, &sum, 8);
  }
  Checksum h;
  h.update(f.data(), 56);
  h.update(f.data() + 64, 32 * static_cast<size_t>(n));
  const uint64_t sum = h.digest();
  std::memcpy(f.data() + 56, &sum, 8);
}

// The error a load of `bytes` into a session with options `o` throws ("" if none).
std::string load_error(const std::vector<uint8_t>& bytes, const SessionOptions& o) {
  test::TempDir dir;
  const std::string p = dir.file("x.kv");
  test::write_file(p, bytes);
  Session s(stories(), o);
  try {
    runtime::load_session(s, p);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void expect_refused(const std::vector<uint8_t>& bytes, const SessionOptions& o,
                    const std::string& words) {
  const std::string e = load_error(bytes, o);
  EXPECT_NE(e.find(words), std::string::npos) << "error: '" << e << "', expected: " << words;
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
}

TEST(KvFile, HostileAndMismatchedFilesAreRefusedWithOneLine) {
  KIVI_REQUIRE_MODEL();
  test::TempDir dir;
  const std::string path = dir.file("c.kv");
  const Case c{"kivi2", "kivi2", "kivi2"};
  {
    Session a(stories(), options(c));
    a.prefill(long_prompt());
    runtime::save_session(a, long_prompt(), 10, 0.1, path);
  }
  const std::vector<uint8_t> good = test::read_file(path);
  ASSERT_EQ(load_error(good, options(c)), "");

  std::vector<uint8_t> f = good;
  f[0] = 'X';
  expect_refused(f, options(c), "not a kivi KV cache file");
  f = good;
  f[8] = 1;  // version
  reseal(f);
  expect_refused(f, options(c), "version 1; this build reads version 4");
  f = good;
  f[16] ^= 1;  // the model fingerprint
  reseal(f);
  expect_refused(f, options(c), "another model");
  expect_refused(std::vector<uint8_t>(good.begin(), good.end() - 100), options(c), "truncated");
  expect_refused(std::vector<uint8_t>(good.begin(), good.begin() + 40), options(c), "truncated");
  f = good;
  f[f.size() - 7] ^= 0x10;  // a byte of the last section
  expect_refused(f, options(c), "corrupted (checksum mismatch)");
  f = good;
  f[64 + 20] ^= 1;  // the table
  expect_refused(f, options(c), "corrupted");

  // Another configuration, another context.
  expect_refused(good, options(Case{"int8", "int8", "int8"}),
                 "key format: kivi2 in the file, int8");
  expect_refused(good, options(Case{"kivi2g", "kivi2", "kivi2", 32, 64}), "residual: 32");
  expect_refused(
      good,
      options(Case{"pre", "kivi2", "kivi2", 32, 32, kv::Int8Granularity::kHead, kv::KeyRope::kPre}),
      "key RoPE");
  expect_refused(good, options(c, 128), "larger than this session's 128");

  // A layer state the cache's rules cannot reach, sealed with valid checksums.
  f = good;
  uint64_t off;
  std::memcpy(&off, f.data() + 64 + 32 * 3 + 8, 8);  // section 3: layer 0's state
  int32_t n_stored;
  std::memcpy(&n_stored, f.data() + off + 4, 4);
  n_stored += 1;
  std::memcpy(f.data() + off + 4, &n_stored, 4);
  reseal(f);
  expect_refused(f, options(c), "not whole groups");
  // A token id outside the vocabulary.
  f = good;
  std::memcpy(&off, f.data() + 64 + 32 * 2 + 8, 8);  // section 2: tokens
  const int32_t bad = 100000;
  std::memcpy(f.data() + off, &bad, 4);
  reseal(f);
  expect_refused(f, options(c), "outside the vocabulary");
}

// tq caches: the file records the rotation seed and the codebooks' fingerprints; a session
// with another seed, or a file whose codebooks are not this build's, is refused by name.
TEST(KvFile, TqFilesNameTheirRotationSeedAndCodebooks) {
  KIVI_REQUIRE_MODEL();
  test::TempDir dir;
  const std::string path = dir.file("tq.kv");
  const Case c{"tq3", "tq3", "tq2.5"};
  {
    Session a(stories(), options(c));
    a.prefill(long_prompt());
    runtime::save_session(a, long_prompt(), 10, 0.1, path);
  }
  const std::vector<uint8_t> good = test::read_file(path);
  ASSERT_EQ(load_error(good, options(c)), "");
  SessionOptions other = options(c);
  other.cache.rotation_seed = 12345;
  expect_refused(good, other, "rotation seed (low half): 0x6b697669 in the file, 0x00003039 here");
  // The config section (section 0) holds 32-bit fields; the 24th is the key codebook.
  std::vector<uint8_t> f = good;
  uint64_t off;
  std::memcpy(&off, f.data() + 64 + 8, 8);
  f[off + 4 * 23] ^= 1;
  reseal(f);
  expect_refused(f, options(c), "key codebook fingerprint");
}

// A file of a cache whose layers differ in format names the first layer whose formats differ
// from the session's; a map giving every layer one pair reads as that pair's uniform cache.
TEST(KvFile, PerLayerFilesNameTheLayerThatDiffers) {
  KIVI_REQUIRE_MODEL();
  test::TempDir dir;
  const std::string path = dir.file("layers.kv");
  Case c{"mix", "f32", "f32"};
  c.layers = "0:kivi2/tq3;*:kivi4";
  {
    Session a(stories(), options(c));
    a.prefill(long_prompt());
    runtime::save_session(a, long_prompt(), 10, 0.1, path);
  }
  const std::vector<uint8_t> good = test::read_file(path);
  ASSERT_EQ(load_error(good, options(c)), "");
  Case d = c;
  d.layers = "0:kivi2/tq3;1:kivi4;2:kivi4/kivi2;*:kivi4";
  expect_refused(good, options(d), "layer 2 value format: kivi4 in the file, kivi2 here");
  Case u{"uniform", "kivi4", "kivi4"};
  expect_refused(good, options(u), "per-layer formats: 5 in the file, 0 here");
  // One pair for every layer: the uniform cache's file.
  const std::string upath = dir.file("uniform.kv");
  {
    Case all = u;
    all.k = all.v = "f32";
    all.layers = "*:kivi4";
    Session a(stories(), options(all));
    a.prefill(long_prompt());
    runtime::save_session(a, long_prompt(), 10, 0.1, upath);
  }
  EXPECT_EQ(load_error(test::read_file(upath), options(u)), "");
}

// A file of a rotated cache records the rotation and its seed.
TEST(KvFile, RotatedFilesNameTheirRotation) {
  KIVI_REQUIRE_MODEL();
  test::TempDir dir;
  const std::string path = dir.file("rot.kv");
  Case c{"rot", "int8", "kivi2"};
  c.rotate = kv::KvRotate::kHadamard;
  {
    Session a(stories(), options(c));
    a.prefill(long_prompt());
    runtime::save_session(a, long_prompt(), 10, 0.1, path);
  }
  const std::vector<uint8_t> good = test::read_file(path);
  ASSERT_EQ(load_error(good, options(c)), "");
  Case plain = c;
  plain.rotate = kv::KvRotate::kNone;
  expect_refused(good, options(plain), "rotation: hadamard in the file, none here");
  SessionOptions seed = options(c);
  seed.cache.rotation_seed = 7;
  expect_refused(good, seed, "rotation seed (low half)");
}

// Rank 0 of two context shards in one process: the other shard is empty (the prompt
// fits the first), so its attention states carry no mass.
class EmptyNeighbour final : public model::CpComm {
 public:
  explicit EmptyNeighbour(int head_dim) : D_(head_dim) {}
  int rank() const override { return 0; }
  int size() const override { return 2; }
  void gather(const float* mine, size_t n, float* out) override {
    std::copy(mine, mine + n, out);
    for (size_t i = 0; i < n; i += static_cast<size_t>(D_) + 2) {
      std::fill(out + n + i, out + n + i + D_, 0.0f);
      out[n + i + D_] = -INFINITY;
      out[n + i + D_ + 1] = 0.0f;
    }
  }

 private:
  int D_;
};

TEST(KvFile, AContextShardsFileContinuesOnlyInThatShard) {
  KIVI_REQUIRE_MODEL();
  test::TempDir dir;
  const Case c{"kivi2", "kivi2", "kivi2"};
  EmptyNeighbour comm(stories().config().head_dim());
  SessionOptions shard = options(c, 512);
  shard.cp = &comm;
  const std::string path = dir.file("shard.kv"), whole = dir.file("whole.kv");
  std::vector<float> expected;
  {
    Session a(stories(), shard);
    ASSERT_NE(a.cp_shard(), nullptr);
    a.prefill(long_prompt());
    runtime::save_session(a, long_prompt(), 10, 0.1, path);
    const float* l = a.decode(5);
    expected.assign(l, l + stories().config().vocab_size);
    Session b(stories(), options(c, 512));
    b.prefill(long_prompt());
    runtime::save_session(b, long_prompt(), 10, 0.1, whole);
  }
  {
    // The loaded shard continues with the bits of the shard that saved it.
    Session a(stories(), shard);
    const auto r = runtime::load_session(a, path);
    EXPECT_EQ(r.n_tokens, static_cast<int>(long_prompt().size()));
    EXPECT_EQ(a.pos(), static_cast<int>(long_prompt().size()));
    const float* l = a.decode(5);
    EXPECT_TRUE(std::equal(expected.begin(), expected.end(), l));
  }
  const std::vector<uint8_t> good = test::read_file(path);
  expect_refused(good, options(c, 512), "saved by rank 0 of --dist cp=2");
  expect_refused(test::read_file(whole), shard, "saved with the whole context in one cache");
  // A shard record that does not add up, sealed with valid checksums: section 3.
  std::vector<uint8_t> f = good;
  uint64_t off;
  std::memcpy(&off, f.data() + 64 + 32 * 3 + 8, 8);
  const int32_t rank = 2;  // of 2 ranks
  std::memcpy(f.data() + off + 4, &rank, 4);
  reseal(f);
  expect_refused(f, shard, "the shard record (rank 2 of 2");
  f = good;
  const int64_t positions = 300;  // more than the shard holds
  std::memcpy(f.data() + off + 16, &positions, 8);
  reseal(f);
  expect_refused(f, shard, "is not valid");
}

TEST(KvFile, ASameShapedModelWithOtherWeightsIsAnotherModel) {
  test::TempDir dir;
  auto synth = [&](uint64_t seed) {
    model::SynthSpec s;
    s.config = model::find_preset("tiny").config;
    s.config.n_layers = 2;
    s.config.ctx = 256;
    s.label = "kv";
    s.seed = seed;
    const std::string path = dir.file(std::to_string(seed) + ".gguf");
    model::write_synthetic_gguf(s, path);
    return model::Model::load(path, "");
  };
  const auto a = synth(1), b = synth(2);
  // Random weights of one shape share the norms runtime::model_fingerprint reads.
  EXPECT_NE(runtime::cache_model_fingerprint(*a), runtime::cache_model_fingerprint(*b));
  SessionOptions o;
  o.threads = 1;
  o.cache.k = o.cache.v = {kv::Format::kKivi4, kv::Int8Granularity::kHead};
  Session sa(*a, o);
  sa.prefill({1, 5, 9, 200, 7});
  runtime::save_session(sa, {1, 5, 9, 200, 7}, 5, 0.0, dir.file("a.kv"));
  Session sb(*b, o);
  try {
    runtime::load_session(sb, dir.file("a.kv"));
    ADD_FAILURE() << "loaded into another model";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("saved from another model"), std::string::npos)
        << e.what();
  }
  Session sa2(*a, o);
  EXPECT_EQ(runtime::load_session(sa2, dir.file("a.kv")).n_tokens, 5);
}

// A cache whose heads hold 64 KiB or more is loaded by mapping the file's pages into the
// cache's buffers (page-aligned head regions in the file and in the pool). Continuing
// from it gives the bits of continuing the saving session; writes after loading (the
// partly filled last block, new blocks) never reach the file; two sessions load the
// same file at once, and one session loads it again over its own mapped cache.
TEST(KvFile, LargeCachesAreMappedInPlaceCopyOnWrite) {
  test::TempDir dir;
  model::ModelConfig mc;
  model::apply_arch_defaults(mc, "llama");
  mc.n_layers = 2;
  mc.dim = 256;
  mc.n_heads = 2;
  mc.n_kv_heads = 2;  // head_dim 128
  mc.hidden_dim = 256;
  mc.vocab_size = 300;
  mc.ctx = 4096;
  mc.rope_theta = 10000.0f;
  const auto m = model::Model::load(test::synth_model(dir, "wide", mc, 3), "");
  std::vector<int> prompt = {1};
  for (int i = 1; i < 2200; ++i) prompt.push_back(3 + (i * 37 + i * i * 11) % 290);
  const std::vector<int> follow1 = {5, 77, 123}, follow2 = {200, 9};

  for (const char* fmt : {"f16", "int8", "kivi2"}) {
    SCOPED_TRACE(fmt);
    SessionOptions o;
    o.threads = 2;
    o.ctx = 4000;
    o.cache.k = o.cache.v = {kv::parse_format(fmt), kv::Int8Granularity::kHead};
    // Blocks of 96 tokens: kivi2's head regions (3 KiB a block) are padded to pages, in
    // the file (23 blocks) and in the pool (42 blocks).
    o.cache.block_tokens = 96;
    const std::string path = dir.file(std::string(fmt) + ".kv");
    Session a(*m, o);
    a.prefill(prompt);
    runtime::save_session(a, prompt, static_cast<int64_t>(prompt.size()), 1.0, path);
    const std::vector<float> want1 = continue_greedy(a, follow1, 4);
    a.reset();
    a.prefill(prompt);
    const std::vector<float> want2 = continue_greedy(a, follow2, 4);
    const std::vector<uint8_t> file = test::read_file(path);

    Session b(*m, o), c(*m, o);
    const runtime::LoadedSession lb = runtime::load_session(b, path);
    const runtime::LoadedSession lc = runtime::load_session(c, path);
    // Every head region of 64 KiB or more is mapped in whole pages; the rest is copied.
    const kv::CacheConfig& cc = a.cache().config();
    const int nb = (static_cast<int>(prompt.size()) + cc.block() - 1) / cc.block();
    uint64_t pages = 0;
    for (kv::Stream st : {kv::Stream::kKey, kv::Stream::kValue}) {
      for (kv::Part part : {kv::Part::kCodes, kv::Part::kScales, kv::Part::kZeros}) {
        const size_t used = kv::part_head_bytes(cc, st, part, nb);
        if (used >= 65536) pages += cc.n_layers * cc.n_kv_heads * (used / 4096 * 4096);
      }
    }
    EXPECT_GT(pages, 0u);
    EXPECT_EQ(lb.mapped_bytes, pages);
    EXPECT_EQ(lc.mapped_bytes, lb.mapped_bytes);
    auto same = [](const std::vector<float>& x, const std::vector<float>& y) {
      return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
    };
    EXPECT_TRUE(same(continue_greedy(b, follow1, 4), want1));
    EXPECT_TRUE(same(continue_greedy(c, follow2, 4), want2));
    EXPECT_EQ(test::read_file(path), file);  // the sessions' writes stayed private
    runtime::load_session(b, path);          // over its own mapped and written cache
    EXPECT_TRUE(same(continue_greedy(b, follow2, 4), want2));
    EXPECT_EQ(test::read_file(path), file);
  }
}

TEST(KvFile, ChecksumDoesNotDependOnHowTheBytesAreSplit) {
  std::vector<uint8_t> d(1000);
  for (size_t i = 0; i < d.size(); ++i) d[i] = static_cast<uint8_t>(i * 131 + 7);
  const uint64_t whole = Checksum::of(d.data(), d.size());
  for (size_t step : {1, 3, 8, 31, 33, 500}) {
    Checksum c;
    for (size_t i = 0; i < d.size(); i += step)
      c.update(d.data() + i, std::min(step, d.size() - i));
    EXPECT_EQ(c.digest(), whole) << step;
  }
  // Any single flipped bit changes it, and so does the length.
  for (size_t i = 0; i < d.size(); i += 97) {
    d[i] ^= 4;
    EXPECT_NE(Checksum::of(d.data(), d.size()), whole) << i;
    d[i] ^= 4;
  }
  EXPECT_NE(Checksum::of(d.data(), d.size() - 1), whole);
}

}  // namespace
}  // namespace kivi

namespace kivi {
namespace {

using test::model_args;

TEST(KvFileCli, SaveThenLoadTwiceGivesTheSameText) {
  KIVI_REQUIRE_MODEL();
  test::TempDir dir;
  const std::string kv = dir.file("p.kv");
  const std::string opts = model_args() + " --kv-cache kivi2 --residual 32 --temp 0 ";
  const auto save = test::run(test::kivi_cmd(
      "generate " + opts + "-p 'Once upon a time' -n 4 --kv-save '" + kv + "' --json"));
  ASSERT_EQ(save.exit_code, 0) << save.err;
  EXPECT_NE(save.out.find("\"kv_save_bytes\""), std::string::npos) << save.out;
  const std::string load =
      "generate " + opts + "--kv-load '" + kv + "' -p 'there was a dog' -n 12 --json";
  const auto a = test::run(test::kivi_cmd(load)), b = test::run(test::kivi_cmd(load));
  ASSERT_EQ(a.exit_code, 0) << a.err;
  ASSERT_EQ(b.exit_code, 0) << b.err;
  for (const char* key : {"\"kv_load_ms\"", "\"kv_loaded_tokens\":5", "\"kv_saved_prefill_ms\"",
                          "\"kv_saved_prefill_tokens\":5"}) {
    EXPECT_NE(a.out.find(key), std::string::npos) << key << " in " << a.out;
  }
  auto completion = [](const std::string& json) {
    const size_t p = json.find("\"completion\"");
    return json.substr(p, json.find("\"text\"") - p);
  };
  EXPECT_EQ(completion(a.out), completion(b.out));
  EXPECT_GT(completion(a.out).size(), 20u);
}

TEST(KvFileCli, MismatchesAndMisuseAreOneLineErrors) {
  KIVI_REQUIRE_MODEL();
  test::TempDir dir;
  const std::string kv = dir.file("p.kv");
  ASSERT_EQ(test::run(test::kivi_cmd("generate " + model_args() +
                                     " --kv-cache kivi2 -p 'Once' -n 0 --kv-save '" + kv + "'"))
                .exit_code,
            0);
  auto expect_error = [](const std::string& args, const std::string& words) {
    test::expect_cli_error(test::run(test::kivi_cmd(args)), words, args);
  };
  expect_error("generate " + model_args() + " --kv-cache int8 -p x --kv-load '" + kv + "'",
               "key format: kivi2 in the file, int8 here");
  expect_error("generate " + model_args() + " --kv-cache kivi2 --kv-load '" + kv + "'",
               "give the follow-up prompt");
  expect_error("generate " + model_args() + " -p x --kv-save '" + test::model_path() + "'",
               "--kv-save");
  expect_error("generate " + model_args() + " --no-kv-cache -p x --kv-load '" + kv + "'",
               "--kv-load needs the KV cache");
  expect_error("generate " + model_args() + " -p x --kv-load '" + test::tokenizer_path() + "'",
               "not a kivi KV cache file");
}

}  // namespace
}  // namespace kivi
