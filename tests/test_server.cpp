// The HTTP server end to end over loopback, on stories260K: every bad request answered
// with its status and an OpenAI error object; concurrent greedy requests give the text
// `kivi generate` gives for each alone; 32 streaming clients for a few hundred requests
// with no error and the pool empty after; clients killed mid-stream cancel their
// sequences at once; idle clients are dropped; the official OpenAI client works.
#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "model/model.h"
#include "runtime/scheduler.h"
#include "server/http_server.h"
#include "test_util.h"

namespace kivi {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

const model::Model& stories() {
  static auto m = model::Model::load(test::model_path(), test::tokenizer_path());
  return *m;
}

runtime::SchedulerOptions kivi2_options(int parallel, int queue) {
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
  explicit TestServer(const runtime::SchedulerOptions& so, server::ServerOptions o = {}) {
    o.port = 0;
    if (o.model_id.empty()) o.model_id = "stories260K";
    sched_ = std::make_unique<runtime::Scheduler>(stories(), so);
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
  // Waits (bounded) until no sequence is active and the pool is empty.
  bool drained(int ms = 5000) const {
    const auto end = Clock::now() + std::chrono::milliseconds(ms);
    while (Clock::now() < end) {
      const auto s = stats();
      if (s.active == 0 && s.queued == 0 && s.blocks_used == 0 && s.blocks_reserved == 0)
        return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }

 private:
  std::unique_ptr<runtime::Scheduler> sched_;
  std::unique_ptr<server::HttpServer> http_;
  int port_ = 0;
  std::thread thread_;
};

// The error object of a response: {"error": {"message", "type", "param", "code"}}.
json error_of(const httplib::Result& r) {
  EXPECT_TRUE(r);
  if (!r) return {};
  const json j = json::parse(r->body, nullptr, false);
  EXPECT_TRUE(j.is_object() && j.contains("error")) << r->body;
  if (!j.is_object() || !j.contains("error")) return {};
  const json& e = j["error"];
  EXPECT_TRUE(e["message"].is_string() && !e["message"].get<std::string>().empty()) << r->body;
  EXPECT_TRUE(e["type"].is_string()) << r->body;
  EXPECT_TRUE(e.contains("param") && e.contains("code")) << r->body;
  return e;
}

// A raw connection, for what a well-behaved client never sends.
int connect_to(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

std::string post_text(const std::string& path, const std::string& body) {
  return "POST " + path +
         " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body;
}

void send_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

// Reads until `needle` appears or the connection ends; returns what was read.
std::string read_until(int fd, const std::string& needle) {
  std::string got;
  char buf[4096];
  while (got.find(needle) == std::string::npos) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  return got;
}

TEST(Server, BadRequestsGetTheirStatusAndAnErrorObject) {
  KIVI_REQUIRE_MODEL();
  server::ServerOptions so;
  so.max_body_bytes = 64 * 1024;
  TestServer srv(kivi2_options(2, 4), so);
  auto c = srv.client();
  struct Case {
    const char* path;
    std::string body;
    int status;
    const char* param;  // "" for none
  };
  const std::string long_prompt(3000, 'a');
  const std::vector<Case> cases = {
      {"/v1/completions", "{\"prompt\": \"hi\"", 400, ""},  // malformed JSON
      {"/v1/completions", "[1, 2]", 400, ""},               // not an object
      {"/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": \"5\"}", 400, "max_tokens"},
      {"/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 2.5}", 400, "max_tokens"},
      {"/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 0}", 400, "max_tokens"},
      {"/v1/completions", "{\"prompt\": \"hi\", \"temperature\": \"hot\"}", 400, "temperature"},
      {"/v1/completions", "{\"prompt\": \"hi\", \"temperature\": 3}", 400, "temperature"},
      {"/v1/completions", "{\"prompt\": \"hi\", \"top_p\": 0}", 400, "top_p"},
      {"/v1/completions", "{\"prompt\": \"hi\", \"stream\": \"yes\"}", 400, "stream"},
      {"/v1/completions", "{\"prompt\": \"hi\", \"stop\": 5}", 400, "stop"},
      {"/v1/completions", "{\"prompt\": \"hi\", \"stop\": [\"a\",\"b\",\"c\",\"d\",\"e\"]}", 400,
       "stop"},
      {"/v1/completions", "{\"prompt\": \"hi\", \"seed\": \"x\"}", 400, "seed"},
      {"/v1/completions", "{\"prompt\": \"hi\", \"n\": 2}", 400, "n"},
      {"/v1/completions", "{\"prompt\": \"hi\", \"logprobs\": 3}", 400, "logprobs"},
      {"/v1/completions", "{\"prompt\": 42}", 400, "prompt"},
      {"/v1/completions", "{\"prompt\": [\"a\", \"b\"]}", 400, "prompt"},
      {"/v1/completions", "{\"prompt\": [1, 99999]}", 400, "prompt"},
      {"/v1/completions", "{\"max_tokens\": 3}", 400, "prompt"},
      {"/v1/completions", "{\"prompt\": \"" + long_prompt + "\"}", 400,
       "prompt"},  // longer than the context
      {"/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 600}", 400, "max_tokens"},
      {"/v1/completions", "{\"prompt\": \"hi\", \"model\": \"gpt-4o\"}", 404, "model"},
      {"/v1/completions", "{\"prompt\": \"hi\", \"model\": 7}", 400, "model"},
      {"/v1/completions", "{\"prompt\": \"caf\xC3\"}", 400, ""},  // invalid UTF-8
      {"/v1/completions", "{\"prompt\": \"\\ud800\"}", 400, ""},  // a lone surrogate escape
      {"/v1/chat/completions", "{\"messages\": \"hi\"}", 400, "messages"},
      {"/v1/chat/completions", "{\"messages\": []}", 400, "messages"},
      {"/v1/chat/completions", "{\"messages\": [{\"role\": \"robot\", \"content\": \"x\"}]}", 400,
       "messages[0].role"},
      {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\"}]}", 400,
       "messages[0].content"},
      {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", 400,
       "messages[0].content"},
      {"/v1/chat/completions", "{\"messages\": [{\"role\": \"assistant\", \"content\": \"x\"}]}",
       400, "messages"},
      {"/v1/chat/completions",
       "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_completion_tokens\": -1}",
       400, "max_completion_tokens"},
      {"/v1/chat/completions",
       "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{}]}", 400, "tools"},
  };
  for (const auto& k : cases) {
    const auto r = c.Post(k.path, k.body, "application/json");
    ASSERT_TRUE(r) << k.body;
    EXPECT_EQ(r->status, k.status) << k.body << " -> " << r->body;
    const json e = error_of(r);
    if (*k.param) {
      EXPECT_EQ(e["param"], k.param) << k.body;
    }
  }
  // Over the body size limit: 413.
  const auto big =
      c.Post("/v1/completions", "{\"prompt\": \"" + std::string(70 * 1024, 'a') + "\"}",
             "application/json");
  ASSERT_TRUE(big);
  EXPECT_EQ(big->status, 413);
  error_of(big);
  // Unknown routes and methods.
  const auto nf = c.Get("/v1/nothing");
  ASSERT_TRUE(nf);
  EXPECT_EQ(nf->status, 404);
  error_of(nf);
  const auto nm = c.Get("/v1/models/gpt-4o");
  ASSERT_TRUE(nm);
  EXPECT_EQ(nm->status, 404);
  // A request line that is not HTTP.
  const int fd = connect_to(srv.port());
  ASSERT_GE(fd, 0);
  send_all(fd, "HELLO\r\n\r\n");
  const std::string reply = read_until(fd, "\r\n\r\n");
  close(fd);
  EXPECT_NE(reply.find(" 400 "), std::string::npos) << reply;
  // A good request still works after all that.
  const auto ok =
      c.Post("/v1/completions", "{\"prompt\": \"Once\", \"max_tokens\": 4}", "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  EXPECT_TRUE(srv.drained());
}

TEST(Server, ApiKeyIsRequiredWhereSet) {
  KIVI_REQUIRE_MODEL();
  server::ServerOptions so;
  so.api_key = "sekrit";
  TestServer srv(kivi2_options(1, 2), so);
  auto c = srv.client();
  const std::string body = "{\"prompt\": \"Once\", \"max_tokens\": 2}";
  auto missing = c.Post("/v1/completions", body, "application/json");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 401);
  EXPECT_EQ(error_of(missing)["code"], "invalid_api_key");
  for (const char* bad : {"Bearer sekri", "Bearer sekritt", "Basic sekrit", "sekrit", "Bearer "}) {
    const auto r = c.Post("/v1/completions", httplib::Headers{{"Authorization", bad}}, body,
                          "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401) << bad;
  }
  EXPECT_EQ(c.Get("/metrics")->status, 401);
  EXPECT_EQ(c.Get("/v1/models")->status, 401);
  EXPECT_EQ(c.Get("/health")->status, 200);
  const httplib::Headers auth{{"Authorization", "Bearer sekrit"}};
  EXPECT_EQ(c.Post("/v1/completions", auth, body, "application/json")->status, 200);
  EXPECT_EQ(c.Get("/v1/models", auth)->status, 200);
  EXPECT_EQ(c.Get("/metrics", auth)->status, 200);
}

TEST(Server, FullQueueAnswers503WithRetryAfter) {
  KIVI_REQUIRE_MODEL();
  TestServer srv(kivi2_options(1, 1));
  // One long request runs, one waits; the next finds the queue full.
  const std::string body =
      "{\"prompt\": \"Once\", \"max_tokens\": 400, \"ignore_eos\": true, \"stream\": true}";
  std::vector<int> fds;
  for (int i = 0; i < 2; ++i) {
    fds.push_back(connect_to(srv.port()));
    send_all(fds.back(), post_text("/v1/completions", body));
    // Wait until the server has taken it (running, then queued).
    const auto end = Clock::now() + std::chrono::seconds(10);
    while (Clock::now() < end && static_cast<int>(srv.stats().submitted) < i + 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  auto c = srv.client();
  const auto r =
      c.Post("/v1/completions", "{\"prompt\": \"Once\", \"max_tokens\": 4}", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(r->get_header_value("Retry-After"), "1");
  error_of(r);
  for (int fd : fds) close(fd);
  EXPECT_TRUE(srv.drained());
  EXPECT_EQ(srv.stats().rejected_queue_full, 1u);
}

// 16 concurrent greedy requests with different prompts give the text each gives alone
// through `kivi generate` with the same cache options.
TEST(Server, ConcurrentRequestsMatchKiviGenerate) {
  KIVI_REQUIRE_MODEL();
  const char* prompts[] = {"Once upon a time",
                           "Tom had a big red ball.",
                           "The sun was hot and",
                           "One day, a cat and a dog",
                           "Sam",
                           "There was a tree in the garden.",
                           "Mia wanted to bake a cake",
                           "A little bird sat on a branch",
                           "Ben and Anna were friends.",
                           "The boat went up and down",
                           "Grandpa told a story about",
                           "It was raining, so",
                           "The dog barked at",
                           "Lucy found a shiny key",
                           "At the zoo, they saw",
                           "Tim was sad because"};
  std::vector<std::string> expected(16);
  for (int i = 0; i < 16; ++i) {
    const auto r = test::run(test::kivi_cmd(
        "generate --json -m '" + test::model_path() + "' -p '" + prompts[i] + "' --temp 0 -n " +
        std::to_string(20 + 5 * i) + " --kv-cache kivi2 -R 32 --ctx 512 --threads 1"));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    expected[i] = json::parse(r.out)["completion"].get<std::string>();
  }
  TestServer srv(kivi2_options(6, 16));
  std::vector<std::string> got(16);
  std::vector<std::thread> clients;
  for (int i = 0; i < 16; ++i) {
    clients.emplace_back([&, i] {
      auto c = srv.client();
      json body = {{"prompt", prompts[i]}, {"max_tokens", 20 + 5 * i}, {"temperature", 0}};
      if (i % 2 == 0) {
        const auto r = c.Post("/v1/completions", body.dump(), "application/json");
        ASSERT_TRUE(r);
        ASSERT_EQ(r->status, 200) << r->body;
        got[i] = json::parse(r->body)["choices"][0]["text"].get<std::string>();
      } else {
        // Streamed: the text is the deltas joined.
        body["stream"] = true;
        httplib::Request req;
        req.method = "POST";
        req.path = "/v1/completions";
        req.body = body.dump();
        req.set_header("Content-Type", "application/json");
        std::string sse;
        req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
          sse.append(d, n);
          return true;
        };
        httplib::Response res;
        httplib::Error err;
        ASSERT_TRUE(c.send(req, res, err));
        ASSERT_EQ(res.status, 200);
        for (size_t p = 0; (p = sse.find("data: ", p)) != std::string::npos;) {
          const size_t e = sse.find("\n\n", p);
          const std::string data = sse.substr(p + 6, e - p - 6);
          p = e;
          if (data == "[DONE]") break;
          got[i] += json::parse(data)["choices"][0]["text"].get<std::string>();
        }
      }
    });
  }
  for (auto& t : clients) t.join();
  for (int i = 0; i < 16; ++i)
    EXPECT_EQ(got[i], expected[i]) << "prompt " << i << ": " << prompts[i];
  EXPECT_TRUE(srv.drained());
}

// Parses a stream of server-sent events into their data fields.
std::vector<std::string> sse_data(const std::string& s) {
  std::vector<std::string> out;
  for (size_t p = 0; (p = s.find("data: ", p)) != std::string::npos;) {
    const size_t e = s.find("\n\n", p);
    if (e == std::string::npos) break;
    out.push_back(s.substr(p + 6, e - p - 6));
    p = e;
  }
  return out;
}

// 32 streaming clients, 320 requests in all, with mixed prompt lengths: every one
// completes with 200, its chunks parse, its usage adds up; the pool is empty after.
TEST(Server, ThirtyTwoStreamingClients) {
  KIVI_REQUIRE_MODEL();
  TestServer srv(kivi2_options(8, 64));
  std::atomic<int> ok{0}, bad{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < 32; ++t) {
    clients.emplace_back([&, t] {
      auto c = srv.client();
      for (int i = 0; i < 10; ++i) {
        std::string prompt = "Once upon a time";
        for (int k = 0; k < (t * 7 + i * 3) % 12; ++k)
          prompt += " there was a little dog named Max";
        const bool chat = (t + i) % 3 == 0;
        json body = {{"max_tokens", 8 + (t * 5 + i) % 40},
                     {"stream", true},
                     {"stream_options", {{"include_usage", true}}},
                     {"seed", t * 100 + i}};
        if (chat) {
          body["messages"] = json::array({{{"role", "user"}, {"content", prompt}}});
        } else {
          body["prompt"] = prompt;
        }
        httplib::Request req;
        req.method = "POST";
        req.path = chat ? "/v1/chat/completions" : "/v1/completions";
        req.body = body.dump();
        req.set_header("Content-Type", "application/json");
        std::string sse;
        req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
          sse.append(d, n);
          return true;
        };
        httplib::Response res;
        httplib::Error err;
        const bool sent = c.send(req, res, err);
        bool good = sent && res.status == 200;
        const auto events = sse_data(sse);
        good = good && events.size() >= 3 && events.back() == "[DONE]";
        if (good) {
          const json usage = json::parse(events[events.size() - 2])["usage"];
          good = usage["total_tokens"] ==
                     usage["prompt_tokens"].get<int>() + usage["completion_tokens"].get<int>() &&
                 usage["completion_tokens"].get<int>() <= body["max_tokens"].get<int>();
        }
        if (!good)
          ADD_FAILURE() << "request " << t << "/" << i << ": sent " << sent << " status "
                        << res.status << " error " << httplib::to_string(err) << " events "
                        << events.size() << "\n"
                        << sse.substr(0, 600);
        (good ? ok : bad)++;
      }
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(ok.load(), 320);
  EXPECT_EQ(bad.load(), 0);
  EXPECT_TRUE(srv.drained());
  const auto s = srv.stats();
  EXPECT_EQ(s.completed, 320u);
  EXPECT_EQ(s.blocks_used, 0);
  EXPECT_GT(s.peak_blocks_used, 0);
}

// Clients that vanish mid-stream (closing, or resetting the connection) cancel their
// sequences: the blocks are back long before max_tokens could have been generated.
TEST(Server, ClientsKilledMidStreamFreeTheirBlocks) {
  KIVI_REQUIRE_MODEL();
  TestServer srv(kivi2_options(4, 8));
  const std::string body =
      "{\"prompt\": \"Once upon a time\", \"max_tokens\": 480, \"ignore_eos\": true, \"stream\": "
      "true}";
  for (int round = 0; round < 3; ++round) {
    std::vector<int> fds;
    for (int i = 0; i < 6; ++i) {
      const int fd = connect_to(srv.port());
      ASSERT_GE(fd, 0);
      send_all(fd, post_text(i % 2 ? "/v1/completions" : "/v1/chat/completions",
                             i % 2 ? body
                                   : "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
                                     "\"max_tokens\": 480, "
                                     "\"ignore_eos\": true, \"stream\": true}"));
      fds.push_back(fd);
    }
    // Read the first event of the running ones, then vanish.
    for (int i = 0; i < 4; ++i) read_until(fds[i], "data: ");
    for (size_t i = 0; i < fds.size(); ++i) {
      if (i % 2) {
        linger l{1, 0};  // close with a reset
        setsockopt(fds[i], SOL_SOCKET, SO_LINGER, &l, sizeof(l));
      }
      close(fds[i]);
    }
    const auto t0 = Clock::now();
    EXPECT_TRUE(srv.drained(5000)) << "round " << round;
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    EXPECT_LT(ms, 2000) << "blocks returned after " << ms << " ms";
  }
  const auto s = srv.stats();
  EXPECT_EQ(s.cancelled, 18u);
  EXPECT_EQ(s.completed, 0u);
  EXPECT_LT(s.generated_tokens, 18u * 480u);
  // The server still serves.
  auto c = srv.client();
  EXPECT_EQ(
      c.Post("/v1/completions", "{\"prompt\": \"Once\", \"max_tokens\": 3}", "application/json")
          ->status,
      200);
}

TEST(Server, IdleAndSlowClientsTimeOut) {
  KIVI_REQUIRE_MODEL();
  server::ServerOptions so;
  so.read_timeout_s = 1;
  so.keep_alive_s = 1;
  TestServer srv(kivi2_options(1, 2), so);
  // Connected but silent: dropped after the read timeout.
  int fd = connect_to(srv.port());
  ASSERT_GE(fd, 0);
  auto t0 = Clock::now();
  char buf[256];
  EXPECT_LE(recv(fd, buf, sizeof(buf), 0), 0);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 5.0);
  close(fd);
  // Half a request, then nothing.
  fd = connect_to(srv.port());
  send_all(fd,
           "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\":");
  t0 = Clock::now();
  const std::string r = read_until(fd, "\r\n\r\n");
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 5.0);
  close(fd);
  (void)r;
  // Idle between requests on a kept-alive connection: closed after the keep-alive time.
  fd = connect_to(srv.port());
  send_all(fd, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_NE(read_until(fd, "}").find("\"status\":\"ok\""), std::string::npos);
  t0 = Clock::now();
  while (recv(fd, buf, sizeof(buf), 0) > 0) {
  }
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 5.0);
  close(fd);
  EXPECT_TRUE(srv.drained());
}

TEST(Server, MetricsReportThePool) {
  KIVI_REQUIRE_MODEL();
  TestServer srv(kivi2_options(2, 4));
  auto c = srv.client();
  EXPECT_EQ(
      c.Post("/v1/completions", "{\"prompt\": \"Once\", \"max_tokens\": 5}", "application/json")
          ->status,
      200);
  const auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 200);
  EXPECT_NE(m->get_header_value("Content-Type").find("text/plain"), std::string::npos);
  for (const char* line :
       {"kivi_requests_completed_total 1", "kivi_kv_blocks_total{format=\"kivi2\"} 8",
        "kivi_kv_blocks_used{format=\"kivi2\"} 0", "kivi_queue_depth 0",
        "kivi_http_requests_total{route=\"/v1/completions\",status=\"200\"} 1",
        "kivi_generated_tokens_total 5"}) {
    EXPECT_NE(m->body.find(line), std::string::npos) << line << "\n" << m->body;
  }
  // Every sample line is "name{labels} value" or "name value", after its HELP and TYPE.
  size_t samples = 0;
  for (size_t p = 0; p < m->body.size();) {
    const size_t e = m->body.find('\n', p);
    const std::string line = m->body.substr(p, e - p);
    p = e + 1;
    if (line.rfind("# ", 0) == 0) continue;
    ++samples;
    const size_t sp = line.rfind(' ');
    ASSERT_NE(sp, std::string::npos) << line;
    char* end = nullptr;
    std::strtod(line.c_str() + sp + 1, &end);
    EXPECT_EQ(*end, '\0') << line;
  }
  EXPECT_GT(samples, 20u);
}

// The official OpenAI JavaScript client (npm package openai) against the server.
TEST(Server, OfficialOpenAiClient) {
  KIVI_REQUIRE_MODEL();
  const std::string dir = std::string(KIVI_SOURCE_DIR) + "/tests/server_js";
  if (!test::file_exists(dir + "/node_modules/openai/package.json")) {
    GTEST_SKIP() << "the OpenAI client is not installed (scripts/setup-server-client.sh needs npm "
                    "and its registry)";
  }
  if (std::system("node --version >/dev/null 2>&1") != 0) GTEST_SKIP() << "node is not installed";
  server::ServerOptions so;
  so.api_key = "test-key";
  TestServer srv(kivi2_options(2, 8), so);
  const auto r = test::run("node '" + dir + "/client_test.mjs' http://127.0.0.1:" +
                           std::to_string(srv.port()) + "/v1 test-key stories260K");
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  const json j = json::parse(r.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r.out << r.err;
  EXPECT_EQ(j["unknown_model"], 404);
  EXPECT_EQ(j["wrong_key"], 401);
  EXPECT_EQ(j["too_long"], 400);
  EXPECT_TRUE(srv.drained());
}

}  // namespace
}  // namespace kivi
