#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common.h"
#include "dist/dist.h"
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

// Ctrl-C: the first stops the reply being written, a second one (or one while waiting
// for input) ends the chat; the conversation is still saved (--kv-save).
std::atomic<int> g_interrupts{0};
extern "C" void on_interrupt(int) { g_interrupts.fetch_add(1); }

void catch_interrupts() {
  struct sigaction sa {};
  sa.sa_handler = on_interrupt;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: a read waiting for input returns
  sigaction(SIGINT, &sa, nullptr);
}

// The next line of standard input (without its newline); false at the end of input or
// when Ctrl-C interrupts the wait. `pending` keeps what was read past the line.
bool read_line(std::string& line, std::string& pending) {
  for (;;) {
    const size_t nl = pending.find('\n');
    if (nl != std::string::npos) {
      line = pending.substr(0, nl);
      pending.erase(0, nl + 1);
      return true;
    }
    if (g_interrupts.load() > 0) return false;
    char buf[4096];
    const ssize_t n = ::read(STDIN_FILENO, buf, sizeof buf);
    if (n > 0) {
      pending.append(buf, static_cast<size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;  // the loop looks at the interrupt count
    } else {
      if (pending.empty()) return false;  // end of input
      line.swap(pending);                 // a last line without a newline
      pending.clear();
      return true;
    }
  }
}

// read_line on rank 0, whose line every rank then gets (mpirun gives standard input to
// rank 0 only).
bool read_line_everywhere(std::string& line, std::string& pending) {
  if (dist::size() == 1) return read_line(line, pending);
  uint64_t got = 0;
  if (dist::is_root()) got = read_line(line, pending) ? 1 : 0;
  dist::broadcast(got);
  if (got) dist::broadcast(line);
  return got != 0;
}

// One line of --json output per turn: the mechanics a test checks.
// `parts`: the reply's reasoning and answer, for a format that splits them (harmony).
void print_turn_json(int turn, const std::vector<int>& prompt, int pos_before, int pos_after_prompt,
                     const std::string& reply, const runtime::ReplyParts* parts,
                     const std::vector<int>& reply_ids, int pos_after, const char* stop) {
  JsonWriter j;
  j.begin_object();
  j.kv("turn", turn);
  j.key("prompt_token_ids").begin_array();
  for (int t : prompt) j.value(t);
  j.end_array();
  j.kv("pos_before", pos_before).kv("pos_after_prompt", pos_after_prompt);
  j.kv("reply", reply);
  if (parts) j.kv("reasoning", parts->reasoning).kv("content", parts->content);
  j.key("reply_token_ids").begin_array();
  for (int t : reply_ids) j.value(t);
  j.end_array();
  j.kv("pos_after", pos_after).kv("stop", std::string(stop));
  j.end_object();
  std::printf("%s\n", j.str().c_str());
  std::fflush(stdout);
}

// Prints a reply as it streams: the answer to stdout; reasoning (harmony's analysis
// channel), when the format has it, to stderr after "[reasoning] ", so that stdout holds
// the answers only.
class ReplyPrinter {
 public:
  explicit ReplyPrinter(bool split) {
    if (split) parser_ = std::make_unique<runtime::HarmonyReplyParser>();
  }
  void push(const std::string& text) { show(parser_ ? parser_->push(text) : content(text)); }
  // The reply's end: what the parser held, and a newline after reasoning.
  void finish() {
    if (parser_) show(parser_->finish());
    if (in_reasoning_) std::fputs("\n", stderr);
    in_reasoning_ = false;
  }

 private:
  static runtime::ReplyParts content(const std::string& text) { return {"", text}; }
  void show(const runtime::ReplyParts& p) {
    if (!p.reasoning.empty()) {
      if (!in_reasoning_) std::fputs("[reasoning] ", stderr);
      in_reasoning_ = true;
      std::fputs(p.reasoning.c_str(), stderr);
      std::fflush(stderr);
    }
    if (!p.content.empty()) {
      if (in_reasoning_) std::fputs("\n", stderr);
      in_reasoning_ = false;
      std::fputs(p.content.c_str(), stdout);
      std::fflush(stdout);
    }
  }
  std::unique_ptr<runtime::HarmonyReplyParser> parser_;
  bool in_reasoning_ = false;
};

}  // namespace

int cmd_chat(int argc, char** argv) {
  Args a(
      "chat",
      "-m MODEL [--system TEXT] [--chat-template llama3|chatml|gemma|phi3|harmony|plain] "
      "[options]",
      "Interactive chat: each line read from stdin is a user message, and the model's reply\n"
      "streams to stdout. The conversation uses the model's chat format, detected from its\n"
      "tokenizer.chat_template (Llama 3 headers, ChatML, Gemma, Phi-3 or gpt-oss's harmony),\n"
      "or the one --chat-template names. A harmony reply's reasoning goes to stderr, its\n"
      "answer to stdout.\n"
      "Every turn appends to the same KV cache: the history is never processed again. A reply\n"
      "ends at the model's end-of-turn token (or after -n tokens); Ctrl-C stops a reply and\n"
      "returns to the prompt. End of input (Ctrl-D), Ctrl-C at the prompt or twice during a\n"
      "reply, or a full context end the chat; a message too long for the context left is\n"
      "skipped with a note.\n"
      "--kv-save FILE keeps the conversation's cache when the chat ends; --kv-load FILE resumes\n"
      "it later without processing the history again.");
  a.section("Chat");
  a.add("system", 0, "TEXT", "System message that opens the conversation.", "");
  a.add("chat-template", 0, "NAME",
        "Chat format: llama3, chatml, gemma, phi3, harmony or plain ('User: ...' / 'Assistant: "
        "...' lines, for any model). Default: detected from the model's template.",
        "");
  add_generation_options(a, false);
  a.replace("max-tokens", "N",
            "Most tokens per reply (0 or -1 = until the end-of-turn token or a full context).",
            "0");
  a.add_flag(
      "json", 0,
      "Print one JSON object per turn (prompt token ids, cache positions, reply text and ids, "
      "stop reason) instead of streaming.");
  add_draft_options(a);
  a.section("KV cache files");
  a.add("kv-save", 0, "FILE",
        "When the chat ends, save the conversation's KV cache, its turn count and the sampler's\n"
        "state to FILE (written atomically; FILE may be the --kv-load file, updated in place).",
        "");
  a.add("kv-load", 0, "FILE",
        "Resume a conversation saved by kivi chat --kv-save (its system message included): the\n"
        "model and the cache options must match, and a sampled chat goes on with its saved\n"
        "random stream, as the uninterrupted one would (--seed starts new conversations).",
        "");
  add_model_options(a);
  add_kv_options(a);
  add_sparse_options(a);
  if (!parse_command_line(a, argc, argv)) return 0;  // --help printed
  const bool json = a.flag("json");
  runtime::GenerationOptions go = generation_options(a);
  if (go.max_tokens == 0) go.max_tokens = -1;  // chat: 0 = no limit per reply
  const std::string system = a.str("system");
  // Under --dist each rank saves and loads its own share (rank_file).
  const std::string kv_save = rank_file(a.str("kv-save")), kv_load = rank_file(a.str("kv-load"));
  if (!kv_load.empty() && a.given("system"))
    fail("--system: the conversation loaded by --kv-load has its system message already");
  if (!kv_save.empty()) {
    // The loaded conversation may be saved over itself: the new file replaces it by a
    // rename, and the cache maps the old file's pages, which live on until it is done.
    on_every_rank([&] {
      io::check_output_is_not_input(kv_save, model_input_paths(a), "--kv-save");
      io::check_output_folder(kv_save, "--kv-save");
      return 0;
    });
  }

  auto m = load_model(a);
  const auto& tk = m->tokenizer();
  const runtime::ChatPrompt chat(tk, a.str("chat-template"));
  note_if_synthetic(*m, "its replies are meaningless");
  // Under mpirun every rank meets a bad option or size at once: one message, from rank 0.
  runtime::SessionOptions so = on_every_rank([&] { return session_options(a, *m); });
  const std::unique_ptr<runtime::DraftModel> draft = draft_model_option(a, *m, so, go);
  so.rewind = go.lookup;  // speculation cuts rejected drafts back
  const std::unique_ptr<runtime::Session> session =
      on_every_rank([&] { return std::make_unique<runtime::Session>(*m, so); });
  runtime::Session& sess = *session;
  go.end_tokens = chat.end_tokens();
  go.stop = chat.stop_strings();
  Rng rng(go.sampler.seed);  // one random stream through every turn
  const int ctx = sess.ctx();
  // Every token fed to the cache, and the seconds spent computing it (for --kv-save).
  std::vector<int> fed;
  int64_t fed_before = 0;  // tokens the loaded conversation had computed
  size_t n_loaded = 0;
  double compute_seconds = 0.0;
  int turn = 0;
  if (!kv_load.empty()) {
    const runtime::LoadedSession loaded =
        on_every_rank([&] { return runtime::load_session(sess, kv_load); });
    if (!loaded.is_chat) {
      fail(
          "%s was saved by kivi generate (a prompt, not a conversation); continue it with 'kivi "
          "generate --kv-load', or start a new chat",
          kv_load.c_str());
    }
    fed = loaded.tokens;
    n_loaded = fed.size();
    fed_before = loaded.prefill_tokens;
    compute_seconds = loaded.prefill_seconds;
    turn = loaded.chat.turns;        // the turns go on counting
    rng.set_state(loaded.chat.rng);  // --seed starts a conversation; this one goes on
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

  // Under mpirun Ctrl-C ends the job (every rank would have to stop at the same token).
  if (dist::size() == 1) catch_interrupts();
  std::string line, pending;
  bool context_full = false, interrupted = false;
  bool after_marker = false;  // plain: the last reply ended by writing "\nUser:"
  for (;;) {
    if (interactive) std::fputs("> ", stderr);
    if (!read_line_everywhere(line, pending)) {  // end of input, or Ctrl-C at the prompt
      interrupted = g_interrupts.load() > 0;
      break;
    }
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::vector<int> prompt = chat.user_turn(line, system, turn == 0, after_marker);
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
    ReplyPrinter printer(chat.has_reasoning());
    t0 = now_seconds();
    while (!gen.done()) {
      const runtime::Continuation::Step st =
          g_interrupts.load() > 0 ? gen.continuation().end(runtime::StopReason::kInterrupted)
                                  : gen.next();
      if (st.token >= 0) ids.push_back(st.token);
      reply += st.text;
      if (!json && !st.text.empty()) printer.push(st.text);
    }
    if (!json) printer.finish();
    // The reply's tokens go into the cache; an end marker does not (the next turn's
    // tokens write it).
    gen.feed_pending();
    compute_seconds += now_seconds() - t0;
    rng = gen.continuation().sampler().rng();
    fed.insert(fed.end(), ids.begin(), ids.end());
    if (gen.pending() >= 0) fed.pop_back();  // no room for it in the cache
    const runtime::StopReason why = gen.continuation().reason();
    const char* stop = why == runtime::StopReason::kEnd           ? "end_of_turn"
                       : why == runtime::StopReason::kStopString  ? "end_of_turn"
                       : why == runtime::StopReason::kContext     ? "context"
                       : why == runtime::StopReason::kInterrupted ? "interrupted"
                                                                  : "length";
    after_marker = why == runtime::StopReason::kStopString;
    if (why == runtime::StopReason::kContext) context_full = true;
    // One Ctrl-C stopped the reply; a second one ends the chat.
    if (g_interrupts.exchange(0) > 1) interrupted = true;
    if (json) {
      runtime::ReplyParts parts;
      if (chat.has_reasoning()) parts = runtime::split_harmony_reply(reply);
      print_turn_json(turn, prompt, pos_before, pos_after_prompt, reply,
                      chat.has_reasoning() ? &parts : nullptr, ids, sess.pos(), stop);
    } else {
      std::fputs("\n", stdout);
      std::fflush(stdout);
    }
    if (context_full || interrupted) break;
  }
  if (context_full) {
    std::fprintf(stderr, "[the context of %d tokens is full (%d used): the chat ends]\n", ctx,
                 sess.pos());
  } else if (interrupted) {
    std::fputs("\n[interrupted: the chat ends]\n", stderr);
  } else if (interactive) {
    std::fputs("\n", stderr);
  }
  const int turns = turn - first_turn;
  std::fprintf(stderr, "[chat: %d turn%s, %d tokens in the cache of %d]\n", turns,
               turns == 1 ? "" : "s", sess.pos(), ctx);
  if (!kv_save.empty() && turn == 0)
    std::fprintf(stderr, "[no turn: nothing saved to %s]\n", kv_save.c_str());
  if (!kv_save.empty() && turn > 0) {
    runtime::ChatRecord record;
    record.turns = turn;
    for (int i = 0; i < 4; ++i) record.rng[i] = rng.state()[i];
    const uint64_t bytes = on_every_rank([&] {
      return runtime::save_session(sess, fed,
                                   fed_before + static_cast<int64_t>(fed.size() - n_loaded),
                                   compute_seconds, kv_save, &record);
    });
    std::fprintf(stderr, "[conversation saved to %s: %d tokens, %llu bytes]\n", kv_save.c_str(),
                 sess.pos(), static_cast<unsigned long long>(bytes));
  }
  return 0;
}

}  // namespace kivi::tools
