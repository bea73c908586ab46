#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <string>

#include "common.h"
#include "core/error.h"
#include "core/json.h"
#include "core/progress.h"
#include "core/sysinfo.h"
#include "core/timer.h"
#include "io/atomic_file.h"
#include "model/config.h"
#include "model/presets.h"
#include "model/synth.h"
#include "model/synth_tokenizer.h"
#include "quant/mix.h"

namespace kivi::tools {

int cmd_synth(int argc, char** argv) {
  Args a(
      "synth",
      "--preset NAME | --layers L --dim D --heads H --kv-heads K --ffn F --vocab V --ctx C -o "
      "OUT.gguf "
      "[--arch llama|qwen2|qwen3|qwen3moe|gemma2|gemma3|phi3|gpt-oss] [--experts E --experts-used "
      "K] "
      "[--rope-scaling linear|llama3|yarn|longrope] "
      "[--sliding-window W "
      "[--sliding-window-pattern N]] [--outtype TYPE] [--seed S] [--json]",
      "Writes a llama, qwen2 or qwen3 GGUF v3 with seeded random weights at a model's shape, for\n"
      "speed and memory measurements and architecture tests (the text it generates is "
      "meaningless,\n"
      "and the tools say so). Matrices are N(0, 0.02^2) in F16 (or --outtype), norm weights 1 in "
      "F32\n"
      "(qwen3's per-head Q/K norms 1 + N(0, 0.2^2)), qwen2's Q/K/V biases N(0, 0.5^2); the file "
      "carries a\n"
      "small SentencePiece tokenizer (control tokens, the 256 byte pieces, generated pieces up to\n"
      "the vocabulary size) and kivi.synthetic = true. The same arguments give the same bytes.\n"
      "\n"
      "With --preset the shape options override the preset's values; without it all seven\n"
      "(--layers --dim --heads --kv-heads --ffn --vocab --ctx) are required. Before writing, the\n"
      "file size is checked against the free disk space and the memory the model needs to run\n"
      "(weights, an f32 cache of min(ctx, 4096) tokens, activations) against the available "
      "memory.");
  a.section("Shape");
  a.add("preset", 0, "NAME",
        "A named shape: llama-3.2-1b, llama-2-7b, llama-3-8b, qwen2.5-0.5b, qwen3-0.6b, "
        "qwen3-30b-a3b, mixtral-8x7b, gemma-3-4b, gemma-3-12b, gemma-2-2b, phi-3-mini, phi-4, "
        "phi-4-mini, gpt-oss-20b, tiny.");
  a.add("arch", 0, "ARCH",
        "Architecture: llama (adjacent-pair RoPE), qwen2 (Q/K/V biases, NeoX RoPE), qwen3 "
        "(per-head Q/K RMSNorm, NeoX RoPE), qwen3moe (qwen3 with a mixture of experts), gemma2 "
        "(soft caps 50 and 30, post-norms, GeGLU, every other layer windowed) or gemma3 (QK norm, "
        "post-norms, GeGLU, windowed layers with RoPE base 10000), phi3 (fused QKV and gate-up, "
        "NeoX RoPE) or gpt-oss (experts with biases and clamped SwiGLU, Q/K/V/output biases, "
        "attention sinks N(0, 1), even layers windowed, 128 tokens unless --sliding-window). "
        "Default: the preset's, else llama.");
  a.add("head-dim", 0, "HD",
        "Head dimension when it differs from dim / heads (qwen3-style; 2 to 1024, even).");
  a.add("rope-dims", 0, "N",
        "Partial rotary embeddings: RoPE turns the first N channels of each head (even, 2 to the "
        "head dimension; Phi-4-mini: 96 of 128). Default: the preset's, else the whole head.");
  a.add("experts", 0, "E",
        "A mixture of E experts in every layer, each a SwiGLU of --ffn channels (qwen3moe; llama "
        "files with experts are Mixtral-style). Default: the preset's, else none.");
  a.add("experts-used", 0, "K", "Experts the router picks per token (1 to --experts).");
  a.add("layers", 0, "L", "Transformer blocks (1 to 1024).");
  a.add("dim", 0, "D", "Embedding width (2 to 65536, a multiple of --heads).");
  a.add("heads", 0, "H", "Query heads (dim / heads must be even).");
  a.add("kv-heads", 0, "K", "Key/value heads (divides --heads; GQA when < H).");
  a.add("ffn", 0, "F", "SwiGLU inner width (1 to 1048576).");
  a.add("vocab", 0, "V", "Vocabulary size (259 to 4194304).");
  a.add("ctx", 0, "C",
        "Context length written to the file (1 to " + std::to_string(model::kMaxContext) + ").");
  a.add("rope-theta", 0, "T", "RoPE base. Default: the preset's, else 10000.");
  a.add("rope-scaling", 0, "KIND",
        "none, linear (every angle divided by the factor; Gemma 3's global layers), longrope "
        "(Phi-3.5's short and long divisors, original context --ctx / factor), yarn (gpt-oss's; "
        "original context --ctx / factor) or llama3 "
        "(Llama 3.1 RoPE scaling, written as the rope_freqs.weight divisors llama.cpp reads; "
        "low/high frequency factors 1 and 4, original context 8192). Default: the preset's, else "
        "none.");
  a.add("rope-scaling-factor", 0, "F",
        "Factor of linear, llama3, yarn or longrope scaling (1 to 1024). Default: the preset's, "
        "else 8 (32 for yarn).");
  a.add("attn-softcap", 0, "CAP",
        "gemma2: the soft cap of the attention scores, s -> CAP tanh(s / CAP) (0.001 to 1e6). "
        "Default: 50.");
  a.add("final-softcap", 0, "CAP",
        "gemma2, gemma3: the soft cap of the logits likewise (0: none). Default: 30 for gemma2, "
        "none for gemma3.");
  a.add_flag("attn-bias", 0,
             "Give the Q, K and V projections biases N(0, 0.5^2) (qwen2 always has them; llama "
             "files may).");
  a.add("sliding-window", 0, "W",
        "Sliding-window attention: the windowed layers attend only the last W tokens and keep "
        "only about W in their "
        "cache (writes attention.sliding_window; 1 to the context). Default: none.");
  a.add("sliding-window-pattern", 0, "N",
        "With --sliding-window: layer l is windowed iff l % N < N - 1, so every N-th layer "
        "attends the whole "
        "context (llama.cpp's convention; 1 to --layers). Default: every 2nd layer global for "
        "gemma2, every "
        "6th for gemma3, else every layer windowed.");
  a.add("classifier", 0, "KIND",
        "tied (output = token embedding) or separate. Default: the preset's, else tied.");
  a.section("Tokenizer");
  a.add("tokenizer-json", 0, "FILE",
        "Carry this Hugging Face tokenizer.json (byte-level BPE) instead of the generated "
        "vocabulary, written as "
        "llama.cpp's converter writes it; the vocabulary size becomes its size unless --vocab is "
        "given (larger: padded).");
  a.add("tokenizer-config", 0, "FILE",
        "tokenizer_config.json for BOS/EOS, add_bos_token and the chat template (default: the one "
        "beside --tokenizer-json).");
  a.section("Output");
  a.add("output", 'o', "FILE", "Output GGUF path (required).");
  a.add("outtype", 0, "TYPE",
        "Matrix storage: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, "
        "q6_k, or q4_k_m "
        "(llama.cpp's Q4_K_M mix; see 'kivi quantize --help'). Quantized types quantize the F32 "
        "values. Norms "
        "are always f32.",
        "f16");
  a.add("seed", 's', "S", "Random seed.", "0");
  a.add_flag("json", 0,
             "Print one JSON object: output, name, bytes, tensors, params, outtype, seed, shape, "
             "seconds, mb_per_s.");
  if (!parse_command_line(a, argc, argv)) return 0;  // --help printed
  const bool json = a.flag("json");
  if (!a.given("output")) fail("synth: give the output path with -o OUT.gguf");
  const std::string out = a.str("output"), outtype = a.str("outtype");
  try {
    quant::parse_file_type(outtype);
  } catch (const Error& e) {
    fail("--outtype: %s", e.what());
  }

  model::SynthSpec spec;
  spec.outtype = outtype;
  spec.seed = static_cast<uint64_t>(a.integer("seed", 0, INT64_MAX));
  model::ModelConfig& c = spec.config;
  const char* shape_opts[] = {"layers", "dim", "heads", "kv-heads", "ffn", "vocab", "ctx"};
  int* fields[] = {&c.n_layers,   &c.dim,        &c.n_heads, &c.n_kv_heads,
                   &c.hidden_dim, &c.vocab_size, &c.ctx};
  if (a.given("preset")) {
    const auto& p = model::find_preset(a.str("preset"));
    c = p.config;
    spec.label = p.name;
  } else {
    std::string missing;
    for (const char* o : shape_opts) {
      if (std::string(o) == "vocab" && a.given("tokenizer-json")) continue;  // the tokenizer's size
      if (!a.given(o)) missing += std::string(missing.empty() ? "" : ", ") + "--" + o;
    }
    if (!missing.empty())
      fail("synth: give --preset NAME, or the whole shape (missing %s)", missing.c_str());
    c.rope_theta = 10000.0f;
    c.shared_classifier = true;
  }
  bool overridden = false;
  for (size_t i = 0; i < sizeof(shape_opts) / sizeof(shape_opts[0]); ++i) {
    if (!a.given(shape_opts[i])) continue;
    *fields[i] = static_cast<int>(a.integer(shape_opts[i], INT_MIN, INT_MAX));
    overridden = true;
  }
  if (a.given("rope-theta")) c.rope_theta = static_cast<float>(a.number("rope-theta", 1e-30, 1e9));
  if (a.given("arch")) {
    const std::string arch = a.str("arch");
    if (!model::is_supported_architecture(arch)) {
      fail("--arch: unknown value '%s' (valid: %s)", arch.c_str(),
           model::supported_architectures());
    }
    if (arch != c.arch) overridden = true;
    model::apply_arch_defaults(c, arch);
  }
  if (a.given("attn-softcap")) {
    if (c.arch != "gemma2") fail("--attn-softcap needs --arch gemma2");
    c.attn_softcap = static_cast<float>(a.number("attn-softcap", 1e-3, 1e6));
    overridden = true;
  }
  if (a.given("final-softcap")) {
    if (c.arch != "gemma2" && c.arch != "gemma3")
      fail("--final-softcap needs --arch gemma2 or gemma3");
    c.final_softcap = static_cast<float>(a.number("final-softcap", 0.0, 1e6));
    overridden = true;
  }
  if (a.given("attn-bias")) {
    c.attn_bias = true;
    overridden = true;
  }
  if (a.given("head-dim")) {
    c.key_length = static_cast<int>(a.integer("head-dim", 2, 1024));
    overridden = true;
  }
  if (a.given("rope-dims")) {
    c.rope_dims = static_cast<int>(a.integer("rope-dims", 2, 1024));
    if (c.rope_dims % 2 != 0 || c.rope_dims > c.head_dim()) {
      fail("--rope-dims %d: expected an even number of 2 to the head dimension %d", c.rope_dims,
           c.head_dim());
    }
    overridden = true;
  }
  if (a.given("experts")) {
    c.n_experts = static_cast<int>(a.integer("experts", 1, 4096));
    overridden = true;
  }
  if (a.given("experts-used")) {
    c.n_experts_used = static_cast<int>(a.integer("experts-used", 1, 4096));
    overridden = true;
  }
  if (c.n_experts > 0 && c.n_experts_used == 0) c.n_experts_used = std::min(c.n_experts, 2);
  model::RopeScaling scaling =
      a.given("preset") ? model::find_preset(a.str("preset")).rope_scaling : model::RopeScaling{};
  bool linear = false, longrope = false, yarn = false;
  if (a.given("rope-scaling")) {
    const std::string k = a.str("rope-scaling");
    if (k != "none" && k != "llama3" && k != "linear" && k != "longrope" && k != "yarn") {
      fail("--rope-scaling: unknown value '%s' (valid: none, linear, llama3, yarn, longrope)",
           k.c_str());
    }
    linear = k == "linear";
    longrope = k == "longrope";
    yarn = k == "yarn";
    scaling.factor = k == "none"             ? 0.0f
                     : scaling.factor > 0.0f ? scaling.factor
                     : yarn                  ? 32.0f
                                             : 8.0f;
    if (k != "llama3") c.rope_freq_scale = 1.0f;
    c.yarn_orig_ctx = 0;
  }
  if (a.given("rope-scaling-factor")) {
    if (scaling.factor == 0.0f)
      fail("--rope-scaling-factor needs --rope-scaling llama3, linear, yarn or longrope");
    scaling.factor = static_cast<float>(a.number("rope-scaling-factor", 1.0, 1024.0));
  }
  if (linear || yarn) {
    // Linear: every angle of the global layers divided by the factor; YaRN blends it with
    // the unscaled angles over the pairs, trained on ctx / factor tokens.
    c.rope_freq_scale = 1.0f / scaling.factor;
    if (yarn) c.yarn_orig_ctx = std::max(1, static_cast<int>(c.ctx / scaling.factor));
    scaling.factor = 0.0f;
  }
  if (a.given("classifier")) {
    const std::string k = a.str("classifier");
    if (k != "tied" && k != "separate")
      fail("--classifier: unknown value '%s' (valid: tied, separate)", k.c_str());
    c.shared_classifier = k == "tied";
  }
  // A preset's window pattern (its period, or every layer) over the new layer count.
  if (c.sliding_window > 0) c.refit_swa_pattern();
  if (a.given("sliding-window-pattern") && !a.given("sliding-window"))
    fail("--sliding-window-pattern needs --sliding-window");
  if (a.given("sliding-window")) {
    c.sliding_window = static_cast<int>(a.integer("sliding-window", 1, model::kMaxContext));
    // Gemma's own pattern unless one is given: every 2nd (gemma2) or 6th (gemma3) layer global.
    const int arch_pattern = c.arch == "gemma2" || c.arch == "gpt-oss" ? 2
                             : c.arch == "gemma3"                      ? 6
                                                                       : 0;
    const int n = a.given("sliding-window-pattern")
                      ? static_cast<int>(a.integer("sliding-window-pattern", 1, 1024))
                      : arch_pattern;
    if (n > c.n_layers) fail("--sliding-window-pattern %d: the model has %d layers", n, c.n_layers);
    c.set_swa_pattern(n);
    overridden = true;
  } else if (!a.given("preset")) {
    c.sliding_window = 0;
  }
  if (c.arch == "gpt-oss" && c.sliding_window == 0) {
    c.sliding_window = std::min(128, c.ctx);  // gpt-oss: 128-token windows, even layers
    c.set_swa_pattern(2);
  }
  std::string tokenizer_desc;
  if (a.given("tokenizer-config") && !a.given("tokenizer-json"))
    fail("--tokenizer-config needs --tokenizer-json");
  if (a.given("tokenizer-json")) {
    tokenizer_desc = model::use_hf_tokenizer(spec, a.str("tokenizer-json"),
                                             a.str("tokenizer-config"), a.given("vocab"));
  }
  model::validate_synth_config(c);
  // A preset's LongRoPE (its factor is the last long divisor) follows the shape options.
  const bool preset_longrope = !c.rope_factors_long.empty() && !a.given("rope-scaling");
  const float preset_factor = preset_longrope ? c.rope_factors_long.back() : 0.0f;
  c.rope_freq_factors.clear();
  c.rope_factors_long.clear();
  if (preset_longrope) {
    model::synthetic_long_rope(c, preset_factor, c.rope_orig_ctx);
  } else if (longrope) {
    // LongRoPE of a model trained on ctx / F tokens.
    model::synthetic_long_rope(c, scaling.factor,
                               std::max(1, static_cast<int>(c.ctx / scaling.factor)));
  } else if (scaling.factor > 0.0f) {
    c.rope_freq_factors = model::llama3_rope_factors(
        c.rope_dim(), c.rope_theta, scaling.factor, scaling.low_freq_factor,
        scaling.high_freq_factor, scaling.original_ctx);
  }
  c.synthetic = true;
  if (spec.label.empty() || overridden) {
    spec.label = strfmt("%s%s, %d layers, dim %d, %d heads, %d KV heads, ffn %d, vocab %d",
                        spec.label.empty() ? "" : (spec.label + "-like: ").c_str(), c.arch.c_str(),
                        c.n_layers, c.dim, c.n_heads, c.n_kv_heads, c.hidden_dim, c.vocab_size);
  }

  // Resources first: nothing is allocated or written if the model cannot be run here or
  // the file cannot be stored.
  // The new file is written beside the old one and renamed over it when complete, so the
  // old one's space is not free while it is written.
  const model::SynthNeeds needs = model::synth_needs(spec);
  model::check_synth_fits(needs, sys::available_memory_bytes(), sys::free_disk_bytes(out), out);
  io::AtomicFile file(out);  // an unwritable path fails here, before any work

  Progress bar("synth", static_cast<int64_t>(needs.file_bytes), "B", !json);
  const double t0 = now_seconds();
  const model::SynthResult r =
      model::write_synthetic_gguf(spec, file, [&](uint64_t done, uint64_t total) {
        bar.set_total(static_cast<int64_t>(total));
        bar.update(static_cast<int64_t>(done));
      });
  file.commit();  // on an error before this, the temporary file is removed and `out` left as it was
  const double secs = now_seconds() - t0;
  bar.finish();
  if (json) {
    JsonWriter j;
    j.begin_object();
    j.kv("output", out)
        .kv("name", model::synthetic_name(spec.label))
        .kv("bytes", r.bytes)
        .kv("tensors", r.n_tensors);
    j.kv("params", c.n_params()).kv("outtype", outtype).kv("seed", spec.seed).kv("arch", c.arch);
    j.kv("head_dim", c.head_dim())
        .kv("rope_scaling", !c.rope_factors_long.empty()   ? "longrope"
                            : !c.rope_freq_factors.empty() ? "llama3"
                            : c.rope_freq_scale != 1.0f    ? "linear"
                                                           : "none");
    j.kv("sliding_window", c.sliding_window);
    j.kv("n_layers", c.n_layers)
        .kv("dim", c.dim)
        .kv("n_heads", c.n_heads)
        .kv("n_kv_heads", c.n_kv_heads);
    j.kv("hidden_dim", c.hidden_dim).kv("vocab_size", c.vocab_size).kv("context_length", c.ctx);
    j.kv("memory_needed", needs.memory_bytes());
    j.kv("tokenizer",
         tokenizer_desc.empty() ? std::string("generated SentencePiece") : tokenizer_desc);
    j.kv("seconds", secs).kv("mb_per_s", secs > 0 ? r.bytes / secs / 1e6 : 0.0);
    j.end_object();
    std::printf("%s\n", j.str().c_str());
  } else {
    std::fprintf(
        stderr,
        "wrote %s: %s (%s, %.3f B parameters, %d tensors, %s, seed %llu) in %.1f s (%.0f MB/s)\n",
        out.c_str(), model::synthetic_name(spec.label).c_str(),
        sys::human_bytes(static_cast<double>(r.bytes)).c_str(), c.n_params() / 1e9, r.n_tensors,
        outtype.c_str(), static_cast<unsigned long long>(spec.seed), secs,
        secs > 0 ? r.bytes / secs / 1e6 : 0.0);
  }
  return 0;
}

}  // namespace kivi::tools
