#include "server/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <chrono>
#include <csignal>

#include "core/error.h"
#include "server/api_error.h"
#include "server/connection.h"
#include "server/openai_request.h"
#include "server/openai_response.h"

namespace kivi::server {

namespace {

using runtime::FinishReason;
using runtime::RequestHandle;
using runtime::Scheduler;

// How often a waiting handler checks for a client that went away.
constexpr std::chrono::milliseconds kPoll{100};

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

bool same_secret(const std::string& given, const std::string& key) {
  // Looks at every byte whatever differs, so the time taken does not tell how much matched.
  if (key.empty()) return false;
  unsigned char diff = given.size() == key.size() ? 0 : 1;
  for (size_t i = 0; i < given.size(); ++i)
    diff |= static_cast<unsigned char>(given[i] ^ key[i % key.size()]);
  return diff == 0;
}

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status();
  res.set_content(e.json(), "application/json");
}

// Counters are kept per route, not per path, so that clients cannot grow them.
std::string route_of(const httplib::Request& req) {
  for (const char* r :
       {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics"}) {
    if (req.path == r) return r;
  }
  if (req.path.rfind("/v1/models/", 0) == 0) return "/v1/models/{id}";
  return "other";
}

const char* finish_name(FinishReason r) { return r == FinishReason::kLength ? "length" : "stop"; }

// A streamed response's state, shared by the content provider and its releaser.
struct Stream {
  std::shared_ptr<RequestHandle> handle;
  ResponseInfo info;
  bool include_usage = false;
  int fd = -1;
  bool done = false;
};

}  // namespace

class HttpServer::Impl {
 public:
  // The library listens with a backlog of 5 connections; many clients connecting at
  // once overflow it and some see their connection reset. listen() again on the bound
  // socket raises it.
  class Server : public httplib::Server {
   public:
    void raise_backlog() { ::listen(svr_sock_, SOMAXCONN); }
  };
  Server http;
};

HttpServer::HttpServer(Scheduler& sched, const ServerOptions& o) : sched_(sched), opt_(o) {
  // A client that closes its connection must not kill the process on the next write.
  std::signal(SIGPIPE, SIG_IGN);
  chat_ = std::make_unique<ChatFormatter>(sched.model().tokenizer(), opt_.chat_template);
  impl_ = std::make_unique<Impl>();
  httplib::Server& h = impl_->http;
  const auto& so = sched.options();
  const int threads = opt_.http_threads > 0 ? opt_.http_threads : so.parallel + so.queue + 8;
  h.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  h.set_payload_max_length(opt_.max_body_bytes);
  h.set_read_timeout(opt_.read_timeout_s, 0);
  h.set_write_timeout(opt_.write_timeout_s, 0);
  h.set_keep_alive_timeout(opt_.keep_alive_s);
  h.set_keep_alive_max_count(1000);
  h.set_tcp_nodelay(true);  // each token's event leaves at once

  ApiContext ctx;
  ctx.tokenizer = &sched.model().tokenizer();
  ctx.chat = chat_.get();
  ctx.model_id = opt_.model_id;
  ctx.ctx = so.ctx;

  h.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (opt_.api_key.empty()) return httplib::Server::HandlerResponse::Unhandled;
    if (req.path.rfind("/v1/", 0) != 0 && req.path != "/metrics")
      return httplib::Server::HandlerResponse::Unhandled;
    const std::string auth = req.get_header_value("Authorization");
    const std::string prefix = "Bearer ";
    const bool ok =
        auth.rfind(prefix, 0) == 0 && same_secret(auth.substr(prefix.size()), opt_.api_key);
    if (!ok) {
      send_error(
          res,
          ApiError(401,
                   auth.empty()
                       ? "You didn't provide an API key: pass it as 'Authorization: Bearer KEY'"
                       : "Incorrect API key provided",
                   "", "invalid_api_key", "invalid_request_error"));
      res.set_header("WWW-Authenticate", "Bearer");
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });

  h.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    const auto s = sched_.stats();
    res.set_content(strfmt("{\"status\":\"ok\",\"slots\":%d,\"active\":%d,\"queued\":%d}",
                           s.parallel, s.active, s.queued),
                    "application/json");
  });
  h.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(prometheus_text(sched_.stats(), counters_.snapshot(), opt_.model_id),
                    "text/plain; version=0.0.4; charset=utf-8");
  });
  const int64_t started = unix_now();
  h.Get("/v1/models", [this, started](const httplib::Request&, httplib::Response& res) {
    res.set_content(models_body(opt_.model_id, started), "application/json");
  });
  h.Get(R"(/v1/models/(.+))", [this, started](const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.matches[1];
    if (id != opt_.model_id) {
      send_error(
          res, ApiError(404, "The model '" + id + "' does not exist", "model", "model_not_found"));
      return;
    }
    res.set_content(model_body(opt_.model_id, started), "application/json");
  });

  auto generate = [this, ctx](Endpoint e, const httplib::Request& req, httplib::Response& res) {
    ParsedRequest p;
    try {
      p = parse_request(e, req.body, ctx);
    } catch (const ApiError& err) {
      send_error(res, err);
      return;
    }
    std::shared_ptr<RequestHandle> handle;
    switch (sched_.submit(p.gen, &handle)) {
      case Scheduler::Submit::kQueued:
        break;
      case Scheduler::Submit::kQueueFull:
        res.set_header("Retry-After", "1");
        send_error(
            res, ApiError(503,
                          "The server is busy: every sequence slot is taken and the queue is full. "
                          "Retry later.",
                          "", "server_busy"));
        return;
      case Scheduler::Submit::kTooLong:
        send_error(res, ApiError(400, "prompt plus max_tokens exceed the context", "max_tokens",
                                 "context_length_exceeded"));
        return;
      case Scheduler::Submit::kOverBudget:
        send_error(
            res,
            ApiError(
                400,
                strfmt("prompt plus max_tokens (%zu tokens) need more KV cache than the server's "
                       "whole budget holds; lower max_tokens",
                       p.gen.prompt.size() + static_cast<size_t>(p.gen.max_tokens)),
                "max_tokens", "kv_budget_exceeded"));
        return;
      case Scheduler::Submit::kStopped:
        send_error(res, ApiError(503, "The server is shutting down"));
        return;
    }
    ResponseInfo info{e, new_response_id(e), unix_now(), opt_.model_id};
    const int fd = find_connection_socket(req.local_port, req.remote_addr, req.remote_port);
    const int n_prompt = static_cast<int>(p.gen.prompt.size());
    if (!p.stream) {
      std::string text;
      RequestHandle::Update u;
      for (;;) {
        u = handle->wait(kPoll);
        text += u.text;
        if (u.finished) break;
        if (stopping_ || peer_closed(fd)) {
          handle->cancel();
          res.status = 499;  // the client closed the request (no one reads this)
          return;
        }
      }
      if (u.reason == FinishReason::kError) {
        send_error(res, ApiError(500, "generation failed: " + u.error));
      } else if (u.reason == FinishReason::kCancelled) {
        send_error(res, ApiError(503, "The server is shutting down"));
      } else {
        res.set_content(
            completion_body(info, text, finish_name(u.reason), {n_prompt, u.completion_tokens}),
            "application/json");
      }
      return;
    }
    auto st = std::make_shared<Stream>();
    st->handle = handle;
    st->info = info;
    st->include_usage = p.include_usage;
    st->fd = fd;
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, st, n_prompt](size_t, httplib::DataSink& sink) {
          auto write = [&](const std::string& s) { return sink.write(s.data(), s.size()); };
          if (st->info.endpoint == Endpoint::kChat && !write(chunk_role(st->info))) return false;
          for (;;) {
            const RequestHandle::Update u = st->handle->wait(kPoll);
            if (!u.text.empty() && !write(chunk_text(st->info, u.text))) return false;
            if (u.finished) {
              bool ok = true;
              if (u.reason == FinishReason::kError) {
                ok = write(sse_error(ApiError(500, "generation failed: " + u.error).json()));
              } else if (u.reason == FinishReason::kCancelled) {
                ok = write(sse_error(ApiError(503, "The server is shutting down").json()));
              } else {
                ok = write(chunk_finish(st->info, finish_name(u.reason)));
                if (ok && st->include_usage)
                  ok = write(chunk_usage(st->info, {n_prompt, u.completion_tokens}));
              }
              ok = ok && write(sse_done());
              st->done = true;
              if (ok) sink.done();
              return ok;
            }
            if (stopping_ || peer_closed(st->fd)) return false;
          }
        },
        // Runs when the response ends, also when writing failed: a stream that did not
        // finish is cancelled so its blocks return to the pool.
        [st](bool) {
          if (!st->done) st->handle->cancel();
        });
  };
  h.Post("/v1/completions", [generate](const httplib::Request& req, httplib::Response& res) {
    generate(Endpoint::kCompletions, req, res);
  });
  h.Post("/v1/chat/completions", [generate](const httplib::Request& req, httplib::Response& res) {
    generate(Endpoint::kChat, req, res);
  });

  // Statuses the library sets itself (404 unknown route, 413 body too large, 400
  // unreadable request, ...) get an error object too.
  h.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string msg;
    switch (res.status) {
      case 404:
        msg = "Unknown request URL: " + req.method + " " + req.path;
        break;
      case 405:
        msg = "Method not allowed: " + req.method + " " + req.path;
        break;
      case 413:
        msg = "The request body is too large";
        break;
      case 499:
        return;
      default:
        msg = strfmt("HTTP error %d", res.status);
        break;
    }
    send_error(res, ApiError(res.status, msg));
  });
  h.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown error";
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        send_error(res, ApiError(500, "internal error: " + what));
      });
  h.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    counters_.add(route_of(req), res.status);
  });
}

HttpServer::~HttpServer() { stop(); }

int HttpServer::bind() {
  httplib::Server& h = impl_->http;
  if (opt_.port == 0) {
    port_ = h.bind_to_any_port(opt_.host);
  } else {
    port_ = h.bind_to_port(opt_.host, opt_.port) ? opt_.port : -1;
  }
  if (port_ < 0) {
    fail("cannot listen on %s:%d (in use, or not an address of this machine)", opt_.host.c_str(),
         opt_.port);
  }
  impl_->http.raise_backlog();
  return port_;
}

void HttpServer::run() {
  if (port_ < 0) bind();
  impl_->http.listen_after_bind();
}

void HttpServer::stop() {
  stopping_ = true;
  if (impl_) impl_->http.stop();
}

}  // namespace kivi::server
