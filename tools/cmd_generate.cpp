#include <cstdio>
#include <string>
#include <vector>

#include "common.h"
#include "core/error.h"
#include "core/json.h"
#include "core/timer.h"
#include "model/forward.h"
#include "runtime/sampler.h"

namespace kivi::tools {

int cmd_generate(int argc, char** argv) {
  Args a(
      "generate", "[-m MODEL] [-t TOKENIZER] [-p PROMPT] [-n N] [options]",
      "Generates text from PROMPT (default empty: from BOS alone) and streams it to stdout (the\n"
      "prompt first). A stats line follows on stderr: prompt and generated tokens, prefill and\n"
      "decode tokens/s, KV bytes.\n"
      "Generation stops at an end-of-text token, after N tokens, or when the context is full.");
  a.section("Generation");
  a.add("prompt", 'p', "TEXT", "The prompt.", "");
  a.add("n", 'n', "N", "Tokens to generate.", "256");
  a.add("temp", 0, "T", "Sampling temperature; 0 = greedy (argmax).", "0.8");
  a.add("top-k", 0, "K", "Sample from the K most likely tokens (0 = off).", "40");
  a.add("top-p", 0, "P",
        "Sample from the smallest set of tokens whose probability reaches P (1 = off).", "0.95");
  a.add("seed", 's', "S", "Random seed; the same seed gives the same text.", "42");
  a.add_flag("ignore-eos", 0,
             "Go on past end-of-text tokens (sampling another token instead), for long runs.");
  a.add_flag("no-kv-cache", 0,
             "Recompute every position at every step (the reference path; slow).");
  a.add_flag("json", 0, "Print one JSON object (text, token ids, stats) instead of streaming.");
  add_model_options(a);
  add_kv_options(a);
  if (!parse_command_line(a, argc, argv)) return 0;  // --help printed
  const bool json = a.flag("json");
  const int n_gen = static_cast<int>(a.integer("n", 0, 1 << 24));
  runtime::SamplerOptions so;
  so.temperature = static_cast<float>(a.number("temp", 0.0, 100.0));
  so.top_k = static_cast<int>(a.integer("top-k", 0, 1 << 24));
  // Any number parses; the range is checked with the sampler's own words.
  so.top_p = static_cast<float>(a.number("top-p", -1e30, 1e30));
  so.seed = static_cast<uint64_t>(a.integer("seed", 0, INT64_MAX));
  runtime::check_sampler_options(so);
  if (a.flag("no-kv-cache"))
    refuse_kv_options(a, "--no-kv-cache (it recomputes keys and values, it has no cache)");

  auto m = load_model(a);
  const auto& cfg = m->config();
  if (cfg.synthetic) {
    std::fprintf(stderr,
                 "note: %s has random weights (written by 'kivi synth' for speed measurement); "
                 "its text is meaningless\n",
                 m->path().c_str());
  }
  const auto& tk = m->tokenizer();
  runtime::SessionOptions opt = session_options(a, *m);
  const bool no_cache = a.flag("no-kv-cache");
  const bool ignore_eos = a.flag("ignore-eos");
  const std::string prompt = a.str("prompt");
  std::vector<int> tokens = tk.encode(prompt, tk.add_bos());
  const int ctx = opt.ctx > 0 ? opt.ctx : cfg.ctx;
  const bool bounded =
      opt.overflow != runtime::ContextOverflow::kStop;  // generation goes on past the context
  if (!bounded && static_cast<int>(tokens.size()) >= ctx) {
    fail(
        "the prompt is %zu tokens, longer than the context can hold with room to generate "
        "(--ctx %d)",
        tokens.size(), ctx);
  }
  std::unique_ptr<runtime::Session> sess;
  if (!no_cache) sess = std::make_unique<runtime::Session>(*m, opt);
  runtime::Sampler sampler(so, cfg.vocab_size);
  ThreadPool nc_pool(opt.threads);

  std::string text = tk.decode_all(tokens);
  if (!json) {
    std::fputs(text.c_str(), stdout);
    std::fflush(stdout);
  }
  const int n_prompt = static_cast<int>(tokens.size());
  double t0 = now_seconds();
  std::vector<float> nc_logits;
  const float* logits = nullptr;
  if (no_cache) {
    nc_logits = model::forward_no_cache(*m, tokens, &nc_pool);
    logits = nc_logits.data();
  } else {
    logits = sess->prefill(tokens);
  }
  const double t_prefill = now_seconds() - t0;
  std::string completion;
  std::vector<int> generated;
  std::string stop = "length";
  t0 = now_seconds();
  for (int i = 0; i < n_gen; ++i) {
    int next = sampler.sample(logits);
    if (next == tk.eos_id() || next == tk.bos_id() || tk.is_end_of_generation(next)) {
      if (!ignore_eos) {
        stop = "eos";
        break;
      }
      // The most likely token that does not end the text.
      next = -1;
      for (int t = 0; t < cfg.vocab_size; ++t) {
        if (t == tk.eos_id() || t == tk.bos_id() || tk.is_end_of_generation(t)) continue;
        if (next < 0 || logits[t] > logits[next]) next = t;
      }
    }
    const std::string piece = tk.decode(tokens.back(), next);
    tokens.push_back(next);
    generated.push_back(next);
    completion += piece;
    if (!json) {
      std::fputs(piece.c_str(), stdout);
      std::fflush(stdout);
    }
    if (i + 1 == n_gen) break;
    if (!bounded &&
        static_cast<int>(tokens.size()) > ctx) {  // the new token has no room in the cache
      stop = "context";
      break;
    }
    if (no_cache) {
      nc_logits = model::forward_no_cache(*m, tokens, &nc_pool);
      logits = nc_logits.data();
    } else {
      logits = sess->decode(next);
    }
  }
  const double t_decode = now_seconds() - t0;
  const int n_out = static_cast<int>(generated.size());
  const double prefill_tps = t_prefill > 0 ? n_prompt / t_prefill : 0.0;
  // Decode speed counts the forward passes after the prefill (the last token needs none).
  const int n_steps = n_out > 0 ? n_out - (stop == "length" || stop == "context" ? 1 : 0) : 0;
  const double decode_tps = t_decode > 0 && n_steps > 0 ? n_steps / t_decode : 0.0;
  const uint64_t kv_used = sess ? sess->cache().bytes_used() : 0;
  const uint64_t kv_reserved = sess ? sess->cache().bytes_reserved() : 0;
  if (json) {
    JsonWriter j;
    j.begin_object();
    j.kv("model", m->path());
    j.kv("prompt", prompt);
    j.kv("completion", completion);
    j.kv("text", text + completion);
    j.key("prompt_token_ids").begin_array();
    for (int i = 0; i < n_prompt; ++i) j.value(tokens[i]);
    j.end_array();
    j.key("token_ids").begin_array();
    for (int t : generated) j.value(t);
    j.end_array();
    j.kv("prompt_tokens", n_prompt);
    j.kv("generated_tokens", n_out);
    j.kv("prefill_tps", prefill_tps);
    j.kv("decode_tps", decode_tps);
    j.kv("kv_cache", no_cache ? std::string("none") : describe_cache(sess->options().cache));
    j.kv("kv_cache_bytes", kv_used);
    j.kv("kv_cache_reserved_bytes", kv_reserved);
    j.kv("stop", stop);
    j.kv("context_overflow", runtime::context_overflow_name(opt.overflow));
    j.kv("dropped_tokens", sess ? sess->dropped() : int64_t{0});
    j.kv("overflows", sess ? sess->overflows() : 0);
    j.kv("overflow_ms_mean",
         sess && sess->overflows() > 0 ? 1e3 * sess->overflow_seconds() / sess->overflows() : 0.0);
    j.end_object();
    std::printf("%s\n", j.str().c_str());
  } else {
    std::printf("\n");
    std::fflush(stdout);
    if (stop == "context")
      std::fprintf(stderr, "[stopped: the context of %d tokens is full]\n", ctx);
    std::fprintf(stderr,
                 "[prompt %d tokens, generated %d tokens | prefill %.1f tok/s, decode %.1f tok/s | "
                 "KV cache %s: %llu bytes used, %llu reserved]\n",
                 n_prompt, n_out, prefill_tps, decode_tps,
                 no_cache ? "none (--no-kv-cache)" : describe_cache(sess->options().cache).c_str(),
                 static_cast<unsigned long long>(kv_used),
                 static_cast<unsigned long long>(kv_reserved));
  }
  return 0;
}

}  // namespace kivi::tools
