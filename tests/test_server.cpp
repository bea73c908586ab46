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

#include "core/error.h"
#include "model/model.h"
#include "runtime/chat.h"
#include "runtime/scheduler.h"
#include "server/http_server.h"
#include "server/messages.h"
#include "server/openai_response.h"
#include "server_test_util.h"
#include "test_util.h"

namespace kivi {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

using test::error_of;
using test::kivi2_options;
using test::post_streamed;
using test::sse_data;
using test::stories;
using test::Streamed;
using test::TestServer;

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
      {"/v1/completions", "{\"prompt\": \"hi\", \"n\": 17}", 400, "n"},
      {"/v1/completions", "{\"prompt\": \"hi\", \"n\": 0}", 400, "n"},
      {"/v1/completions", "{\"prompt\": \"hi\", \"logprobs\": 9}", 400, "logprobs"},
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
       "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{}]}", 400,
       "tools[0].type"},
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
  // The scheme's case does not matter (RFC 7235); the key's does.
  const httplib::Headers lower{{"Authorization", "bearer sekrit"}};
  EXPECT_EQ(c.Post("/v1/completions", lower, body, "application/json")->status, 200);
  const httplib::Headers upper_key{{"Authorization", "bearer SEKRIT"}};
  EXPECT_EQ(c.Post("/v1/completions", upper_key, body, "application/json")->status, 401);
  EXPECT_EQ(c.Get("/v1/models", auth)->status, 200);
  EXPECT_EQ(c.Get("/metrics", auth)->status, 200);
}

TEST(Server, UnimplementedFieldsAreRefusedByName) {
  KIVI_REQUIRE_MODEL();
  TestServer srv(kivi2_options(1, 2));
  auto c = srv.client();
  for (const char* f :
       {"\"grammar\": 5", "\"json_schema\": {\"pattern\": \"a+\"}", "\"typical_p\": 0.5",
        "\"tfs_z\": 0.9", "\"n_predict\": 8", "\"mirostat\": 2", "\"tool_choice\": \"auto\""}) {
    const std::string body = std::string("{\"prompt\": \"Once\", \"max_tokens\": 2, ") + f + "}";
    const auto r = c.Post("/v1/completions", body, "application/json");
    ASSERT_TRUE(r) << f;
    EXPECT_EQ(r->status, 400) << f;
    const std::string name = std::string(f).substr(1, std::string(f).find('"', 1) - 1);
    EXPECT_EQ(error_of(r)["param"], name) << r->body;
  }
  // Their neutral values change nothing and are accepted.
  const auto ok = c.Post("/v1/completions",
                         "{\"prompt\": \"Once\", \"max_tokens\": 2, \"typical_p\": 1, "
                         "\"tfs_z\": 1, \"tool_choice\": \"none\"}",
                         "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
}

// A grammar decides the reply: greedy or sampled, the text is the grammar's sentence and
// the reply ends when the grammar does, with finish_reason "stop"; a grammar that does
// not compile is a 400 with its line and column.
TEST(Server, GrammarConstrainsTheReply) {
  KIVI_REQUIRE_MODEL();
  TestServer srv(kivi2_options(1, 2));
  auto c = srv.client();
  for (const char* temp : {"0", "1"}) {
    const std::string body = std::string(
                                 "{\"prompt\": \"Once upon a time\", \"max_tokens\": 40, "
                                 "\"temperature\": ") +
                             temp +
                             ", \"grammar\": \"root ::= (\\\"yes\\\" | \\\"no\\\") \\\".\\\"\"}";
    const auto r = c.Post("/v1/completions", body, "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const json j = json::parse(r->body);
    const std::string text = j["choices"][0]["text"];
    EXPECT_TRUE(text == "yes." || text == "no.") << text;
    EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  }
  const auto bad =
      c.Post("/v1/completions",
             "{\"prompt\": \"Once\", \"grammar\": \"root ::= \\\"a\\\"\\nx ::= (\\\"b\\\"\"}",
             "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_EQ(error_of(bad)["param"], "grammar");
  EXPECT_NE(error_of(bad)["message"].get<std::string>().find("line 2, column 7"), std::string::npos)
      << bad->body;
  const auto both = c.Post("/v1/completions",
                           "{\"prompt\": \"Once\", \"grammar\": \"root ::= \\\"a\\\"\", "
                           "\"response_format\": {\"type\": \"json_object\"}}",
                           "application/json");
  ASSERT_TRUE(both);
  EXPECT_EQ(both->status, 400) << both->body;
}

// The sampler's fields reach the sampler: a logit bias of +100 makes a token the greedy
// choice, penalties and min_p are accepted in range; out of range or a key that is not a
// token id is a 400 naming the field.
TEST(Server, SamplingFieldsReachTheSampler) {
  KIVI_REQUIRE_MODEL();
  TestServer srv(kivi2_options(1, 2));
  auto c = srv.client();
  const auto& tk = stories().tokenizer();
  const int forced = tk.vocab_size() - 7;
  const std::string body =
      "{\"prompt\": \"Once\", \"max_tokens\": 3, \"temperature\": 0, "
      "\"logit_bias\": {\"" +
      std::to_string(forced) + "\": 100}}";
  const auto r = c.Post("/v1/completions", body, "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const std::string piece = tk.token_text(forced);
  const std::string text = json::parse(r->body)["choices"][0]["text"];
  EXPECT_NE(text.find(piece.substr(piece.find_first_not_of(' '))), std::string::npos)
      << text << " (forced token " << forced << " '" << piece << "')";
  const auto plain =
      c.Post("/v1/completions",
             "{\"prompt\": \"Once\", \"max_tokens\": 8, \"temperature\": 0.7, \"seed\": 3, "
             "\"min_p\": 0.05, \"presence_penalty\": 0.5, \"frequency_penalty\": 0.5, "
             "\"repeat_penalty\": 1.1, \"repeat_last_n\": 16}",
             "application/json");
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->status, 200) << plain->body;
  for (const char* f : {"\"logit_bias\": {\"abc\": 1}", "\"logit_bias\": {\"99999999\": 1}",
                        "\"logit_bias\": {\"5\": 101}", "\"logit_bias\": [1]",
                        "\"frequency_penalty\": 2.5", "\"presence_penalty\": -3", "\"min_p\": 1.5",
                        "\"repeat_penalty\": 0", "\"repeat_last_n\": -2"}) {
    const std::string b = std::string("{\"prompt\": \"Once\", \"max_tokens\": 2, ") + f + "}";
    const auto e = c.Post("/v1/completions", b, "application/json");
    ASSERT_TRUE(e) << f;
    EXPECT_EQ(e->status, 400) << f;
    const std::string name = std::string(f).substr(1, std::string(f).find('"', 1) - 1);
    EXPECT_EQ(error_of(e)["param"], name) << e->body;
  }
}

TEST(Server, ContentLengthIsJudgedBeforeTheBody) {
  KIVI_REQUIRE_MODEL();
  TestServer srv(kivi2_options(1, 2));
  // Headers only: the answer must come at once, not after the read timeout (10 s).
  const std::pair<const char*, const char*> cases[] = {
      {"Content-Length: 5\r\nContent-Length: 6\r\n", "HTTP/1.1 400"},
      {"Content-Length: -5\r\n", "HTTP/1.1 400"},
      {"Content-Length: 99999999999\r\n", "HTTP/1.1 413"},
      {"Content-Length: 5x\r\n", "HTTP/1.1 400"},
  };
  for (const auto& [headers, status] : cases) {
    const int fd = connect_to(srv.port());
    ASSERT_GE(fd, 0);
    const auto t0 = Clock::now();
    send_all(fd, std::string("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                             "Content-Type: application/json\r\n") +
                     headers + "\r\n");
    const std::string got = read_until(fd, "}}");
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    close(fd);
    EXPECT_EQ(got.rfind(status, 0), 0u) << headers << ": " << got;
    EXPECT_NE(got.find("\"error\""), std::string::npos) << got;
    EXPECT_EQ(got.find("HTTP error"), std::string::npos) << got;  // a message that says why
    EXPECT_LT(secs, 5.0) << headers;
  }
}

TEST(Server, CorsIsOffByDefaultAndOnForItsOrigin) {
  KIVI_REQUIRE_MODEL();
  {
    TestServer srv(kivi2_options(1, 2));
    auto c = srv.client();
    const auto pre = c.Options("/v1/completions");
    ASSERT_TRUE(pre);
    EXPECT_EQ(pre->status, 405);
    EXPECT_FALSE(pre->has_header("Access-Control-Allow-Origin"));
    const auto get = c.Get("/v1/models");
    ASSERT_TRUE(get);
    EXPECT_FALSE(get->has_header("Access-Control-Allow-Origin"));
  }
  server::ServerOptions o;
  o.cors_origin = "http://localhost:3000";
  o.api_key = "sekrit";
  TestServer srv(kivi2_options(1, 2), o);
  auto c = srv.client();
  // The preflight needs no key; the request itself does, and both name the origin.
  const auto pre = c.Options("/v1/chat/completions");
  ASSERT_TRUE(pre);
  EXPECT_EQ(pre->status, 204);
  EXPECT_EQ(pre->get_header_value("Access-Control-Allow-Origin"), "http://localhost:3000");
  EXPECT_NE(pre->get_header_value("Access-Control-Allow-Headers").find("Authorization"),
            std::string::npos);
  const auto post = c.Post("/v1/completions", httplib::Headers{{"Authorization", "Bearer sekrit"}},
                           "{\"prompt\": \"Once\", \"max_tokens\": 2}", "application/json");
  ASSERT_TRUE(post);
  EXPECT_EQ(post->status, 200);
  EXPECT_EQ(post->get_header_value("Access-Control-Allow-Origin"), "http://localhost:3000");
  const auto denied = c.Post("/v1/completions", "{\"prompt\": \"Once\"}", "application/json");
  ASSERT_TRUE(denied);
  EXPECT_EQ(denied->status, 401);
  EXPECT_EQ(denied->get_header_value("Access-Control-Allow-Origin"), "http://localhost:3000");
}

TEST(Server, ASecondServerOnATakenPortIsRefused) {
  KIVI_REQUIRE_MODEL();
  TestServer first(kivi2_options(1, 2));
  runtime::Scheduler sched(stories(), kivi2_options(1, 2));
  server::ServerOptions o;
  o.port = first.port();
  server::HttpServer second(sched, o);
  try {
    second.bind();
    ADD_FAILURE() << "a second server bound port " << o.port;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("port " + std::to_string(o.port) + " is in use"),
              std::string::npos)
        << e.what();
  }
  sched.stop();
}

TEST(Server, ShutdownEndsStreamsAndWaitingRequestsWithAnError) {
  KIVI_REQUIRE_MODEL();
  TestServer srv(kivi2_options(1, 2));
  const std::string stream =
      "{\"prompt\": \"Once\", \"max_tokens\": 400, \"ignore_eos\": true, \"stream\": true}";
  const int a = connect_to(srv.port());
  send_all(a, post_text("/v1/completions", stream));
  ASSERT_TRUE(srv.wait_for([](const runtime::SchedulerStats& s) { return s.active == 1; }));
  srv.pause();
  const int b = connect_to(srv.port());
  send_all(b, post_text("/v1/completions", "{\"prompt\": \"Once\", \"max_tokens\": 4}"));
  ASSERT_TRUE(srv.wait_for([](const runtime::SchedulerStats& s) { return s.queued == 1; }));
  std::thread stopper([&] { srv.stop_http(); });
  const std::string sa = read_until(a, "[DONE]");
  const std::string sb = read_until(b, "shutting down");
  stopper.join();
  srv.resume();
  close(a);
  close(b);
  // The stream ends with an error event, then [DONE]; the waiting request gets a 503 body.
  EXPECT_NE(sa.find("The server is shutting down"), std::string::npos) << sa;
  EXPECT_NE(sa.find("data: [DONE]"), std::string::npos) << sa;
  EXPECT_NE(sb.find("HTTP/1.1 503"), std::string::npos) << sb;
  EXPECT_NE(sb.find("The server is shutting down"), std::string::npos) << sb;
  EXPECT_TRUE(srv.drained());
}

TEST(Server, FullQueueAnswers503WithRetryAfter) {
  KIVI_REQUIRE_MODEL();
  TestServer srv(kivi2_options(1, 1));
  // One long request runs, one waits; the next finds the queue full. The scheduler is
  // held once the first runs, so neither can finish or move before the third arrives.
  const std::string body =
      "{\"prompt\": \"Once\", \"max_tokens\": 400, \"ignore_eos\": true, \"stream\": true}";
  std::vector<int> fds;
  fds.push_back(connect_to(srv.port()));
  send_all(fds.back(), post_text("/v1/completions", body));
  ASSERT_TRUE(srv.wait_for([](const runtime::SchedulerStats& s) { return s.active == 1; }));
  srv.pause();
  fds.push_back(connect_to(srv.port()));
  send_all(fds.back(), post_text("/v1/completions", body));
  ASSERT_TRUE(srv.wait_for([](const runtime::SchedulerStats& s) { return s.queued == 1; }));
  auto c = srv.client();
  const auto r =
      c.Post("/v1/completions", "{\"prompt\": \"Once\", \"max_tokens\": 4}", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(r->get_header_value("Retry-After"), "1");
  error_of(r);
  for (int fd : fds) close(fd);
  srv.resume();
  EXPECT_TRUE(srv.drained());
  const auto s = srv.stats();
  EXPECT_EQ(s.rejected_queue_full, 1u);
  EXPECT_EQ(s.cancelled, 2u);
  EXPECT_EQ(s.completed, 0u);
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
        const Streamed r = post_streamed(c, "/v1/completions", body);
        ASSERT_TRUE(r.sent) << httplib::to_string(r.err);
        ASSERT_EQ(r.status, 200);
        for (const auto& data : sse_data(r.sse)) {
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
        const Streamed r =
            post_streamed(c, chat ? "/v1/chat/completions" : "/v1/completions", body);
        bool good = r.sent && r.status == 200;
        const auto events = sse_data(r.sse);
        good = good && events.size() >= 3 && events.back() == "[DONE]";
        if (good) {
          // The prompt's tokens counted apart: the model's tokenizer over the text the
          // server writes (plain chat format for chat requests).
          const json usage = json::parse(events[events.size() - 2])["usage"];
          const json last = json::parse(events[events.size() - 3]);
          const auto& tk = stories().tokenizer();
          const int want_prompt = static_cast<int>(
              tk.encode(chat ? "User: " + prompt + "\nAssistant:" : prompt, tk.add_bos()).size());
          const int completion = usage["completion_tokens"].get<int>();
          good = usage["prompt_tokens"].get<int>() == want_prompt &&
                 usage["total_tokens"].get<int>() == want_prompt + completion &&
                 completion <= body["max_tokens"].get<int>() &&
                 (last["choices"][0]["finish_reason"] != "length" ||
                  completion == body["max_tokens"].get<int>());
        }
        if (!good)
          ADD_FAILURE() << "request " << t << "/" << i << ": sent " << r.sent << " status "
                        << r.status << " error " << httplib::to_string(r.err) << " events "
                        << events.size() << "\n"
                        << r.sse.substr(0, 600);
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
// sequences: every request that had not finished when its client went away ends as
// cancelled, none completes, and the blocks come back. The scheduler is held while the
// clients vanish and until the server has noticed them all, so a busy machine cannot
// let a request run on to max_tokens meanwhile.
TEST(Server, ClientsKilledMidStreamFreeTheirBlocks) {
  KIVI_REQUIRE_MODEL();
  TestServer srv(kivi2_options(4, 8));
  const std::string completion =
      "{\"prompt\": \"Once upon a time\", \"max_tokens\": 480, \"ignore_eos\": true, "
      "\"stream\": true}";
  const std::string chat =
      "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 480, "
      "\"ignore_eos\": true, \"stream\": true}";
  uint64_t unfinished = 0;  // requests running or queued when their clients vanished
  for (int round = 0; round < 3; ++round) {
    const auto before = srv.stats();
    std::vector<int> fds;
    for (int i = 0; i < 6; ++i) {
      const int fd = connect_to(srv.port());
      ASSERT_GE(fd, 0);
      send_all(fd, post_text(i % 2 ? "/v1/completions" : "/v1/chat/completions",
                             i % 2 ? completion : chat));
      fds.push_back(fd);
    }
    // Four decode (each has a token out), two wait; then hold everything.
    ASSERT_TRUE(srv.wait_for([&](const runtime::SchedulerStats& s) {
      return s.submitted == before.submitted + 6 &&
             s.completed + s.cancelled + static_cast<uint64_t>(s.active + s.queued) ==
                 before.completed + before.cancelled + 6 &&
             (s.active == 4 || s.queued == 0) && s.prefilling == 0 &&
             s.generated_tokens >= before.generated_tokens + 4;
    })) << "round "
        << round;
    srv.pause();
    const auto held = srv.stats();
    unfinished += static_cast<uint64_t>(held.active + held.queued);
    for (size_t i = 0; i < fds.size(); ++i) {
      if (i % 2) {
        linger l{1, 0};  // close with a reset
        setsockopt(fds[i], SOL_SOCKET, SO_LINGER, &l, sizeof(l));
      }
      close(fds[i]);
    }
    // The server notices every vanished client while nothing runs.
    EXPECT_TRUE(srv.wait_for([&](const runtime::SchedulerStats& s) {
      return s.cancelling == held.active + held.queued;
    })) << "round "
        << round;
    srv.resume();
    EXPECT_TRUE(srv.drained()) << "round " << round;
    const auto after = srv.stats();
    EXPECT_EQ(after.completed, held.completed) << "round " << round;
    EXPECT_EQ(after.cancelled - held.cancelled, static_cast<uint64_t>(held.active + held.queued))
        << "round " << round;
  }
  const auto s = srv.stats();
  EXPECT_EQ(s.cancelled, unfinished);
  EXPECT_EQ(s.completed + s.cancelled, 18u);
  EXPECT_GT(s.cancelled, 0u);
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
  // The client has its answer before the scheduler frees the sequence and before the
  // server counts the request (after the response is written): wait for both.
  EXPECT_TRUE(srv.drained());
  const std::vector<std::string> lines = {
      "kivi_requests_completed_total 1",
      "kivi_kv_blocks_total{format=\"kivi2\"} 8",
      "kivi_kv_blocks_used{format=\"kivi2\"} 0",
      "kivi_queue_depth 0",
      "kivi_http_requests_total{route=\"/v1/completions\",status=\"200\"} 1",
      "kivi_generated_tokens_total 5"};
  auto has_all = [&](const std::string& body) {
    for (const auto& l : lines)
      if (body.find(l) == std::string::npos) return false;
    return true;
  };
  httplib::Result m = c.Get("/metrics");
  for (const auto end = Clock::now() + std::chrono::seconds(20);
       m && !has_all(m->body) && Clock::now() < end;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    m = c.Get("/metrics");
  }
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 200);
  EXPECT_NE(m->get_header_value("Content-Type").find("text/plain"), std::string::npos);
  for (const auto& line : lines) {
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
  EXPECT_GT(j["logprobs"], 0);
  EXPECT_TRUE(srv.drained());
}

// Structured output through the OpenAI client, every reply validated by ajv (an
// independent JSON-schema validator): 100 seeded runs per schema (10 under sanitizers).
TEST(Server, StructuredOutputValidatesWithAjv) {
  KIVI_REQUIRE_MODEL();
  const std::string dir = std::string(KIVI_SOURCE_DIR) + "/tests/server_js";
  if (!test::file_exists(dir + "/node_modules/openai/package.json") ||
      !test::file_exists(dir + "/node_modules/ajv/package.json")) {
    GTEST_SKIP() << "the OpenAI client or ajv is not installed (scripts/setup-server-client.sh "
                    "needs npm and its registry)";
  }
  if (std::system("node --version >/dev/null 2>&1") != 0) GTEST_SKIP() << "node is not installed";
#ifdef KIVI_SANITIZE
  const int runs = 10;
#else
  const int runs = 100;
#endif
  server::ServerOptions so;
  so.api_key = "test-key";
  TestServer srv(kivi2_options(2, 8), so);
  const auto r = test::run("node '" + dir +
                           "/structured_test.mjs' http://127.0.0.1:" + std::to_string(srv.port()) +
                           "/v1 test-key stories260K " + std::to_string(runs));
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  const json j = json::parse(r.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r.out << r.err;
  EXPECT_EQ(j["person"]["stop"], runs);
  EXPECT_EQ(j["measures"]["stop"], runs);
  EXPECT_TRUE(srv.drained());
}

// Tool calls through the OpenAI client on stories260K (a plain transcript: hermes calls):
// "required" replies are calls whose arguments ajv validates against each function's
// schema, for 40 seeds (8 under sanitizers); a named function, a stream, the round trip
// with the tool's result, "auto" and the 400s of bad tools (tests/server_js/tools_test.mjs).
TEST(Server, ToolCallsValidateAndRoundTrip) {
  KIVI_REQUIRE_MODEL();
  const std::string dir = std::string(KIVI_SOURCE_DIR) + "/tests/server_js";
  if (!test::file_exists(dir + "/node_modules/openai/package.json") ||
      !test::file_exists(dir + "/node_modules/ajv/package.json")) {
    GTEST_SKIP() << "the OpenAI client or ajv is not installed (scripts/setup-server-client.sh "
                    "needs npm and its registry)";
  }
  if (std::system("node --version >/dev/null 2>&1") != 0) GTEST_SKIP() << "node is not installed";
#ifdef KIVI_SANITIZE
  const int runs = 8;
#else
  const int runs = 40;
#endif
  server::ServerOptions so;
  so.api_key = "test-key";
  // The tools' description alone is some 400 of stories260K's small tokens: a longer
  // context than it was trained on (the text is meaningless either way).
  runtime::SchedulerOptions o = kivi2_options(2, 8);
  o.ctx = 1280;
  TestServer srv(o, so);
  const auto r =
      test::run("node '" + dir + "/tools_test.mjs' http://127.0.0.1:" + std::to_string(srv.port()) +
                "/v1 test-key stories260K " + std::to_string(runs));
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  const json j = json::parse(r.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r.out << r.err;
  EXPECT_GE(j["required"]["tool_calls"].get<int>(), runs * 8 / 10);
  EXPECT_EQ(j["named"]["name"], "add");
  EXPECT_GE(j["round_trip"]["calls"].get<int>(), 1);
  EXPECT_TRUE(srv.drained());
}

// `kivi bench-serve` against a server it starts: its counts agree with each other, with
// the responses' usage and with the server's own token count.
TEST(Server, BenchServeReportsConsistentNumbers) {
  KIVI_REQUIRE_MODEL();
  const auto r = test::run(test::kivi_cmd(
      "bench-serve --json -m '" + test::model_path() +
      "' --ctx 512 --parallel 3 --queue 16 --kv-cache kivi2 -R 32 --threads 1 --clients 5 "
      "--requests 20 --seconds 120 --max-tokens 24 --prompt-words 2,60 --seed 7"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r.out << r.err;
  EXPECT_EQ(j["sent"], 20);
  EXPECT_EQ(j["completed"], 20);
  EXPECT_EQ(j["rejected"].get<int>() + j["errors"].get<int>() + j["cut"].get<int>(), 0);
  const json& res = j["results"];
  ASSERT_EQ(res.size(), 20u);
  uint64_t prompt = 0, completion = 0;
  for (const auto& q : res) {
    EXPECT_EQ(q["outcome"], "completed");
    EXPECT_EQ(q["completion_tokens"], 24);  // ignore_eos: every request runs to max_tokens
    EXPECT_GE(q["chunks"].get<int>(), 1);
    EXPECT_LE(q["chunks"].get<int>(), 24);
    EXPECT_GT(q["prompt_tokens"].get<int>(), q["prompt_words"].get<int>() / 2);
    EXPECT_GE(q["ttft_ms"].get<double>(), 0);
    EXPECT_LE(q["ttft_ms"].get<double>(), q["total_ms"].get<double>());
    prompt += q["prompt_tokens"].get<uint64_t>();
    completion += q["completion_tokens"].get<uint64_t>();
  }
  EXPECT_EQ(j["prompt_tokens"].get<uint64_t>(), prompt);
  EXPECT_EQ(j["completion_tokens"].get<uint64_t>(), completion);
  EXPECT_NEAR(j["tokens_per_second"].get<double>(),
              static_cast<double>(completion) / j["wall_s"].get<double>(),
              1e-6 * j["tokens_per_second"].get<double>());
  for (const char* p : {"ttft_ms", "itl_ms", "tpot_ms"}) {
    const json& x = j[p];
    EXPECT_LE(x["p50"].get<double>(), x["p99"].get<double>()) << p;
    EXPECT_LE(x["p99"].get<double>(), x["max"].get<double>()) << p;
    EXPECT_GT(x["count"].get<int>(), 0) << p;
  }
  EXPECT_EQ(j["ttft_ms"]["count"], 20);
  // The server saw what the clients saw.
  const json& s = j["server"];
  ASSERT_TRUE(s.is_object()) << r.out;
  EXPECT_EQ(s["admitted"].get<double>(), 20.0);
  EXPECT_EQ(s["generated_tokens"].get<double>(), static_cast<double>(completion));
  EXPECT_LE(s["active_peak"].get<double>(), 3.0);
  EXPECT_GT(s["kv_bytes_peak"].get<double>(), 0.0);
  EXPECT_LE(s["kv_bytes_peak_seen"].get<double>(), s["kv_bytes_peak"].get<double>());
  // At most the pool plus the residual windows and block tables of the slots in use.
  EXPECT_GT(j["kv_slot_bytes"].get<double>(), 0.0);
  EXPECT_LE(s["kv_bytes_peak"].get<double>(),
            j["kv_pool_blocks"].get<double>() * j["kv_block_bytes"].get<double>() +
                s["active_peak"].get<double>() * j["kv_slot_bytes"].get<double>());
  // Bad options are errors, not runs.
  for (const char* bad : {"--clients 0", "--prompt-words 9,3", "--url ftp://x:1",
                          "--url http://127.0.0.1:1 -m x.gguf"}) {
    const auto e = test::run(test::kivi_cmd(std::string("bench-serve --json ") + bad));
    EXPECT_NE(e.exit_code, 0) << bad;
    EXPECT_NE(e.err.find("error"), std::string::npos) << bad << ": " << e.err;
  }
}

}  // namespace
}  // namespace kivi
