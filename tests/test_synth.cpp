// `kivi synth`: synthetic GGUF files load, carry the expected tensors and metadata,
// generate, are byte-identical for a seed, and bad shapes or too little memory or disk
// are reported before anything is written.
#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/f16.h"
#include "core/normal_table.h"
#include "io/gguf.h"
#include "model/ffn.h"
#include "model/model.h"
#include "model/presets.h"
#include "model/synth.h"
#include "runtime/sampler.h"
#include "runtime/session.h"
#include "test_util.h"

namespace kivi {
namespace {

using test::kivi_cmd;
using test::run;

model::SynthSpec tiny_spec(uint64_t seed = 0) {
  model::SynthSpec s;
  s.config = model::find_preset("tiny").config;
  s.label = "tiny";
  s.seed = seed;
  return s;
}

// Expects kivi::Error whose message contains every needle.
template <class F>
void expect_error(F&& f, std::initializer_list<const char*> needles) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning " << *needles.begin();
  } catch (const Error& e) {
    for (const char* n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

using test::expect_cli_error;

TEST(NormalTable, QuantilesAreSymmetricSortedAndStandard) {
  const NormalTable& t = NormalTable::get();
  double sum = 0, sum2 = 0;
  for (int i = 0; i < 65536; ++i) {
    const float q = t.quantile(static_cast<uint16_t>(i));
    EXPECT_EQ(q, -t.quantile(static_cast<uint16_t>(65535 - i)));
    if (i > 0) {
      EXPECT_LT(t.quantile(static_cast<uint16_t>(i - 1)), q);
    }
    sum += q;
    sum2 += static_cast<double>(q) * q;
  }
  EXPECT_NEAR(sum / 65536, 0.0, 1e-9);
  EXPECT_NEAR(std::sqrt(sum2 / 65536), 1.0, 1e-3);
  EXPECT_NEAR(normal_quantile(0.975), 1.959963984540054, 1e-12);
  EXPECT_NEAR(normal_quantile(1e-6), -4.753424308822899, 1e-10);
  // Samples: mean 0, deviation as asked.
  Rng rng(3);
  std::vector<float> x(1 << 20);
  t.fill(rng, x.data(), x.size(), 2.0f);
  double m = 0, v = 0;
  for (float f : x) m += f;
  m /= x.size();
  for (float f : x) v += (f - m) * (f - m);
  EXPECT_NEAR(m, 0.0, 0.01);
  EXPECT_NEAR(std::sqrt(v / x.size()), 2.0, 0.01);
}

TEST(Synth, TokenizerHasDistinctPiecesAtLlama3Size) {
  const auto tk = model::synthetic_tokenizer(128256);
  ASSERT_EQ(tk.vocab_size(), 128256);
  EXPECT_EQ(tk.n_byte_pieces(), 256);
  EXPECT_EQ(tk.piece(0), "<unk>");
  EXPECT_EQ(tk.piece(1), "<s>");
  EXPECT_EQ(tk.piece(2), "</s>");
  EXPECT_EQ(tk.piece(3), "<0x00>");
  EXPECT_EQ(tk.piece(258), "<0xFF>");
  EXPECT_EQ(tk.type(10), tok::TokenType::kByte);
  std::set<std::string> seen(tk.pieces().begin(), tk.pieces().end());
  EXPECT_EQ(seen.size(), tk.pieces().size());
  for (int i = 259; i < tk.vocab_size(); ++i) {
    ASSERT_EQ(tk.type(i), tok::TokenType::kNormal) << i;
    ASSERT_FALSE(tk.piece(i).empty()) << i;
    if (i > 259) {
      ASSERT_LT(tk.score(i), tk.score(i - 1)) << i;
    }
  }
  // Text round-trips, and common words merge into multi-character pieces.
  const std::string text = "Hello, world! The quick brown fox jumps over 13 lazy dogs.";
  const auto ids = tk.encode(text, true);
  EXPECT_LT(ids.size(), text.size() / 2);
  EXPECT_EQ(tk.decode_all(std::vector<int>(ids.begin() + 1, ids.end()), ids[0]), text);
  // Bytes without a piece fall back to byte pieces.
  const std::string utf8 = "caf\xC3\xA9";
  const auto u = tk.encode(utf8, false);
  EXPECT_EQ(tk.decode_all(u), utf8);
  // The smallest vocabulary works too.
  EXPECT_EQ(model::synthetic_tokenizer(model::kSynthMinVocab).vocab_size(), model::kSynthMinVocab);
}

TEST(Synth, TinyPresetLoadsWithTheExpectedTensorsAndMetadata) {
  test::TempDir t;
  const auto spec = tiny_spec();
  const auto r = model::write_synthetic_gguf(spec, t.file("tiny.gguf"));
  const auto& c = spec.config;
  EXPECT_EQ(r.n_tensors, 9 * c.n_layers + 2);
  io::GgufFile f(t.file("tiny.gguf"));
  EXPECT_EQ(f.file_size(), r.bytes);
  EXPECT_TRUE(f.get_bool("kivi.synthetic"));
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_string("general.name"), "synthetic tiny, random weights");
  EXPECT_EQ(f.get_uint("general.file_type"), 1u);
  EXPECT_EQ(f.get_uint("llama.context_length"), static_cast<uint64_t>(c.ctx));
  EXPECT_EQ(f.get_uint("llama.attention.head_count_kv"), static_cast<uint64_t>(c.n_kv_heads));
  EXPECT_EQ(f.get_float("llama.rope.freq_base"), c.rope_theta);
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "llama");
  EXPECT_EQ(f.array_size("tokenizer.ggml.tokens"), static_cast<uint64_t>(c.vocab_size));
  EXPECT_EQ(f.find_tensor("output.weight"), nullptr);  // tied, as the preset says
  const auto* q = f.find_tensor("blk.3.attn_q.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->type, static_cast<uint32_t>(io::GgmlType::kF16));
  const auto* n = f.find_tensor("blk.0.ffn_norm.weight");
  ASSERT_NE(n, nullptr);
  EXPECT_EQ(n->type, static_cast<uint32_t>(io::GgmlType::kF32));
  // The estimate used for the disk check covers the file.
  EXPECT_GE(model::synth_needs(spec).file_bytes, r.bytes);

  const auto m = model::Model::load(t.file("tiny.gguf"));
  EXPECT_TRUE(m->config().synthetic);
  EXPECT_EQ(m->config().n_layers, c.n_layers);
  EXPECT_EQ(m->config().kv_dim(), c.kv_dim());
  EXPECT_EQ(m->weights().layers[1].attn_norm, std::vector<float>(c.dim, 1.0f));
  // Weights are N(0, 0.02^2).
  const auto& wk = m->weights().layers[2].wk;
  double s2 = 0;
  for (int64_t i = 0; i < wk.rows * wk.cols; ++i) {
    const float v = f16_to_f32(static_cast<const uint16_t*>(wk.data)[i]);
    s2 += static_cast<double>(v) * v;
  }
  EXPECT_NEAR(std::sqrt(s2 / (wk.rows * wk.cols)), model::kSynthWeightStd, 0.001);

  // It generates: finite logits, N tokens in the vocabulary.
  runtime::SessionOptions o;
  o.threads = 2;
  o.ctx = 256;
  runtime::Session s(*m, o);
  const float* logits = s.prefill(m->tokenizer().encode("Once upon a time", true));
  for (int i = 0; i < 20; ++i) {
    for (int v = 0; v < c.vocab_size; ++v) ASSERT_TRUE(std::isfinite(logits[v])) << "step " << i;
    const int tok = runtime::argmax(logits, c.vocab_size);
    ASSERT_GE(tok, 0);
    ASSERT_LT(tok, c.vocab_size);
    logits = s.decode(tok);
  }
}

// A mixture of experts (qwen3moe): the file holds the experts as 3-D tensors and the
// router in F32; a batched prefill gives each row the bits one token at a time gives
// (rows are grouped by expert); the router keeps the lower expert on a tie.
TEST(Synth, MixtureOfExpertsLoadsAndBatchesAsItStreams) {
  test::TempDir t;
  auto spec = tiny_spec();
  model::apply_arch_defaults(spec.config, "qwen3moe");
  spec.config.n_experts = 4;
  spec.config.n_experts_used = 2;
  spec.outtype = "q8_0";
  model::write_synthetic_gguf(spec, t.file("moe.gguf"));
  io::GgufFile f(t.file("moe.gguf"));
  EXPECT_EQ(f.get_uint("qwen3moe.expert_count"), 4u);
  const auto* e = f.find_tensor("blk.1.ffn_down_exps.weight");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->dims, (std::vector<uint64_t>{static_cast<uint64_t>(spec.config.hidden_dim),
                                            static_cast<uint64_t>(spec.config.dim), 4u}));
  EXPECT_EQ(f.find_tensor("blk.0.ffn_gate_inp.weight")->type,
            static_cast<uint32_t>(io::GgmlType::kF32));
  EXPECT_EQ(f.find_tensor("blk.0.ffn_gate.weight"), nullptr);

  const auto m = model::Model::load(t.file("moe.gguf"));
  EXPECT_EQ(m->config().n_experts, 4);
  EXPECT_EQ(m->config().n_experts_used, 2);
  runtime::SessionOptions o;
  o.threads = 2;
  o.ctx = 128;
  o.forward.prefill = attn::PrefillMode::kStream;  // bit for bit with decoding
  const std::vector<int> prompt = m->tokenizer().encode("Once upon a time there was a dog", true);
  const int V = m->config().vocab_size, n = static_cast<int>(prompt.size());
  std::vector<float> batched(static_cast<size_t>(n) * V);
  runtime::Session a(*m, o), b(*m, o);
  a.prefill(prompt, batched.data());
  for (int i = 0; i < n; ++i) {
    const float* l = b.decode(prompt[i]);
    ASSERT_TRUE(std::equal(l, l + V, batched.data() + static_cast<size_t>(i) * V)) << "row " << i;
  }

  const float logits[5] = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f};
  int picked[3];
  float w[3];
  model::route(logits, 5, 3, picked, w);
  EXPECT_EQ(picked[0], 1);
  EXPECT_EQ(picked[1], 3);
  EXPECT_EQ(picked[2], 4);
  // The softmax over the three picked logits: 1 : 1 : e^-1.
  const float z = 2.0f + std::exp(-1.0f);
  EXPECT_NEAR(w[0], 1.0f / z, 1e-6f);
  EXPECT_NEAR(w[2], std::exp(-1.0f) / z, 1e-6f);

  model::ModelConfig bad = spec.config;
  bad.n_experts_used = 5;
  try {
    bad.validate("x.gguf");
    FAIL() << "5 of 4 experts accepted";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("expert_used_count"), std::string::npos) << err.what();
  }
}

TEST(Synth, SameSeedSameBytesOtherSeedOtherBytes) {
  test::TempDir t;
  model::write_synthetic_gguf(tiny_spec(7), t.file("a.gguf"));
  model::write_synthetic_gguf(tiny_spec(7), t.file("b.gguf"));
  model::write_synthetic_gguf(tiny_spec(8), t.file("c.gguf"));
  const auto a = test::read_file(t.file("a.gguf")), b = test::read_file(t.file("b.gguf")),
             c = test::read_file(t.file("c.gguf"));
  ASSERT_FALSE(a.empty());
  EXPECT_TRUE(a == b);
  ASSERT_EQ(a.size(), c.size());
  EXPECT_FALSE(a == c);
  // f32 storage holds the same draws before rounding to f16.
  auto f32 = tiny_spec(7);
  f32.outtype = "f32";
  model::write_synthetic_gguf(f32, t.file("d.gguf"));
  const auto ma = model::Model::load(t.file("a.gguf")), md = model::Model::load(t.file("d.gguf"));
  const auto& x = ma->weights().layers[0].w_down;
  const auto& y = md->weights().layers[0].w_down;
  ASSERT_EQ(y.dtype, ops::DType::kF32);
  for (int64_t i = 0; i < 5000; ++i) {
    ASSERT_EQ(f16_to_f32(static_cast<const uint16_t*>(x.data)[i]),
              round_f16(static_cast<const float*>(y.data)[i]));
  }
}

TEST(Synth, ValuesDoNotDependOnChunking) {
  // Generated in one piece, or in pieces starting anywhere: the same values.
  const uint64_t n = 3 * 4096 + 123;
  std::vector<uint16_t> whole(n), parts(n);
  model::synth_matrix_values(5, 2, 0, n, true, whole.data());
  for (uint64_t first = 0, step = 1; first < n; first += step, step = step * 3 + 7) {
    const uint64_t cnt = std::min(step, n - first);
    model::synth_matrix_values(5, 2, first, cnt, true, parts.data() + first);
  }
  EXPECT_TRUE(whole == parts);
  std::vector<uint16_t> other(n);
  model::synth_matrix_values(5, 3, 0, n, true, other.data());  // another tensor: other values
  EXPECT_FALSE(whole == other);
  // A tensor spanning two 16 MiB chunks of the writer holds exactly those values.
  test::TempDir t;
  auto big = tiny_spec(1);
  big.config.vocab_size = 40000;  // token_embd: 40000 x 256 f16 = 20 MB
  model::write_synthetic_gguf(big, t.file("big.gguf"));
  const auto m = model::Model::load(t.file("big.gguf"));
  const uint64_t e = 40000ull * 256;
  std::vector<uint16_t> expect(e);
  model::synth_matrix_values(1, 0, 0, e, true, expect.data());
  const auto* got = static_cast<const uint16_t*>(m->weights().token_embd.data);
  EXPECT_TRUE(std::equal(expect.begin(), expect.end(), got));
}

TEST(Synth, ShapeErrorsNameTheOption) {
  auto shape = [](int layers, int dim, int heads, int kv, int ffn, int vocab, int ctx) {
    model::ModelConfig c;
    c.n_layers = layers;
    c.dim = dim;
    c.n_heads = heads;
    c.n_kv_heads = kv;
    c.hidden_dim = ffn;
    c.vocab_size = vocab;
    c.ctx = ctx;
    return c;
  };
  EXPECT_NO_THROW(model::validate_synth_config(shape(2, 256, 8, 2, 512, 512, 1024)));
  expect_error([&] { model::validate_synth_config(shape(2, 250, 8, 2, 512, 512, 1024)); },
               {"--heads 8", "--dim 250"});
  expect_error([&] { model::validate_synth_config(shape(2, 256, 8, 3, 512, 512, 1024)); },
               {"--kv-heads 3", "--heads 8"});
  expect_error([&] { model::validate_synth_config(shape(2, 24, 8, 2, 512, 512, 1024)); },
               {"head dimension", "odd"});
  expect_error([&] { model::validate_synth_config(shape(0, 256, 8, 2, 512, 512, 1024)); },
               {"--layers = 0", "1 to 1024"});
  expect_error([&] { model::validate_synth_config(shape(2, 256, 8, 16, 512, 512, 1024)); },
               {"--kv-heads = 16", "1 to 8"});
  expect_error([&] { model::validate_synth_config(shape(2, 256, 8, 2, 512, 100, 1024)); },
               {"--vocab = 100", "259"});
  expect_error([&] { model::validate_synth_config(shape(2, 256, 8, 2, 0, 512, 1024)); },
               {"--ffn = 0"});
  expect_error([&] { model::validate_synth_config(shape(2, 256, 8, 2, 512, 512, 0)); },
               {"--ctx = 0"});
  expect_error([&] { model::validate_synth_config(shape(2, 4096, 2, 2, 512, 512, 1024)); },
               {"head dimension", "2048"});
}

TEST(Synth, MemoryAndDiskChecksComeFirst) {
  model::SynthSpec s;
  s.config = model::find_preset("llama-3.2-1b").config;
  s.label = "llama-3.2-1b";
  const auto n = model::synth_needs(s);
  // 1.24e9 parameters in f16, 16 layers x 8 KV heads x 64 x 2 x 4 bytes per token for 4096 tokens.
  EXPECT_GT(n.weight_bytes, 2400000000ull);
  EXPECT_LT(n.weight_bytes, 2500000000ull);
  EXPECT_EQ(n.kv_tokens, 4096);
  EXPECT_EQ(n.kv_bytes, 2ull * 16 * 512 * 4 * 4096);
  EXPECT_GT(n.file_bytes, n.weight_bytes);
  expect_error([&] { model::check_synth_fits(n, 1ull << 30, 0, "x.gguf"); },
               {"needs 2.", "GiB of memory to run, only 1.00 GiB available"});
  expect_error([&] { model::check_synth_fits(n, 0, 1ull << 30, "x.gguf"); },
               {"'x.gguf'", "1.00 GiB of disk space"});
  EXPECT_NO_THROW(model::check_synth_fits(n, 64ull << 30, 64ull << 30, "x.gguf"));
  EXPECT_NO_THROW(model::check_synth_fits(n, 0, 0, "x.gguf"));  // unknown: not checked
}

TEST(SynthCli, WritesGeneratesAndSaysTheWeightsAreRandom) {
  test::TempDir t;
  const std::string out = t.file("tiny.gguf");
  const auto w = run(kivi_cmd("synth --preset tiny --ctx 131072 -o '" + out + "' --json"));
  ASSERT_EQ(w.exit_code, 0) << w.err;
  EXPECT_EQ(w.err, "");
  for (const char* k :
       {"\"bytes\":", "\"tensors\":38", "\"seconds\":", "\"name\":\"synthetic tiny"}) {
    EXPECT_NE(w.out.find(k), std::string::npos) << k << " in " << w.out;
  }
  // The nominal context (131072) is kept in the file; sessions default to 4096 tokens.
  const auto g = run(kivi_cmd("generate -m '" + out + "' -p hi -n 5 --temp 0 --json"));
  ASSERT_EQ(g.exit_code, 0) << g.err;
  EXPECT_NE(g.err.find("random weights"), std::string::npos) << g.err;
  EXPECT_NE(g.err.find("context of 4096 tokens"), std::string::npos) << g.err;
  EXPECT_NE(g.out.find("\"generated_tokens\":"), std::string::npos);
  const auto i = run(kivi_cmd("info '" + out + "'"));
  EXPECT_NE(i.out.find("random weights"), std::string::npos);
  EXPECT_NE(i.out.find("kivi.synthetic"), std::string::npos);
  // Explicit shape.
  const auto e = run(
      kivi_cmd("synth --layers 2 --dim 128 --heads 4 --kv-heads 2 --ffn 256 --vocab 300 --ctx 512 "
               "--outtype f32 --seed 3 -o '" +
               t.file("e.gguf") + "'"));
  ASSERT_EQ(e.exit_code, 0) << e.err;
  const auto m = model::Model::load(t.file("e.gguf"));
  EXPECT_EQ(m->config().hidden_dim, 256);
  EXPECT_EQ(m->weights().layers[0].wq.dtype, ops::DType::kF32);
}

TEST(SynthCli, ErrorsAreOneLine) {
  test::TempDir t;
  const std::string out = " -o '" + t.file("x.gguf") + "'";
  expect_cli_error(run(kivi_cmd("synth --preset tiny")), "-o OUT.gguf");
  expect_cli_error(run(kivi_cmd("synth --preset nope" + out)), "unknown preset 'nope'");
  expect_cli_error(run(kivi_cmd("synth --layers 2 --dim 128" + out)),
                   "missing --heads, --kv-heads, --ffn, --vocab, --ctx");
  expect_cli_error(run(kivi_cmd("synth --preset tiny --heads 7" + out)),
                   "--heads 7 does not divide --dim 256");
  expect_cli_error(run(kivi_cmd("synth --preset tiny --outtype q4" + out)), "--outtype");
  expect_cli_error(run(kivi_cmd("synth --preset tiny -o /nonexistent-dir/x.gguf")),
                   "cannot write '/nonexistent-dir/x.gguf'");
  expect_cli_error(run(kivi_cmd("synth --preset tiny -o '" + t.path() + "'")), "is a directory");
  // A model far larger than any machine's memory is refused before anything is written.
  expect_cli_error(
      run(kivi_cmd("synth --preset llama-3-8b --layers 1000 --dim 16384 --heads 128" + out)),
      "of memory to run, only");
  EXPECT_FALSE(test::file_exists(t.file("x.gguf")));
}

}  // namespace
}  // namespace kivi
