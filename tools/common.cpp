#include "common.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>

#include "core/cpu.h"
#include "core/error.h"
#include "core/sysinfo.h"
#include "core/threadpool.h"
#include "kv/format.h"
#include "model/finite.h"

namespace kivi::tools {

void add_model_options(Args& a) {
  a.section("Model");
  a.add("model", 'm', "FILE",
        "Model file: a llama2.c checkpoint (.bin) or GGUF. Default: $KIVI_MODEL, then "
        "models/stories260K.bin, then ../shared/models/stories260K.bin.");
  a.add("tokenizer", 't', "FILE",
        "llama2.c tokenizer file. Default for .bin models: tok<vocab>.bin or tokenizer.bin beside the "
        "model; GGUF models use their embedded tokenizer.");
  a.add("ctx", 'c', "N", "Context length in tokens; the KV cache is allocated for N. Default: the model's.");
  a.add("threads", 0, "N", "Worker threads (0 = all cores).", "0");
  a.add_flag("alibi", 0, "Use ALiBi attention biases instead of RoPE (changes the model; for testing the kernels).");
  a.add("simd", 0, "TARGET", "Force a SIMD target (e.g. avx3, avx2, sse4, scalar). Default: the best this CPU supports.");
  a.add_flag("check-weights", 0,
             "Scan every weight for NaN and Inf at load and name the first tensor holding one (reads the whole "
             "file once). Without it, non-finite values are still an error, at the first layer they reach.");
}

void add_kv_options(Args& a, bool allow_list) {
  a.section("KV cache");
  a.add("kv-cache", 0, allow_list ? "LIST" : "FORMAT",
        std::string(allow_list ? "Comma-separated cache formats. " : "Cache format for keys and values. ") +
            "Formats: f32, f16, int8, kivi2, kivi4, kivi8.",
        allow_list ? "" : "f32");
  a.add("kv-cache-k", 0, "FORMAT", "Key format (overrides --kv-cache for keys), e.g. kivi4.");
  a.add("kv-cache-v", 0, "FORMAT", "Value format (overrides --kv-cache for values), e.g. kivi2.");
  a.add("int8-granularity", 0, "G",
        "int8 scale granularity: tensor (one per layer and K/V, fixed at the first prefill; later "
        "overflow is clamped and counted), token, head or group.",
        "head");
  a.add("group-size", 'G', "G",
        "Quantization group: KIVI key groups of G tokens; KIVI value and int8 groups of min(G, head_dim) channels.",
        "32");
  a.add("residual", 'R', "R", "KIVI residual window: the last R tokens stay in full precision; a multiple of G.", "128");
  a.add("key-flush", 0, "POLICY",
        "KIVI key flush: batch (quantize all R when the residual reaches R) or group (quantize the "
        "oldest G when it exceeds R).",
        "batch");
  a.add("scale-dtype", 0, "TYPE", "Storage of scales and zero points: f16 (half the bytes) or f32.", "f16");
  a.add("attn-precision", 0, "MODE",
        "Attention over quantized caches: exact (float math on the stored codes, within 1e-5 of "
        "dequantize-then-attend) or fast (integer dot products with the query and the softmax "
        "weights rounded to int16; ~1e-3 relative error, faster on x86).",
        "exact");
  a.add("window", 0, "N", "Sliding-window attention over the last N tokens (0 = full).", "0");
}

std::unique_ptr<model::Model> load_model(const Args& a) {
  const std::string path = model::default_model_path(a.str("model"));
  if (path.empty()) {
    fail("no model given and none found: pass -m FILE, set $KIVI_MODEL, or run scripts/get-model.sh "
         "(looked for models/stories260K.bin and ../shared/models/stories260K.bin)");
  }
  auto m = model::Model::load(path, a.str("tokenizer"));
  if (a.flag("alibi")) m->mutable_config().alibi = true;
  if (a.flag("check-weights")) model::check_finite_weights(*m);
  return m;
}

std::vector<std::string> model_input_paths(const Args& a) {
  const std::string path = model::default_model_path(a.str("model"));
  return {path, a.given("tokenizer") ? a.str("tokenizer") : model::default_tokenizer_path(path)};
}

std::vector<std::string> kv_format_list(const Args& a, const std::vector<std::string>& def) {
  if (!a.given("kv-cache")) return def;
  const std::string s = a.str("kv-cache");
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t comma = s.find(',', start);
    const std::string item = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (item.empty()) {
      fail("--kv-cache: empty format in the list '%s' (formats: f32, f16, int8, kivi2, kivi4, kivi8)", s.c_str());
    }
    out.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

void refuse_kv_options(const Args& a, const char* why) {
  for (const char* o : {"kv-cache", "kv-cache-k", "kv-cache-v", "int8-granularity", "group-size", "residual",
                        "key-flush", "scale-dtype", "attn-precision", "window"}) {
    if (a.given(o)) fail("--%s has no effect with %s; leave it out", o, why);
  }
}

bool parse_command_line(Args& a, int argc, char** argv) {
  if (!a.parse(argc, argv)) {
    std::fputs(a.help().c_str(), stdout);
    return false;
  }
  if (a.given("simd")) cpu::force_target(a.str("simd"));
  return true;
}

int threads_option(const Args& a) {
  const int t = static_cast<int>(a.integer("threads", 0, 1024));
  return t > 0 ? t : hardware_threads();
}

kv::CacheConfig cache_config(const Args& a, const std::string& format) {
  kv::CacheConfig c;
  // An explicit --kv-cache '' is an error (parse_format names it), as --kv-cache-k '' is.
  const std::string base = format.empty() ? a.str("kv-cache") : format;
  kv::StreamFormat f{kv::parse_format(base, "--kv-cache"), kv::parse_granularity(a.str("int8-granularity"))};
  c.k = f;
  c.v = f;
  if (a.given("kv-cache-k")) c.k.format = kv::parse_format(a.str("kv-cache-k"), "--kv-cache-k");
  if (a.given("kv-cache-v")) c.v.format = kv::parse_format(a.str("kv-cache-v"), "--kv-cache-v");
  c.group_size = static_cast<int>(a.integer("group-size", 1, 65536));
  c.residual = static_cast<int>(a.integer("residual", 0, model::kMaxContext));
  c.key_flush = kv::parse_key_flush(a.str("key-flush"));
  c.param_type = kv::parse_param_type(a.str("scale-dtype"));
  return c;
}

runtime::SessionOptions session_options(const Args& a, const model::Model& m, const std::string& format) {
  runtime::SessionOptions o;
  o.ctx = a.given("ctx") ? static_cast<int>(a.integer("ctx", 1, model::kMaxContext)) : 0;
  if (o.ctx > m.config().ctx && !m.config().synthetic) {
    fail("--ctx %d is larger than the model's context length %d", o.ctx, m.config().ctx);
  }
  o.threads = threads_option(a);
  o.cache = cache_config(a, format);
  o.forward.precision = attn::parse_precision(a.str("attn-precision"));
  o.forward.window = static_cast<int>(a.integer("window", 0, model::kMaxContext));
  if (!a.given("ctx")) o.ctx = default_context(m, o);
  return o;
}

int default_context(const model::Model& m, const runtime::SessionOptions& o) {
  const auto& c = m.config();
  const uint64_t avail = sys::available_memory_bytes();
  // The mapped weights stay resident while the model runs; the rest is the session's.
  const uint64_t weights = m.weight_bytes();
  const uint64_t budget = avail == 0 ? UINT64_MAX : avail > weights ? avail - weights : 0;
  auto fits = [&](int n) { return runtime::session_bytes(c, o.cache, n, o.max_batch) <= budget; };
  auto need = [&](int n) { return sys::human_bytes(static_cast<double>(runtime::session_bytes(c, o.cache, n, o.max_batch))); };
  const std::string have = sys::human_bytes(static_cast<double>(budget));
  if (c.synthetic) {
    // A synthetic model's context length is nominal (the real model's); a cache for all
    // of it (8 GiB in f32 for llama-3.2-1b's 131072) would only slow every run down.
    int n = std::min(c.ctx, kSyntheticDefaultCtx);
    while (n > 256 && !fits(n)) n /= 2;
    if (!fits(n)) {
      fail("a session of %d tokens needs %s (KV cache %s) but only %s of memory is available beside the weights",
           n, need(n).c_str(), describe_cache(o.cache).c_str(), have.c_str());
    }
    if (n < c.ctx) {
      std::fprintf(stderr, "note: context of %d tokens (the synthetic model's nominal context is %d; --ctx N sets it)\n",
                   n, c.ctx);
    }
    return n;
  }
  if (fits(c.ctx)) return c.ctx;
  int fit = 0;  // the largest power of two that fits
  for (int n = 256; n < c.ctx && fits(n); n *= 2) fit = n;
  fail("a session over the model's full context of %d tokens needs %s (KV cache %s) but only %s of memory is "
       "available beside the weights; pass --ctx N%s", c.ctx, need(c.ctx).c_str(), describe_cache(o.cache).c_str(),
       have.c_str(), fit > 0 ? strfmt(" (%d fits)", fit).c_str() : "");
}

std::string describe_cache(const kv::CacheConfig& c) {
  std::string s = c.k == c.v ? kv::describe(c.k) : "K " + kv::describe(c.k) + " / V " + kv::describe(c.v);
  if (c.has_residual()) {
    s += strfmt(" (G=%d, R=%d, %s flush, %s scales)", c.group_size, c.residual, kv::key_flush_name(c.key_flush),
                kv::param_type_name(c.param_type));
  } else if (c.k.format == kv::Format::kInt8 || c.v.format == kv::Format::kInt8) {
    s += strfmt(" (%s scales)", kv::param_type_name(c.param_type));
  }
  return s;
}

}  // namespace kivi::tools
