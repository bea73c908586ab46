#include "common.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "core/cpu.h"
#include "core/error.h"
#include "core/sysinfo.h"
#include "core/threadpool.h"
#include "io/mapped_file.h"
#include "kv/format.h"
#include "model/finite.h"

namespace kivi::tools {

void add_model_options(Args& a, const char* ctx_help) {
  a.section("Model");
  a.add("model", 'm', "FILE",
        "Model file: a llama2.c checkpoint (.bin) or GGUF. Default: $KIVI_MODEL, then "
        "models/stories260K.bin, then ../shared/models/stories260K.bin.");
  a.add("tokenizer", 't', "FILE",
        "llama2.c tokenizer file. Default for .bin models: tok<vocab>.bin or tokenizer.bin beside "
        "the "
        "model; GGUF models use their embedded tokenizer.");
  a.add("ctx", 'c', ctx_help ? "LIST" : "N",
        ctx_help
            ? ctx_help
            : "Context length in tokens; the KV cache is allocated for N. Default: the model's.");
  add_threads_options(a);
  a.add_flag(
      "alibi", 0,
      "Use ALiBi attention biases instead of RoPE (changes the model; for testing the kernels).");
  a.add(
      "simd", 0, "TARGET",
      "Force a SIMD target (e.g. avx3, avx2, sse4, scalar). Default: the best this CPU supports.");
  a.add_flag("copy-weights", 0,
             "Copy the weights from the file into memory backed by 2 MiB pages at load (about "
             "0.3 s per GiB; more when the kernel must first compact memory). Float weights "
             "decode up to ~1.2x faster than from the file's 4 KiB page-cache pages.");
  a.add_flag("check-weights", 0,
             "Scan every weight for NaN and Inf at load and name the first tensor holding one "
             "(reads the whole "
             "file once). Without it, non-finite values are still an error, at the first layer "
             "they reach.");
}

void add_kv_options(Args& a, bool allow_list) {
  a.section("KV cache");
  a.add("kv-cache", 0, allow_list ? "LIST" : "FORMAT",
        std::string(allow_list ? "Comma-separated cache formats. "
                               : "Cache format for keys and values. ") +
            "Formats: f32, f16, int8, kivi2, kivi4, kivi8.",
        allow_list ? "" : "f32");
  a.add("kv-cache-k", 0, "FORMAT", "Key format (overrides --kv-cache for keys), e.g. kivi4.");
  a.add("kv-cache-v", 0, "FORMAT", "Value format (overrides --kv-cache for values), e.g. kivi2.");
  a.add("int8-granularity", 0, "G",
        "int8 scale granularity: tensor (one per layer and K/V, fixed at the first prefill; later "
        "overflow is clamped and counted), token, head or group.",
        "head");
  a.add("group-size", 'G', "G",
        "Quantization group: KIVI key groups of G tokens; KIVI value and int8 groups of min(G, "
        "head_dim) channels.",
        "32");
  a.add("residual", 'R', "R",
        "KIVI residual window: the last R tokens stay in full precision; a multiple of G.", "128");
  a.add("key-flush", 0, "POLICY",
        "KIVI key flush: batch (quantize all R when the residual reaches R) or group (quantize the "
        "oldest G when it exceeds R).",
        "batch");
  a.add("key-rope", 0, "WHERE",
        "Keys stored after RoPE (post, as KIVI does) or before it (pre: quantized unrotated, where "
        "channel outliers stay in their channels, and rotated by position inside attention).",
        "post");
  a.add("kv-share", 0, "N",
        "Cross-layer KV sharing: each group of N adjacent layers reads the first layer's keys and "
        "values "
        "(the others skip their K and V projections and store no cache). 1 = no sharing.",
        "1");
  a.add("kv-share-map", 0, "LIST",
        "Cross-layer KV sharing by pairs BORROWER:OWNER (comma-separated, owner earlier than "
        "borrower), "
        "e.g. 3:1,5:2; applied after --kv-share.");
  a.add("scale-dtype", 0, "TYPE", "Storage of scales and zero points: f16 (half the bytes) or f32.",
        "f16");
  a.add("attn-precision", 0, "MODE",
        "Attention over quantized caches: exact (float math on the stored codes, within 1e-5 of "
        "dequantize-then-attend) or fast (integer dot products with the query and the softmax "
        "weights rounded to int16; ~1e-3 relative error, faster on x86).",
        "exact");
  a.add("window", 0, "N",
        "Sliding-window attention over the last N tokens (0 = full). With --context-overflow "
        "window: the "
        "window kept in the cache (default: the context minus the sink blocks and one block).",
        "0");
  a.add("context-overflow", 0, "POLICY",
        "When the cache is full: stop (an error), shift (drop the oldest half after the sinks and "
        "go on), "
        "or window (keep the sinks and the most recent --window tokens; memory stays flat).",
        "stop");
  a.add("sinks", 0, "N",
        "Tokens at the start kept by the shift and window policies (attention sinks).", "4");
}

void add_sparse_options(Args& a, bool lists) {
  a.section("Sparse attention");
  a.add("sparse", 0, lists ? "KINDS" : "KIND",
        std::string(lists ? "Comma-separated selection kinds; each is " : "") +
            "Block-sparse attention: each KV head attends the top blocks by their summary (quest: "
            "per-channel key min/max bound; max; mean; fix: the mean of the keys at offsets 0, "
            "B/4, B/2, 3B/4; random: a baseline) plus the sinks and the local window; off = "
            "dense.",
        "off");
  a.add("sparse-block", 0, "N", "Tokens per block (a multiple of the KIVI key group G).", "64");
  a.add("sparse-budget", 0, lists ? "LIST" : "N",
        lists ? "Tokens of selected blocks per KV head and step (comma-separated list; k = 1024)."
              : "Tokens of selected blocks per KV head and step.",
        "4096");
  a.add("sparse-sinks", 0, "N", "First tokens always attended.", "4");
  a.add(
      "sparse-local", 0, "N",
      "Most recent tokens always attended (with KIVI's residual and any block not yet summarized).",
      "256");
  a.add("sparse-dense-layers", 0, "N", "The first N layers attend densely.", "0");
  a.add("sparse-heads", 0, "MODE",
        "per: each KV head selects its own blocks; shared: the KV heads' scores are summed and "
        "every head attends the same blocks.",
        "per");
  a.add("sparse-reselect", 0, "N",
        "Select every N decode steps and reuse the blocks in between (the local window reaches "
        "back to the last selection).",
        "1");
  a.add("sparse-reuse-layers", 0, "N",
        "Of every N consecutive sparse layers the first selects and the others attend its blocks.",
        "1");
  a.add("sparse-preselect", 0, "W",
        "After a prefill, the attention of its last W tokens picks candidate blocks per KV head "
        "(SnapKV-style, max-pooled over neighbouring blocks); decode selects among them and the "
        "blocks filled since. 0 = off.",
        "0");
  a.add("sparse-candidates", 0, "N",
        "Tokens of candidate blocks per KV head kept by --sparse-preselect.", "16384");
}

sparse::Options sparse_options(const Args& a, sparse::Kind default_kind) {
  sparse::Options o;
  if (!a.given("sparse") && default_kind == sparse::Kind::kOff) {
    for (const char* n : {"sparse-block", "sparse-budget", "sparse-sinks", "sparse-local",
                          "sparse-dense-layers", "sparse-heads", "sparse-reselect",
                          "sparse-reuse-layers", "sparse-preselect", "sparse-candidates"}) {
      if (a.given(n)) fail("--%s needs --sparse KIND (quest, max, mean, fix or random)", n);
    }
    return o;
  }
  o.kind = a.given("sparse") ? sparse::parse_kind(a.str("sparse")) : default_kind;
  o.block = static_cast<int>(a.integer("sparse-block", 1, 65536));
  o.budget = static_cast<int>(a.integer("sparse-budget", 0, model::kMaxContext));
  o.sinks = static_cast<int>(a.integer("sparse-sinks", 0, model::kMaxContext));
  o.local = static_cast<int>(a.integer("sparse-local", 1, model::kMaxContext));
  o.dense_layers = static_cast<int>(a.integer("sparse-dense-layers", 0, 1 << 16));
  o.heads = sparse::parse_heads(a.str("sparse-heads"));
  o.reselect = static_cast<int>(a.integer("sparse-reselect", 1, 65536));
  o.reuse_layers = static_cast<int>(a.integer("sparse-reuse-layers", 1, 65536));
  o.preselect = static_cast<int>(a.integer("sparse-preselect", 0, model::kMaxContext));
  o.candidates = static_cast<int>(a.integer("sparse-candidates", 0, model::kMaxContext));
  if (a.given("sparse-candidates") && o.preselect == 0)
    fail("--sparse-candidates needs --sparse-preselect W");
  o.validate();
  return o;
}

std::unique_ptr<model::Model> load_model(const Args& a) {
  const std::string path = model::default_model_path(a.str("model"));
  if (path.empty()) {
    fail(
        "no model given and none found: pass -m FILE, set $KIVI_MODEL, or run scripts/get-model.sh "
        "(looked for models/stories260K.bin and ../shared/models/stories260K.bin)");
  }
  auto m = model::Model::load(path, a.str("tokenizer"));
  if (a.flag("alibi")) m->mutable_config().alibi = true;
  if (a.flag("copy-weights") && !m->copy_weights_to_memory())
    std::fprintf(
        stderr,
        "warning: could not copy the weights into memory; reading them from the file's map\n");
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
    const std::string item =
        s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (item.empty()) {
      fail(
          "--kv-cache: empty format in the list '%s' (formats: f32, f16, int8, kivi2, kivi4, "
          "kivi8)",
          s.c_str());
    }
    out.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

void refuse_kv_options(const Args& a, const char* why) {
  for (const char* o : {"kv-cache",
                        "kv-cache-k",
                        "kv-cache-v",
                        "int8-granularity",
                        "group-size",
                        "residual",
                        "key-flush",
                        "scale-dtype",
                        "attn-precision",
                        "window",
                        "sparse",
                        "sparse-block",
                        "sparse-budget",
                        "sparse-sinks",
                        "sparse-local",
                        "sparse-dense-layers",
                        "sparse-heads",
                        "sparse-reselect",
                        "sparse-reuse-layers",
                        "sparse-preselect",
                        "sparse-candidates"}) {
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

void add_threads_options(Args& a) {
  a.add("threads", 0, "N",
        "Worker threads, counting the main one (0 = every hardware thread this process may use). "
        "More than the hardware has is capped to it, with a warning, unless --threads-force.",
        "0");
  a.add_flag("threads-force", 0,
             "Use --threads N even above the hardware thread count (threads then share cores and "
             "idle ones block instead of spinning).");
}

int threads_option(const Args& a) {
  const int requested = static_cast<int>(a.integer("threads", 0, 1024));
  const ThreadCount tc = resolve_thread_count(requested, a.flag("threads-force"));
  if (tc.capped) {
    std::fprintf(
        stderr,
        "kivi: warning: --threads %d is more than the %d hardware thread%s this process may use; "
        "using %d (--threads-force keeps %d)\n",
        requested, tc.threads, tc.threads == 1 ? "" : "s", tc.threads, requested);
  }
  return tc.threads;
}

std::string read_text_file(const std::string& path) {
  io::check_regular_file(path, "text");
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("cannot read text file '%s'", path.c_str());
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<std::pair<int, int>> parse_share_map(const std::string& text) {
  std::vector<std::pair<int, int>> pairs;
  size_t i = 0;
  while (i <= text.size()) {
    const size_t e = std::min(text.find(',', i), text.size());
    const std::string item = text.substr(i, e - i);
    const size_t colon = item.find(':');
    char* end = nullptr;
    long b = -1, o = -1;
    if (colon != std::string::npos && colon > 0 && colon + 1 < item.size()) {
      b = std::strtol(item.c_str(), &end, 10);
      const bool b_ok = end == item.c_str() + colon;
      o = std::strtol(item.c_str() + colon + 1, &end, 10);
      if (!b_ok || *end != '\0') b = o = -1;
    }
    if (b < 0 || o < 0 || b > (1 << 20) || o > (1 << 20)) {
      fail("--kv-share-map: '%s' is not BORROWER:OWNER (layer numbers, e.g. 3:1)", item.c_str());
    }
    pairs.emplace_back(static_cast<int>(b), static_cast<int>(o));
    i = e + 1;
  }
  return pairs;
}

kv::CacheConfig cache_config(const Args& a, const std::string& format_and_policies) {
  kv::CacheConfig c;
  // FORMAT[+shareN][+pre]: cache policies attached to one format (bench lists).
  std::string spec = format_and_policies.empty() ? a.str("kv-cache") : format_and_policies;
  std::vector<std::string> policies;
  for (size_t plus = spec.find('+'); plus != std::string::npos; plus = spec.find('+')) {
    const size_t next = spec.find('+', plus + 1);
    policies.push_back(
        spec.substr(plus + 1, next == std::string::npos ? std::string::npos : next - plus - 1));
    spec.erase(plus, next == std::string::npos ? std::string::npos : next - plus);
  }
  const std::string base = spec;
  kv::StreamFormat f{kv::parse_format(base, "--kv-cache"),
                     kv::parse_granularity(a.str("int8-granularity"))};
  c.k = f;
  c.v = f;
  if (a.given("kv-cache-k")) c.k.format = kv::parse_format(a.str("kv-cache-k"), "--kv-cache-k");
  if (a.given("kv-cache-v")) c.v.format = kv::parse_format(a.str("kv-cache-v"), "--kv-cache-v");
  c.group_size = static_cast<int>(a.integer("group-size", 1, 65536));
  c.residual = static_cast<int>(a.integer("residual", 0, model::kMaxContext));
  c.key_flush = kv::parse_key_flush(a.str("key-flush"));
  c.param_type = kv::parse_param_type(a.str("scale-dtype"));
  c.key_rope = kv::parse_key_rope(a.str("key-rope"));
  c.share_every = static_cast<int>(a.integer("kv-share", 1, 1 << 16));
  if (a.given("kv-share-map")) c.share_map = parse_share_map(a.str("kv-share-map"));
  for (const auto& p : policies) {
    char* end = nullptr;
    if (p.rfind("share", 0) == 0 && p.size() > 5) {
      const long n = std::strtol(p.c_str() + 5, &end, 10);
      if (*end != '\0' || n < 1 || n > (1 << 16))
        fail("'+%s': expected +shareN with N >= 1", p.c_str());
      c.share_every = static_cast<int>(n);
    } else if (p == "pre") {
      c.key_rope = kv::KeyRope::kPre;
    } else {
      fail("'+%s': unknown cache policy (valid: +shareN, +pre)", p.c_str());
    }
  }
  return c;
}

runtime::SessionOptions session_options(const Args& a, const model::Model& m,
                                        const std::string& format, int ctx, bool read_sparse) {
  runtime::SessionOptions o;
  o.ctx = ctx >= 0         ? ctx
          : a.given("ctx") ? static_cast<int>(a.integer("ctx", 1, model::kMaxContext))
                           : 0;
  if (o.ctx > m.config().ctx && !m.config().synthetic) {
    fail("--ctx %d is larger than the model's context length %d", o.ctx, m.config().ctx);
  }
  o.threads = threads_option(a);
  o.cache = cache_config(a, format);
  o.forward.precision = attn::parse_precision(a.str("attn-precision"));
  o.forward.window = static_cast<int>(a.integer("window", 0, model::kMaxContext));
  o.overflow = runtime::parse_context_overflow(a.str("context-overflow"));
  o.sinks = static_cast<int>(a.integer("sinks", 0, 512));
  if (read_sparse) o.sparse = sparse_options(a);
  if (o.ctx == 0) o.ctx = default_context(m, o);
  return o;
}

int default_context(const model::Model& m, const runtime::SessionOptions& o) {
  const auto& c = m.config();
  const uint64_t avail = sys::available_memory_bytes();
  // The mapped weights stay resident while the model runs; the rest is the session's.
  const uint64_t weights = m.weight_bytes();
  const uint64_t budget = avail == 0 ? UINT64_MAX : avail > weights ? avail - weights : 0;
  auto fits = [&](int n) {
    return runtime::session_bytes(c, o.cache, n, o.max_batch, o.sparse) <= budget;
  };
  auto need = [&](int n) {
    return sys::human_bytes(
        static_cast<double>(runtime::session_bytes(c, o.cache, n, o.max_batch, o.sparse)));
  };
  const std::string have = sys::human_bytes(static_cast<double>(budget));
  if (c.synthetic) {
    // A synthetic model's context length is nominal (the real model's); a cache for all
    // of it (8 GiB in f32 for llama-3.2-1b's 131072) would only slow every run down.
    int n = std::min(c.ctx, kSyntheticDefaultCtx);
    while (n > 256 && !fits(n)) n /= 2;
    if (!fits(n)) {
      fail(
          "a session of %d tokens needs %s (KV cache %s) but only %s of memory is available beside "
          "the weights",
          n, need(n).c_str(), describe_cache(o.cache).c_str(), have.c_str());
    }
    if (n < c.ctx) {
      std::fprintf(stderr,
                   "note: context of %d tokens (the synthetic model's nominal context is %d; --ctx "
                   "N sets it)\n",
                   n, c.ctx);
    }
    return n;
  }
  if (fits(c.ctx)) return c.ctx;
  int fit = 0;  // the largest power of two that fits
  for (int n = 256; n < c.ctx && fits(n); n *= 2) fit = n;
  fail(
      "a session over the model's full context of %d tokens needs %s (KV cache %s) but only %s of "
      "memory is "
      "available beside the weights; pass --ctx N%s",
      c.ctx, need(c.ctx).c_str(), describe_cache(o.cache).c_str(), have.c_str(),
      fit > 0 ? strfmt(" (%d fits)", fit).c_str() : "");
}

std::string describe_cache(const kv::CacheConfig& c) {
  std::string s =
      c.k == c.v ? kv::describe(c.k) : "K " + kv::describe(c.k) + " / V " + kv::describe(c.v);
  if (c.has_residual()) {
    s += strfmt(" (G=%d, R=%d, %s flush, %s scales)", c.group_size, c.residual,
                kv::key_flush_name(c.key_flush), kv::param_type_name(c.param_type));
  } else if (c.k.format == kv::Format::kInt8 || c.v.format == kv::Format::kInt8) {
    s += strfmt(" (%s scales)", kv::param_type_name(c.param_type));
  }
  if (c.key_rope == kv::KeyRope::kPre) s += ", keys before RoPE";
  const std::string sharing = kv::describe_sharing(c);
  if (!sharing.empty()) s += ", shared across " + sharing;
  return s;
}

}  // namespace kivi::tools
