#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "common.h"
#include "core/error.h"
#include "core/json.h"
#include "core/timer.h"
#include "io/atomic_file.h"
#include "runtime/chat.h"
#include "core/rng.h"
#include "runtime/generation.h"
#include "runtime/session_file.h"

namespace kivi::tools {

namespace {

// One line of --json output per turn: the mechanics a test checks.
void print_turn_json(int turn, const std::vector<int>& prompt, int pos_before, int pos_after_prompt,
                     const std::string& reply, const std::vector<int>& reply_ids, int pos_after,
                     const char* stop) {
  JsonWriter j;
  j.begin_object();
  j.kv("turn", turn);
  j.key("prompt_token_ids").begin_array();
  for (int t : prompt) j.value(t);
  j.end_array();
  j.kv("pos_before", pos_before).kv("pos_after_prompt", pos_after_prompt);
  j.kv("reply", reply);
  j.key("reply_token_ids").begin_array();
  for (int t : reply_ids) j.value(t);
  j.end_array();
  j.kv("pos_after", pos_after).kv("stop", std::string(stop));
  j.end_object();
  std::printf("%s\n", j.str().c_str());
  std::fflush(stdout);
}

}  // namespace

int cmd_chat(int argc, char** argv) {
  Args a(
      "chat", "-m MODEL [--system TEXT] [--chat-template llama3|chatml] [options]",
      "Interactive chat: each line read from stdin is a user message, and the model's reply\n"
      "streams to stdout. The conversation uses the model's chat format, detected from its\n"
      "tokenizer.chat_template (Llama 3 headers or ChatML), or the one --chat-template names.\n"
      "Every turn appends to the same KV cache: the history is never processed again. A reply\n"
      "ends at the model's end-of-turn token (or after -n tokens); end of input (Ctrl-D) ends\n"
      "the chat, and so does a full context, with a message.\n"
      "--kv-save FILE keeps the conversation's cache when the chat ends; --kv-load FILE resumes\n"
      "it later without processing the history again.");
  a.section("Chat");
  a.add("system", 0, "TEXT", "System message that opens the conversation.", "");
  a.add("chat-template", 0, "NAME",
        "Chat format: llama3 or chatml (default: detected from the model).", "");
  a.add("n", 'n', "N",
        "Most tokens per reply (0 or -1 = until the end-of-turn token or a full context).", "0");
  add_sampling_options(a);
  a.add_flag(
      "json", 0,
      "Print one JSON object per turn (prompt token ids, cache positions, reply text and ids, "
      "stop reason) instead of streaming.");
  a.section("KV cache files");
  a.add("kv-save", 0, "FILE",
        "When the chat ends, save the conversation's KV cache to FILE (written atomically).", "");
  a.add("kv-load", 0, "FILE",
        "Resume a conversation saved by --kv-save (its system message included): the model and\n"
        "the cache options must match.",
        "");
  add_model_options(a);
  add_kv_options(a);
  add_sparse_options(a);
  if (!parse_command_line(a, argc, argv)) return 0;  // --help printed
  const bool json = a.flag("json");
  runtime::GenerationOptions go = generation_options(a);
  if (go.max_tokens == 0) go.max_tokens = -1;  // chat: 0 = no limit per reply
  const std::string system = a.str("system");
  const std::string kv_save = a.str("kv-save"), kv_load = a.str("kv-load");
  if (!kv_load.empty() && a.given("system"))
    fail("--system: the conversation loaded by --kv-load has its system message already");
  if (!kv_save.empty()) {
    std::vector<std::string> inputs = model_input_paths(a);
    if (!kv_load.empty()) inputs.push_back(kv_load);
    io::check_output_is_not_input(kv_save, inputs, "--kv-save");
  }

  auto m = load_model(a);
  const auto& tk = m->tokenizer();
  const runtime::ChatPrompt chat(tk, a.str("chat-template"));
  if (m->config().synthetic) {
    std::fprintf(stderr,
                 "note: %s has random weights (written by 'kivi synth' for speed measurement); "
                 "its replies are meaningless\n",
                 m->path().c_str());
  }
  runtime::Session sess(*m, session_options(a, *m));
  go.end_tokens = chat.end_tokens();
  Rng rng(go.sampler.seed);  // one random stream through every turn
  const int ctx = sess.ctx();
  // Every token fed to the cache, and the seconds spent computing it (for --kv-save).
  std::vector<int> fed;
  int64_t fed_before = 0;  // tokens the loaded conversation had computed
  size_t n_loaded = 0;
  double compute_seconds = 0.0;
  int turn = 0;
  if (!kv_load.empty()) {
    const runtime::LoadedSession loaded = runtime::load_session(sess, kv_load);
    fed = loaded.tokens;
    n_loaded = fed.size();
    fed_before = loaded.prefill_tokens;
    compute_seconds = loaded.prefill_seconds;
    turn = 1;  // the system message and the first turn's markup are in the cache
    if (!json) {
      std::fprintf(stderr, "[conversation loaded from %s: %d tokens in %.1f ms]\n", kv_load.c_str(),
                   loaded.n_tokens, 1e3 * loaded.load_seconds);
    }
  }
  const int first_turn = turn;
  const bool interactive = !json && isatty(STDIN_FILENO);
  if (interactive) {
    std::fprintf(stderr, "chat format %s, context %d tokens, KV cache %s. End with Ctrl-D.\n",
                 runtime::chat_format_name(chat.format()), ctx,
                 describe_cache(sess.options().cache).c_str());
  }

  std::string line;
  bool context_full = false;
  for (;;) {
    if (interactive) std::fputs("> ", stderr);
    if (!std::getline(std::cin, line)) break;  // end of input
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::vector<int> prompt = chat.user_turn(line, system, turn == 0);
    const int pos_before = sess.pos();
    // The turn's tokens and at least one reply token must fit.
    if (sess.options().overflow == runtime::ContextOverflow::kStop &&
        pos_before + static_cast<int>(prompt.size()) >= ctx) {
      std::fprintf(stderr,
                   "[the message takes %zu tokens but the context of %d has %d left: it is "
                   "skipped; a shorter one may fit]\n",
                   prompt.size(), ctx, ctx - pos_before);
      continue;
    }
    ++turn;
    double t0 = now_seconds();
    runtime::Generator gen(sess, go, prompt.back());
    gen.continuation().sampler().set_rng(rng);
    gen.prefill(prompt);
    compute_seconds += now_seconds() - t0;
    fed.insert(fed.end(), prompt.begin(), prompt.end());
    const int pos_after_prompt = sess.pos();
    std::string reply;
    std::vector<int> ids;
    t0 = now_seconds();
    while (!gen.continuation().done()) {
      const runtime::Continuation::Step st = gen.next();
      if (st.token >= 0) ids.push_back(st.token);
      reply += st.text;
      if (!json && !st.text.empty()) {
        std::fputs(st.text.c_str(), stdout);
        std::fflush(stdout);
      }
    }
    // The reply's tokens go into the cache; an end marker does not (the next turn's
    // tokens write it).
    gen.feed_pending();
    compute_seconds += now_seconds() - t0;
    rng = gen.continuation().sampler().rng();
    fed.insert(fed.end(), ids.begin(), ids.end());
    const runtime::StopReason why = gen.continuation().reason();
    const char* stop = why == runtime::StopReason::kEnd       ? "end_of_turn"
                       : why == runtime::StopReason::kContext ? "context"
                                                              : "length";
    if (why == runtime::StopReason::kContext) context_full = true;
    if (json) {
      print_turn_json(turn, prompt, pos_before, pos_after_prompt, reply, ids, sess.pos(), stop);
    } else {
      std::fputs("\n", stdout);
      std::fflush(stdout);
    }
    if (context_full) break;
  }
  if (context_full) {
    std::fprintf(stderr, "[the context of %d tokens is full (%d used): the chat ends]\n", ctx,
                 sess.pos());
  } else if (interactive) {
    std::fputs("\n", stderr);
  }
  const int turns = turn - first_turn;
  std::fprintf(stderr, "[chat: %d turn%s, %d tokens in the cache of %d]\n", turns,
               turns == 1 ? "" : "s", sess.pos(), ctx);
  if (!kv_save.empty()) {
    const uint64_t bytes =
        runtime::save_session(sess, fed, fed_before + static_cast<int64_t>(fed.size() - n_loaded),
                              compute_seconds, kv_save);
    std::fprintf(stderr, "[conversation saved to %s: %d tokens, %llu bytes]\n", kv_save.c_str(),
                 sess.pos(), static_cast<unsigned long long>(bytes));
  }
  return 0;
}

}  // namespace kivi::tools
