// The server with gpt-oss's harmony format, on a synthetic gpt-oss model: reasoning
// apart from the answer, and tool calls in harmony's syntax.
#include <httplib.h>
#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/model.h"
#include "runtime/chat.h"
#include "runtime/tool_calls.h"
#include "server/messages.h"
#include "server/openai_response.h"
#include "server_test_util.h"
#include "test_util.h"

namespace kivi {
namespace {

using nlohmann::json;
using test::kivi2_options;
using test::post_streamed;
using test::sse_data;
using test::Streamed;
using test::TestServer;

// A small synthetic gpt-oss model (o200k_harmony-like vocabulary of 600) in `dir`, or
// null (with a test failure) when kivi synth fails.
std::unique_ptr<model::Model> gpt_oss(const test::TempDir& dir, int ctx) {
  const std::string path = dir.file("oss.gguf");
  const auto made = test::run(test::kivi_cmd(
      "synth --arch gpt-oss --layers 2 --dim 128 --heads 4 --kv-heads 2 --head-dim 32 --ffn 64 "
      "--experts 4 --experts-used 2 --vocab 600 --ctx " +
      std::to_string(ctx) + " -o '" + path + "'"));
  EXPECT_EQ(made.exit_code, 0) << made.err;
  if (made.exit_code != 0) return nullptr;
  return model::Model::load(path);
}

// gpt-oss (harmony): a chat reply's reasoning (the analysis channel) goes to
// message.reasoning_content and its answer to content, llama-server's fields; the markup
// goes to neither. On a synthetic gpt-oss model, with the markup tokens favoured by
// logit_bias so that replies hold some: the chat reply is what runtime/chat.h's split
// makes of the raw text /v1/completions gives for the same prompt tokens and seed, and a
// streamed reply's deltas add up to the whole one.
TEST(Server, HarmonyRepliesSplitReasoningFromContent) {
  test::TempDir dir;
  const auto model = gpt_oss(dir, 512);
  ASSERT_TRUE(model);
  const tok::Tokenizer& tk = model->tokenizer();
  // The conversation's tokens: harmony's turns, a reply in the history as the final
  // channel's message.
  const server::ChatFormatter chat(tk, "");
  ASSERT_STREQ(chat.name(), "harmony");
  EXPECT_TRUE(chat.has_reasoning());
  const std::vector<server::ChatMessage> messages = {
      {"system", "be brief"}, {"user", "hello"}, {"assistant", "hi"}, {"user", "again"}};
  runtime::ChatPrompt turns(tk, "harmony");
  const std::vector<int> prompt = chat.format(messages).tokens;
  {
    std::vector<int> want = turns.user_turn("hello", "be brief", true);
    const auto tail = tk.encode(
        "<|channel|>final<|message|>hi<|end|><|start|>user<|message|>again<|end|><|start|>"
        "assistant",
        false, false, true);
    want.insert(want.end(), tail.begin(), tail.end());
    EXPECT_EQ(prompt, want);  // (the same date: both are today's)
  }
  json bias = json::object();
  for (const char* m : {"<|channel|>", "<|message|>", "<|start|>", "<|end|>"})
    bias[std::to_string(tk.find_special(m))] = 4;
  bias[std::to_string(tk.find_special("<|return|>"))] = -100;
  bias[std::to_string(tk.find_special("<|call|>"))] = -100;
  server::ServerOptions o;
  o.model_id = "oss";
  TestServer s(kivi2_options(2, 4), o, model.get());
  auto c = s.client();
  const json params = {{"max_tokens", 48}, {"temperature", 1.0}, {"seed", 5}, {"logit_bias", bias}};
  json raw_body = params;
  raw_body["prompt"] = prompt;
  const auto raw = c.Post("/v1/completions", raw_body.dump(), "application/json");
  ASSERT_TRUE(raw);
  ASSERT_EQ(raw->status, 200) << raw->body;
  const std::string text = json::parse(raw->body)["choices"][0]["text"];
  EXPECT_NE(text.find("<|"), std::string::npos) << text;  // the markup is rendered
  const runtime::ReplyParts want = runtime::split_harmony_reply(text);
  json chat_body = params;
  chat_body["messages"] = json::array();
  for (const auto& m : messages)
    chat_body["messages"].push_back({{"role", m.role}, {"content", m.content}});
  const auto whole = c.Post("/v1/chat/completions", chat_body.dump(), "application/json");
  ASSERT_TRUE(whole);
  ASSERT_EQ(whole->status, 200) << whole->body;
  const json w = json::parse(whole->body);
  EXPECT_EQ(w["usage"]["prompt_tokens"], prompt.size());
  const json& msg = w["choices"][0]["message"];
  EXPECT_EQ(msg["content"], want.content);
  EXPECT_EQ(msg.value("reasoning_content", std::string()), want.reasoning);
  EXPECT_EQ(msg.contains("reasoning_content"), !want.reasoning.empty());
  EXPECT_EQ(want.content.find("<|"), std::string::npos) << want.content;
  chat_body["stream"] = true;
  const Streamed st = post_streamed(c, "/v1/chat/completions", chat_body);
  ASSERT_TRUE(st.sent);
  ASSERT_EQ(st.status, 200);
  std::string content, reasoning;
  for (const std::string& d : sse_data(st.sse)) {
    if (d == "[DONE]") continue;
    const json e = json::parse(d);
    ASSERT_FALSE(e.contains("error")) << d;
    const json& delta = e["choices"][0]["delta"];
    content += delta.value("content", std::string());
    reasoning += delta.value("reasoning_content", std::string());
  }
  EXPECT_EQ(content, want.content);
  EXPECT_EQ(reasoning, want.reasoning);
  EXPECT_TRUE(s.drained());
}

// gpt-oss (harmony) tool calls: with tool_choice "required" or a named function the
// reply is a commentary message to "functions.NAME" (its markup written by the grammar
// with the vocabulary's control tokens or spelled), returned as message.tool_calls with
// arguments that follow the function's schema, whole and streamed; its reasoning, if any,
// stays in reasoning_content. The round trip (the call, the tool's result) is accepted and
// prompted as runtime/tool_calls.h writes harmony's history.
TEST(Server, HarmonyToolCallsFollowTheirSchemas) {
  test::TempDir dir;
  const auto model = gpt_oss(dir, 1024);
  ASSERT_TRUE(model);
  server::ServerOptions o;
  o.model_id = "oss";
  runtime::SchedulerOptions so = kivi2_options(2, 4);
  so.ctx = 1024;  // the tools' namespace is some 400 of this vocabulary's tokens
  TestServer s(so, o, model.get());
  auto c = s.client();
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "description": "Weather of a city", "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["c", "f"]}},
      "required": ["city", "unit"], "additionalProperties": false}}},
    {"type": "function", "function": {"name": "now", "parameters": {"type": "object",
      "properties": {}, "additionalProperties": false}}}])");
  const json messages = json::array({{{"role", "user"}, {"content", "Weather in Paris?"}}});
  auto check_args = [](const std::string& name, const std::string& arguments) {
    const json a = json::parse(arguments);
    if (name == "now") return a.empty();
    return a.size() == 2 && a["city"].is_string() && (a["unit"] == "c" || a["unit"] == "f");
  };
  int calls = 0;
  for (int seed = 0; seed < 12; ++seed) {
    json body = {{"messages", messages}, {"tools", tools},     {"tool_choice", "required"},
                 {"max_tokens", 120},    {"temperature", 1.0}, {"seed", seed}};
    if (seed % 3 == 2)
      body["tool_choice"] = {{"type", "function"}, {"function", {{"name", "now"}}}};
    const auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const json j = json::parse(r->body);
    const json& choice = j["choices"][0];
    if (choice["finish_reason"] == "length") continue;  // a long string ran out of tokens
    ASSERT_EQ(choice["finish_reason"], "tool_calls") << r->body;
    const json& tc = choice["message"]["tool_calls"];
    ASSERT_EQ(tc.size(), 1u) << r->body;
    const std::string name = tc[0]["function"]["name"];
    if (seed % 3 == 2) {
      EXPECT_EQ(name, "now");
    }
    EXPECT_TRUE(check_args(name, tc[0]["function"]["arguments"])) << r->body;
    EXPECT_TRUE(choice["message"]["content"].is_null()) << r->body;
    ++calls;
  }
  EXPECT_GE(calls, 8);
  // Streamed: the call arrives as delta.tool_calls, and the finish reason says so.
  json body = {{"messages", messages}, {"tools", tools},     {"tool_choice", "required"},
               {"max_tokens", 120},    {"temperature", 0.0}, {"stream", true}};
  const Streamed st = post_streamed(c, "/v1/chat/completions", body);
  ASSERT_TRUE(st.sent);
  ASSERT_EQ(st.status, 200);
  json call;
  std::string finish;
  for (const std::string& d : sse_data(st.sse)) {
    if (d == "[DONE]") continue;
    const json e = json::parse(d);
    ASSERT_FALSE(e.contains("error")) << d;
    const json& ch = e["choices"][0];
    if (ch["delta"].contains("tool_calls")) call = ch["delta"]["tool_calls"][0];
    if (ch.contains("finish_reason") && ch["finish_reason"].is_string())
      finish = ch["finish_reason"];
  }
  if (finish != "length") {
    EXPECT_EQ(finish, "tool_calls");
    ASSERT_TRUE(call.is_object()) << st.sse;
    EXPECT_TRUE(check_args(call["function"]["name"], call["function"]["arguments"])) << st.sse;
  }
  // The round trip: the call and the tool's result in the history.
  json history = messages;
  history.push_back(
      {{"role", "assistant"},
       {"content", nullptr},
       {"tool_calls", json::array({{{"id", "call_1"},
                                    {"type", "function"},
                                    {"function",
                                     {{"name", "get_weather"},
                                      {"arguments", R"({"city": "Paris", "unit": "c"})"}}}}})}});
  history.push_back({{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "{\"temp\": 21}"}});
  const json round = {{"messages", history}, {"tools", tools}, {"max_tokens", 8}, {"seed", 1}};
  const auto r = c.Post("/v1/chat/completions", round.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const server::ChatFormatter chat(model->tokenizer(), "");
  std::vector<server::ChatMessage> ms = {
      {"user", "Weather in Paris?"},
      {"assistant", "", {{"call_1", "get_weather", R"({"city": "Paris", "unit": "c"})"}}},
      {"tool", "{\"temp\": 21}"}};
  std::vector<runtime::ToolFunction> fns;
  for (const json& t : tools) {
    const nlohmann::ordered_json ot = nlohmann::ordered_json::parse(t.dump());
    fns.push_back({t["function"]["name"], ot, ot["function"]["parameters"]});
  }
  EXPECT_EQ(json::parse(r->body)["usage"]["prompt_tokens"], chat.format(ms, &fns).tokens.size());
  EXPECT_TRUE(s.drained());
}

// The response bodies carry reasoning as llama-server does: message.reasoning_content
// when there is some, delta.reasoning_content in a stream.
TEST(Server, ReasoningContentInResponseBodies) {
  const server::ResponseInfo info{server::Endpoint::kChat, "chatcmpl-x", 7, "m"};
  const json b = json::parse(server::completion_body(info, "4", "stop", {3, 2}, "2+2=4"));
  EXPECT_EQ(b["choices"][0]["message"]["content"], "4");
  EXPECT_EQ(b["choices"][0]["message"]["reasoning_content"], "2+2=4");
  const json plain = json::parse(server::completion_body(info, "4", "stop", {3, 2}));
  EXPECT_FALSE(plain["choices"][0]["message"].contains("reasoning_content"));
  const std::string ev = server::chunk_reasoning(info, "thinking");
  ASSERT_EQ(ev.rfind("data: ", 0), 0u);
  const json e = json::parse(ev.substr(6));
  EXPECT_EQ(e["object"], "chat.completion.chunk");
  EXPECT_EQ(e["choices"][0]["delta"], (json{{"reasoning_content", "thinking"}}));
}

}  // namespace
}  // namespace kivi
