#include "server/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "core/error.h"
#include "runtime/reply_reader.h"
#include "server/api_error.h"
#include "server/token_api.h"
#include "server/embeddings.h"
#include "server/slots.h"
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
  for (const char* r : {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health",
                        "/metrics", "/tokenize", "/detokenize", "/slots"}) {
    if (req.path == r) return r;
  }
  if (req.path.rfind("/v1/models/", 0) == 0) return "/v1/models/{id}";
  if (req.path.rfind("/slots/", 0) == 0) return "/slots/{id}";
  return "other";
}

// Why the Content-Length headers cannot be trusted, or null: two that differ, one that
// is not a decimal number, or a length over `max`.
const char* bad_content_length(const httplib::Request& req, size_t max) {
  const auto range = req.headers.equal_range("Content-Length");
  std::string first;
  for (auto it = range.first; it != range.second; ++it) {
    const std::string& v = it->second;
    if (v.empty() || v.size() > 19 || v.find_first_not_of("0123456789") != std::string::npos)
      return "not a length in bytes";
    if (first.empty()) {
      first = v;
    } else if (std::stoull(v) != std::stoull(first)) {
      return "two different lengths";
    }
  }
  if (!first.empty() && std::stoull(first) > max) return "too large";
  return nullptr;
}

const char* finish_name(FinishReason r) { return r == FinishReason::kLength ? "length" : "stop"; }

// Calls as the client sees them, each with a new id.
std::vector<runtime::ToolCall> with_ids(std::vector<runtime::ToolCall> calls) {
  for (auto& c : calls) c.id = new_tool_call_id();
  return calls;
}

// One choice's sequence and what its text still owes the client: log-probabilities of
// tokens not yet sent (they go with the next chunk of answer text, or the last), and the
// reader that takes tool calls out and splits reasoning (harmony) from the answer.
struct ChoiceState {
  std::shared_ptr<RequestHandle> handle;
  std::unique_ptr<runtime::ReplyReader> reader;
  bool logprobs = false;
  Logprobs pending;
  bool finished = false;
  RequestHandle::Update last;  // the final update (reason, counts, error)
  // The pending log-probabilities for a chunk (null without them); clears them after.
  const Logprobs* take_logprobs(Logprobs& out) {
    if (!logprobs) return nullptr;
    out = pending;
    for (const auto& x : pending.items)
      pending.text_offset += static_cast<int>(pending.tokenizer->token_text(x.token, true).size());
    pending.items.clear();
    return &out;
  }
};

// A streamed response's state, shared by the content provider and its releaser.
struct Stream {
  std::vector<ChoiceState> choices;
  ResponseInfo info;
  bool include_usage = false;
  int fd = -1;
  bool done = false;
  void cancel() {
    for (auto& c : choices) c.handle->cancel();
  }
};

// A refused submission's answer.
void send_submit_error(httplib::Response& res, Scheduler::Submit sub, const ParsedRequest& p) {
  switch (sub) {
    case Scheduler::Submit::kQueueFull:
      res.set_header("Retry-After", "1");
      send_error(res,
                 ApiError(503,
                          "The server is busy: every sequence slot is taken and the queue is full. "
                          "Retry later.",
                          "", "server_busy"));
      return;
    case Scheduler::Submit::kTooLong:
      send_error(res, ApiError(400, "prompt plus max_tokens exceed the context", "max_tokens",
                               "context_length_exceeded"));
      return;
    case Scheduler::Submit::kOverBudget:
      send_error(res,
                 ApiError(400,
                          strfmt("prompt plus max_tokens (%zu tokens) need more KV cache than the "
                                 "server's whole budget holds; lower max_tokens",
                                 p.gen.prompt.size() + static_cast<size_t>(p.gen.max_tokens)),
                          "max_tokens", "kv_budget_exceeded"));
      return;
    case Scheduler::Submit::kStopped:
    case Scheduler::Submit::kQueued:
      break;
  }
  send_error(res, ApiError(503, "The server is shutting down"));
}

// Ends a stream: `last` (an event, or nothing), then [DONE].
bool finish_stream(Stream& st, httplib::DataSink& sink, const std::string& last) {
  const bool ok = (last.empty() || sink.write(last.data(), last.size())) &&
                  sink.write(sse_done(), std::strlen(sse_done()));
  st.done = true;
  if (ok) sink.done();
  return ok;
}

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
  explicit Impl(HttpServer& s) : s_(s) {}
  Server http;

  // The routes, in the order requests meet them.
  void add_checks();       // the body's length and the API key, from the headers
  void add_info_routes();  // /health, /metrics, /v1/models, /tokenize, /detokenize
  void add_generation_routes(const ApiContext& ctx);  // completions and chat completions
  void add_embedding_routes(const ApiContext& ctx);   // /v1/embeddings
  void add_slot_routes();                             // /slots (server/slots.h)
  void add_error_handlers();  // error objects for the library's own statuses; counters

 private:
  HttpServer& s_;
};

HttpServer::HttpServer(Scheduler& sched, const ServerOptions& o) : sched_(sched), opt_(o) {
  // A client that closes its connection must not kill the process on the next write.
  std::signal(SIGPIPE, SIG_IGN);
  chat_ = std::make_unique<ChatFormatter>(sched.model().tokenizer(), opt_.chat_template);
  impl_ = std::make_unique<Impl>(*this);
  httplib::Server& h = impl_->http;
  const auto& so = sched.options();
  // A handler holds its thread while its request waits or runs: one per slot and per
  // queued request, up to kMaxQueueThreads of the queue (--queue 5000 does not start 5000
  // threads; later connections wait for a thread before their request is queued).
  constexpr int kMaxQueueThreads = 256;
  const int threads = opt_.http_threads > 0
                          ? opt_.http_threads
                          : so.parallel + std::min(so.queue, kMaxQueueThreads) + 8;
  h.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  h.set_payload_max_length(opt_.max_body_bytes);
  h.set_read_timeout(opt_.read_timeout_s, 0);
  h.set_write_timeout(opt_.write_timeout_s, 0);
  h.set_keep_alive_timeout(opt_.keep_alive_s);
  h.set_keep_alive_max_count(1000);
  h.set_tcp_nodelay(true);  // each token's event leaves at once
  // The library's default also sets SO_REUSEPORT, which lets a second server bind the
  // same port and take half of the requests; only SO_REUSEADDR is set here.
  h.set_socket_options([](int sock) {
    const int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });

  ApiContext ctx;
  ctx.tokenizer = &sched.model().tokenizer();
  ctx.chat = chat_.get();
  ctx.model_id = opt_.model_id;
  ctx.ctx = so.ctx;
  const runtime::SchedulerStats st = sched.stats();
  ctx.pool_tokens = static_cast<int64_t>(st.blocks_total) * st.block_tokens;

  impl_->add_checks();
  impl_->add_info_routes();
  impl_->add_generation_routes(ctx);
  impl_->add_embedding_routes(ctx);
  impl_->add_slot_routes();
  impl_->add_error_handlers();
}

void HttpServer::Impl::add_checks() {
  httplib::Server& h = http;
  if (!s_.opt_.cors_origin.empty()) {
    // Every response names the allowed origin; preflights are answered below.
    h.set_default_headers(
        {{"Access-Control-Allow-Origin", s_.opt_.cors_origin}, {"Vary", "Origin"}});
  }
  h.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (req.method == "OPTIONS") {
      // A browser's CORS preflight (it carries no API key): allowed with --cors, else 405.
      if (s_.opt_.cors_origin.empty()) {
        send_error(res, ApiError(405, "Method not allowed: OPTIONS " + req.path +
                                          " (CORS is off; kivi serve --cors ORIGIN turns it on)"));
        return httplib::Server::HandlerResponse::Handled;
      }
      res.status = 204;
      res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
      res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type");
      res.set_header("Access-Control-Max-Age", "600");
      return httplib::Server::HandlerResponse::Handled;
    }
    // The body's length, judged from the headers before any of the body is read: a
    // request whose length is ambiguous, malformed or over the limit is answered at
    // once (not after the read timeout), and the connection closes.
    if (const char* why = bad_content_length(req, s_.opt_.max_body_bytes)) {
      const bool too_large = std::string(why) == "too large";
      send_error(
          res, ApiError(too_large ? 413 : 400, too_large ? "The request body is too large"
                                                         : std::string("Content-Length: ") + why));
      res.set_header("Connection", "close");
      return httplib::Server::HandlerResponse::Handled;
    }
    if (s_.opt_.api_key.empty()) return httplib::Server::HandlerResponse::Unhandled;
    if (req.path.rfind("/v1/", 0) != 0 && req.path != "/metrics" && req.path != "/tokenize" &&
        req.path != "/detokenize" && req.path.rfind("/slots", 0) != 0)
      return httplib::Server::HandlerResponse::Unhandled;
    const std::string auth = req.get_header_value("Authorization");
    // The scheme is case-insensitive (RFC 7235): "bearer KEY" is accepted too.
    std::string scheme = auth.substr(0, 7);
    for (char& c : scheme) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    const bool ok = scheme == "bearer " && same_secret(auth.substr(7), s_.opt_.api_key);
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
}

void HttpServer::Impl::add_info_routes() {
  httplib::Server& h = http;
  h.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    const auto s = s_.sched_.stats();
    res.set_content(strfmt("{\"status\":\"ok\",\"slots\":%d,\"active\":%d,\"queued\":%d}",
                           s.parallel, s.active, s.queued),
                    "application/json");
  });
  h.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(prometheus_text(s_.sched_.stats(), s_.counters_.snapshot(), s_.opt_.model_id),
                    "text/plain; version=0.0.4; charset=utf-8");
  });
  // Text to token ids and back (server/token_api.h).
  h.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
    try {
      res.set_content(tokenize_body(req.body, s_.sched_.model().tokenizer()), "application/json");
    } catch (const ApiError& e) {
      send_error(res, e);
    }
  });
  h.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    try {
      res.set_content(detokenize_body(req.body, s_.sched_.model().tokenizer()), "application/json");
    } catch (const ApiError& e) {
      send_error(res, e);
    }
  });
  const int64_t started = unix_now();
  h.Get("/v1/models", [this, started](const httplib::Request&, httplib::Response& res) {
    res.set_content(models_body(s_.opt_.model_id, started), "application/json");
  });
  h.Get(R"(/v1/models/(.+))", [this, started](const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.matches[1];
    if (id != s_.opt_.model_id) {
      send_error(
          res, ApiError(404, "The model '" + id + "' does not exist", "model", "model_not_found"));
      return;
    }
    res.set_content(model_body(s_.opt_.model_id, started), "application/json");
  });
}

void HttpServer::Impl::add_generation_routes(const ApiContext& ctx) {
  httplib::Server& h = http;
  auto generate = [this, ctx](Endpoint e, const httplib::Request& req, httplib::Response& res) {
    ParsedRequest p;
    try {
      p = parse_request(e, req.body, ctx);
    } catch (const ApiError& err) {
      send_error(res, err);
      return;
    }
    // n choices: n sequences of the one prompt with seeds seed, seed + 1, ...; all or none
    // are queued.
    std::vector<std::shared_ptr<RequestHandle>> handles(static_cast<size_t>(p.n));
    for (int i = 0; i < p.n; ++i) {
      runtime::GenerationRequest g = p.gen;
      g.sampling.seed += static_cast<uint64_t>(i);
      const Scheduler::Submit sub = s_.sched_.submit(std::move(g), &handles[i]);
      if (sub == Scheduler::Submit::kQueued) continue;
      for (int j = 0; j < i; ++j) handles[j]->cancel();
      send_submit_error(res, sub, p);
      return;
    }
    // Counted until the response ends, so that stop() lets it finish with a final event.
    s_.in_flight_.fetch_add(1);
    struct Done {
      std::atomic<int>& n;
      bool armed = true;
      ~Done() {
        if (armed) n.fetch_sub(1);
      }
    } done_guard{s_.in_flight_};
    ResponseInfo info{e, new_response_id(e), unix_now(), s_.opt_.model_id};
    const int fd = find_connection_socket(req.local_port, req.remote_addr, req.remote_port);
    const int n_prompt = static_cast<int>(p.gen.prompt.size());
    // harmony: the reply's reasoning goes to reasoning_content, its answer to content.
    const bool split_reasoning = e == Endpoint::kChat && ctx.chat && ctx.chat->has_reasoning();
    const bool want_logprobs = p.gen.logprobs >= 0;
    auto st = std::make_shared<Stream>();
    st->info = info;
    st->include_usage = p.include_usage;
    st->fd = fd;
    st->choices.resize(static_cast<size_t>(p.n));
    for (int i = 0; i < p.n; ++i) {
      ChoiceState& c = st->choices[i];
      c.handle = handles[i];
      c.reader = std::make_unique<runtime::ReplyReader>(
          split_reasoning, p.tool_syntax,
          p.tools.active() ? p.tools.names() : std::vector<std::string>{});
      c.logprobs = want_logprobs;
      c.pending.tokenizer = ctx.tokenizer;
    }
    // With several choices each handle is polled briefly in turn.
    const auto poll = p.n == 1 ? kPoll : std::chrono::milliseconds(2);
    if (!p.stream) {
      std::vector<std::string> texts(static_cast<size_t>(p.n));
      for (;;) {
        bool all = true;
        for (int i = 0; i < p.n; ++i) {
          ChoiceState& c = st->choices[i];
          if (c.finished) continue;
          const RequestHandle::Update u = c.handle->wait(poll);
          texts[i] += u.text;
          c.pending.items.insert(c.pending.items.end(), u.logprobs.begin(), u.logprobs.end());
          if (u.finished) {
            c.finished = true;
            c.last = u;
          }
          all = all && c.finished;
        }
        if (all) break;
        if (s_.stopping_) {
          st->cancel();
          send_error(res, ApiError(503, "The server is shutting down"));
          return;
        }
        if (peer_closed(fd)) {
          st->cancel();
          res.status = 499;  // the client closed the request (no one reads this)
          return;
        }
      }
      std::vector<Choice> out(static_cast<size_t>(p.n));
      Usage usage{n_prompt, 0, 0};
      for (int i = 0; i < p.n; ++i) {
        const RequestHandle::Update& u = st->choices[i].last;
        if (u.reason == FinishReason::kError) {
          send_error(res, ApiError(500, "generation failed: " + u.error));
          return;
        }
        if (u.reason == FinishReason::kCancelled) {
          send_error(res, ApiError(503, "The server is shutting down"));
          return;
        }
        runtime::ReplyReader& reader = *st->choices[i].reader;
        runtime::ReplyParts parts = reader.push(texts[i]);
        const runtime::ReplyParts rest = reader.finish();
        parts.reasoning += rest.reasoning;
        parts.content += rest.content;
        const std::vector<runtime::ToolCall> calls = with_ids(reader.calls());
        out[i] =
            Choice{std::move(parts.content), calls.empty() ? finish_name(u.reason) : "tool_calls",
                   std::move(parts.reasoning), want_logprobs ? &st->choices[i].pending : nullptr,
                   std::move(calls)};
        usage.completion_tokens += u.completion_tokens;
        usage.cached_tokens = std::max(usage.cached_tokens, u.cached_prompt_tokens);
      }
      res.set_content(completion_body(info, out, usage), "application/json");
      return;
    }
    res.set_header("Cache-Control", "no-cache");
    done_guard.armed = false;  // the releaser below ends the count
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, st, n_prompt, poll](size_t, httplib::DataSink& sink) {
          auto write = [&](const std::string& s) { return sink.write(s.data(), s.size()); };
          const int n = static_cast<int>(st->choices.size());
          if (st->info.endpoint == Endpoint::kChat) {
            for (int i = 0; i < n; ++i)
              if (!write(chunk_role(st->info, i))) return false;
          }
          // New text of choice i as chunks: reasoning and answer apart when the format
          // splits them, and the calls at the end.
          Logprobs lp;
          auto write_text = [&](int i, const std::string& text, bool last) {
            ChoiceState& c = st->choices[i];
            runtime::ReplyParts parts = c.reader->push(text);
            if (last) {
              const runtime::ReplyParts rest = c.reader->finish();
              parts.reasoning += rest.reasoning;
              parts.content += rest.content;
            }
            return (parts.reasoning.empty() ||
                    write(chunk_reasoning(st->info, parts.reasoning, i))) &&
                   (parts.content.empty() ||
                    write(chunk_text(st->info, parts.content, c.take_logprobs(lp), i))) &&
                   (!last || c.reader->calls().empty() ||
                    write(chunk_tool_calls(st->info, with_ids(c.reader->calls()), i)));
          };
          for (;;) {
            bool all = true;
            for (int i = 0; i < n; ++i) {
              ChoiceState& c = st->choices[i];
              if (c.finished) continue;
              const RequestHandle::Update u = c.handle->wait(poll);
              c.pending.items.insert(c.pending.items.end(), u.logprobs.begin(), u.logprobs.end());
              if (!write_text(i, u.text, u.finished)) return false;
              if (u.finished) {
                c.finished = true;
                c.last = u;
                if (u.reason == FinishReason::kError) {
                  st->cancel();
                  return finish_stream(
                      *st, sink, sse_error(ApiError(500, "generation failed: " + u.error).json()));
                }
                if (u.reason == FinishReason::kCancelled) {
                  return finish_stream(
                      *st, sink, sse_error(ApiError(503, "The server is shutting down").json()));
                }
                const bool called = !c.reader->calls().empty();
                if (!write(chunk_finish(st->info, called ? "tool_calls" : finish_name(u.reason),
                                        c.pending.items.empty() ? nullptr : c.take_logprobs(lp),
                                        i)))
                  return false;
              }
              all = all && c.finished;
            }
            if (all) {
              Usage usage{n_prompt, 0, 0};
              for (const ChoiceState& c : st->choices) {
                usage.completion_tokens += c.last.completion_tokens;
                usage.cached_tokens = std::max(usage.cached_tokens, c.last.cached_prompt_tokens);
              }
              return finish_stream(*st, sink,
                                   st->include_usage ? chunk_usage(st->info, usage) : "");
            }
            if (s_.stopping_) {
              // Shutdown: the client learns why its stream ends, and the stream is whole.
              st->cancel();
              return finish_stream(*st, sink,
                                   sse_error(ApiError(503, "The server is shutting down").json()));
            }
            if (peer_closed(st->fd)) return false;
          }
        },
        // Runs when the response ends, also when writing failed: a stream that did not
        // finish is cancelled so its blocks return to the pool.
        [this, st](bool) {
          if (!st->done) st->cancel();
          s_.in_flight_.fetch_sub(1);
        });
  };
  h.Post("/v1/completions", [generate](const httplib::Request& req, httplib::Response& res) {
    generate(Endpoint::kCompletions, req, res);
  });
  h.Post("/v1/chat/completions", [generate](const httplib::Request& req, httplib::Response& res) {
    generate(Endpoint::kChat, req, res);
  });
}

void HttpServer::Impl::add_embedding_routes(const ApiContext& ctx) {
  http.Post("/v1/embeddings", [this, ctx](const httplib::Request& req, httplib::Response& res) {
    try {
      const std::vector<std::vector<int>> inputs = parse_embeddings_request(req.body, ctx);
      std::lock_guard<std::mutex> lock(s_.embed_mu_);
      if (!s_.embedder_) {
        const runtime::SchedulerOptions& so = s_.sched_.options();
        runtime::SessionOptions eo;
        eo.ctx = so.ctx;
        eo.threads = so.threads;
        eo.cache = so.cache;
        s_.embedder_ = std::make_unique<runtime::Session>(s_.sched_.model(), eo);
      }
      const auto pooling = s_.opt_.pooling == "last" ? runtime::Session::Pooling::kLast
                                                     : runtime::Session::Pooling::kMean;
      std::vector<std::vector<float>> out;
      int tokens = 0;
      for (const auto& ids : inputs) {
        out.push_back(s_.embedder_->embed(ids, pooling));
        tokens += static_cast<int>(ids.size());
      }
      res.set_content(embeddings_body(out, ctx.model_id, tokens), "application/json");
    } catch (const ApiError& e) {
      send_error(res, e);
    } catch (const Error& e) {
      send_error(res, ApiError(500, std::string("embedding failed: ") + e.what()));
    }
  });
}

void HttpServer::Impl::add_slot_routes() {
  const int ctx = s_.sched_.options().ctx;
  http.Get("/slots", [this, ctx](const httplib::Request&, httplib::Response& res) {
    res.set_content(slots_body(s_.sched_.slots(), ctx), "application/json");
  });
  http.Post(R"(/slots/(\d{1,9}))", [this](const httplib::Request& req, httplib::Response& res) {
    try {
      const int id = std::stoi(req.matches[1]);
      res.set_content(slot_action(s_.sched_, id, req.get_param_value("action"), req.body,
                                  s_.opt_.slot_save_path),
                      "application/json");
    } catch (const ApiError& e) {
      send_error(res, e);
    }
  });
}

void HttpServer::Impl::add_error_handlers() {
  httplib::Server& h = http;
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
      case 400:
        msg =
            "The HTTP request could not be read: a malformed request line or header, or a body "
            "without Content-Length or chunked transfer encoding";
        break;
      case 414:
        msg = "The request URL is too long";
        break;
      case 431:
        msg = "The request headers are too large";
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
    s_.counters_.add(route_of(req), res.status);
  });
}

HttpServer::~HttpServer() { stop(); }

namespace {

// Whether another process listens on host:port (IPv4 addresses; others are left to the
// library's own bind).
bool port_in_use(const std::string& host, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  const std::string h = host == "localhost" ? "127.0.0.1" : host;
  if (inet_pton(AF_INET, h.c_str(), &a.sin_addr) != 1) return false;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  const int yes = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  const bool in_use =
      ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 && errno == EADDRINUSE;
  ::close(fd);
  return in_use;
}

}  // namespace

int HttpServer::bind() {
  httplib::Server& h = impl_->http;
  if (opt_.port != 0 && port_in_use(opt_.host, opt_.port))
    fail("cannot listen on %s:%d: port %d is in use", opt_.host.c_str(), opt_.port, opt_.port);
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
  run_started_ = true;
  if (!stopping_) {
    if (port_ < 0) bind();
    impl_->http.listen_after_bind();
  }
  run_done_ = true;
}

void HttpServer::stop() {
  stopping_ = true;
  // Requests in flight end with a 503 or a final error event and [DONE] (each handler
  // notices within one poll); then the listener and the connections close.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (in_flight_.load() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (!impl_) return;
  impl_->http.stop();
  // The library's stop() does nothing before its listener runs: a stop that came while
  // run() was starting would leave it accepting forever. Stop again until run() returns
  // (run() itself returns at once when it starts after the stop).
  while (run_started_ && !run_done_) {
    if (impl_->http.is_running()) impl_->http.stop();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace kivi::server
