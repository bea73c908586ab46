// Architectures: llama (with llama3 RoPE scaling), qwen2, qwen3, gemma2, gemma3 and phi3 load,
// files that do not fit them give one-line errors naming the tensor or key, and on each
// architecture the engine's paths agree (batched prefill, token-by-token decode, the no-cache
// oracle, keys cached before RoPE, a context shift). The logits themselves are checked against
// independent references by tests/reference/check_arch.py (numpy) and
// tests/reference/check_llamacpp.py (llama.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/threadpool.h"
#include "io/gguf_writer.h"
#include "model/config.h"
#include "model/convert.h"
#include "model/forward.h"
#include "model/forward_batch.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "model/synth.h"
#include "runtime/session.h"
#include "test_util.h"

namespace kivi {
namespace {

model::ModelConfig small(const std::string& arch) {
  model::ModelConfig c;
  model::apply_arch_defaults(c, arch);
  c.n_layers = 2;
  c.dim = 64;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.hidden_dim = 96;
  c.vocab_size = 300;
  c.ctx = 256;
  c.rope_theta = 10000.0f;
  return c;
}

// A GGUF of shape `c` with random weights.
std::string synth(const test::TempDir& t, const std::string& name, const model::ModelConfig& c) {
  return test::synth_model(t, name, c, 3);
}

using test::load_error;
using test::write_model;

void expect_one_line_error(const std::string& path, const std::vector<std::string>& parts) {
  const std::string msg = load_error(path);
  ASSERT_FALSE(msg.empty()) << path << " loaded";
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  for (const auto& p : parts)
    EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
}

TEST(Arch, EachArchitectureLoadsWithItsSwitches) {
  test::TempDir t;
  auto q3 = small("qwen3");
  q3.key_length = 32;  // head dimension apart from dim / n_heads
  q3.shared_classifier = false;
  auto l3 = small("llama");
  l3.rope_theta = 500000.0f;
  l3.rope_freq_factors =
      model::llama3_rope_factors(l3.head_dim(), l3.rope_theta, 8.0f, 1.0f, 4.0f, 8192.0f);
  struct Case {
    std::string name;
    model::ModelConfig c;
  } cases[] = {{"llama", small("llama")}, {"llama3", l3}, {"qwen2", small("qwen2")}, {"qwen3", q3}};
  for (const auto& k : cases) {
    const auto m = model::Model::load(synth(t, k.name, k.c));
    const auto& c = m->config();
    EXPECT_EQ(c.arch, k.c.arch) << k.name;
    EXPECT_EQ(c.rope_style,
              k.c.arch == "llama" ? attn::RopeStyle::kAdjacent : attn::RopeStyle::kNeox)
        << k.name;
    EXPECT_EQ(c.attn_bias, k.c.arch == "qwen2") << k.name;
    EXPECT_EQ(c.qk_norm, k.c.arch == "qwen3") << k.name;
    EXPECT_EQ(c.head_dim(), k.c.head_dim()) << k.name;
    EXPECT_EQ(c.shared_classifier, k.c.shared_classifier) << k.name;
    EXPECT_EQ(c.rope_freq_factors, k.c.rope_freq_factors) << k.name;
    const auto& L = m->weights().layers[1];
    EXPECT_EQ(L.bq.size(), c.attn_bias ? static_cast<size_t>(c.q_dim()) : 0u) << k.name;
    EXPECT_EQ(L.k_norm.size(), c.qk_norm ? static_cast<size_t>(c.head_dim()) : 0u) << k.name;
    EXPECT_EQ(L.wq.rows, c.q_dim()) << k.name;
    EXPECT_EQ(L.wo.cols, c.q_dim()) << k.name;
    // Tied: the classifier is the embedding itself; separate: its own tensor.
    EXPECT_EQ(m->weights().output.data == m->weights().token_embd.data, c.shared_classifier)
        << k.name;
  }
}

TEST(Arch, Llama3FactorsFollowTheirDefinition) {
  // Llama 3.1's parameters at head_dim 128, theta 500000: wavelengths 2 pi theta^(2i/128).
  const auto f = model::llama3_rope_factors(128, 500000.0f, 8.0f, 1.0f, 4.0f, 8192.0f);
  ASSERT_EQ(f.size(), 64u);
  for (int i = 0; i < 64; ++i) {
    const double wavelen = 2 * M_PI * std::pow(500000.0, 2.0 * i / 128);
    if (wavelen < 2048) {
      EXPECT_EQ(f[i], 1.0f) << i;  // high frequencies kept
    } else if (wavelen > 8192) {
      EXPECT_FLOAT_EQ(f[i], 8.0f) << i;  // low frequencies divided by the factor
    } else {
      const double s = (8192 / wavelen - 1) / 3;  // between: 1 / ((1 - s) / 8 + s)
      EXPECT_NEAR(f[i], 1 / ((1 - s) / 8 + s), 1e-5) << i;
      EXPECT_GT(f[i], 1.0f);
      EXPECT_LT(f[i], 8.0f);
    }
  }
  EXPECT_THROW(model::llama3_rope_factors(128, 500000.0f, 8.0f, 4.0f, 1.0f, 8192.0f),
               Error);  // low > high
}

TEST(Arch, FilesThatDoNotFitAreOneLineErrorsNamingTheTensor) {
  test::TempDir t;
  auto other = small("llama");
  other.arch = "phi2";
  expect_one_line_error(write_model(t, "phi", other, {}),
                        {"unsupported architecture 'phi2'", "llama, qwen2, qwen3"});
  // phi3: a fused QKV of the wrong height; LongRoPE's long factors without the short ones.
  expect_one_line_error(write_model(t, "phi3_qkv", small("phi3"),
                                    [](auto& s) {
                                      for (auto& x : s) {
                                        if (x.name == "blk.0.attn_qkv.weight") x.rows -= 1;
                                      }
                                    }),
                        {"'blk.0.attn_qkv.weight'", "expected [64, 128]"});
  expect_one_line_error(
      write_model(
          t, "phi3_long", small("phi3"),
          [](auto& s) {
            s.push_back({"rope_factors_long.weight", model::TensorRole::kOutputNorm, -1, 8, 0});
          }),
      {"'rope_factors_long.weight' without 'rope_factors_short.weight'"});
  // gemma: a post-norm missing; gemma2 with an attention cap of 0.
  expect_one_line_error(write_model(t, "g3_post", small("gemma3"),
                                    [](auto& s) {
                                      std::erase_if(s, [](const auto& x) {
                                        return x.name == "blk.1.post_ffw_norm.weight";
                                      });
                                    }),
                        {"missing tensor 'blk.1.post_ffw_norm.weight'", "gemma3"});
  auto g2 = small("gemma2");
  g2.attn_softcap = 0.0f;
  expect_one_line_error(write_model(t, "g2_cap", g2, {}), {"gemma2.attn_logit_softcapping = 0"});
  // A window pattern of more flags than layers.
  expect_one_line_error(
      write_model(t, "g3_pattern", small("gemma3"), {},
                  [](io::GgufWriter& w) {
                    w.add_u32("gemma3.attention.sliding_window", 8);
                    w.add_i32_array("gemma3.attention.sliding_window_pattern", {1, 1, 0});
                  }),
      {"sliding_window_pattern' has 3 elements, expected one per layer (2)"});

  // qwen2: a bias of the wrong length, and a missing one.
  expect_one_line_error(write_model(t, "q2_shape", small("qwen2"),
                                    [](auto& s) {
                                      for (auto& x : s) {
                                        if (x.name == "blk.1.attn_k.bias") x.rows += 1;
                                      }
                                    }),
                        {"'blk.1.attn_k.bias'", "[33]", "32 elements"});
  expect_one_line_error(
      write_model(t, "q2_missing", small("qwen2"),
                  [](auto& s) {
                    std::erase_if(s, [](const auto& x) { return x.name == "blk.0.attn_v.bias"; });
                  }),
      {"missing tensor 'blk.0.attn_v.bias'", "qwen2"});
  // qwen3: no attn_k_norm, and a q norm as a matrix.
  expect_one_line_error(write_model(t, "q3_missing", small("qwen3"),
                                    [](auto& s) {
                                      std::erase_if(s, [](const auto& x) {
                                        return x.name == "blk.1.attn_k_norm.weight";
                                      });
                                    }),
                        {"missing tensor 'blk.1.attn_k_norm.weight'", "qwen3"});
  expect_one_line_error(write_model(t, "q3_matrix", small("qwen3"),
                                    [](auto& s) {
                                      for (auto& x : s) {
                                        if (x.name == "blk.0.attn_q_norm.weight") x.cols = 2;
                                      }
                                    }),
                        {"'blk.0.attn_q_norm.weight'", "[2, 16]", "16 elements"});
  // A query projection of the wrong height for the head dimension.
  auto q3 = small("qwen3");
  q3.key_length = 32;
  expect_one_line_error(write_model(t, "q3_q", q3,
                                    [](auto& s) {
                                      for (auto& x : s) {
                                        if (x.name == "blk.0.attn_q.weight") x.rows = 64;
                                      }
                                    }),
                        {"'blk.0.attn_q.weight'", "[64, 64]", "expected [64, 128]"});
  // RoPE: divisors of the wrong length or not positive, unsupported scaling types.
  auto l3 = small("llama");
  l3.rope_freq_factors.assign(5, 2.0f);
  expect_one_line_error(write_model(t, "freqs_len", l3, {}),
                        {"rope_freqs.weight has 5 elements", "8"});
  l3.rope_freq_factors.assign(8, 0.0f);
  expect_one_line_error(write_model(t, "freqs_zero", l3, {}), {"rope_freqs.weight[0] = 0"});
  expect_one_line_error(
      write_model(t, "su", small("llama"), {},
                  [](io::GgufWriter& w) {
                    w.add_string("llama.rope.scaling.type", "su");
                    w.add_f32("llama.rope.scaling.factor", 4.0f);
                  }),
      {"llama.rope.scaling.type = 'su' is not supported", "none, linear, llama3, yarn"});
  expect_one_line_error(write_model(t, "yarn_mul", small("llama"), {},
                                    [](io::GgufWriter& w) {
                                      w.add_string("llama.rope.scaling.type", "yarn");
                                      w.add_f32("llama.rope.scaling.factor", 4.0f);
                                      w.add_f32("llama.rope.scaling.yarn_log_multiplier", 0.1f);
                                    }),
                        {"yarn_log_multiplier is not supported"});
  // Output-projection biases are not silently ignored.
  expect_one_line_error(
      write_model(
          t, "bo", small("qwen2"),
          [](auto& s) {
            s.push_back({"blk.0.attn_output.bias", model::TensorRole::kAttnQBias, 0, 64, 0});
          }),
      {"'blk.0.attn_output.bias'", "qwen2 has no output-projection bias"});
  // gpt-oss: sinks missing or of the wrong length, an expert bias missing, no experts, no
  // window.
  auto oss = small("gpt-oss");
  oss.n_experts = 4;
  oss.n_experts_used = 2;
  oss.sliding_window = 8;
  oss.set_swa_pattern(2);
  expect_one_line_error(write_model(t, "oss_sinks", oss,
                                    [](auto& s) {
                                      std::erase_if(s, [](const auto& x) {
                                        return x.name == "blk.1.attn_sinks.weight";
                                      });
                                    }),
                        {"missing tensor 'blk.1.attn_sinks.weight'", "gpt-oss"});
  expect_one_line_error(write_model(t, "oss_sinks_len", oss,
                                    [](auto& s) {
                                      for (auto& x : s) {
                                        if (x.name == "blk.0.attn_sinks.weight") x.rows = 3;
                                      }
                                    }),
                        {"'blk.0.attn_sinks.weight'", "[3]", "4 elements"});
  expect_one_line_error(write_model(t, "oss_bias", oss,
                                    [](auto& s) {
                                      std::erase_if(s, [](const auto& x) {
                                        return x.name == "blk.0.ffn_down_exps.bias";
                                      });
                                    }),
                        {"missing tensor 'blk.0.ffn_down_exps.bias'"});
  auto dense = oss;
  dense.n_experts = dense.n_experts_used = 0;
  expect_one_line_error(write_model(t, "oss_dense", dense, {}),
                        {"architecture gpt-oss without gpt-oss.expert_count"});
  auto open = oss;
  open.sliding_window = 0;
  expect_one_line_error(write_model(t, "oss_window", open, {}),
                        {"gpt-oss without gpt-oss.attention.sliding_window"});
}

TEST(Arch, RopeScalingKeysGiveTheSameFactorsAsTheTensor) {
  test::TempDir t;
  auto c = small("llama");
  c.rope_theta = 500000.0f;
  // llama3 keys without rope_freqs.weight: the loader computes the divisors.
  const auto keys = model::Model::load(write_model(t, "keys", c, {}, [](io::GgufWriter& w) {
    w.add_string("llama.rope.scaling.type", "llama3");
    w.add_f32("llama.rope.scaling.factor", 32.0f);
    w.add_f32("llama.rope.scaling.low_freq_factor", 1.0f);
    w.add_f32("llama.rope.scaling.high_freq_factor", 4.0f);
    w.add_u32("llama.rope.scaling.original_context_length", 8192);
  }));
  EXPECT_EQ(keys->config().rope_freq_factors,
            model::llama3_rope_factors(16, 500000.0f, 32.0f, 1.0f, 4.0f, 8192.0f));
  // Linear scaling: angles divided by the factor.
  const auto lin = model::Model::load(write_model(t, "linear", c, {}, [](io::GgufWriter& w) {
    w.add_string("llama.rope.scaling.type", "linear");
    w.add_f32("llama.rope.scaling.factor", 4.0f);
  }));
  EXPECT_FLOAT_EQ(lin->config().rope_freq_scale, 0.25f);
  std::vector<float> a(16), b(16);
  model::fill_rope_row(a.data(), 40, lin->config(), 0);
  model::fill_rope_row(b.data(), 10, 16, 500000.0f);
  for (int i = 0; i < 16; ++i) EXPECT_NEAR(a[i], b[i], 1e-6) << i;
}

std::vector<float> run_session(const model::Model& m, const std::vector<int>& prompt,
                               int decode_steps, kv::KeyRope key_rope, int max_batch,
                               std::vector<int>* generated = nullptr) {
  runtime::SessionOptions o;
  o.threads = 2;
  o.ctx = 128;
  o.max_batch = max_batch;
  o.cache.key_rope = key_rope;
  runtime::Session s(m, o);
  const float* logits = s.prefill(prompt);
  for (int i = 0; i < decode_steps; ++i) {
    int best = 0;
    for (int v = 1; v < m.config().vocab_size; ++v) best = logits[v] > logits[best] ? v : best;
    if (generated) generated->push_back(best);
    logits = s.decode(best);
  }
  return std::vector<float>(logits, logits + m.config().vocab_size);
}

TEST(Arch, EnginePathsAgreeOnEveryArchitecture) {
  test::TempDir t;
  auto q3 = small("qwen3");
  q3.key_length = 32;
  auto l3 = small("llama");
  l3.rope_theta = 500000.0f;
  l3.rope_freq_factors = model::llama3_rope_factors(16, 500000.0f, 32.0f, 1.0f, 4.0f, 8192.0f);
  // Gemma 3: layer 0 windowed (12 tokens, its own RoPE base), layer 1 global with base 1e6
  // scaled by 1/8; Gemma 2 with soft caps that bite.
  auto g3 = small("gemma3");
  g3.rope_theta = 1e6f;
  g3.rope_freq_scale = 0.125f;
  g3.sliding_window = 12;
  g3.set_swa_pattern(2);
  auto g2 = small("gemma2");
  g2.sliding_window = 12;
  g2.set_swa_pattern(2);
  g2.attn_softcap = 0.3f;
  g2.final_softcap = 2.0f;
  // Phi-3 with LongRoPE: trained on 64 tokens, run at 128 (the long divisors).
  auto pl = small("phi3");
  for (int i = 0; i < 8; ++i) {
    pl.rope_freq_factors.push_back(1.0f + 0.03f * i);
    pl.rope_factors_long.push_back(1.0f + 0.5f * i);
  }
  pl.rope_orig_ctx = 64;
  pl.rope_attn_factor = 1.1f;
  // gpt-oss: 4 biased experts (2 per token) with the clamped SwiGLU, sinks, Q/K/V and
  // output biases, layer 0 windowed (12 tokens), YaRN by 8 over 32 tokens.
  auto oss = small("gpt-oss");
  oss.n_experts = 4;
  oss.n_experts_used = 2;
  oss.sliding_window = 12;
  oss.set_swa_pattern(2);
  oss.rope_freq_scale = 0.125f;
  oss.yarn_orig_ctx = 32;
  oss.shared_classifier = false;
  // Partial rotary embeddings: NeoX (Phi-4-mini's kind, 12 of 16 channels, with LongRoPE)
  // and adjacent pairs (llama, 10 of 16, with 5 llama3 divisors).
  auto pp = pl;
  pp.rope_dims = 12;
  pp.rope_freq_factors.resize(6);
  pp.rope_factors_long.resize(6);
  auto lp = small("llama");
  lp.rope_dims = 10;
  lp.rope_theta = 500000.0f;
  lp.rope_freq_factors = model::llama3_rope_factors(10, 500000.0f, 32.0f, 1.0f, 4.0f, 8192.0f);
  for (const auto& [name, c] :
       std::vector<std::pair<std::string, model::ModelConfig>>{{"phi3 partial rotary", pp},
                                                               {"llama partial rotary", lp},
                                                               {"llama3", l3},
                                                               {"qwen2", small("qwen2")},
                                                               {"qwen3", q3},
                                                               {"gemma3", g3},
                                                               {"phi3", small("phi3")},
                                                               {"phi3 longrope", pl},
                                                               {"gemma2", g2},
                                                               {"gpt-oss", oss}}) {
    const auto m = model::Model::load(synth(t, name, c));
    std::vector<int> prompt = {1};
    for (int i = 0; i < 40; ++i) prompt.push_back(3 + (i * 37) % 290);
    std::vector<int> gen;
    // Batched prefill + 8 decoded tokens, keys after RoPE.
    const auto post = run_session(*m, prompt, 8, kv::KeyRope::kPost, 64, &gen);
    // Keys before RoPE, rotated inside attention with the same table (and pair style).
    const auto pre = run_session(*m, prompt, 8, kv::KeyRope::kPre, 64);
    // One token at a time.
    const auto stream = run_session(*m, prompt, 8, kv::KeyRope::kPost, 1);
    std::vector<int> all = prompt;
    all.insert(all.end(), gen.begin(), gen.end());
    ThreadPool pool(2);
    const auto oracle = model::forward_no_cache(*m, all, &pool);
    double d_pre = 0, d_stream = 0, d_oracle = 0, scale = 0;
    for (size_t v = 0; v < post.size(); ++v) {
      d_pre = std::max(d_pre, std::fabs(static_cast<double>(post[v]) - pre[v]));
      d_stream = std::max(d_stream, std::fabs(static_cast<double>(post[v]) - stream[v]));
      d_oracle = std::max(d_oracle, std::fabs(static_cast<double>(post[v]) - oracle[v]));
      scale = std::max(scale, std::fabs(static_cast<double>(post[v])));
    }
    EXPECT_GT(scale, 0.05) << name;
    EXPECT_LT(d_pre, 1e-5) << name;
    // The tiled prefill equals decoding up to float rounding (test_prefill; the stream
    // prefill is bit for bit, test_model).
    EXPECT_LT(d_stream, 1e-5) << name;
    EXPECT_LT(d_oracle, 1e-5) << name;

    // The server's batched forward: this prompt beside another in one step gives the
    // session's logits (biases, head norms and the pair style applied there too).
    const auto alone = run_session(*m, prompt, 0, kv::KeyRope::kPost, 64);
    kv::CacheConfig shaped;
    shaped.n_layers = c.n_layers;
    shaped.n_kv_heads = c.n_kv_heads;
    shaped.head_dim = m->config().head_dim();
    shaped.ctx = 128;
    shaped.layer_window = m->config().layer_windows();
    kv::KvCache ca(shaped), cb(shaped);
    const std::vector<int> other = {1, 7, 9, 11, 200};
    std::vector<float> la(c.vocab_size), lb(c.vocab_size);
    model::BatchForward fwd(m->config(), 64, 2, 128, 2, shaped.block());
    const model::BatchSequence batch[2] = {
        {&ca, prompt.data(), static_cast<int>(prompt.size()), la.data()},
        {&cb, other.data(), static_cast<int>(other.size()), lb.data()}};
    fwd.run(*m, batch, 2, &pool, {});
    double d_batch = 0;
    for (size_t v = 0; v < la.size(); ++v)
      d_batch = std::max(d_batch, std::fabs(static_cast<double>(la[v]) - alone[v]));
    EXPECT_LT(d_batch, 1e-5) << name;
  }
}

double shift_error(const model::Model& m);

TEST(Arch, ContextShiftRotatesNeoxKeys) {
  // With keys after RoPE a context shift rotates the kept keys back in place; for NeoX
  // pairs the rotation must pair (i, i + D/2). After the shift the cache must equal one
  // that was fed the kept tokens at their new positions: compare the next logits with a
  // fresh session fed [sinks..., kept...] (the shift keeps the sinks and drops blocks).
  // A rotation that paired adjacent channels instead gives 2.4e-3.
  // One layer: its keys and values depend on the token alone, not on the dropped context,
  // so the shifted cache and the fresh one hold the same vectors. Also Phi with partial
  // rotary embeddings (12 of 16 channels) and LongRoPE past its original context: the
  // shift turns the rotated pairs without the attention factor the keys carry already and
  // leaves the unrotated channels alone.
  test::TempDir t;
  auto q2 = small("qwen2");
  q2.n_layers = 1;
  auto phi = small("phi3");
  phi.n_layers = 1;
  phi.rope_dims = 12;
  for (int i = 0; i < 6; ++i) {
    phi.rope_freq_factors.push_back(1.0f + 0.05f * i);
    phi.rope_factors_long.push_back(1.0f + 0.6f * i);
  }
  phi.rope_orig_ctx = 64;
  phi.rope_attn_factor = 1.1f;
  for (const auto& [name, c] :
       std::vector<std::pair<std::string, model::ModelConfig>>{{"qwen2", q2}, {"phi3", phi}}) {
    const auto m = model::Model::load(synth(t, name, c));
    EXPECT_LT(shift_error(*m), 1e-5) << name;
  }
}

// Max |logits| difference between a session whose context shift dropped a block and a
// fresh one fed the kept tokens (see ContextShiftRotatesNeoxKeys).
double shift_error(const model::Model& m) {
  runtime::SessionOptions o;
  o.threads = 1;
  o.ctx = 128;
  o.max_batch = 128;
  o.overflow = runtime::ContextOverflow::kShift;
  o.sinks = 32;  // one whole block: sinks are kept in whole blocks
  o.cache.block_tokens = 32;
  std::vector<int> tokens;
  for (int i = 0; i < 128; ++i) tokens.push_back(3 + (i * 53) % 290);
  runtime::Session s(m, o);
  s.prefill(tokens);
  const float* shifted = s.decode(7);  // overflows: drops a block after the sinks
  EXPECT_GT(s.dropped(), 0);
  const int dropped = static_cast<int>(s.dropped());
  std::vector<int> kept(tokens.begin(), tokens.begin() + 32);
  kept.insert(kept.end(), tokens.begin() + 32 + dropped, tokens.end());
  kept.push_back(7);
  runtime::SessionOptions f = o;
  f.overflow = runtime::ContextOverflow::kStop;
  runtime::Session fresh(m, f);
  const float* want = fresh.prefill(kept);
  double d = 0;
  for (int v = 0; v < m.config().vocab_size; ++v)
    d = std::max(d, std::fabs(static_cast<double>(shifted[v]) - want[v]));
  return d;
}

}  // namespace
}  // namespace kivi
