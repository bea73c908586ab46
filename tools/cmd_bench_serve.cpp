// kivi bench-serve: concurrent streaming clients against an OpenAI-compatible server,
// one it starts in this process or one at --url (docs/SERVER.md).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common.h"
#include "core/error.h"
#include "core/json.h"
#include "core/progress.h"
#include "core/sysinfo.h"
#include "runtime/scheduler.h"
#include "serve_options.h"
#include "server/http_server.h"
#include "load_client.h"

namespace kivi::tools {

namespace {

// "http://HOST:PORT" with an optional path (such as /v1), which is ignored.
void parse_url(const std::string& url, std::string* host, int* port) {
  const std::string scheme = "http://";
  if (url.rfind(scheme, 0) != 0) fail("--url '%s': expected http://HOST:PORT", url.c_str());
  std::string rest = url.substr(scheme.size());
  const size_t slash = rest.find('/');
  if (slash != std::string::npos) rest.resize(slash);
  const size_t colon = rest.rfind(':');
  *host = colon == std::string::npos ? rest : rest.substr(0, colon);
  *port = 80;
  if (colon != std::string::npos) {
    const std::string p = rest.substr(colon + 1);
    char* end = nullptr;
    const long v = std::strtol(p.c_str(), &end, 10);
    if (p.empty() || *end != '\0' || v < 1 || v > 65535)
      fail("--url '%s': the port must be 1 to 65535", url.c_str());
    *port = static_cast<int>(v);
  }
  if (host->empty()) fail("--url '%s': no host", url.c_str());
}

void write_percentiles(JsonWriter& j, const char* name, const Percentiles& p) {
  j.key(name).begin_object();
  j.kv("count", static_cast<uint64_t>(p.count))
      .kv("p50", p.p50)
      .kv("p99", p.p99)
      .kv("mean", p.mean)
      .kv("max", p.max);
  j.end_object();
}

const char* outcome_name(RequestResult::Outcome o) {
  switch (o) {
    case RequestResult::Outcome::kCompleted:
      return "completed";
    case RequestResult::Outcome::kRejected:
      return "rejected";
    case RequestResult::Outcome::kCut:
      return "cut";
    case RequestResult::Outcome::kError:
      break;
  }
  return "error";
}

}  // namespace

int cmd_bench_serve(int argc, char** argv) {
  Args a("bench-serve",
         "[-m MODEL | --url URL] [--clients N] [--requests N] [--seconds S] [--max-tokens N] "
         "[--json]",
         "Load generator for the OpenAI-compatible server: N concurrent clients send streamed\n"
         "completion requests (seeded prompts of mixed lengths) over HTTP, one after another, "
         "until\n"
         "--requests are sent or --seconds pass. Without --url it starts 'kivi serve' in this "
         "process\n"
         "on a free loopback port (serve, model and KV options apply). Reports aggregate "
         "tokens/s\n"
         "(from the responses' usage), time to first token and inter-token latency (p50, p99), "
         "peak KV\n"
         "bytes, admissions and the queue. Docs: docs/SERVER.md.");
  a.section("Load");
  a.add("url", 0, "URL", "A running server to measure (http://HOST:PORT); default: start one.");
  a.add("clients", 0, "N", "Concurrent clients, each with one request in flight.", "8");
  a.add("requests", 0, "N", "Requests to send in all.", "64");
  a.add("seconds", 0, "S",
        "Time limit: no request starts after it, and streams still open are cut.", "60");
  a.add("prompt-words", 0, "MIN,MAX",
        "Prompt length in words, drawn per request (tokens depend on the tokenizer).", "8,128");
  a.add("system-words", 0, "N",
        "A common system prompt of N words before every prompt (prefix sharing).", "0");
  a.add_flag("distinct-system", 0,
             "Give every request a different system prompt of --system-words words (the "
             "control for prefix sharing).");
  a.add("ramp", 0, "S", "Start the clients spread over S seconds instead of at once.", "0");
  a.add("max-tokens", 0, "N", "max_tokens of every request.", "64");
  a.add("turns", 0, "N",
        "Requests per conversation: each later turn resends the previous prompt and reply with a "
        "new message of --prompt-words words (what the prefix cache serves).",
        "1");
  a.add("temp", 0, "T", "Sampling temperature of every request (each has its own seed).", "0.8");
  a.add_flag("stop-at-eos", 0,
             "Let requests end at an end-of-text token (default: ignore_eos, so every request "
             "generates --max-tokens).");
  a.add("seed", 0, "N", "Seed of the prompts and of the requests' sampling.", "1");
  a.add_flag("json", 0, "Print one JSON object (with every request) instead of the table.");
  add_serve_options(a);
  add_model_options(a);
  add_kv_options(a);
  if (!parse_command_line(a, argc, argv)) return 0;  // --help printed
  const bool json = a.flag("json");

  LoadOptions lo;
  lo.clients = static_cast<int>(a.integer("clients", 1, 4096));
  lo.requests = static_cast<int>(a.integer("requests", 1, 10000000));
  lo.seconds = a.number("seconds", 0.1, 86400);
  const auto words = a.int_list("prompt-words", 1, 100000);
  if (words.size() != 2 || words[0] > words[1])
    fail("--prompt-words '%s': expected MIN,MAX with MIN <= MAX", a.str("prompt-words").c_str());
  lo.prompt_words_min = static_cast<int>(words[0]);
  lo.prompt_words_max = static_cast<int>(words[1]);
  lo.system_words = static_cast<int>(a.integer("system-words", 0, 1000000));
  lo.distinct_system = a.flag("distinct-system");
  lo.ramp_seconds = a.number("ramp", 0, 86400);
  lo.max_tokens = static_cast<int>(a.integer("max-tokens", 1, 1 << 24));
  lo.turns = static_cast<int>(a.integer("turns", 1, 10000));
  lo.temperature = a.number("temp", 0, 2);
  lo.ignore_eos = !a.flag("stop-at-eos");
  lo.seed = static_cast<uint64_t>(a.integer("seed", 0, INT64_MAX));

  std::unique_ptr<model::Model> m;
  std::unique_ptr<runtime::Scheduler> sched;
  std::unique_ptr<server::HttpServer> http;
  std::thread serving;
  std::string url;
  if (a.given("url")) {
    for (const char* o : {"model", "tokenizer", "parallel", "queue", "kv-budget", "kv-cache",
                          "kv-cache-k", "kv-cache-v", "ctx", "alias", "chat-template"}) {
      if (a.given(o))
        fail(
            "--%s configures the server bench-serve starts; with --url the server is already "
            "running",
            o);
    }
    parse_url(a.str("url"), &lo.host, &lo.port);
    lo.api_key = a.given("api-key") ? a.str("api-key") : "";
    url = a.str("url");
  } else {
    m = load_model(a);
    ServeConfig cfg = serve_config(a, *m);
    if (!a.given("port")) cfg.server.port = 0;
    sched = std::make_unique<runtime::Scheduler>(*m, cfg.sched);
    http = std::make_unique<server::HttpServer>(*sched, cfg.server);
    lo.port = http->bind();
    lo.host = cfg.server.host == "0.0.0.0" ? "127.0.0.1" : cfg.server.host;
    lo.api_key = cfg.server.api_key;
    if (!json) print_serve_summary(*sched, cfg.server);
    serving = std::thread([&] { http->run(); });
    url = "http://" + lo.host + ":" + std::to_string(lo.port);
  }

  Progress bar("bench-serve", lo.requests, "req", !json);
  std::mutex bar_mu;
  lo.progress = [&](int finished) {
    std::lock_guard<std::mutex> lock(bar_mu);
    bar.update(finished);
  };
  LoadReport r = run_load(lo);
  bar.finish();
  if (http) {
    http->stop();
    serving.join();
    sched->stop();
  }
  const bool any_failed = r.errors > 0;

  if (json) {
    JsonWriter j;
    j.begin_object();
    j.kv("url", url).kv("in_process", !a.given("url"));
    if (sched) {
      const auto st = sched->stats();
      j.kv("cache", st.cache_format)
          .kv("parallel", st.parallel)
          .kv("ctx", st.ctx)
          .kv("kv_pool_blocks", st.blocks_total)
          .kv("kv_block_tokens", st.block_tokens)
          .kv("kv_block_bytes", st.block_bytes)
          .kv("kv_slot_bytes", st.slot_bytes);
    }
    j.kv("clients", lo.clients)
        .kv("requests", lo.requests)
        .kv("seconds_limit", lo.seconds)
        .kv("max_tokens", lo.max_tokens)
        .kv("turns", lo.turns)
        .kv("system_words", lo.system_words)
        .kv("distinct_system", lo.distinct_system)
        .kv("ramp_s", lo.ramp_seconds)
        .kv("ignore_eos", lo.ignore_eos)
        .kv("seed", lo.seed);
    j.kv("sent", r.sent)
        .kv("completed", r.completed)
        .kv("rejected", r.rejected)
        .kv("errors", r.errors)
        .kv("cut", r.cut)
        .kv("wall_s", r.wall_s)
        .kv("prompt_tokens", r.prompt_tokens)
        .kv("completion_tokens", r.completion_tokens)
        .kv("cached_prompt_tokens", r.cached_tokens)
        .kv("tokens_per_second", r.tokens_per_second);
    write_percentiles(j, "ttft_ms", r.ttft_ms);
    write_percentiles(j, "itl_ms", r.itl_ms);
    write_percentiles(j, "tpot_ms", r.tpot_ms);
    write_percentiles(j, "ttft_first_turn_ms", r.ttft_first_turn_ms);
    write_percentiles(j, "ttft_later_turns_ms", r.ttft_later_turns_ms);
    if (r.metrics) {
      j.key("server").begin_object();
      j.kv("admitted", r.admitted)
          .kv("generated_tokens", r.server_generated_tokens)
          .kv("kv_bytes_peak", r.kv_bytes_peak)
          .kv("kv_blocks_peak", r.kv_blocks_peak)
          .kv("kv_bytes_peak_seen", r.kv_bytes_peak_seen)
          .kv("queue_depth_peak", r.queue_depth_peak)
          .kv("active_peak", r.active_peak)
          .kv("blocks_shared_peak", r.blocks_shared_peak)
          .kv("preemptions", r.preemptions);
      j.end_object();
    } else {
      j.key("server").null();
    }
    j.key("results").begin_array();
    for (const auto& q : r.requests) {
      j.begin_object()
          .kv("outcome", outcome_name(q.outcome))
          .kv("status", q.status)
          .kv("prompt_words", q.prompt_words)
          .kv("prompt_tokens", q.prompt_tokens)
          .kv("completion_tokens", q.completion_tokens)
          .kv("cached_tokens", q.cached_tokens)
          .kv("turn", q.turn)
          .kv("chunks", q.chunks)
          .kv("ttft_ms", q.ttft_ms)
          .kv("total_ms", q.total_ms);
      if (!q.error.empty()) j.kv("error", q.error);
      j.end_object();
    }
    j.end_array();
    j.end_object();
    std::printf("%s\n", j.str().c_str());
  } else {
    std::printf("bench-serve: %s, %d clients, %d requests sent in %.2f s\n", url.c_str(),
                lo.clients, r.sent, r.wall_s);
    std::printf("  completed %d, rejected (503) %d, errors %d, cut at the time limit %d\n",
                r.completed, r.rejected, r.errors, r.cut);
    std::printf("  tokens: %llu prompt, %llu generated; %.1f generated tokens/s aggregate\n",
                static_cast<unsigned long long>(r.prompt_tokens),
                static_cast<unsigned long long>(r.completion_tokens), r.tokens_per_second);
    std::printf("  time to first token (ms): p50 %.1f  p99 %.1f  mean %.1f  (%zu requests)\n",
                r.ttft_ms.p50, r.ttft_ms.p99, r.ttft_ms.mean, r.ttft_ms.count);
    if (lo.turns > 1) {
      std::printf(
          "  conversations of %d turns: time to first token (ms) p50 %.1f in first turns, %.1f "
          "in later turns; %llu of %llu prompt tokens cached\n",
          lo.turns, r.ttft_first_turn_ms.p50, r.ttft_later_turns_ms.p50,
          static_cast<unsigned long long>(r.cached_tokens),
          static_cast<unsigned long long>(r.prompt_tokens));
    }
    std::printf(
        "  inter-token latency (ms): p50 %.2f  p99 %.2f  mean %.2f  (%zu gaps between chunks)\n",
        r.itl_ms.p50, r.itl_ms.p99, r.itl_ms.mean, r.itl_ms.count);
    std::printf("  time per output token (ms): p50 %.2f  p99 %.2f  mean %.2f  (after the first)\n",
                r.tpot_ms.p50, r.tpot_ms.p99, r.tpot_ms.mean);
    if (r.metrics) {
      std::printf(
          "  server: %.0f admitted, queue depth peak %.0f, active peak %.0f, KV peak %s (seen "
          "%s), shared blocks peak %.0f, %.0f preempted\n",
          r.admitted, r.queue_depth_peak, r.active_peak, sys::human_bytes(r.kv_bytes_peak).c_str(),
          sys::human_bytes(r.kv_bytes_peak_seen).c_str(), r.blocks_shared_peak, r.preemptions);
    } else {
      std::printf("  server: /metrics not readable\n");
    }
    for (const auto& q : r.requests) {
      if (!q.error.empty()) {
        std::fprintf(stderr, "bench-serve: a request failed (status %d): %s\n", q.status,
                     q.error.c_str());
        break;
      }
    }
  }
  return any_failed ? 1 : 0;
}

}  // namespace kivi::tools
