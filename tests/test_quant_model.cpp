// Quantized weights end to end: a synthetic model quantized to Q8_0, Q4_K and the
// Q4_K_M mix gives logits close to the same model with its dequantized weights stored as
// F32; stories260K stored as F16 and BF16 gives llama2.c's published greedy text; the
// Q4_K_M rule; `kivi quantize`, `kivi info` and `kivi bench-matvec` from the command line;
// and unreadable weight types are one-line errors.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "io/gguf.h"
#include "model/convert.h"
#include "model/model.h"
#include "model/synth.h"
#include "quant/mix.h"
#include "quant/quantize_file.h"
#include "runtime/sampler.h"
#include "runtime/session.h"
#include "test_util.h"

namespace kivi {
namespace {

using quant::Type;
using runtime::Session;
using runtime::SessionOptions;

SessionOptions f32_cache() {
  SessionOptions o;
  o.threads = 2;
  o.cache.k = {kv::Format::kF32, kv::Int8Granularity::kHead};
  o.cache.v = o.cache.k;
  o.ctx = 64;
  return o;
}

std::vector<float> all_logits(const model::Model& m, const std::vector<int>& tokens) {
  Session s(m, f32_cache());
  std::vector<float> out(tokens.size() * static_cast<size_t>(m.config().vocab_size));
  s.prefill(tokens, out.data());
  return out;
}

// A synthetic shape whose every matrix is whole K-quant blocks, with a separate
// classifier and 8 layers (so the Q4_K_M rule raises some layers and not others).
model::SynthSpec synth_spec(const std::string& outtype) {
  model::SynthSpec s;
  model::ModelConfig& c = s.config;
  c.n_layers = 8;
  c.dim = 256;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.hidden_dim = 512;
  c.vocab_size = 512;
  c.ctx = 128;
  c.rope_theta = 10000.0f;
  c.shared_classifier = false;
  c.synthetic = true;
  s.label = "test";
  s.outtype = outtype;
  s.seed = 7;
  return s;
}

// Logits from quantized weights (integer kernels, activations rounded to 8 bits) against
// the same weights dequantized to F32 (float kernels): the difference is the activations'
// rounding alone. Rounding a block of activations to 8 bits adds noise of about
// amax / 127 / sqrt(12), near 0.6% of the activations' RMS for normal values, so each
// product is off by about 0.6%; through 8 layers of random weights the logits differ by
// (measured) 1.1% RMS for Q8_0, 1.5% for Q4_K and Q4_K_M, at most 7% of their RMS in any
// one logit, with the same top token at all 40 positions. The bound: 3% RMS, 12% for any
// logit, the same top token at >= 90% of positions.
TEST(QuantModel, QuantizedLogitsMatchTheDequantizedF32Model) {
  test::TempDir t;
  Rng r(3);
  std::vector<int> tokens(40);
  for (auto& v : tokens) v = 3 + static_cast<int>(r.next_u64() % 500);
  for (const char* type : {"q8_0", "q4_k", "q4_k_m"}) {
    const std::string q = t.file(std::string(type) + ".gguf"),
                      d = t.file(std::string(type) + "_f32.gguf");
    model::write_synthetic_gguf(synth_spec(type), q);
    quant::quantize_file(q, d, quant::parse_file_type("f32"), nullptr);
    const auto mq = model::Model::load(q), md = model::Model::load(d);
    EXPECT_LT(mq->weight_bytes() * 3, md->weight_bytes())
        << type;  // quantized weights are read in place
    EXPECT_EQ(md->weights().layers[0].wq.dtype, Type::kF32);
    const auto lq = all_logits(*mq, tokens), ld = all_logits(*md, tokens);
    const int V = mq->config().vocab_size;
    double diff2 = 0, ref2 = 0, worst = 0;
    int agree = 0;
    for (size_t p = 0; p < tokens.size(); ++p) {
      for (int v = 0; v < V; ++v) {
        const double a = lq[p * V + v], b = ld[p * V + v];
        diff2 += (a - b) * (a - b);
        ref2 += b * b;
        worst = std::max(worst, std::fabs(a - b));
      }
      agree += runtime::argmax(&lq[p * V], V) == runtime::argmax(&ld[p * V], V);
    }
    const double rel = std::sqrt(diff2 / ref2),
                 rms = std::sqrt(ref2 / static_cast<double>(lq.size()));
    std::printf(
        "  %-6s relative RMS difference %.4f, largest %.4f of the RMS, top-1 agreement %d/%zu\n",
        type, rel, worst / rms, agree, tokens.size());
    EXPECT_LT(rel, 0.03) << type;
    EXPECT_LT(worst, 0.12 * rms) << type;
    EXPECT_GE(agree, static_cast<int>(tokens.size() * 9 / 10)) << type;
  }
}

TEST(QuantModel, Q4KMRuleFollowsLlamaCpp) {
  const auto& ft = quant::parse_file_type("Q4_K_M");
  EXPECT_EQ(ft.llama_ftype, 15);
  auto type = [&](const std::string& name, uint64_t row = 2048, int layers = 16,
                  bool tied = false) {
    return quant::tensor_type(ft, quant::TensorDesc{name, 2, row}, layers, tied);
  };
  // use_more_bits(i, 16): i < 2, i >= 14, (i - 2) % 3 == 2.
  std::vector<int> more;
  for (int i = 0; i < 16; ++i) {
    if (quant::use_more_bits(i, 16)) more.push_back(i);
    const Type want = quant::use_more_bits(i, 16) ? Type::kQ6_K : Type::kQ4_K;
    EXPECT_EQ(type("blk." + std::to_string(i) + ".attn_v.weight"), want) << i;
    EXPECT_EQ(type("blk." + std::to_string(i) + ".ffn_down.weight", 8192), want) << i;
    EXPECT_EQ(type("blk." + std::to_string(i) + ".attn_q.weight"), Type::kQ4_K);
    EXPECT_EQ(type("blk." + std::to_string(i) + ".ffn_up.weight"), Type::kQ4_K);
  }
  EXPECT_EQ(more, (std::vector<int>{0, 1, 4, 7, 10, 13, 14, 15}));
  EXPECT_EQ(type("output.weight"), Type::kQ6_K);
  EXPECT_EQ(type("token_embd.weight"), Type::kQ4_K);
  EXPECT_EQ(type("token_embd.weight", 2048, 16, true), Type::kQ6_K);  // tied classifier
  // Rows that are not whole blocks fall back.
  EXPECT_EQ(type("blk.2.attn_q.weight", 96), Type::kQ5_0);
  EXPECT_EQ(type("blk.0.attn_v.weight", 96), Type::kQ8_0);
  EXPECT_EQ(type("blk.2.attn_q.weight", 100), Type::kF16);
  EXPECT_EQ(
      quant::tensor_type(quant::parse_file_type("q3_k"), {"blk.0.attn_q.weight", 2, 64}, 4, false),
      Type::kQ4_0);
  // Plain types convert every matrix alike; norms and vectors are not converted.
  EXPECT_EQ(
      quant::tensor_type(quant::parse_file_type("q4_0"), {"output.weight", 2, 2048}, 16, false),
      Type::kQ4_0);
  EXPECT_FALSE(quant::is_converted({"blk.0.attn_norm.weight", 1, 2048}));
  EXPECT_FALSE(quant::is_converted({"output_norm.weight", 2, 2048}));
  EXPECT_FALSE(quant::is_converted({"rope_freqs", 2, 64}));
  EXPECT_TRUE(quant::is_converted({"blk.0.attn_q.weight", 2, 2048}));
  EXPECT_THROW(quant::parse_file_type("iq2_xxs"), Error);
}

TEST(QuantModel, SynthQ4KMStoresTheMix) {
  test::TempDir t;
  model::write_synthetic_gguf(synth_spec("q4_k_m"), t.file("m.gguf"));
  io::GgufFile f(t.file("m.gguf"));
  EXPECT_EQ(f.get_uint("general.file_type"), 15u);
  // The memory and disk checks before writing count the quantized sizes.
  uint64_t bytes = 0;
  for (const auto& tn : f.tensors()) bytes += tn.n_bytes;
  EXPECT_EQ(model::synth_needs(synth_spec("q4_k_m")).weight_bytes, bytes);
  EXPECT_LT(model::synth_needs(synth_spec("q4_k_m")).weight_bytes * 3,
            model::synth_needs(synth_spec("f16")).weight_bytes);
  for (const auto& tn : f.tensors()) {
    Type want = Type::kQ4_K;
    if (tn.dims.size() == 1) want = Type::kF32;
    if (tn.name == "output.weight") want = Type::kQ6_K;
    for (int l : {0, 3, 6, 7}) {  // use_more_bits(i, 8): i < 1, i >= 7, (i - 1) % 3 == 2
      if (tn.name == "blk." + std::to_string(l) + ".attn_v.weight" ||
          tn.name == "blk." + std::to_string(l) + ".ffn_down.weight") {
        want = Type::kQ6_K;
      }
    }
    EXPECT_EQ(tn.type, static_cast<uint32_t>(want)) << tn.name;
  }
}

// Requantizing is deterministic and copying is exact: q4_k -> q4_k copies the bytes.
TEST(QuantModel, QuantizeFileCopiesWhatItDoesNotConvert) {
  test::TempDir t;
  model::write_synthetic_gguf(synth_spec("q4_k"), t.file("a.gguf"));
  const auto r = quant::quantize_file(t.file("a.gguf"), t.file("b.gguf"),
                                      quant::parse_file_type("q4_k"), nullptr);
  EXPECT_EQ(r.n_converted, 0);
  io::GgufFile a(t.file("a.gguf")), b(t.file("b.gguf"));
  ASSERT_EQ(a.tensors().size(), b.tensors().size());
  for (size_t i = 0; i < a.tensors().size(); ++i) {
    const auto &x = a.tensors()[i], &y = b.tensors()[i];
    EXPECT_EQ(x.name, y.name);
    ASSERT_EQ(x.n_bytes, y.n_bytes);
    EXPECT_EQ(std::memcmp(x.data, y.data, x.n_bytes), 0) << x.name;
  }
  for (const auto& k : a.keys()) {
    if (k == "general.file_type" || k == "general.alignment") continue;
    EXPECT_EQ(a.describe(k), b.describe(k)) << k;
  }
  EXPECT_EQ(b.get_uint("general.quantization_version"), 2u);
}

std::vector<int> greedy(const model::Model& m, const std::vector<int>& prompt, int n) {
  SessionOptions o = f32_cache();
  o.ctx = 0;
  Session s(m, o);
  return test::greedy(s, prompt, n);
}

// stories260K stored as F16 and as BF16 still gives the text llama2.c publishes.
TEST(QuantModel, Stories260KAsF16AndBf16GivesThePublishedText) {
  KIVI_REQUIRE_MODEL();
  test::TempDir t;
  model::convert_llama2c_to_gguf(test::model_path(), test::tokenizer_path(), t.file("s.gguf"),
                                 false);
  for (const char* type : {"f16", "bf16"}) {
    const std::string path = t.file(std::string(type) + ".gguf");
    quant::quantize_file(t.file("s.gguf"), path, quant::parse_file_type(type), nullptr);
    const auto m = model::Model::load(path);
    EXPECT_EQ(m->weights().layers[0].wq.dtype,
              std::string(type) == "f16" ? Type::kF16 : Type::kBF16);
    const auto prompt = m->tokenizer().encode("Once upon a time", true);
    const auto out = greedy(*m, prompt, 56);
    std::vector<int> all(prompt.begin() + 1, prompt.end());
    all.insert(all.end(), out.begin(), out.end());
    EXPECT_EQ(m->tokenizer().decode_all(all, prompt[0]), test::kPublishedText) << type;
  }
}

// A file with a weight of a type this engine cannot read: one line naming the tensor,
// its type and the supported list.
TEST(QuantModel, UnreadableWeightTypeIsAnError) {
  test::TempDir t;
  model::SynthSpec s = synth_spec("f32");
  s.config.n_layers = 1;
  model::write_synthetic_gguf(s, t.file("m.gguf"));
  auto img = test::read_file(t.file("m.gguf"));
  const std::string name = "blk.0.attn_q.weight";
  size_t pos = 0;
  for (;; ++pos) {
    ASSERT_LT(pos + name.size(), img.size());
    if (std::memcmp(img.data() + pos, name.data(), name.size()) == 0) break;
  }
  const size_t type_at = pos + name.size() + 4 + 2 * 8;  // n_dims, two dims
  const uint32_t iq2_xxs = 16;
  std::memcpy(img.data() + type_at, &iq2_xxs, 4);
  test::write_file(t.file("iq.gguf"), img);
  std::string err;
  try {
    model::Model::load(t.file("iq.gguf"));
  } catch (const Error& e) {
    err = e.what();
  }
  EXPECT_NE(err.find("tensor 'blk.0.attn_q.weight' has type IQ2_XXS"), std::string::npos) << err;
  EXPECT_NE(err.find("supported: F32, F16, BF16, Q4_0"), std::string::npos) << err;
  const auto r = test::run(test::kivi_cmd("info '" + t.file("iq.gguf") + "'"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("IQ2_XXS"), std::string::npos) << r.err;
  const auto q = test::run(
      test::kivi_cmd("quantize '" + t.file("iq.gguf") + "' '" + t.file("o.gguf") + "' q8_0"));
  EXPECT_EQ(q.exit_code, 1);
  EXPECT_NE(q.err.find("'blk.0.attn_q.weight' has type IQ2_XXS"), std::string::npos) << q.err;
  EXPECT_FALSE(test::file_exists(t.file("o.gguf")));
}

TEST(QuantCli, QuantizeInfoAndBench) {
  test::TempDir t;
  const std::string m = t.file("m.gguf"), q = t.file("q.gguf");
  ASSERT_EQ(test::run(test::kivi_cmd("synth --preset tiny --outtype f32 -o '" + m + "'")).exit_code,
            0);
  auto r = test::run(test::kivi_cmd("quantize '" + m + "' '" + q + "' q4_k_m --json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("\"type\":\"q4_k_m\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("{\"type\":\"Q6_K\""), std::string::npos) << r.out;
  r = test::run(test::kivi_cmd("info '" + q + "'"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("bytes per type:"), std::string::npos);
  EXPECT_NE(r.out.find("Q4_K"), std::string::npos);
  r = test::run(test::kivi_cmd("info '" + q + "' --json"));
  EXPECT_NE(r.out.find("\"bytes_per_type\":[{"), std::string::npos) << r.out;
  r = test::run(test::kivi_cmd("generate -m '" + q + "' -p hello -n 4 --temp 0"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  // Errors are one line.
  for (const std::string& bad : std::vector<std::string>{
           "quantize '" + m + "' '" + q + "' q9_9", "quantize '" + m + "' '" + m + "' q8_0",
           "quantize /nonexistent.gguf '" + q + "' q8_0", "quantize '" + m + "'",
           "bench-matvec --type iq4_nl", "bench-matvec --type q4_k --cols 300",
           "synth --preset tiny --outtype q7 -o '" + q + "'"}) {
    r = test::run(test::kivi_cmd(bad));
    EXPECT_EQ(r.exit_code, 1) << bad << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << bad << ": " << r.err;
  }
  r = test::run(test::kivi_cmd(
      "bench-matvec --type f16,q8_0,q4_k --rows 64 --cols 512 --rounds 2 --calls 2 --footprint 1 "
      "--threads 2 --no-probe --json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("\"type\":\"Q4_K\""), std::string::npos) << r.out;
  for (const char* cmd : {"quantize --help", "bench-matvec --help"}) {
    r = test::run(test::kivi_cmd(cmd));
    EXPECT_EQ(r.exit_code, 0);
    EXPECT_NE(r.out.find("--json"), std::string::npos) << cmd;
  }
}

}  // namespace
}  // namespace kivi
