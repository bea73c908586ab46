#include "serve_options.h"

#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "common.h"
#include "core/error.h"
#include "core/sysinfo.h"
#include "runtime/engine_options.h"

namespace kivi::tools {

KvBudget parse_kv_budget(const std::string& text) {
  const auto bad = [&]() -> KvBudget {
    fail(
        "--kv-budget '%s': expected a size in bytes (8G, 512MiB, 1073741824) or in tokens (65536t, "
        "64Ktok)",
        text.c_str());
  };
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
    ++i;
  if (i == 0) return bad();
  char* end = nullptr;
  const std::string num = text.substr(0, i);
  const double value = std::strtod(num.c_str(), &end);
  if (end != num.c_str() + num.size() || !std::isfinite(value) || value <= 0) return bad();
  std::string unit;
  for (size_t j = i; j < text.size(); ++j) {
    if (text[j] != ' ')
      unit += static_cast<char>(std::tolower(static_cast<unsigned char>(text[j])));
  }
  double mult = 1;
  if (!unit.empty() && (unit[0] == 'k' || unit[0] == 'm' || unit[0] == 'g' || unit[0] == 't')) {
    // "t" alone means tokens; "tb"/"tib" would be tebibytes, which no budget needs.
    if (unit[0] != 't') {
      mult = unit[0] == 'k' ? 1024.0 : unit[0] == 'm' ? 1024.0 * 1024 : 1024.0 * 1024 * 1024;
      unit.erase(0, 1);
      if (!unit.empty() && unit[0] == 'i') unit.erase(0, 1);
    }
  }
  KvBudget b;
  const double x = value * mult;
  if (unit == "t" || unit == "tok" || unit == "tokens") {
    if (x < 1 || x > 1e12) return bad();
    b.tokens = static_cast<int64_t>(std::ceil(x));
  } else if (unit.empty() || unit == "b") {
    if (x < 1 || x > 1e15) return bad();
    b.bytes = static_cast<uint64_t>(x);
  } else {
    return bad();
  }
  return b;
}

void add_serve_options(Args& a) {
  a.section("Server");
  a.add("host", 0, "ADDR",
        "Address to listen on (127.0.0.1: this machine only; 0.0.0.0: every interface).",
        "127.0.0.1");
  a.add("port", 0, "N", "Port to listen on (0: any free port, printed at start).", "8080");
  a.add("parallel", 0, "N", "Sequences generated together (slots of the batch).", "4");
  a.add("queue", 0, "N",
        "Requests waiting for a slot or for KV memory; beyond it the server answers 503.", "64");
  a.add("kv-budget", 0, "SIZE",
        "KV memory shared by all sequences, allocated up front: bytes (8G, 512MiB) or tokens "
        "(65536t, 64Ktok). "
        "Sequences take blocks as they grow; when none is left the newest is preempted and "
        "prefilled again later. A request whose prompt plus max_tokens exceed it is refused. "
        "Default: --parallel x --ctx tokens.");
  a.add("prefill-chunk", 0, "N",
        "Prompt tokens processed per step (beside the decoding sequences' tokens).", "64");
  a.add("prefix-cache", 0, "on|off",
        "Keep each ended request's KV cache for later prompts that start with its tokens (the "
        "next turn of a chat) and start requests after cached blocks of a shared prompt prefix; "
        "kept caches are evicted, least recently used first, when memory or a slot is needed.",
        "on");
  a.add("lookup", 0, "N",
        "Speculative decoding by prompt lookup: each decoding sequence drafts up to N tokens (0 "
        "= off, at most 64) that followed an earlier occurrence of its latest tokens and checks "
        "them in its rows of the step. The text is the same; text that repeats earlier text "
        "takes fewer steps.",
        "0");
  a.add("lookup-ngram", 0, "N",
        "Tokens --lookup matches (the longest of N down to 2 that occurred before).", "3");
  a.add("slot-save-path", 0, "DIR",
        "Directory of slot files: POST /slots/ID?action=save|restore with {\"filename\": NAME} "
        "saves the cache an ended request left in slot ID to DIR/NAME, or restores one into it. "
        "Default: off.",
        "");
  a.add("api-key", 0, "KEY",
        "Require 'Authorization: Bearer KEY' on /v1/* and /metrics. Default: $KIVI_API_KEY.");
  a.add("alias", 0, "NAME",
        "Model id clients pass as 'model'. Default: the model file's name without extension.");
  a.add("chat-template", 0, "NAME",
        "Chat format for /v1/chat/completions: llama3, chatml, gemma, phi3, harmony or plain. "
        "Default: the model's template, else plain.");
  a.add("max-body", 0, "BYTES", "Largest request body accepted (413 beyond).", "4194304");
  a.add("cors", 0, "ORIGIN",
        "Let web pages from ORIGIN ('*' for any, or e.g. http://localhost:3000) call the API: "
        "CORS headers on every response and answers to preflight requests. Default: off.");
  a.add("pooling", 0, "HOW",
        "Embeddings (/v1/embeddings): mean (the mean of every token's final hidden state) or "
        "last (the last token's), each scaled to unit length.",
        "mean");
  a.add("timeout", 0, "S",
        "Seconds a client may take to send a request or to read a response before it is dropped.",
        "10");
  add_draft_options(a);
}

static std::string model_id(const model::Model& m) {
  std::string name = m.path();
  const size_t slash = name.find_last_of('/');
  if (slash != std::string::npos) name = name.substr(slash + 1);
  const size_t dot = name.find_last_of('.');
  if (dot != std::string::npos && dot > 0) name = name.substr(0, dot);
  return name.empty() ? "kivi" : name;
}

ServeConfig serve_config(const Args& a, const model::Model& m) {
  ServeConfig c;
  const runtime::SessionOptions so = session_options(a, m);
  // What the shared block pool does not do is refused, not ignored.
  if (so.overflow != runtime::ContextOverflow::kStop) {
    fail(
        "--context-overflow %s is not supported by the server (each request ends at its "
        "context); leave it out",
        runtime::context_overflow_name(so.overflow));
  }
  if (a.given("sinks"))
    fail("--sinks has no effect in the server (no context overflow); leave it out");
  runtime::SchedulerOptions& s = c.sched;
  s.ctx = so.ctx;
  s.cache = so.cache;
  s.forward = so.forward;
  s.threads = so.threads;
  s.parallel = static_cast<int>(a.integer("parallel", 1, 4096));
  s.queue = static_cast<int>(a.integer("queue", 0, 1 << 20));
  s.prefill_chunk = static_cast<int>(a.integer("prefill-chunk", 1, 1 << 16));
  const std::string pc = a.str("prefix-cache");
  if (pc != "on" && pc != "off") fail("--prefix-cache '%s': expected on or off", pc.c_str());
  s.prefix_cache = pc == "on";
  s.lookup = static_cast<int>(a.integer("lookup", 0, 64));
  s.lookup_ngram = static_cast<int>(a.integer("lookup-ngram", 1, 16));
  runtime::GenerationOptions drafting;
  drafting.lookup = s.lookup;  // --draft-model refuses --lookup
  s.draft = draft_model_option(a, m, so, drafting);
  if (a.given("kv-budget")) {
    const KvBudget b = parse_kv_budget(a.str("kv-budget"));
    s.kv_budget_bytes = b.bytes;
    s.kv_budget_tokens = b.tokens;
  } else {
    // Every slot can hold a whole context, unless that is more than the memory
    // beside the weights: then most of that memory.
    const kv::CacheConfig shaped = runtime::scheduler_cache_shape(m.config(), s);
    const runtime::PoolPlan plan = runtime::plan_pool(shaped, s);
    const uint64_t need =
        static_cast<uint64_t>(plan.blocks) * plan.block_bytes + plan.slot_bytes * s.parallel;
    const uint64_t avail = sys::available_memory_bytes();
    const uint64_t beside = avail > m.weight_bytes() ? avail - m.weight_bytes() : 0;
    if (avail > 0 && need > beside / 10 * 8) {
      s.kv_budget_bytes = beside / 10 * 8;
      std::fprintf(
          stderr,
          "note: %d slots x %d tokens need %s of KV cache; the budget is %s (80%% of the memory "
          "available beside the weights; --kv-budget sets it)\n",
          s.parallel, s.ctx, sys::human_bytes(static_cast<double>(need)).c_str(),
          sys::human_bytes(static_cast<double>(s.kv_budget_bytes)).c_str());
    }
  }
  server::ServerOptions& o = c.server;
  o.host = a.str("host");
  if (a.given("slot-save-path")) {
    o.slot_save_path = a.str("slot-save-path");
    struct stat st {};
    if (o.slot_save_path.empty() || ::stat(o.slot_save_path.c_str(), &st) != 0 ||
        !S_ISDIR(st.st_mode) || ::access(o.slot_save_path.c_str(), W_OK) != 0) {
      fail("--slot-save-path %s: not a directory this process can write", o.slot_save_path.c_str());
    }
    if (!s.prefix_cache)
      fail("--slot-save-path: slots keep ended requests' caches only with --prefix-cache on");
    while (o.slot_save_path.size() > 1 && o.slot_save_path.back() == '/')
      o.slot_save_path.pop_back();
  }
  o.port = static_cast<int>(a.integer("port", 0, 65535));
  o.api_key = a.given("api-key") ? a.str("api-key") : "";
  if (o.api_key.empty()) {
    if (const char* env = std::getenv("KIVI_API_KEY")) o.api_key = env;
  }
  o.model_id = a.given("alias") ? a.str("alias") : model_id(m);
  o.chat_template = a.given("chat-template") ? a.str("chat-template") : "";
  if (!o.chat_template.empty() && o.chat_template != "llama3" && o.chat_template != "chatml" &&
      o.chat_template != "gemma" && o.chat_template != "phi3" && o.chat_template != "harmony" &&
      o.chat_template != "plain") {
    fail("--chat-template '%s': expected llama3, chatml, gemma, phi3, harmony or plain",
         o.chat_template.c_str());
  }
  o.max_body_bytes = static_cast<size_t>(a.integer("max-body", 1024, int64_t{1} << 32));
  o.cors_origin = a.str("cors");
  if (o.cors_origin.find_first_of("\r\n") != std::string::npos)
    fail("--cors '%s': an origin is one line", o.cors_origin.c_str());
  o.pooling = a.str("pooling");
  if (o.pooling != "mean" && o.pooling != "last")
    fail("--pooling '%s': expected mean or last", o.pooling.c_str());
  o.read_timeout_s = o.write_timeout_s = static_cast<int>(a.integer("timeout", 1, 3600));
  return c;
}

void block_stop_signals() {
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
}

void print_serve_summary(const runtime::Scheduler& s, const server::ServerOptions& o) {
  const auto st = s.stats();
  const uint64_t pool = static_cast<uint64_t>(st.blocks_total) * st.block_bytes;
  std::fprintf(stderr,
               "kivi serve: model '%s', KV cache %s, %d slot%s of %d tokens, pool of %d blocks x "
               "%d tokens = %lld tokens in %s (+ %s of residual windows), queue %d\n",
               o.model_id.c_str(), describe_cache(s.cache_config()).c_str(), st.parallel,
               st.parallel == 1 ? "" : "s", st.ctx, st.blocks_total, st.block_tokens,
               static_cast<long long>(st.blocks_total) * st.block_tokens,
               sys::human_bytes(static_cast<double>(pool)).c_str(),
               sys::human_bytes(static_cast<double>(st.slot_bytes * st.parallel)).c_str(),
               st.queue_capacity);
}

}  // namespace kivi::tools
