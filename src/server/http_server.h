// The OpenAI-compatible HTTP server over a runtime::Scheduler:
//   POST /v1/completions, POST /v1/chat/completions   (stream: true answers with
//        server-sent events, ending with "data: [DONE]")
//   GET  /v1/models, /v1/models/{id}, /health, /metrics
// Errors are OpenAI's JSON error objects with their HTTP status (api_error.h); a full
// queue answers 503 with Retry-After. With an API key, /v1/* and /metrics need
// "Authorization: Bearer KEY" (401 otherwise); /health stays open.
//
// Clients that go away are noticed between tokens (connection.h) and their sequences
// cancelled, which frees their KV blocks at the scheduler's next step. Reads and writes
// time out (a slow or idle client is dropped), bodies are limited in size, and every
// connection is served by one of a fixed set of threads.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>

#include "runtime/scheduler.h"
#include "runtime/session.h"
#include "server/messages.h"
#include "server/metrics.h"

namespace kivi::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;            // 0: any free port (see HttpServer::port)
  std::string api_key;        // empty: no authentication
  std::string model_id;       // the name clients pass as `model`
  std::string chat_template;  // "", "llama3", "chatml" or "plain" (messages.h)
  size_t max_body_bytes = 4u << 20;
  // CORS: "" (default) sends no CORS headers and answers no preflight; "*" or an origin
  // ("http://localhost:3000") lets web pages of that origin call the API.
  std::string cors_origin;
  int read_timeout_s = 10;       // receiving a request
  int write_timeout_s = 10;      // a client that stops reading
  int keep_alive_s = 5;          // an idle connection between requests
  int http_threads = 0;          // 0: slots + min(queue, 256) + 8
  std::string pooling = "mean";  // embeddings: "mean" or "last" (server/embeddings.h)
  std::string slot_save_path;    // slot files (server/slots.h); "" = saving slots is off
};

class HttpServer {
 public:
  HttpServer(runtime::Scheduler& sched, const ServerOptions& o);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds the listening socket; throws kivi::Error if it cannot. Returns the port.
  int bind();
  int port() const { return port_; }
  // Serves until stop() (from any thread).
  void run();
  void stop();
  bool stopping() const { return stopping_.load(); }

  const ChatFormatter& chat() const { return *chat_; }
  const HttpCounters& counters() const { return counters_; }

 private:
  class Impl;
  runtime::Scheduler& sched_;
  ServerOptions opt_;
  std::unique_ptr<ChatFormatter> chat_;
  HttpCounters counters_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> run_started_{false}, run_done_{false};  // run() entered, returned
  std::atomic<int> in_flight_{0};  // generation requests whose responses have not ended
  int port_ = -1;
  // Embeddings run on a session of their own (the scheduler's cache format and threads),
  // made on the first request, one request at a time.
  std::mutex embed_mu_;
  std::unique_ptr<runtime::Session> embedder_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kivi::server
