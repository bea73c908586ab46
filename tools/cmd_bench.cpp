#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "common.h"
#include "runtime/engine_options.h"
#include "core/cpu.h"
#include "core/error.h"
#include "core/json.h"
#include "core/progress.h"
#include "core/sysinfo.h"
#include "kv/format.h"
#include "runtime/bench.h"
#include "runtime/perplexity.h"
#include "runtime/session.h"

namespace kivi::tools {

namespace {

const char* kRandomLabel = "random fill (speed only; token match not meaningful)";

// "kivi2", "int8/head", "K kivi4 / V kivi2", "f32+share2", "kivi2+pre".
std::string short_name(const kv::CacheConfig& c) {
  std::string s =
      c.k == c.v ? kv::describe(c.k) : "K " + kv::describe(c.k) + " / V " + kv::describe(c.v);
  if (c.share_every > 1) s += "+share" + std::to_string(c.share_every);
  if (!c.share_map.empty()) s += "+map";
  if (c.key_rope == kv::KeyRope::kPre) s += "+pre";
  return s;
}

bool is_f32(const kv::CacheConfig& c) {
  return !c.mixed() && c.k.format == kv::Format::kF32 && c.v.format == kv::Format::kF32 &&
         c.share_every == 1 && c.share_map.empty() && c.key_rope == kv::KeyRope::kPost;
}

// The parameters shared by every format: "G=32, R=128, batch flush, f16 scales".
std::string shared_params(const kv::CacheConfig& c) {
  return strfmt("G=%d, R=%d, %s key flush, %s scales, int8 per %s", c.group_size, c.residual,
                kv::key_flush_name(c.key_flush), kv::param_type_name(c.param_type),
                kv::granularity_name(c.k.granularity));
}

// The configurations to run: the f32 reference first (or the first listed one with
// --no-f32-reference), then each listed format, with the KV options applied to all.
struct Formats {
  kv::CacheConfig ref;
  std::vector<kv::CacheConfig> caches;
  std::vector<std::string> names;
  std::vector<char> no_cache;
  bool f32_ref = true, ref_listed = false;
};

Formats bench_formats(const Args& a) {
  // Formats: the list (default f32, f16, int8, kivi4, kivi2), with --kv-cache-k/-v applied
  // to each; the f32 reference goes first and is run once.
  Formats out;
  std::vector<std::string> list;
  if (a.given("configs") && a.given("kv-cache")) fail("give --configs or --kv-cache, not both");
  if (a.given("configs")) {
    list = a.list("configs");
  } else if (a.given("kv-cache")) {
    list = kv_format_list(a, {});
  } else if (a.given("kv-cache-k") || a.given("kv-cache-v")) {
    list = {"f32"};
  } else {
    list = {"f32", "f16", "int8", "kivi4", "kivi2"};
  }
  out.f32_ref = !a.flag("no-f32-reference");
  const bool f32_ref = out.f32_ref;
  kv::CacheConfig& ref = out.ref;
  ref = cache_config(a, "f32");
  ref.k.format = ref.v.format = kv::Format::kF32;
  std::vector<kv::CacheConfig>& caches = out.caches;
  std::vector<std::string>& names = out.names;
  std::vector<char>& no_cache = out.no_cache;
  bool& ref_listed = out.ref_listed;
  caches = {ref};
  names = {"f32"};
  no_cache = {0};
  if (!f32_ref) {
    if (list.empty() || list[0] == "no-cache")
      fail("--no-f32-reference: the first listed format becomes the reference; list a cache first");
    ref = cache_config(a, list[0]);
    caches = {ref};
    names = {short_name(ref)};
    ref_listed = true;
    list.erase(list.begin());
  }
  for (const auto& f : list) {
    if (f == "no-cache") {
      for (const auto& n : names) {
        if (n == f) fail("--configs lists no-cache twice");
      }
      caches.push_back(ref);
      names.push_back(f);
      no_cache.push_back(1);
      continue;
    }
    const kv::CacheConfig c = cache_config(a, f);
    if (f32_ref && is_f32(c)) {
      ref_listed = true;
      continue;
    }
    bool dup = false;
    for (const auto& n : names) dup = dup || n == short_name(c);
    if (dup) fail("--kv-cache lists %s twice", short_name(c).c_str());
    caches.push_back(c);
    names.push_back(short_name(c));
    no_cache.push_back(0);
  }
  return out;
}

// All sessions live at once: they must fit beside the weights before any is allocated.
void check_memory(const model::Model& m, const runtime::BenchConfig& bc) {
  const auto& mc = m.config();
  const auto& caches = bc.caches;
  uint64_t total = 0;
  for (size_t i = 0; i < caches.size(); ++i) {
    const kv::CacheConfig& c = caches[i];
    runtime::cache_shape_for(mc, c, bc.ctx);  // validates
    // Under --dist cp a session holds its shard of the positions.
    const int ctx = bc.cp ? model::cp_shard_tokens(bc.ctx, bc.cp->size(),
                                                   runtime::cache_shape_for(mc, c, bc.ctx).block())
                          : bc.ctx;
    total += runtime::session_bytes(mc, c, ctx, 64,
                                    i > 0 || bc.sparse_reference ? bc.sparse : sparse::Options{});
  }
  const uint64_t avail = sys::available_memory_bytes(), weights = m.weight_bytes();
  if (avail > 0 && total + weights > avail) {
    fail(
        "%zu sessions of %d tokens need %s beside the weights (%s) but only %s of memory is "
        "available; lower "
        "--ctx-fill or -n, or list fewer formats",
        caches.size(), bc.ctx, sys::human_bytes(static_cast<double>(total)).c_str(),
        sys::human_bytes(static_cast<double>(weights)).c_str(),
        sys::human_bytes(static_cast<double>(avail)).c_str());
  }
}

// Perplexity per configuration (cached ones; a cacheless decoder computes the f32
// cache's numbers in double, so it has no entry of its own).
std::vector<double> perplexities(const Args& a, const model::Model& model,
                                 const runtime::BenchConfig& bc, const runtime::BenchResult& r,
                                 bool json) {
  const auto* m = &model;
  const auto& mc = model.config();
  const auto& tk = model.tokenizer();
  const auto& caches = bc.caches;
  std::vector<double> ppl(r.formats.size(), 0.0);
  if (a.given("ppl-text")) {
    const auto text_tokens = tk.encode(text_everywhere(a.str("ppl-text")), false);
    const int pctx =
        a.given("ppl-ctx") ? static_cast<int>(a.integer("ppl-ctx", 2, 1 << 24)) : mc.ctx;
    Progress pbar("perplexity", static_cast<int64_t>(r.formats.size()), "config",
                  !json && Progress::stderr_is_terminal());
    for (size_t i = 0; i < r.formats.size(); ++i) {
      if (r.formats[i].no_cache) continue;
      runtime::SessionOptions o;
      o.ctx = pctx;
      o.cache = caches[i];
      o.threads = bc.threads;
      o.forward = bc.forward;
      if (i > 0 || bc.sparse_reference) o.sparse = bc.sparse;
      runtime::Session s(*m, o);
      ppl[i] = runtime::evaluate_perplexity(s, text_tokens, runtime::EvalMode::kStreaming).ppl;
      pbar.update(static_cast<int64_t>(i + 1));
    }
    pbar.finish();
  }

  return ppl;
}

// A finished run and what its report needs.
struct Report {
  const model::Model* m = nullptr;
  const runtime::BenchConfig* bc = nullptr;
  const runtime::BenchResult* r = nullptr;
  const Formats* formats = nullptr;
  std::vector<double> ppl;
  int n_fill = 0, n_gen = 0;
  bool random_fill = false, markdown = false, with_ppl = false;
};

void print_json(const Report& rep) {
  const auto& r = *rep.r;
  const auto& bc = *rep.bc;
  const auto* m = rep.m;
  const auto& mc = m->config();
  const auto& ppl = rep.ppl;
  const auto& ref = rep.formats->ref;
  const bool ref_listed = rep.formats->ref_listed, random_fill = rep.random_fill;
  const int n_fill = rep.n_fill, n_gen = rep.n_gen;
  const std::string fill_desc = n_fill == 0 ? "none" : random_fill ? kRandomLabel : "text";
  JsonWriter j;
  j.begin_object();
  j.kv("model", m->path()).kv("ctx_fill", n_fill).kv("ctx_fill_random", random_fill).kv("n", n_gen);
  j.kv("threads", r.threads).kv("prompt_tokens", r.prompt_tokens).kv("fill", fill_desc);
  j.kv("ranks", dist::size());  // under --dist kv_bytes are rank 0's share
  j.kv("token_match_meaningful", !random_fill).kv("synthetic", mc.synthetic);
  j.kv("simd", cpu::current_target_name()).kv("kv_params", shared_params(ref));
  j.kv("attn_precision", attn::precision_name(bc.forward.precision));
  j.kv("sparse", sparse::describe(bc.sparse));
  j.key("results").begin_array();
  for (size_t i = 0; i < r.formats.size(); ++i) {
    const auto& f = r.formats[i];
    j.begin_object();
    j.kv("format", f.name).kv("kv_cache", describe_cache(f.cache));
    j.kv("reference", i == 0).kv("listed", i > 0 || ref_listed);
    j.kv("ctx", r.ctx).kv("prefill_tps", f.prefill_tps).kv("decode_tps", f.decode_tps);
    j.kv("decode_ms", f.decode_seconds * 1e3).kv("kv_bytes", f.kv_bytes);
    j.kv("compression_vs_f32", f.compression_vs_f32).kv("compression_vs_f16", f.compression_vs_f16);
    j.kv("token_match", f.token_match);
    if (f.first_divergence >= 0) {
      j.kv("first_divergence", f.first_divergence);
    } else {
      j.key("first_divergence").null();
    }
    j.kv("overhead_pct", f.overhead_pct).kv("attn_share", f.attn_share).kv("no_cache", f.no_cache);
    if (ppl[i] > 0) {
      j.kv("ppl", ppl[i]);
    } else {
      j.key("ppl").null();
    }
    j.end_object();
  }
  j.end_array().end_object();
  std::printf("%s\n", j.str().c_str());
}

// The table (plain or Markdown) with a header naming the run.
void print_table(const Report& rep) {
  const auto& r = *rep.r;
  const auto& bc = *rep.bc;
  const auto* m = rep.m;
  const auto& mc = m->config();
  const auto& ppl = rep.ppl;
  const auto& ref = rep.formats->ref;
  const bool ref_listed = rep.formats->ref_listed, f32_ref = rep.formats->f32_ref;
  const bool random_fill = rep.random_fill, markdown = rep.markdown, with_ppl = rep.with_ppl;
  const int n_fill = rep.n_fill, n_gen = rep.n_gen;
  std::string fill_line = "no fill";
  if (n_fill > 0)
    fill_line = random_fill ? strfmt("%d positions, %s", n_fill, kRandomLabel)
                            : strfmt("%d tokens of text", n_fill);
  std::printf("model     %s%s\n", m->path().c_str(), mc.synthetic ? " (random weights)" : "");
  std::printf("fill      %s\n", fill_line.c_str());
  std::printf(
      "decode    at ctx %d (fill %d + prompt %d), %d greedy tokens per format, %d thread%s, SIMD "
      "%s\n",
      r.ctx, r.fill, r.prompt_tokens, n_gen, r.threads, r.threads == 1 ? "" : "s",
      cpu::current_target_name().c_str());
  if (dist::size() > 1) {
    std::printf(
        "ranks     %d (--dist tp): each holds 1/%d of the heads; KV bytes are rank 0's share\n",
        dist::size(), dist::size());
  }
  std::printf("KV        %s; compression counts the bytes used at ctx %d%s\n",
              shared_params(ref).c_str(), r.ctx + n_gen,
              random_fill ? ""
              : f32_ref   ? "; match: greedy tokens equal to f32's"
                          : "; match: greedy tokens equal to the reference's");
  if (bc.sparse.enabled())
    std::printf("sparse    %s (%s)\n", sparse::describe(bc.sparse).c_str(),
                f32_ref ? "every format but the f32 reference" : "every format");
  if (markdown) std::printf("\n");
  auto cells = [&](const runtime::BenchFormatResult& f, bool first, size_t index) {
    std::vector<std::string> c;
    c.push_back(!first       ? f.name
                : !f32_ref   ? f.name + " (reference)"
                : ref_listed ? "f32 (reference)"
                             : "f32 (reference, not listed)");
    c.push_back(std::to_string(r.ctx));
    c.push_back(strfmt("%.1f", f.prefill_tps));
    c.push_back(strfmt("%.1f", f.decode_tps));
    c.push_back(f.no_cache ? "n/a" : strfmt("%.0f%%", 100.0 * f.attn_share));
    c.push_back(std::to_string(f.kv_bytes));
    c.push_back(f.no_cache ? "-" : strfmt("%.2fx", f.compression_vs_f32));
    c.push_back(f.no_cache ? "-" : strfmt("%.2fx", f.compression_vs_f16));
    c.push_back(strfmt("%.1f%%%s", f.token_match, random_fill ? "*" : ""));
    c.push_back(f.first_divergence >= 0 ? std::to_string(f.first_divergence) : "-");
    c.push_back(first ? "-" : strfmt("%+.1f%%", f.overhead_pct));
    if (with_ppl) c.push_back(ppl[index] > 0 ? strfmt("%.4f", ppl[index]) : "n/a");
    return c;
  };
  std::vector<std::string> head = {"format",      "ctx",         "prefill tok/s", "decode tok/s",
                                   "attn share",  "KV bytes",    "vs f32",        "vs f16",
                                   "token match", "1st diverge", "overhead"};
  if (with_ppl) head.push_back("ppl");
  std::vector<std::vector<std::string>> rows;
  for (size_t i = 0; i < r.formats.size(); ++i) rows.push_back(cells(r.formats[i], i == 0, i));
  std::vector<size_t> w(head.size());
  for (size_t k = 0; k < head.size(); ++k) {
    w[k] = head[k].size();
    for (const auto& row : rows) w[k] = std::max(w[k], row[k].size());
  }
  auto line = [&](const std::vector<std::string>& c) {
    std::string s = markdown ? "|" : "";
    for (size_t k = 0; k < c.size(); ++k) {
      const std::string cell = k == 0 ? c[k] + std::string(w[k] - c[k].size(), ' ')
                                      : std::string(w[k] - c[k].size(), ' ') + c[k];
      s += markdown ? " " + cell + " |" : (k ? "  " : "") + cell;
    }
    std::printf("%s\n", s.c_str());
  };
  line(head);
  if (markdown) {
    std::string s = "|";
    for (size_t k = 0; k < head.size(); ++k)
      s += (k == 0 ? " :" : " ") + std::string(w[k] - 1, '-') + (k == 0 ? " |" : ": |");
    std::printf("%s\n", s.c_str());
  }
  for (const auto& row : rows) line(row);
  if (random_fill) std::printf("%s* %s\n", markdown ? "\n" : "", kRandomLabel);
}

}  // namespace

int cmd_bench(int argc, char** argv) {
  Args a(
      "bench",
      "[-m MODEL] [-t TOKENIZER] [-p PROMPT] [-n N] [--ctx-fill N [--ctx-fill-random]] "
      "[--kv-cache LIST] [KV options] [--threads N] [--json | --markdown]",
      "Runs KV cache formats side by side on one model, with the same prompt and the same number\n"
      "of greedy tokens, and reports per format: prefill and decode tokens/s, the share of a "
      "decode\n"
      "step spent in attention, KV cache bytes, compression against f32 and f16, greedy token\n"
      "agreement with the f32 cache (position by position, with the first divergence) and the\n"
      "decode time relative to f32. The f32 cache runs as the reference (unless\n"
      "--no-f32-reference). Formats default\n"
      "to f32,f16,int8,kivi4,kivi2; the KV options (G, R, ...) apply to every one. Sessions hold\n"
      "exactly fill + prompt + N tokens unless --ctx is given.\n"
      "\n"
      "Timing: every format's session is prepared first; then the decode steps run round-robin,\n"
      "one step of each format in turn, each step timed on its own, and speeds are medians over\n"
      "the steps, so a slow moment of the machine falls on all formats alike. Generation does not\n"
      "stop at end-of-text: every format runs N steps.\n"
      "\n"
      "--ctx-fill N puts N positions in the cache before the prompt, to measure decoding at a "
      "long\n"
      "context: a paragraph of text repeated and prefilled (slow for big models), or with\n"
      "--ctx-fill-random seeded random keys and values written straight into the cache through\n"
      "each format's quantizer (no forward pass; for speed only: the token match then means\n"
      "nothing and is labelled so).");
  a.section("Benchmark");
  a.add("prompt", 'p', "TEXT", "The prompt (after the fill).", "Once upon a time");
  a.add("n", 'n', "N", "Greedy tokens per format (= timed decode steps).", "200");
  a.add("ctx-fill", 0, "N", "Positions put in the cache before the prompt.", "0");
  a.add_flag("ctx-fill-random", 0,
             "Fill with seeded random keys and values instead of text (speed only).");
  a.add("seed", 's', "S", "Seed of the random fill.", "1234");
  a.add_flag("no-f32-reference", 0,
             "Do not run the f32 reference (whose cache may not fit at long contexts): the first "
             "listed format is the reference for token match and overhead, and --sparse applies "
             "to it too.");
  a.add("configs", 0, "LIST",
        "Configurations to compare (instead of --kv-cache): formats with optional policies, "
        "FORMAT[+shareN][+pre], and no-cache (every step recomputes every position), e.g. "
        "no-cache,f32,int8,f32+share2,int8+share2.");
  a.add("ppl-text", 0, "FILE",
        "Also report each configuration's perplexity on this text (streaming, as deployed).");
  a.add("ppl-ctx", 0, "N", "Context of the perplexity runs (default: the model's).");
  a.add_flag(
      "json", 0,
      "Print {\"model\", \"ctx_fill\", \"ctx_fill_random\", \"n\", \"threads\", \"results\": "
      "[{format, ctx, "
      "prefill_tps, decode_tps, kv_bytes, compression_vs_f32, compression_vs_f16, token_match, "
      "first_divergence, overhead_pct, attn_share, ...}]}.");
  a.add_flag("markdown", 0, "Print the table as GitHub Markdown.");
  add_model_options(a);
  add_kv_options(a, true);
  add_sparse_options(a);
  if (!parse_command_line(a, argc, argv)) return 0;  // --help printed
  const bool json = a.flag("json"), markdown = a.flag("markdown");
  if (json && markdown) fail("give --json or --markdown, not both");
  const int n_gen = static_cast<int>(a.integer("n", 1, 1 << 20));
  const int n_fill = static_cast<int>(a.integer("ctx-fill", 0, model::kMaxContext));
  const bool random_fill = a.flag("ctx-fill-random");
  if (random_fill && n_fill == 0)
    fail("--ctx-fill-random needs --ctx-fill N (N > 0 positions to fill)");

  const Formats fm = bench_formats(a);
  auto m = load_model(a);
  for (const char nc : fm.no_cache) {
    if (nc && dist::size() > 1)
      throw dist::CollectiveError("--configs no-cache runs in one process only");
  }
  const auto& mc = m->config();
  const auto& tk = m->tokenizer();
  runtime::BenchConfig bc;
  bc.names = fm.names;
  bc.caches = fm.caches;
  bc.no_cache = fm.no_cache;
  bc.n_gen = n_gen;
  bc.threads = threads_option(a);
  bc.seed = static_cast<uint64_t>(a.integer("seed", 0, INT64_MAX));
  bc.forward.precision = attn::parse_precision(a.str("attn-precision"));
  bc.forward.window = static_cast<int>(a.integer("window", 0, model::kMaxContext));
  bc.sparse = sparse_options(a);
  bc.sparse_reference = !fm.f32_ref;
  bc.cp = dist::cp_comm();
  if (random_fill) {
    bc.fill_random = n_fill;
  } else if (n_fill > 0) {
    bc.fill = runtime::fill_tokens(tk, runtime::kFillText, n_fill);
  }
  bc.prompt = tk.encode(a.str("prompt"), n_fill == 0);
  if (bc.prompt.empty()) fail("-p: the prompt has no tokens");
  const int need = n_fill + static_cast<int>(bc.prompt.size()) + n_gen;
  // Without --ctx, the sessions hold exactly what the run needs (at least one group of G).
  bc.ctx = a.given("ctx") ? static_cast<int>(a.integer("ctx", 1, model::kMaxContext))
                          : std::max(need, fm.ref.group_size);
  if (need > bc.ctx) {
    fail("--ctx-fill %d + prompt %zu tokens + -n %d = %d tokens do not fit in --ctx %d", n_fill,
         bc.prompt.size(), n_gen, need, bc.ctx);
  }
  if (bc.ctx > mc.ctx && !mc.synthetic) {
    fail(
        "--ctx-fill %d + prompt %zu tokens + -n %d = %d tokens exceed the model's context of %d; "
        "lower --ctx-fill "
        "or -n",
        n_fill, bc.prompt.size(), n_gen, bc.ctx, mc.ctx);
  }
  on_every_rank([&] {
    check_memory(*m, bc);
    return 0;
  });
  if (!json) note_if_synthetic(*m, "speeds are real, tokens are not");

  Progress bar("bench", 1, "tok", !json);
  const auto r = runtime::run_bench(*m, bc, [&](int64_t done, int64_t total) {
    bar.set_total(total);
    bar.update(done);
  });
  bar.finish();

  Report rep;
  rep.m = m.get();
  rep.bc = &bc;
  rep.r = &r;
  rep.formats = &fm;
  rep.ppl = perplexities(a, *m, bc, r, json);
  rep.n_fill = n_fill;
  rep.n_gen = n_gen;
  rep.random_fill = random_fill;
  rep.markdown = markdown;
  rep.with_ppl = a.given("ppl-text");
  if (json) {
    print_json(rep);
  } else {
    print_table(rep);
  }
  return 0;
}

}  // namespace kivi::tools
