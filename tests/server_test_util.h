// The HTTP server in tests: a scheduler and server on a free loopback port, and the
// error object of a response, streamed requests and their events (test_server*.cpp,
// test_server_api.cpp).
#pragma once

#include <httplib.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "model/model.h"
#include "runtime/scheduler.h"
#include "server/http_server.h"
#include "test_util.h"

namespace kivi::test {

inline runtime::SchedulerOptions kivi2_options(int parallel, int queue) {
  runtime::SchedulerOptions o;
  o.parallel = parallel;
  o.queue = queue;
  o.ctx = 512;
  o.threads = 1;
  o.prefill_chunk = 32;
  o.cache.k = o.cache.v = {kv::Format::kKivi2};
  o.cache.residual = 32;
  return o;
}

// A scheduler and an HTTP server on a free loopback port, served by a thread.
class TestServer {
 public:
  // Serves stories260K unless `model` is given.
  explicit TestServer(const runtime::SchedulerOptions& so, server::ServerOptions o = {},
                      const model::Model* model = nullptr) {
    o.port = 0;
    if (o.model_id.empty()) o.model_id = "stories260K";
    sched_ = std::make_unique<runtime::Scheduler>(model ? *model : stories(), so);
    http_ = std::make_unique<server::HttpServer>(*sched_, o);
    port_ = http_->bind();
    thread_ = std::thread([this] { http_->run(); });
  }
  ~TestServer() {
    http_->stop();
    thread_.join();
    sched_->stop();
  }
  int port() const { return port_; }
  runtime::SchedulerStats stats() const { return sched_->stats(); }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(120, 0);
    return c;
  }
  void pause() { sched_->pause(); }
  void stop_http() { http_->stop(); }
  void resume() { sched_->resume(); }
  // Waits (bounded) until `done(stats)` holds; false on the deadline (generous: the
  // suite also runs under sanitizers on 2 busy cores).
  template <class F>
  bool wait_for(F done, int ms = 60000) const {
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (std::chrono::steady_clock::now() < end) {
      if (done(stats())) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return done(stats());
  }
  // Waits (bounded) until no sequence is active and the pool is empty.
  bool drained(int ms = 60000) const {
    return wait_for(
        [](const runtime::SchedulerStats& s) {
          return s.active == 0 && s.queued == 0 && s.blocks_used == 0 && s.blocks_reserved == 0;
        },
        ms);
  }

 private:
  std::unique_ptr<runtime::Scheduler> sched_;
  std::unique_ptr<server::HttpServer> http_;
  int port_ = 0;
  std::thread thread_;
};

// The error object of a response: {"error": {"message", "type", "param", "code"}}.
inline nlohmann::json error_of(const httplib::Result& r) {
  EXPECT_TRUE(r);
  if (!r) return {};
  const nlohmann::json j = nlohmann::json::parse(r->body, nullptr, false);
  EXPECT_TRUE(j.is_object() && j.contains("error")) << r->body;
  if (!j.is_object() || !j.contains("error")) return {};
  const nlohmann::json& e = j["error"];
  EXPECT_TRUE(e["message"].is_string() && !e["message"].get<std::string>().empty()) << r->body;
  EXPECT_TRUE(e["type"].is_string()) << r->body;
  EXPECT_TRUE(e.contains("param") && e.contains("code")) << r->body;
  return e;
}

// Parses a stream of server-sent events into their data fields.
inline std::vector<std::string> sse_data(const std::string& s) {
  std::vector<std::string> out;
  for (size_t p = 0; (p = s.find("data: ", p)) != std::string::npos;) {
    const size_t e = s.find("\n\n", p);
    if (e == std::string::npos) break;
    out.push_back(s.substr(p + 6, e - p - 6));
    p = e;
  }
  return out;
}

// A streamed POST: whether it was sent, its status and error, the events' bytes.
struct Streamed {
  bool sent = false;
  int status = 0;
  httplib::Error err = httplib::Error::Success;
  std::string sse;
};

inline Streamed post_streamed(httplib::Client& c, const std::string& path,
                              const nlohmann::json& body) {
  Streamed r;
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&r](const char* d, size_t n, uint64_t, uint64_t) {
    r.sse.append(d, n);
    return true;
  };
  httplib::Response res;
  r.sent = c.send(req, res, r.err);
  r.status = res.status;
  return r;
}

}  // namespace kivi::test
