// kivi serve: the OpenAI-compatible HTTP server (docs/SERVER.md).
#include <pthread.h>

#include <csignal>
#include <cstdio>
#include <thread>

#include "common.h"
#include "core/error.h"
#include "runtime/scheduler.h"
#include "serve_options.h"
#include "server/http_server.h"

namespace kivi::tools {

int cmd_serve(int argc, char** argv) {
  Args a(
      "serve", "[-m MODEL] [--host ADDR] [--port N] [--parallel N] [--kv-budget SIZE] [options]",
      "Serves the model over HTTP with OpenAI's API: POST /v1/completions and "
      "/v1/chat/completions\n"
      "(stream: true for server-sent events), GET /v1/models, /health and /metrics (Prometheus).\n"
      "Requests are decoded together in one batch; all sequences draw KV cache blocks from one "
      "pool,\n"
      "and prompts with a common prefix share its blocks. Ctrl-C stops the server. Docs: "
      "docs/SERVER.md.");
  add_serve_options(a);
  add_model_options(a);
  add_kv_options(a);
  if (!parse_command_line(a, argc, argv)) return 0;  // --help printed

  // Signals go to one thread that stops the server; the others never see them.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGUSR1);
  block_stop_signals();  // main() did so already when MPI starts threads of its own

  auto m = load_model(a);
  note_if_synthetic(*m, "its text is meaningless");
  if (dist::cp_comm()) {
    throw dist::CollectiveError(
        "kivi serve runs over ranks with --dist tp only (each --dist cp rank would hold a shard "
        "of every sequence's positions)");
  }
  ServeConfig cfg = on_every_rank([&] { return serve_config(a, *m); });
  // Under mpirun every rank runs the same steps on its share of the model and of every
  // sequence's cache; rank 0 schedules them and serves HTTP. The pools must have the
  // same number of blocks everywhere: rank 0's budget holds on every rank.
  cfg.sched.link = dist::step_link();
  dist::broadcast(cfg.sched.kv_budget_bytes);
  auto sched = on_every_rank([&] { return std::make_unique<runtime::Scheduler>(*m, cfg.sched); });
  std::unique_ptr<server::HttpServer> http_owner;
  const int port = on_every_rank([&] {
    if (!dist::is_root()) return 0;
    http_owner = std::make_unique<server::HttpServer>(*sched, cfg.server);
    return http_owner->bind();
  });
  if (cfg.sched.link) {
    if (!dist::is_root()) {
      sched->follow();
      return 0;
    }
    sched->start();
  }
  server::HttpServer& http = *http_owner;
  runtime::Scheduler& s = *sched;
  print_serve_summary(s, cfg.server);
  std::fprintf(stderr, "kivi serve: chat format %s; listening on http://%s:%d%s\n",
               http.chat().name(), cfg.server.host.c_str(), port,
               cfg.server.api_key.empty() ? "" : " (API key required)");

  std::thread waiter([&] {
    int sig = 0;
    sigwait(&sigs, &sig);
    if (sig != SIGUSR1) std::fprintf(stderr, "kivi serve: stopping\n");
    http.stop();
  });
  http.run();
  pthread_kill(waiter.native_handle(),
               SIGUSR1);  // wakes the waiter if the server stopped by itself
  waiter.join();
  s.stop();
  const auto st = s.stats();
  std::fprintf(
      stderr,
      "kivi serve: %llu requests completed, %llu cancelled, %llu refused (queue full); %llu "
      "tokens generated\n",
      static_cast<unsigned long long>(st.completed), static_cast<unsigned long long>(st.cancelled),
      static_cast<unsigned long long>(st.rejected_queue_full),
      static_cast<unsigned long long>(st.generated_tokens));
  return 0;
}

}  // namespace kivi::tools
