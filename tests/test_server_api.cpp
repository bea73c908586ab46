// The server's endpoints beside generation: /tokenize and /detokenize against the
// tokenizer they serve (ids, pieces, special tokens, a round trip), and every malformed
// body answered with a 400 naming the field.
#include <httplib.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "attn/prefill.h"
#include "model/tensor_parallel.h"
#include "runtime/request.h"
#include "runtime/session.h"
#include "server/api_error.h"
#include "server/token_api.h"
#include "server_test_util.h"
#include "test_util.h"

namespace kivi {
namespace {

using nlohmann::json;
using test::error_of;
using test::stories;
using test::TestServer;

TEST(ServerApi, TokenizeGivesTheTokenizersIds) {
  KIVI_REQUIRE_MODEL();
  const auto& tk = stories().tokenizer();
  const std::string text = "Once upon a time, there was a little girl named Lily.";
  const json plain = json::parse(server::tokenize_body(json{{"content", text}}.dump(), tk));
  EXPECT_EQ(plain["tokens"].get<std::vector<int>>(), tk.encode(text, false));
  const json special =
      json::parse(server::tokenize_body(json{{"content", text}, {"add_special", true}}.dump(), tk));
  EXPECT_EQ(special["tokens"].get<std::vector<int>>(), tk.encode(text, true));
  ASSERT_EQ(special["tokens"][0].get<int>(), tk.bos_id());
  const json pieces =
      json::parse(server::tokenize_body(json{{"content", text}, {"with_pieces", true}}.dump(), tk));
  ASSERT_EQ(pieces["tokens"].size(), plain["tokens"].size());
  std::string joined;
  for (size_t i = 0; i < pieces["tokens"].size(); ++i) {
    const json& p = pieces["tokens"][i];
    EXPECT_EQ(p["id"], plain["tokens"][i]);
    EXPECT_EQ(p["piece"].get<std::string>(), tk.token_text(p["id"].get<int>(), true));
    joined += p["piece"].get<std::string>();
  }
  EXPECT_NE(joined.find("Lily"), std::string::npos) << joined;
  // Back to the text.
  const json back =
      json::parse(server::detokenize_body(json{{"tokens", plain["tokens"]}}.dump(), tk));
  EXPECT_EQ(back["content"].get<std::string>(),
            tk.decode_all(plain["tokens"].get<std::vector<int>>()));
  EXPECT_NE(back["content"].get<std::string>().find(text.substr(1)), std::string::npos)
      << back["content"];
  // Empty text and an empty list.
  EXPECT_EQ(json::parse(server::tokenize_body(R"({"content": ""})", tk))["tokens"].size(), 0u);
  EXPECT_EQ(json::parse(server::detokenize_body(R"({"tokens": []})", tk))["content"], "");
}

TEST(ServerApi, MalformedBodiesNameTheField) {
  KIVI_REQUIRE_MODEL();
  const auto& tk = stories().tokenizer();
  struct Case {
    bool tokenize;
    std::string body, param, says;
  };
  const Case cases[] = {
      {true, "not json", "", "not valid JSON"},
      {true, "[1, 2]", "", "JSON object"},
      {true, "{}", "content", "'content' is required"},
      {true, R"({"content": 5})", "content", "must be a string"},
      {true, R"({"content": "a", "add_special": "yes"})", "add_special", "boolean"},
      {true, R"({"content": "a", "with_pieces": 1})", "with_pieces", "boolean"},
      {true, "{\"content\": \"\xff\"}", "", "UTF-8"},
      {false, "{}", "tokens", "'tokens' is required"},
      {false, R"({"tokens": "1 2"})", "tokens", "array"},
      {false, R"({"tokens": [1, -1]})", "tokens", "tokens[1]"},
      {false, R"({"tokens": [1, 512]})", "tokens", "0 to 511"},
      {false, R"({"tokens": [1.5]})", "tokens", "tokens[0]"},
  };
  for (const Case& c : cases) {
    try {
      c.tokenize ? server::tokenize_body(c.body, tk) : server::detokenize_body(c.body, tk);
      ADD_FAILURE() << "accepted " << c.body;
    } catch (const server::ApiError& e) {
      EXPECT_EQ(e.status(), 400) << c.body;
      EXPECT_EQ(e.param(), c.param) << c.body;
      EXPECT_NE(std::string(e.what()).find(c.says), std::string::npos)
          << c.body << ": " << e.what();
    }
  }
}

TEST(ServerApi, TokenizeOverHttp) {
  KIVI_REQUIRE_MODEL();
  server::ServerOptions o;
  o.api_key = "secret";
  TestServer s(test::kivi2_options(1, 4), o);
  httplib::Client c = s.client();
  const std::string body = json{{"content", "Lily had a small cat."}}.dump();
  // The API key guards these routes as it guards /v1/.
  auto r = c.Post("/tokenize", body, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  c.set_bearer_token_auth("secret");
  r = c.Post("/tokenize", body, "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json ids = json::parse(r->body)["tokens"];
  EXPECT_EQ(ids.get<std::vector<int>>(),
            stories().tokenizer().encode("Lily had a small cat.", false));
  r = c.Post("/detokenize", json{{"tokens", ids}}.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_NE(json::parse(r->body)["content"].get<std::string>().find("Lily had a small cat."),
            std::string::npos)
      << r->body;
  r = c.Post("/detokenize", R"({"tokens": [99999]})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(error_of(r)["param"], "tokens");
}

// token_logprob against a log-softmax written here in double: the value, the top-k in
// order, ties to the lower id.
TEST(ServerApi, TokenLogprobIsTheLogSoftmax) {
  const std::vector<float> logits = {1.0f, 3.0f, -2.0f, 3.0f, 0.5f, 2.0f};
  double z = 0;
  for (float x : logits) z += std::exp(static_cast<double>(x));
  auto ref = [&](int i) { return static_cast<double>(logits[i]) - std::log(z); };
  const runtime::TokenLogprob lp = runtime::token_logprob(logits.data(), 6, 4, 3);
  EXPECT_EQ(lp.token, 4);
  EXPECT_NEAR(lp.logprob, ref(4), 1e-6);
  ASSERT_EQ(lp.top.size(), 3u);
  EXPECT_EQ(lp.top[0].first, 1);  // 3.0 twice: the lower id first
  EXPECT_EQ(lp.top[1].first, 3);
  EXPECT_EQ(lp.top[2].first, 5);
  for (const auto& [id, v] : lp.top) EXPECT_NEAR(v, ref(id), 1e-6);
  EXPECT_TRUE(runtime::token_logprob(logits.data(), 6, 0, 0).top.empty());
  EXPECT_EQ(runtime::token_logprob(logits.data(), 6, 0, 99).top.size(), 6u);
}

json post_json(httplib::Client& c, const std::string& path, const json& body) {
  auto r = c.Post(path, body.dump(), "application/json");
  EXPECT_TRUE(r);
  if (!r) return {};
  EXPECT_EQ(r->status, 200) << r->body;
  return json::parse(r->body, nullptr, false);
}

// Greedy completions with log-probabilities: each token's value is the log-softmax of the
// logits a session computes for it (written here), the chosen token is the top one, and
// the completions, chat and streamed forms agree.
TEST(ServerApi, LogprobsOfGreedyTokens) {
  KIVI_REQUIRE_MODEL();
  const auto& m = stories();
  const auto& tk = m.tokenizer();
  runtime::SchedulerOptions so = test::kivi2_options(2, 4);
  TestServer s(so);
  httplib::Client c = s.client();
  const std::vector<int> prompt = tk.encode("Once upon a time, there was a", true);
  const json body = {{"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0}, {"logprobs", 2}};
  const json r = post_json(c, "/v1/completions", body);
  const json& lp = r["choices"][0]["logprobs"];
  ASSERT_TRUE(lp.is_object()) << r.dump();
  const int n = r["usage"]["completion_tokens"].get<int>();
  ASSERT_GT(n, 0);
  ASSERT_EQ(lp["tokens"].size(), static_cast<size_t>(n));
  ASSERT_EQ(lp["token_logprobs"].size(), static_cast<size_t>(n));
  ASSERT_EQ(lp["top_logprobs"].size(), static_cast<size_t>(n));
  // The same tokens through a session with the server's cache: their log-softmax.
  runtime::SessionOptions o;
  o.threads = 1;
  o.ctx = so.ctx;
  o.cache = so.cache;
  runtime::Session ses(m, o);
  const float* logits = ses.prefill(prompt);
  const int V = m.config().vocab_size;
  std::string text;
  for (int i = 0; i < n; ++i) {
    int best = 0;
    for (int v = 1; v < V; ++v) best = logits[v] > logits[best] ? v : best;
    double mx = logits[best], z = 0;
    for (int v = 0; v < V; ++v) z += std::exp(static_cast<double>(logits[v]) - mx);
    const double want = static_cast<double>(logits[best]) - mx - std::log(z);
    EXPECT_EQ(lp["tokens"][i].get<std::string>(), tk.token_text(best, true)) << "token " << i;
    EXPECT_NEAR(lp["token_logprobs"][i].get<double>(), want, 1e-3) << "token " << i;
    ASSERT_LE(lp["top_logprobs"][i].size(), 2u);
    EXPECT_NEAR(lp["top_logprobs"][i][tk.token_text(best, true)].get<double>(), want, 1e-3);
    EXPECT_EQ(lp["text_offset"][i].get<int>(), static_cast<int>(text.size()));
    text += tk.token_text(best, true);
    logits = ses.decode(best);
  }
  EXPECT_EQ(text, r["choices"][0]["text"].get<std::string>());

  // Chat: logprobs true with three alternatives, whole and streamed.
  const json chat = {{"messages", json::array({{{"role", "user"}, {"content", "Hi"}}})},
                     {"max_tokens", 6},
                     {"temperature", 0},
                     {"logprobs", true},
                     {"top_logprobs", 3}};
  const json cr = post_json(c, "/v1/chat/completions", chat);
  const json& content = cr["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), cr["usage"]["completion_tokens"].get<size_t>()) << cr.dump();
  for (const json& e : content) {
    EXPECT_LE(e["logprob"].get<double>(), 0.0);
    ASSERT_EQ(e["top_logprobs"].size(), 3u);
    EXPECT_EQ(e["top_logprobs"][0]["token"], e["token"]);  // greedy: the top one
    EXPECT_NEAR(e["top_logprobs"][0]["logprob"].get<double>(), e["logprob"].get<double>(), 1e-6);
    EXPECT_GE(e["top_logprobs"][0]["logprob"].get<double>(),
              e["top_logprobs"][1]["logprob"].get<double>());
    std::string bytes;
    for (const json& b : e["bytes"]) bytes += static_cast<char>(b.get<int>());
    EXPECT_EQ(bytes, e["token"].get<std::string>());
  }
  json streamed = chat;
  streamed["stream"] = true;
  auto sr = c.Post("/v1/chat/completions", streamed.dump(), "application/json");
  ASSERT_TRUE(sr);
  json all = json::array();
  size_t pos = 0;
  const std::string& sb = sr->body;
  while ((pos = sb.find("data: ", pos)) != std::string::npos) {
    const size_t end = sb.find("\n\n", pos);
    const std::string data = sb.substr(pos + 6, end - pos - 6);
    pos = end;
    if (data == "[DONE]") break;
    const json ev = json::parse(data);
    for (const json& ch : ev["choices"]) {
      if (ch["logprobs"].is_object())
        for (const json& e : ch["logprobs"]["content"]) all.push_back(e);
    }
  }
  ASSERT_EQ(all.size(), content.size()) << sb;
  for (size_t i = 0; i < all.size(); ++i) {
    EXPECT_EQ(all[i]["token"], content[i]["token"]);
    EXPECT_NEAR(all[i]["logprob"].get<double>(), content[i]["logprob"].get<double>(), 1e-6);
  }
}

TEST(ServerApi, LogprobFieldsAreChecked) {
  KIVI_REQUIRE_MODEL();
  TestServer s(test::kivi2_options(1, 4));
  httplib::Client c = s.client();
  const json msgs = json::array({{{"role", "user"}, {"content", "Hi"}}});
  struct Case {
    const char* path;
    json body;
    const char* param;
  };
  const Case cases[] = {
      {"/v1/chat/completions", {{"messages", msgs}, {"logprobs", "yes"}}, "logprobs"},
      {"/v1/chat/completions",
       {{"messages", msgs}, {"logprobs", true}, {"top_logprobs", 21}},
       "top_logprobs"},
      {"/v1/chat/completions", {{"messages", msgs}, {"top_logprobs", 2}}, "top_logprobs"},
      {"/v1/completions", {{"prompt", "Hi"}, {"logprobs", 6}}, "logprobs"},
      {"/v1/completions", {{"prompt", "Hi"}, {"logprobs", true}}, "logprobs"},
      {"/v1/completions", {{"prompt", "Hi"}, {"logprobs", 1}, {"top_logprobs", 2}}, "top_logprobs"},
  };
  for (const Case& k : cases) {
    auto r = c.Post(k.path, k.body.dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << k.body.dump() << " " << r->body;
    EXPECT_EQ(error_of(r)["param"], k.param) << k.body.dump();
  }
  // Without them, "logprobs" is null.
  auto r = c.Post("/v1/completions", json{{"prompt", "Hi"}, {"max_tokens", 2}}.dump(),
                  "application/json");
  ASSERT_TRUE(r);
  EXPECT_TRUE(json::parse(r->body)["choices"][0]["logprobs"].is_null()) << r->body;
}

// Session::embed: unit length; the last token's embedding is the direction of the hidden
// state the classifier turns into that position's logits (checked against a prefill's
// logits); mean pooling differs; the same input gives the same bits, over several chunks.
TEST(ServerApi, EmbeddingsAreTheFinalHiddenStates) {
  KIVI_REQUIRE_MODEL();
  const auto& m = stories();
  const auto& tk = m.tokenizer();
  runtime::SessionOptions o;
  o.threads = 2;
  o.ctx = 512;
  runtime::Session s(m, o);
  std::string text;
  for (int i = 0; i < 8; ++i) text += "Lily had a small cat named Max. ";
  const std::vector<int> ids = tk.encode(text, true);
  ASSERT_GT(ids.size(), 64u);  // more than one prefill chunk
  const auto last = s.embed(ids, runtime::Session::Pooling::kLast);
  const auto mean = s.embed(ids, runtime::Session::Pooling::kMean);
  EXPECT_EQ(s.embed(ids, runtime::Session::Pooling::kMean), mean);
  EXPECT_EQ(s.pos(), 0);
  const int dim = m.config().dim, V = m.config().vocab_size;
  ASSERT_EQ(last.size(), static_cast<size_t>(dim));
  auto norm = [](const std::vector<float>& v) {
    double n = 0;
    for (float x : v) n += static_cast<double>(x) * x;
    return std::sqrt(n);
  };
  EXPECT_NEAR(norm(last), 1.0, 1e-5);
  EXPECT_NEAR(norm(mean), 1.0, 1e-5);
  double dot = 0;
  for (int d = 0; d < dim; ++d) dot += static_cast<double>(last[d]) * mean[d];
  EXPECT_LT(dot, 0.9999);
  // W e_last is the last position's logits over |h|: the same direction.
  std::vector<float> from_embedding(V);
  model::classify(m, last.data(), 1, from_embedding.data(), nullptr);
  const float* logits = s.prefill(ids);
  double ab = 0, aa = 0, bb = 0;
  for (int v = 0; v < V; ++v) {
    ab += static_cast<double>(from_embedding[v]) * logits[v];
    aa += static_cast<double>(from_embedding[v]) * from_embedding[v];
    bb += static_cast<double>(logits[v]) * logits[v];
  }
  EXPECT_GT(ab / std::sqrt(aa * bb), 1.0 - 1e-6);
  EXPECT_THROW(s.embed({}, runtime::Session::Pooling::kMean), Error);
  EXPECT_THROW(s.embed(std::vector<int>(600, 5), runtime::Session::Pooling::kMean), Error);
}

TEST(ServerApi, EmbeddingsOverHttp) {
  KIVI_REQUIRE_MODEL();
  const auto& m = stories();
  const auto& tk = m.tokenizer();
  runtime::SchedulerOptions so = test::kivi2_options(1, 4);
  TestServer srv(so);
  httplib::Client c = srv.client();
  const std::string a = "Once upon a time", b = "The cat sat on the mat.";
  const json r =
      post_json(c, "/v1/embeddings", {{"input", json::array({a, b})}, {"model", "stories260K"}});
  ASSERT_EQ(r["object"], "list") << r.dump();
  ASSERT_EQ(r["data"].size(), 2u);
  runtime::SessionOptions o;
  o.threads = 1;
  o.ctx = so.ctx;
  o.cache = so.cache;
  runtime::Session s(m, o);
  int tokens = 0;
  for (int i = 0; i < 2; ++i) {
    const json& d = r["data"][i];
    EXPECT_EQ(d["object"], "embedding");
    EXPECT_EQ(d["index"], i);
    const std::vector<int> ids = tk.encode(i == 0 ? a : b, tk.add_bos());
    tokens += static_cast<int>(ids.size());
    const auto want = s.embed(ids, runtime::Session::Pooling::kMean);
    const auto got = d["embedding"].get<std::vector<float>>();
    ASSERT_EQ(got.size(), want.size());
    for (size_t j = 0; j < got.size(); ++j) EXPECT_NEAR(got[j], want[j], 1e-5) << j;
  }
  EXPECT_EQ(r["usage"]["prompt_tokens"], tokens);
  // One string, token ids and arrays of ids give the same vectors.
  const std::vector<int> ids = tk.encode(a, tk.add_bos());
  for (const json& input : {json(a), json(ids), json::array({ids})}) {
    const json x = post_json(c, "/v1/embeddings", {{"input", input}});
    ASSERT_EQ(x["data"].size(), 1u) << input.dump();
    EXPECT_EQ(x["data"][0]["embedding"], r["data"][0]["embedding"]) << input.dump();
  }
  struct Case {
    json body;
    int status;
    const char* param;
  };
  const Case cases[] = {
      {json::object(), 400, "input"},
      {{{"input", json::array()}}, 400, "input"},
      {{{"input", 5}}, 400, "input"},
      {{{"input", json::array({1, 99999})}}, 400, "input"},
      {{{"input", json::array({json::array()})}}, 400, "input"},
      {{{"input", "hi"}, {"dimensions", 8}}, 400, "dimensions"},
      {{{"input", "hi"}, {"encoding_format", "base64"}}, 400, "encoding_format"},
      {{{"input", "hi"}, {"model", "gpt-x"}}, 404, "model"},
      {{{"input", std::string(4000, 'a')}}, 400, "input"},
  };
  for (const Case& k : cases) {
    auto res = c.Post("/v1/embeddings", k.body.dump(), "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, k.status) << k.body.dump().substr(0, 80) << " " << res->body;
    EXPECT_EQ(error_of(res)["param"], k.param) << k.body.dump().substr(0, 80);
  }
}

// The next turn of a chat resumes the previous one's kept cache: usage reports the cached
// prompt tokens, /metrics counts the hit, and the answer is the one a server without the
// prefix cache gives.
TEST(ServerApi, ChatTurnsResumeFromThePrefixCache) {
  KIVI_REQUIRE_MODEL();
  std::vector<std::string> answers[2];
  json last_usage;
  std::string metrics;
  for (const bool cache : {true, false}) {
    runtime::SchedulerOptions so = test::kivi2_options(2, 4);
    so.prefix_cache = cache;
    so.forward.prefill = attn::PrefillMode::kStream;  // bit for bit: the same answers
    TestServer s(so);
    httplib::Client c = s.client();
    json messages = json::array({{{"role", "user"}, {"content", "Tell me a story about a cat."}}});
    for (int turn = 0; turn < 3; ++turn) {
      const json r = post_json(c, "/v1/chat/completions",
                               {{"messages", messages}, {"max_tokens", 16}, {"temperature", 0}});
      const std::string answer = r["choices"][0]["message"]["content"].get<std::string>();
      answers[cache ? 0 : 1].push_back(answer);
      const json& u = r["usage"];
      const int cached = u["prompt_tokens_details"]["cached_tokens"].get<int>();
      if (!cache || turn == 0) {
        EXPECT_EQ(cached, 0) << r.dump();
      } else {
        // Most of the prompt: everything but the new message and whatever of the
        // previous answer re-tokenizes differently.
        EXPECT_GT(cached, u["prompt_tokens"].get<int>() / 2) << r.dump();
        EXPECT_LT(cached, u["prompt_tokens"].get<int>()) << r.dump();
      }
      messages.push_back({{"role", "assistant"}, {"content", answer}});
      messages.push_back({{"role", "user"}, {"content", turn == 0 ? "And then?" : "The end."}});
    }
    if (cache) {
      ASSERT_TRUE(s.wait_for([](const runtime::SchedulerStats& st) { return st.active == 0; }));
      metrics = c.Get("/metrics")->body;
    }
  }
  EXPECT_EQ(answers[0], answers[1]);
  EXPECT_NE(metrics.find("kivi_prefix_cache_queries_total 3"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("kivi_prefix_cache_hits_total 2"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("kivi_prefix_cache_sequences 1"), std::string::npos) << metrics;
  // Latency histograms: three requests each, buckets cumulative up to +Inf = count.
  for (const char* h : {"kivi_request_queue_time_seconds", "kivi_time_to_first_token_seconds",
                        "kivi_time_per_output_token_seconds", "kivi_e2e_request_latency_seconds"}) {
    const std::string name = h;
    EXPECT_NE(metrics.find("# TYPE " + name + " histogram"), std::string::npos) << name;
    EXPECT_NE(metrics.find(name + "_count 3\n"), std::string::npos) << name;
    EXPECT_NE(metrics.find(name + "_bucket{le=\"+Inf\"} 3\n"), std::string::npos) << name;
    double last = 0;
    int buckets = 0;
    for (size_t p = metrics.find(name + "_bucket{"); p != std::string::npos;
         p = metrics.find(name + "_bucket{", p + 1)) {
      const double v = std::stod(metrics.substr(metrics.find("} ", p) + 2));
      EXPECT_GE(v, last) << name;
      last = v;
      ++buckets;
    }
    EXPECT_GT(buckets, 10) << name;
  }
}

// A pool smaller than the context: a chat request without max_tokens may run to the
// pool's end (not a 400), and several at once share the pool, the newest preempted when
// it runs dry; all of them finish.
TEST(ServerApi, ChatWithoutMaxTokensFitsAPoolSmallerThanTheContext) {
  KIVI_REQUIRE_MODEL();
  runtime::SchedulerOptions so = test::kivi2_options(3, 4);
  so.kv_budget_tokens = 3 * 128;  // 384 tokens, the context 512
  TestServer s(so);
  const json body = {
      {"messages", json::array({{{"role", "user"}, {"content", "Tell me a story about a cat."}}})},
      {"ignore_eos", true},
      {"temperature", 0}};
  std::vector<json> replies(3);
  std::vector<std::thread> clients;
  for (int i = 0; i < 3; ++i) {
    clients.emplace_back([&, i] {
      httplib::Client c = s.client();
      c.set_read_timeout(300);
      replies[i] = post_json(c, "/v1/chat/completions", body);
    });
  }
  for (auto& t : clients) t.join();
  for (const json& r : replies) {
    ASSERT_TRUE(r.contains("usage")) << r.dump();
    EXPECT_EQ(r["choices"][0]["finish_reason"], "length") << r.dump();
    EXPECT_EQ(r["usage"]["total_tokens"].get<int>(), 384) << r.dump();
    EXPECT_EQ(r["choices"][0]["message"]["content"],
              replies[0]["choices"][0]["message"]["content"]);
  }
  httplib::Client c = s.client();
  const std::string metrics = c.Get("/metrics")->body;
  const size_t at = metrics.find("\nkivi_preemptions_total ");
  ASSERT_NE(at, std::string::npos) << metrics;
  EXPECT_GE(std::stoi(metrics.substr(at + 24)), 1) << metrics;
  // Asking for more than the pool holds is still refused at once.
  json more = body;
  more["max_tokens"] = 400;
  auto r = c.Post("/v1/chat/completions", more.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(r->body.find("kv_budget_exceeded"), std::string::npos) << r->body;
}

// Slots: a conversation's cache saved from one server, restored into a fresh one, and
// continued there with the answer of a server that never stopped (KIVI with a residual
// window, whose ring the file carries); the files' names and the slots' ids checked.
TEST(ServerApi, SlotsSaveAndRestoreAConversationAcrossServers) {
  KIVI_REQUIRE_MODEL();
  test::TempDir dir;
  runtime::SchedulerOptions so = test::kivi2_options(2, 4);
  so.prefix_cache = true;
  so.forward.prefill = attn::PrefillMode::kStream;  // bit for bit: the same answers
  server::ServerOptions o;
  o.slot_save_path = dir.path();
  json messages = json::array({{{"role", "user"}, {"content", "Tell me a story about a cat."}}});
  auto turn = [&](httplib::Client& c) {
    return post_json(c, "/v1/chat/completions",
                     {{"messages", messages}, {"max_tokens", 16}, {"temperature", 0}});
  };
  auto post = [](httplib::Client& c, const std::string& path, const json& body) {
    auto r = c.Post(path, body.dump(), "application/json");
    EXPECT_TRUE(r) << path;
    return r;
  };
  int saved = 0;
  {
    TestServer a(so, o);
    httplib::Client c = a.client();
    const json r = turn(c);
    messages.push_back({{"role", "assistant"}, {"content", r["choices"][0]["message"]["content"]}});
    messages.push_back({{"role", "user"}, {"content", "And then?"}});
    ASSERT_TRUE(a.wait_for([](const runtime::SchedulerStats& st) { return st.active == 0; }));
    const json slots = json::parse(c.Get("/slots")->body);
    ASSERT_EQ(slots.size(), 2u) << slots.dump();
    int id = -1;
    for (const json& sl : slots) {
      EXPECT_FALSE(sl["is_processing"].get<bool>());
      EXPECT_EQ(sl["n_ctx"], 512);
      if (sl["n_tokens"].get<int>() > 0) id = sl["id"].get<int>();
    }
    ASSERT_GE(id, 0) << slots.dump();
    const json other = error_of(
        post(c, "/slots/" + std::to_string(1 - id) + "?action=save", {{"filename", "conv.kv"}}));
    EXPECT_EQ(other["code"], "slot_empty") << other.dump();
    auto res = post(c, "/slots/" + std::to_string(id) + "?action=save", {{"filename", "conv.kv"}});
    ASSERT_EQ(res->status, 200) << res->body;
    const json sv = json::parse(res->body);
    saved = sv["n_saved"].get<int>();
    EXPECT_EQ(sv["id_slot"], id);
    EXPECT_EQ(sv["filename"], "conv.kv");
    EXPECT_GT(saved, 20);
    EXPECT_GT(sv["n_written"].get<int64_t>(), 0);
  }
  // A server that never stopped: the second turn's answer.
  std::string expected;
  {
    TestServer c0(so);
    httplib::Client c = c0.client();
    json first = messages;
    first.erase(first.end() - 2, first.end());
    post_json(c, "/v1/chat/completions",
              {{"messages", first}, {"max_tokens", 16}, {"temperature", 0}});
    ASSERT_TRUE(c0.wait_for([](const runtime::SchedulerStats& st) { return st.active == 0; }));
    expected = turn(c)["choices"][0]["message"]["content"].get<std::string>();
  }
  TestServer b(so, o);
  httplib::Client c = b.client();
  auto res = post(c, "/slots/1?action=restore", {{"filename", "conv.kv"}});
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(json::parse(res->body)["n_restored"], saved);
  EXPECT_EQ(json::parse(c.Get("/slots")->body)[1]["n_tokens"], saved);
  const json r = turn(c);
  EXPECT_EQ(r["usage"]["prompt_tokens_details"]["cached_tokens"], saved) << r.dump();
  EXPECT_EQ(r["choices"][0]["message"]["content"], expected);
  ASSERT_TRUE(b.wait_for([](const runtime::SchedulerStats& st) { return st.active == 0; }));
  // Erasing frees what a slot kept.
  int erased = 0;
  for (int id : {0, 1}) {
    const json e = json::parse(post(c, "/slots/" + std::to_string(id) + "?action=erase", {})->body);
    erased += e["n_erased"].get<int>();
  }
  EXPECT_GT(erased, saved);
  for (const json& sl : json::parse(c.Get("/slots")->body)) EXPECT_EQ(sl["n_tokens"], 0);
  EXPECT_TRUE(b.drained());
  // Bad requests: one line each, naming the file as the client did.
  test::write_text(dir.file("bad.kv"), "not a cache");
  const struct {
    std::string path;
    json body;
    int status;
    std::string code;
  } bad[] = {
      {"/slots/0?action=restore", {{"filename", "../conv.kv"}}, 400, ""},
      {"/slots/0?action=restore", {{"filename", ".hidden"}}, 400, ""},
      {"/slots/0?action=restore", json::object(), 400, ""},
      {"/slots/0?action=restore", {{"filename", "missing.kv"}}, 404, "file_not_found"},
      {"/slots/0?action=restore", {{"filename", "bad.kv"}}, 400, "invalid_slot_file"},
      {"/slots/5?action=restore", {{"filename", "conv.kv"}}, 404, "slot_not_found"},
      {"/slots/0?action=fly", json::object(), 400, ""},
      {"/slots/0", json::object(), 400, ""},
  };
  for (const auto& t : bad) {
    auto x = post(c, t.path, t.body);
    EXPECT_EQ(x->status, t.status) << t.path << " " << x->body;
    const json e = error_of(x);
    if (!t.code.empty()) {
      EXPECT_EQ(e["code"], t.code) << x->body;
    }
    EXPECT_EQ(x->body.find(dir.path()), std::string::npos) << x->body;
  }
  // Without --slot-save-path: listing only.
  TestServer n(so);
  httplib::Client cn = n.client();
  EXPECT_EQ(json::parse(cn.Get("/slots")->body).size(), 2u);
  const json off = error_of(post(cn, "/slots/0?action=save", {{"filename", "x.kv"}}));
  EXPECT_EQ(off["code"], "slots_unavailable") << off.dump();
}

// The events of a streamed response, parsed, up to [DONE].
std::vector<json> sse_events(const std::string& body) {
  std::vector<json> out;
  size_t pos = 0;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    const size_t end = body.find("\n\n", pos);
    const std::string data = body.substr(pos + 6, end - pos - 6);
    pos = end;
    if (data == "[DONE]") break;
    out.push_back(json::parse(data));
  }
  return out;
}

// n choices are n sequences of the one prompt with seeds seed, seed + 1, ...: each equals
// the single-choice answer with its seed, whole and streamed, and usage adds them up.
TEST(ServerApi, SeveralChoicesAreSeveralSeededSequences) {
  KIVI_REQUIRE_MODEL();
  TestServer s(test::kivi2_options(4, 8));
  httplib::Client c = s.client();
  const json base = {{"prompt", "Once upon a time"}, {"max_tokens", 12}, {"temperature", 0.9}};
  json many = base;
  many["n"] = 3;
  many["seed"] = 40;
  const json r = post_json(c, "/v1/completions", many);
  ASSERT_EQ(r["choices"].size(), 3u) << r.dump();
  int completion = 0;
  std::vector<std::string> texts;
  for (int i = 0; i < 3; ++i) {
    const json& ch = r["choices"][i];
    EXPECT_EQ(ch["index"].get<int>(), i);
    json one = base;
    one["seed"] = 40 + i;
    const json single = post_json(c, "/v1/completions", one);
    EXPECT_EQ(ch["text"], single["choices"][0]["text"]) << "choice " << i;
    EXPECT_EQ(ch["finish_reason"], single["choices"][0]["finish_reason"]);
    completion += single["usage"]["completion_tokens"].get<int>();
    texts.push_back(ch["text"].get<std::string>());
  }
  EXPECT_EQ(r["usage"]["completion_tokens"].get<int>(), completion);
  EXPECT_EQ(r["usage"]["prompt_tokens"],
            post_json(c, "/v1/completions", base)["usage"]["prompt_tokens"]);
  EXPECT_TRUE(texts[0] != texts[1] || texts[1] != texts[2]);  // different seeds

  // Chat, streamed: every chunk names its choice; the pieces add up to the whole answers.
  const json msgs = json::array({{{"role", "user"}, {"content", "Tell me a story"}}});
  json chat = {
      {"messages", msgs}, {"max_tokens", 10}, {"temperature", 0.9},
      {"seed", 7},        {"n", 2},           {"stream_options", {{"include_usage", true}}}};
  const json whole = post_json(c, "/v1/chat/completions", chat);
  ASSERT_EQ(whole["choices"].size(), 2u) << whole.dump();
  chat["stream"] = true;
  auto sr = c.Post("/v1/chat/completions", chat.dump(), "application/json");
  ASSERT_TRUE(sr);
  std::string content[2];
  int roles[2] = {0, 0}, finishes[2] = {0, 0}, usage = 0;
  for (const json& ev : sse_events(sr->body)) {
    ASSERT_FALSE(ev.contains("error")) << ev.dump();
    if (ev.contains("usage") && ev["usage"].is_object()) {
      ++usage;
      EXPECT_EQ(ev["usage"]["completion_tokens"], whole["usage"]["completion_tokens"]);
    }
    for (const json& ch : ev["choices"]) {
      const int i = ch["index"].get<int>();
      ASSERT_TRUE(i == 0 || i == 1) << ev.dump();
      const json& d = ch["delta"];
      if (d.contains("role")) ++roles[i];
      if (d.contains("content")) content[i] += d["content"].get<std::string>();
      if (!ch["finish_reason"].is_null()) ++finishes[i];
    }
  }
  EXPECT_EQ(usage, 1);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(roles[i], 1) << i;
    EXPECT_EQ(finishes[i], 1) << i;
    EXPECT_EQ(content[i], whole["choices"][i]["message"]["content"].get<std::string>()) << i;
  }
  EXPECT_TRUE(s.drained());
}

}  // namespace
}  // namespace kivi
