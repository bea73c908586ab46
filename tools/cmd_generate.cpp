#include <cstdio>
#include <string>
#include <vector>

#include "common.h"
#include "core/error.h"
#include "core/json.h"
#include "core/timer.h"
#include "io/atomic_file.h"
#include "model/forward.h"
#include "runtime/generation.h"
#include "runtime/session_file.h"

namespace kivi::tools {

namespace {

// What a generate run did, for its report.
struct Report {
  const model::Model* m = nullptr;
  const runtime::Session* sess = nullptr;  // null with --no-kv-cache
  runtime::SessionOptions opt;
  std::string prompt, text, completion, stop, kv_load, kv_save;
  std::vector<int> prompt_tokens, generated;
  runtime::LoadedSession loaded;
  int n_prompt = 0, n_out = 0, n_saved = 0, ctx = 0;
  bool no_cache = false;
  double t_prefill = 0, t_save = 0, prefill_tps = 0, decode_tps = 0;
  uint64_t kv_saved_bytes = 0, kv_used = 0, kv_reserved = 0;
  int lookup = 0, steps = 0;  // the draft size; forward passes after the prefill
  std::string draft_model;    // --draft-model (drafts from it, not by lookup)
  runtime::Generator::Speculation spec;
};

void print_json(const Report& r) {
  JsonWriter j;
  j.begin_object();
  j.kv("model", r.m->path());
  j.kv("prompt", r.prompt);
  j.kv("completion", r.completion);
  j.kv("text", r.text + r.completion);
  j.key("prompt_token_ids").begin_array();
  for (int t : r.prompt_tokens) j.value(t);
  j.end_array();
  j.key("token_ids").begin_array();
  for (int t : r.generated) j.value(t);
  j.end_array();
  j.kv("prompt_tokens", r.n_prompt);
  j.kv("generated_tokens", r.n_out);
  j.kv("prefill_tps", r.prefill_tps);
  j.kv("decode_tps", r.decode_tps);
  j.kv("prefill_ms", 1e3 * r.t_prefill);
  if (!r.kv_load.empty()) {
    j.kv("kv_load", r.kv_load)
        .kv("kv_load_ms", 1e3 * r.loaded.load_seconds)
        .kv("kv_loaded_tokens", r.loaded.n_tokens)
        .kv("kv_file_bytes", r.loaded.bytes)
        .kv("kv_mapped_bytes", r.loaded.mapped_bytes);
    // What the file saves: the prefill that produced it.
    j.kv("kv_saved_prefill_tokens", r.loaded.prefill_tokens)
        .kv("kv_saved_prefill_ms", 1e3 * r.loaded.prefill_seconds);
  }
  if (!r.kv_save.empty()) {
    j.kv("kv_save", r.kv_save)
        .kv("kv_save_ms", 1e3 * r.t_save)
        .kv("kv_save_bytes", r.kv_saved_bytes);
  }
  j.kv("kv_cache", r.no_cache ? std::string("none") : describe_cache(r.sess->options().cache));
  j.kv("kv_cache_bytes", r.kv_used);
  j.kv("kv_cache_reserved_bytes", r.kv_reserved);
  j.kv("sparse", r.sess ? sparse::describe(r.sess->options().sparse) : std::string());
  if (r.sess && r.sess->sparse()) {
    const auto& ss = r.sess->sparse()->stats();
    j.kv("sparse_select_seconds", ss.select_seconds).kv("sparse_attend_seconds", ss.attend_seconds);
    j.kv("sparse_attended_fraction",
         ss.tokens_context ? double(ss.tokens_attended) / ss.tokens_context : 0.0);
  }
  j.kv("stop", r.stop);
  j.kv("decode_steps", r.steps);
  if (r.lookup > 0) {
    j.key("lookup").begin_object();
    j.kv("source", r.draft_model.empty() ? "prompt lookup" : "draft model");
    if (!r.draft_model.empty()) j.kv("draft_model", r.draft_model);
    j.kv("draft", r.lookup).kv("verifications", r.spec.rounds);
    j.kv("drafted", r.spec.drafted).kv("accepted", r.spec.accepted);
    j.kv("acceptance", r.spec.drafted ? double(r.spec.accepted) / r.spec.drafted : 0.0);
    j.end_object();
  }
  j.kv("context_overflow", runtime::context_overflow_name(r.opt.overflow));
  j.kv("dropped_tokens", r.sess ? r.sess->dropped() : int64_t{0});
  j.kv("overflows", r.sess ? r.sess->overflows() : 0);
  j.kv("overflow_ms_mean", r.sess && r.sess->overflows() > 0
                               ? 1e3 * r.sess->overflow_seconds() / r.sess->overflows()
                               : 0.0);
  j.end_object();
  std::printf("%s\n", j.str().c_str());
}

// The stats lines on stderr after the streamed text.
void print_stats(const Report& r) {
  std::printf("\n");
  std::fflush(stdout);
  if (r.stop == "context")
    std::fprintf(stderr, "[stopped: the context of %d tokens is full]\n", r.ctx);
  std::fprintf(
      stderr,
      "[prompt %d tokens, generated %d tokens | prefill %.1f tok/s, decode %.1f tok/s | "
      "KV cache %s: %llu bytes used, %llu reserved]\n",
      r.n_prompt, r.n_out, r.prefill_tps, r.decode_tps,
      r.no_cache ? "none (--no-kv-cache)" : describe_cache(r.sess->options().cache).c_str(),
      static_cast<unsigned long long>(r.kv_used), static_cast<unsigned long long>(r.kv_reserved));
  if (r.lookup > 0) {
    std::fprintf(stderr,
                 "[%s: %d of %d drafted tokens accepted (%.0f%%) in %d verifications; %.2f "
                 "tokens per decode step]\n",
                 r.draft_model.empty() ? "lookup" : "draft model", r.spec.accepted, r.spec.drafted,
                 r.spec.drafted ? 100.0 * r.spec.accepted / r.spec.drafted : 0.0, r.spec.rounds,
                 r.steps ? double(r.n_out) / r.steps : 0.0);
  }
  if (!r.kv_load.empty()) {
    std::fprintf(stderr,
                 "[KV cache loaded from %s: %d tokens in %.1f ms (%.1f of %.1f MiB mapped in "
                 "place); their prefill took %.1f ms]\n",
                 r.kv_load.c_str(), r.loaded.n_tokens, 1e3 * r.loaded.load_seconds,
                 r.loaded.mapped_bytes / 1048576.0, r.loaded.bytes / 1048576.0,
                 1e3 * r.loaded.prefill_seconds);
  }
  if (!r.kv_save.empty()) {
    std::fprintf(stderr, "[KV cache saved to %s: %d tokens, %llu bytes in %.1f ms]\n",
                 r.kv_save.c_str(), r.n_saved, static_cast<unsigned long long>(r.kv_saved_bytes),
                 1e3 * r.t_save);
  }
  if (r.sess && r.sess->sparse()) {
    const auto& ss = r.sess->sparse()->stats();
    std::fprintf(
        stderr,
        "[sparse attention %s: %.1f%% of the tokens attended | select %.1f ms, attend %.1f ms]\n",
        sparse::describe(r.sess->options().sparse).c_str(),
        ss.tokens_context ? 100.0 * ss.tokens_attended / ss.tokens_context : 0.0,
        1e3 * ss.select_seconds, 1e3 * ss.attend_seconds);
  }
}

}  // namespace

int cmd_generate(int argc, char** argv) {
  Args a(
      "generate", "[-m MODEL] [-t TOKENIZER] [-p PROMPT] [-n N] [options]",
      "Generates text from PROMPT (default empty: from BOS alone) and streams it to stdout (the\n"
      "prompt first). A stats line follows on stderr: prompt and generated tokens, prefill and\n"
      "decode tokens/s, KV bytes.\n"
      "Generation stops at an end-of-text token, after N tokens, or when the context is full.\n"
      "Compute once, use many: --kv-save FILE keeps the cache after the prompt's prefill;\n"
      "--kv-load FILE -p FOLLOW-UP continues from it, as often as wanted, without the prefill.");
  a.section("Generation");
  a.add("prompt", 'p', "TEXT", "The prompt ('-' reads it from standard input).", "");
  a.add("file", 'f', "FILE", "Read the prompt from FILE (instead of -p).", "");
  add_generation_options(a, true);
  a.add_flag("no-kv-cache", 0,
             "Recompute every position at every step (the reference path; slow).");
  a.add_flag("json", 0, "Print one JSON object (text, token ids, stats) instead of streaming.");
  add_draft_options(a);
  a.section("KV cache files");
  a.add("kv-save", 0, "FILE",
        "After the prefill of the prompt, save the KV cache (blocks as stored, residual window,\n"
        "positions, sparse summaries, the token ids and the prefill time) to FILE, written\n"
        "atomically; generation then goes on as usual.",
        "");
  a.add("kv-load", 0, "FILE",
        "Continue from a cache saved by --kv-save: the prompt (required) is appended after its\n"
        "tokens, without a BOS. The model, the cache options and a --ctx at least as large as\n"
        "the saving session's must match; anything else is refused with the difference named.",
        "");
  add_model_options(a);
  add_kv_options(a);
  add_sparse_options(a);
  if (!parse_command_line(a, argc, argv)) return 0;  // --help printed
  refuse_distributed(a, {"no-kv-cache"});
  const bool json = a.flag("json");
  runtime::GenerationOptions go = generation_options(a);
  if (a.flag("no-kv-cache")) {
    refuse_kv_options(a, "--no-kv-cache (it recomputes keys and values, it has no cache)");
    for (const char* o : {"kv-save", "kv-load"}) {
      if (a.given(o)) fail("--%s needs the KV cache; leave out --no-kv-cache", o);
    }
  }
  // Under --dist each rank saves and loads its own share (rank_file).
  const std::string kv_save = rank_file(a.str("kv-save")), kv_load = rank_file(a.str("kv-load"));
  if (!kv_save.empty()) {
    std::vector<std::string> inputs = model_input_paths(a);
    if (!kv_load.empty()) inputs.push_back(kv_load);
    on_every_rank([&] {
      io::check_output_is_not_input(kv_save, inputs, "--kv-save");
      io::check_output_folder(kv_save, "--kv-save");  // before the prefill, not after it
      return 0;
    });
  }
  const std::string prompt = prompt_option(a);

  auto m = load_model(a);
  const auto& cfg = m->config();
  note_if_synthetic(*m, "its text is meaningless");
  const auto& tk = m->tokenizer();
  // Under mpirun every rank meets a bad option or size at once: one message, from rank 0.
  runtime::SessionOptions opt = on_every_rank([&] { return session_options(a, *m); });
  if (a.flag("no-kv-cache") && a.given("draft-model"))
    fail("--draft-model: not with --no-kv-cache (drafts are checked against the cache)");
  const std::unique_ptr<runtime::DraftModel> draft = draft_model_option(a, *m, opt, go);
  opt.rewind = go.lookup;  // speculation cuts rejected drafts back
  const bool no_cache = a.flag("no-kv-cache");
  const int ctx = opt.ctx > 0 ? opt.ctx : cfg.ctx;
  const bool bounded =
      opt.overflow != runtime::ContextOverflow::kStop;  // generation goes on past the context
  std::unique_ptr<runtime::Session> sess;
  if (!no_cache) sess = on_every_rank([&] { return std::make_unique<runtime::Session>(*m, opt); });
  // A loaded cache: its tokens come first and the prompt follows them.
  runtime::LoadedSession loaded;
  if (!kv_load.empty()) {
    if (prompt.empty())
      fail("--kv-load: give the follow-up prompt with -p (the cache ends at its last token)");
    loaded = on_every_rank([&] { return runtime::load_session(*sess, kv_load); });
  }
  const int n_loaded = static_cast<int>(loaded.tokens.size());
  std::vector<int> tokens = loaded.tokens;
  // A follow-up continues the saved text (tokenizer.h: encode_continuation).
  const std::vector<int> prompt_tokens =
      kv_load.empty() ? tk.encode(prompt, tk.add_bos()) : tk.encode_continuation(prompt);
  tokens.insert(tokens.end(), prompt_tokens.begin(), prompt_tokens.end());
  const int in_cache = loaded.n_tokens + static_cast<int>(prompt_tokens.size());
  if (!bounded && in_cache >= ctx) {
    fail(
        "the prompt is %zu tokens%s, longer than the context can hold with room to generate "
        "(--ctx %d)",
        prompt_tokens.size(),
        n_loaded ? strfmt(" after %d loaded ones", loaded.n_tokens).c_str() : "", ctx);
  }
  ThreadPool nc_pool(opt.threads);

  std::string text = tk.decode_all(tokens);
  if (!json) {
    std::fputs(text.c_str(), stdout);
    std::fflush(stdout);
  }
  const int n_prompt = static_cast<int>(prompt_tokens.size());
  double t0 = now_seconds();
  const int prev = tokens.empty() ? -1 : tokens.back();
  std::unique_ptr<runtime::Generator> gen;
  std::vector<float> nc_logits;
  if (no_cache) {
    nc_logits = model::forward_no_cache(*m, tokens, &nc_pool);
  } else {
    gen = std::make_unique<runtime::Generator>(*sess, go, prev);
    gen->prefill(prompt_tokens);
  }
  const double t_prefill = now_seconds() - t0;
  uint64_t kv_saved_bytes = 0;
  double t_save = 0.0;
  const int n_saved = sess ? sess->pos() : 0;
  if (!kv_save.empty()) {
    const double ts = now_seconds();
    kv_saved_bytes = on_every_rank([&] {
      return runtime::save_session(*sess, tokens, loaded.prefill_tokens + n_prompt,
                                   loaded.prefill_seconds + t_prefill, kv_save);
    });
    t_save = now_seconds() - ts;
  }
  std::string completion;
  std::vector<int> generated;
  int n_steps = 0;  // forward passes after the prefill
  t0 = now_seconds();
  // Without a cache every step recomputes the whole sequence; the decisions are the same.
  runtime::Continuation nc(tk, go, prev);
  runtime::Continuation& cont = gen ? gen->continuation() : nc;
  while (gen ? !gen->done() : !cont.done()) {
    runtime::Continuation::Step st;
    if (gen) {
      st = gen->next();
    } else if (static_cast<int>(tokens.size()) > ctx) {
      st = cont.end(runtime::StopReason::kContext);
    } else {
      if (!generated.empty()) {
        nc_logits = model::forward_no_cache(*m, tokens, &nc_pool);
        ++n_steps;
      }
      st = cont.next(nc_logits.data());
    }
    if (st.token >= 0) {
      tokens.push_back(st.token);
      generated.push_back(st.token);
    }
    completion += st.text;
    if (!json && !st.text.empty()) {
      std::fputs(st.text.c_str(), stdout);
      std::fflush(stdout);
    }
  }
  if (gen) n_steps = gen->decode_steps();
  const std::string stop = runtime::stop_reason_name(cont.reason());
  const double t_decode = now_seconds() - t0;
  const int n_out = static_cast<int>(generated.size());
  const double prefill_tps = t_prefill > 0 ? n_prompt / t_prefill : 0.0;
  // Tokens the decode steps chose (the first comes from the prefill; an end token counts),
  // per second: with --lookup a step may choose several.
  const int decoded = n_out - 1 + (cont.reason() == runtime::StopReason::kEnd ? 1 : 0);
  const double decode_tps = t_decode > 0 && n_steps > 0 ? std::max(decoded, 0) / t_decode : 0.0;
  const uint64_t kv_used = sess ? sess->kv_bytes_used() : 0;
  const uint64_t kv_reserved = sess ? sess->kv_bytes_reserved() : 0;
  Report r;
  r.m = m.get();
  r.sess = sess.get();
  r.opt = opt;
  r.prompt = prompt;
  r.text = text;
  r.completion = completion;
  r.stop = stop;
  r.kv_load = kv_load;
  r.kv_save = kv_save;
  r.prompt_tokens = prompt_tokens;
  r.generated = generated;
  r.loaded = loaded;
  r.n_prompt = n_prompt;
  r.n_out = n_out;
  r.n_saved = n_saved;
  r.ctx = ctx;
  r.no_cache = no_cache;
  r.t_prefill = t_prefill;
  r.t_save = t_save;
  r.prefill_tps = prefill_tps;
  r.decode_tps = decode_tps;
  r.lookup = go.lookup;
  if (draft) r.draft_model = draft->model().path();
  r.steps = n_steps;
  if (gen) r.spec = gen->speculation();
  r.kv_saved_bytes = kv_saved_bytes;
  r.kv_used = kv_used;
  r.kv_reserved = kv_reserved;
  if (json) {
    print_json(r);
  } else {
    print_stats(r);
  }
  return 0;
}

}  // namespace kivi::tools
