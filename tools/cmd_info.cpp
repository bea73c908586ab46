#include <cstdio>
#include <string>
#include <vector>

#include "common.h"
#include "core/error.h"
#include "core/json.h"
#include "core/sysinfo.h"
#include "kv/format.h"
#include "kv/layer_formats.h"
#include "model/presets.h"
#include "runtime/engine_options.h"

namespace kivi::tools {

namespace {

struct MemRow {
  std::string name;
  kv::CacheConfig cfg;
  std::string invalid;  // why this format does not apply to the shape, if it does not
};

std::vector<MemRow> memory_rows(const Args& a, const model::ModelConfig& c, int ctx) {
  std::vector<std::string> formats;
  if (a.given("kv-cache-layers")) {
    formats = {""};  // the map's own row
  } else if (a.given("kv-cache") || a.given("kv-cache-k") || a.given("kv-cache-v")) {
    formats = kv_format_list(a, {"f32"});
  } else {
    formats = {"f32", "f16", "int8", "kivi4", "tq4", "tq3", "kivi2", "tq2"};
  }
  std::vector<MemRow> rows;
  for (const auto& f : formats) {
    kv::CacheConfig cc = cache_config(a, f);
    cc.n_layers = c.n_layers;
    cc.n_kv_heads = c.n_kv_heads;
    cc.head_dim = c.head_dim();
    cc.ctx = ctx;
    cc.layer_window = c.layer_windows();  // windowed layers hold only their window
    if (!cc.layer_map.empty())
      cc.layer_formats = kv::parse_layer_formats(cc.layer_map, cc.n_layers, cc.k.granularity);
    std::string why;
    try {
      cc.validate();
    } catch (const Error& e) {
      why = e.what();
    }
    rows.push_back({describe_cache(cc), cc, why});
  }
  return rows;
}

// Tensors and bytes per element type, in order of first appearance.
struct TypeBytes {
  std::string type;
  int tensors = 0;
  uint64_t bytes = 0;
};

std::vector<TypeBytes> bytes_per_type(const model::Model& m) {
  std::vector<TypeBytes> out;
  auto add = [&](const std::string& type, uint64_t bytes) {
    for (auto& t : out) {
      if (t.type == type) {
        ++t.tensors;
        t.bytes += bytes;
        return;
      }
    }
    out.push_back({type, 1, bytes});
  };
  if (m.gguf()) {
    for (const auto& t : m.gguf()->tensors()) add(io::ggml_type_name(t.type), t.n_bytes);
  } else {
    const auto& w = m.weights();
    auto mat = [&](const ops::Matrix& x) { add(ops::dtype_name(x.dtype), x.bytes()); };
    mat(w.token_embd);
    for (const auto& L : w.layers) {
      for (const ops::Matrix* x : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_down, &L.w_up})
        mat(*x);
      add("F32", L.attn_norm.size() * 4);
      add("F32", L.ffn_norm.size() * 4);
    }
    add("F32", w.output_norm.size() * 4);
    if (!m.config().shared_classifier) mat(w.output);
  }
  return out;
}

// What info reports, computed once for both outputs.
struct Report {
  const model::Model* m = nullptr;  // null for a preset
  model::ModelConfig c;
  std::string source;
  int ctx = 0;
  std::vector<MemRow> rows;
  double f16_bpt = 0, f32_bpt = 0;  // bytes per token of f16 and f32 caches
  bool tensors = false;             // --tensors
};

void print_json(const Report& r) {
  const model::Model* m = r.m;
  const model::ModelConfig& c = r.c;
  const auto& source = r.source;
  const int ctx = r.ctx;
  const auto& rows = r.rows;
  const double f16_bpt = r.f16_bpt, f32_bpt = r.f32_bpt;
  JsonWriter j;
  j.begin_object();
  j.kv("source", source);
  if (m) j.kv("format", m->format());
  j.kv("arch", c.arch);
  j.kv("name", c.name);
  j.kv("dim", c.dim).kv("hidden_dim", c.hidden_dim).kv("n_layers", c.n_layers);
  j.kv("n_experts", c.n_experts).kv("n_experts_used", c.n_experts_used);
  j.kv("n_heads", c.n_heads).kv("n_kv_heads", c.n_kv_heads).kv("head_dim", c.head_dim());
  j.kv("vocab_size", c.vocab_size).kv("context_length", c.ctx).kv("rope_theta", c.rope_theta);
  j.kv("norm_eps", c.norm_eps)
      .kv("shared_classifier", c.shared_classifier)
      .kv("synthetic", c.synthetic);
  j.kv("rope_style", c.rope_style == attn::RopeStyle::kNeox ? "neox" : "adjacent");
  j.kv("rope_scaling", !c.rope_freq_factors.empty() ? "divisors"
                       : c.rope_freq_scale != 1.0f  ? "linear"
                                                    : "none");
  j.kv("attn_bias", c.attn_bias).kv("qk_norm", c.qk_norm);
  j.kv("post_norms", c.post_norms).kv("embed_scale", c.embed_scale);
  j.kv("ffn_activation", c.ffn_act == model::Activation::kGeluTanh ? "gelu_tanh" : "silu");
  j.kv("attention_scale", c.attention_scale());
  j.kv("attn_softcap", c.attn_softcap).kv("final_softcap", c.final_softcap);
  j.kv("rope_theta_swa", c.has_local_rope() ? c.rope_theta_swa : 0.0f);
  j.kv("sliding_window", c.sliding_window);
  if (c.sliding_window > 0) {
    j.key("sliding_window_layers").begin_array();
    for (int l = 0; l < c.n_layers; ++l) j.value(c.layer_window(l) > 0);
    j.end_array();
  }
  j.kv("params", c.n_params());
  if (m) j.kv("weight_bytes", static_cast<uint64_t>(m->weight_bytes()));
  if (m) {
    j.key("bytes_per_type").begin_array();
    for (const auto& t : bytes_per_type(*m)) {
      j.begin_object()
          .kv("type", t.type)
          .kv("tensors", t.tensors)
          .kv("bytes", t.bytes)
          .end_object();
    }
    j.end_array();
  }
  if (m) {
    const auto& tk = m->tokenizer();
    j.key("tokenizer").begin_object();
    j.kv("model", std::string(tk.model_name()))
        .kv("vocab_size", tk.vocab_size())
        .kv("bos_id", tk.bos_id())
        .kv("eos_id", tk.eos_id());
    j.kv("byte_pieces", tk.n_byte_pieces());
    j.end_object();
  }
  j.kv("kv_ctx", ctx);
  j.key("kv_memory").begin_array();
  for (const auto& row : rows) {
    const double bpt = kv::layer_bytes_per_token(row.cfg) * c.n_layers;
    j.begin_object();
    j.kv("format", row.name);
    if (!row.invalid.empty()) {
      j.kv("invalid", row.invalid).end_object();
      continue;
    }
    j.kv("bytes_per_token", bpt);
    j.kv("bits_per_element_k", kv::bits_per_element(row.cfg, kv::Stream::kKey));
    j.kv("bits_per_element_v", kv::bits_per_element(row.cfg, kv::Stream::kValue));
    j.kv("bytes_at_ctx", kv::expected_bytes_used(row.cfg, ctx));
    j.kv("bytes_reserved", kv::expected_bytes_reserved(row.cfg));
    j.kv("compression_vs_f32", f32_bpt / bpt);
    j.kv("compression_vs_f16", f16_bpt / bpt);
    j.end_object();
  }
  j.end_array();
  if (m && r.tensors && m->gguf()) {
    j.key("tensors").begin_array();
    for (const auto& t : m->gguf()->tensors()) {
      j.begin_object()
          .kv("name", t.name)
          .kv("type", io::ggml_type_name(t.type))
          .kv("bytes", t.n_bytes);
      j.key("dims").begin_array();
      for (auto d : t.dims) j.value(static_cast<uint64_t>(d));
      j.end_array().end_object();
    }
    j.end_array();
  }
  j.end_object();
  std::printf("%s\n", j.str().c_str());
}

// The model: shape, architecture switches, weights per type, tokenizer, GGUF metadata.
void print_model(const Report& r) {
  const model::Model* m = r.m;
  const model::ModelConfig& c = r.c;
  const auto& source = r.source;
  std::printf("%s\n", source.c_str());
  if (m) std::printf("  format           %s\n", m->format().c_str());
  std::printf("  architecture     %s%s\n", c.arch.c_str(),
              c.synthetic ? " (random weights: speed measurement only)" : "");
  if (!c.name.empty()) std::printf("  name             %s\n", c.name.c_str());
  std::printf("  dim              %d\n  hidden_dim       %d\n  layers           %d\n", c.dim,
              c.hidden_dim, c.n_layers);
  if (c.n_experts > 0) {
    std::printf("  experts          %d, %d per token (each a SwiGLU of hidden_dim)\n", c.n_experts,
                c.n_experts_used);
  }
  std::printf("  heads            %d query, %d KV (%s), head_dim %d\n", c.n_heads, c.n_kv_heads,
              c.n_kv_heads == c.n_heads ? "MHA"
              : c.n_kv_heads == 1       ? "MQA"
                                        : "GQA",
              c.head_dim());
  std::printf(
      "  vocab            %d\n  context          %d\n  rope theta       %g\n  rms eps          "
      "%g\n",
      c.vocab_size, c.ctx, c.rope_theta, c.norm_eps);
  const std::string yarn = c.yarn_orig_ctx > 0 ? strfmt(", YaRN (factor %g over %d tokens)",
                                                        1.0 / c.rope_freq_scale, c.yarn_orig_ctx)
                                               : "";
  std::printf("  rope             %s pairs%s\n",
              c.rope_style == attn::RopeStyle::kNeox ? "NeoX (i, i + D/2)" : "adjacent (2i, 2i+1)",
              c.yarn_orig_ctx > 0            ? yarn.c_str()
              : !c.rope_factors_long.empty() ? ", LongRoPE (short and long divisors)"
              : !c.rope_freq_factors.empty() ? ", per-frequency divisors (rope_freqs.weight)"
              : c.rope_freq_scale != 1.0f    ? ", linear scaling"
                                             : "");
  if (c.attn_bias || c.qk_norm || c.out_bias || c.head_sinks) {
    std::string parts;
    auto part = [&](bool on, const char* what) {
      if (on) parts += (parts.empty() ? "" : ", ") + std::string(what);
    };
    part(c.attn_bias, "Q/K/V biases");
    part(c.out_bias, "output bias");
    part(c.qk_norm, "per-head Q/K RMSNorm");
    part(c.head_sinks, "a sink logit per head");
    std::printf("  attention        %s\n", parts.c_str());
  }
  if (c.post_norms || c.embed_scale || c.ffn_act != model::Activation::kSilu) {
    std::printf("  block            %s%s%s\n", c.embed_scale ? "embedding x sqrt(dim), " : "",
                c.post_norms ? "RMSNorm after attention and FFN too, " : "",
                c.ffn_act == model::Activation::kGeluTanh    ? "GeGLU FFN"
                : c.ffn_act == model::Activation::kSwigluOai ? "clamped SwiGLU (limit 7, alpha "
                                                               "1.702), biased experts"
                                                             : "SwiGLU FFN");
  }
  if (c.attn_softcap > 0.0f || c.final_softcap > 0.0f) {
    std::printf("  soft caps        attention scores %g, logits %g (0: none)\n", c.attn_softcap,
                c.final_softcap);
  }
  if (c.has_local_rope()) {
    std::printf("  windowed rope    base %g, scale %g (the sliding-window layers' own)\n",
                c.rope_theta_swa, c.rope_freq_scale_swa);
  }
  if (c.sliding_window > 0) {
    int n = 0;
    for (int l = 0; l < c.n_layers; ++l) n += c.layer_window(l) > 0;
    std::string which;
    for (int l = 0; l < c.n_layers && n < c.n_layers; ++l)
      which += (which.empty() ? " (" : " ") + std::string(c.layer_window(l) > 0 ? "w" : "F");
    std::printf("  sliding window   %d tokens in %d of %d layers%s%s\n", c.sliding_window, n,
                c.n_layers, which.c_str(), which.empty() ? "" : ")");
  }
  std::printf("  classifier       %s\n",
              c.shared_classifier ? "tied to the embedding" : "separate");
  std::printf("  parameters       %.3f M\n", c.n_params() / 1e6);
  if (m)
    std::printf("  weights          %s\n",
                sys::human_bytes(static_cast<double>(m->weight_bytes())).c_str());
  if (m) {
    const auto types = bytes_per_type(*m);
    uint64_t total = 0;
    for (const auto& t : types) total += t.bytes;
    std::printf("bytes per type:\n");
    for (const auto& t : types) {
      std::printf("  %-6s %5d tensors %14llu bytes (%s, %5.1f%%)\n", t.type.c_str(), t.tensors,
                  static_cast<unsigned long long>(t.bytes),
                  sys::human_bytes(static_cast<double>(t.bytes)).c_str(),
                  total ? 100.0 * static_cast<double>(t.bytes) / static_cast<double>(total) : 0.0);
    }
  }
  if (m) {
    const auto& tk = m->tokenizer();
    std::printf("tokenizer: %s\n", tk.describe().c_str());
    if (m->gguf()) {
      const auto& g = *m->gguf();
      std::printf("gguf: version %u, %zu metadata keys, %zu tensors, alignment %u\n", g.version(),
                  g.keys().size(), g.tensors().size(), g.alignment());
      for (const auto& k : g.keys()) std::printf("  %-40s %s\n", k.c_str(), g.describe(k).c_str());
    }
  }
}

// Every tensor (always for small models, with --tensors for large ones).
void print_tensors(const Report& r) {
  const model::Model* m = r.m;
  const model::ModelConfig& c = r.c;
  if (!m) return;
  if (r.tensors || 9 * c.n_layers + 3 <= 64) {
    std::printf("tensors:\n");
    if (m->gguf()) {
      for (const auto& t : m->gguf()->tensors()) {
        std::string dims;
        for (auto d : t.dims) dims += (dims.empty() ? "" : " x ") + std::to_string(d);
        std::printf("  %-32s %-6s [%s] %llu bytes\n", t.name.c_str(),
                    io::ggml_type_name(t.type).c_str(), dims.c_str(),
                    static_cast<unsigned long long>(t.n_bytes));
      }
    } else {
      const auto& w = m->weights();
      auto line = [](const char* n, const ops::Matrix& x) {
        std::printf("  %-32s %-4s [%lld x %lld]\n", n, ops::dtype_name(x.dtype),
                    static_cast<long long>(x.rows), static_cast<long long>(x.cols));
      };
      line("token_embedding", w.token_embd);
      for (size_t l = 0; l < w.layers.size(); ++l) {
        const auto& L = w.layers[l];
        const std::string p = "layer" + std::to_string(l) + ".";
        line((p + "wq").c_str(), L.wq);
        line((p + "wk").c_str(), L.wk);
        line((p + "wv").c_str(), L.wv);
        line((p + "wo").c_str(), L.wo);
        line((p + "w1 (gate)").c_str(), L.w_gate);
        line((p + "w2 (down)").c_str(), L.w_down);
        line((p + "w3 (up)").c_str(), L.w_up);
      }
      line(c.shared_classifier ? "classifier (tied)" : "classifier", w.output);
    }
  }
}

// KV cache memory per format at the context.
void print_kv_memory(const Report& r) {
  const model::ModelConfig& c = r.c;
  const int ctx = r.ctx;
  const double f16_bpt = r.f16_bpt, f32_bpt = r.f32_bpt;
  std::printf("KV cache memory at %d tokens (%d layers x %d KV heads x head_dim %d):\n", ctx,
              c.n_layers, c.n_kv_heads, c.head_dim());
  std::printf("  %-44s %12s %8s %8s %14s %8s %8s\n", "format", "bytes/token", "bits K", "bits V",
              "total", "vs f32", "vs f16");
  for (const auto& row : r.rows) {
    if (!row.invalid.empty()) {
      std::printf("  %-44s n/a: %s\n", row.name.c_str(), row.invalid.c_str());
      continue;
    }
    const double bpt = kv::layer_bytes_per_token(row.cfg) * c.n_layers;
    std::printf(
        "  %-44s %12.1f %8.3f %8.3f %14s %7.2fx %7.2fx\n", row.name.c_str(), bpt,
        kv::bits_per_element(row.cfg, kv::Stream::kKey),
        kv::bits_per_element(row.cfg, kv::Stream::kValue),
        sys::human_bytes(static_cast<double>(kv::expected_bytes_used(row.cfg, ctx))).c_str(),
        f32_bpt / bpt, f16_bpt / bpt);
  }
  if (c.sliding_window > 0) {
    std::printf(
        "  bytes/token counts every layer; a layer with a sliding window holds at most its\n"
        "  window's blocks, so the totals grow by fewer bytes per token past the window.\n");
  }
}

}  // namespace

int cmd_info(int argc, char** argv) {
  Args a(
      "info", "[MODEL] [--preset NAME] [--kv-cache LIST] [--ctx N] [--tensors] [--json]",
      "Describes a model: file format, architecture, tensors (each one's type and bytes, and the\n"
      "bytes per type) and tokenizer, and the KV cache memory it needs at N tokens for each\n"
      "format (bytes per token and total, residual window included). With --preset, describes a\n"
      "named shape without a model file.");
  a.add("preset", 0, "NAME",
        "A named shape instead of a model: llama-3.2-1b, llama-2-7b, llama-3-8b, tiny.");
  a.add_flag("tensors", 0, "List every tensor.");
  a.add_flag("json", 0, "Print one JSON object (with bytes_per_type: [{type, tensors, bytes}]).");
  add_model_options(a);
  add_kv_options(a, true);
  a.positionals("MODEL", 0, 1);
  if (!parse_command_line(a, argc, argv)) return 0;  // --help printed
  std::unique_ptr<model::Model> m;
  Report r;
  if (a.given("preset")) {
    const auto& p = model::find_preset(a.str("preset"));
    r.c = p.config;
    r.source = "preset " + p.name;
  } else {
    if (!a.positional().empty() && a.given("model"))
      fail("give the model either as MODEL or with -m, not both");
    const std::string path =
        model::default_model_path(a.positional().empty() ? a.str("model") : a.positional()[0]);
    if (path.empty())
      fail("no model given and none found (pass MODEL or -m FILE, or --preset NAME)");
    m = model::Model::load(path, a.str("tokenizer"));
    r.m = m.get();
    r.c = m->config();
    r.source = m->path();
  }
  r.ctx = a.given("ctx") ? static_cast<int>(a.integer("ctx", 1, model::kMaxContext)) : r.c.ctx;
  r.rows = memory_rows(a, r.c, r.ctx);
  if (r.rows.size() == 1 && !r.rows[0].invalid.empty()) fail("%s", r.rows[0].invalid.c_str());
  kv::CacheConfig f16 = r.rows.front().cfg;
  f16.k = f16.v = {kv::Format::kF16, kv::Int8Granularity::kHead};
  f16.layer_formats.clear();
  f16.layer_map.clear();
  kv::CacheConfig f32 = f16;
  f32.k = f32.v = {kv::Format::kF32, kv::Int8Granularity::kHead};
  r.f16_bpt = kv::layer_bytes_per_token(f16) * r.c.n_layers;
  r.f32_bpt = kv::layer_bytes_per_token(f32) * r.c.n_layers;
  r.tensors = a.flag("tensors");
  if (a.flag("json")) {
    print_json(r);
  } else {
    print_model(r);
    print_tensors(r);
    print_kv_memory(r);
  }
  return 0;
}

}  // namespace kivi::tools
