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
#include "runtime/sampler.h"
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
  a.add("n", 'n', "N", "Most tokens per reply (0 = until the end-of-turn token or a full context).",
        "0");
  a.add("temp", 0, "T", "Sampling temperature; 0 = greedy (argmax).", "0.8");
  a.add("top-k", 0, "K", "Sample from the K most likely tokens (0 = off).", "40");
  a.add("top-p", 0, "P",
        "Sample from the smallest set of tokens whose probability reaches P (1 = off).", "0.95");
  a.add("seed", 's', "S", "Random seed; the same seed and input give the same replies.", "42");
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
  const int n_max = static_cast<int>(a.integer("n", 0, 1 << 24));
  runtime::SamplerOptions so;
  so.temperature = static_cast<float>(a.number("temp", 0.0, 100.0));
  so.top_k = static_cast<int>(a.integer("top-k", 0, 1 << 24));
  so.top_p = static_cast<float>(a.number("top-p", 0.0, 1.0));
  so.seed = static_cast<uint64_t>(a.integer("seed", 0, INT64_MAX));
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
  runtime::Sampler sampler(so, m->config().vocab_size);
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
      context_full = true;
      break;
    }
    ++turn;
    double t0 = now_seconds();
    const float* logits = sess.prefill(prompt);
    compute_seconds += now_seconds() - t0;
    fed.insert(fed.end(), prompt.begin(), prompt.end());
    const int pos_after_prompt = sess.pos();
    tok::StreamDecoder stream(tk);
    std::string reply;
    std::vector<int> ids;
    const char* stop = "end_of_turn";
    for (;;) {
      const int next = sampler.sample(logits);
      if (chat.ends_reply(next))
        break;  // the next turn's tokens write the end marker into the cache
      ids.push_back(next);
      const std::string piece = stream.push(next);
      reply += piece;
      if (!json) {
        std::fputs(piece.c_str(), stdout);
        std::fflush(stdout);
      }
      if (sess.pos() >= ctx && sess.options().overflow == runtime::ContextOverflow::kStop) {
        stop = "context";
        context_full = true;
        break;
      }
      t0 = now_seconds();
      logits = sess.decode(next);
      compute_seconds += now_seconds() - t0;
      fed.push_back(next);
      if (n_max > 0 && static_cast<int>(ids.size()) >= n_max) {
        stop = "length";
        break;
      }
    }
    const std::string tail = stream.flush();
    reply += tail;
    if (json) {
      print_turn_json(turn, prompt, pos_before, pos_after_prompt, reply, ids, sess.pos(), stop);
    } else {
      std::fputs(tail.c_str(), stdout);
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
  std::fprintf(stderr, "[chat: %d turns, %d tokens in the cache of %d]\n", turn - first_turn,
               sess.pos(), ctx);
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
