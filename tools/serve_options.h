// Options of `kivi serve` (also taken by `kivi bench-serve` when it starts a server of
// its own): the listening address, the sequence slots, the queue, the KV budget.
#pragma once

#include <cstdint>
#include <string>

#include "args.h"
#include "model/model.h"
#include "runtime/scheduler.h"
#include "server/http_server.h"

namespace kivi::tools {

// A --kv-budget value: bytes ("8G", "512MiB", "1073741824") or tokens ("65536t",
// "64Ktok", "1M tokens"). K, M, G are powers of 1024.
struct KvBudget {
  uint64_t bytes = 0;
  int64_t tokens = 0;
};
KvBudget parse_kv_budget(const std::string& text);

// --host, --port, --parallel, --queue, --kv-budget, --prefill-chunk, --api-key, --alias,
// --chat-template, --max-body, --timeout
void add_serve_options(Args& a);

struct ServeConfig {
  runtime::SchedulerOptions sched;
  server::ServerOptions server;
};
// From the parsed options (with the model and KV options). The model id is --alias or
// the model file's name without its extension.
ServeConfig serve_config(const Args& a, const model::Model& m);

// One line on stderr describing what a scheduler serves and how much it can hold.
void print_serve_summary(const runtime::Scheduler& s, const server::ServerOptions& o);
// Blocks SIGINT, SIGTERM and SIGUSR1 in the calling thread and every thread it starts
// later: kivi serve waits for them in one thread of its own. main() calls it before MPI
// starts its threads, which would otherwise take the signal and end the process.
void block_stop_signals();

}  // namespace kivi::tools
