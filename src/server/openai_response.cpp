#include "server/openai_response.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <mutex>
#include <random>

#include "server/api_error.h"

namespace kivi::server {

namespace {

using nlohmann::json;

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

json base(const ResponseInfo& r, const char* object) {
  return {{"id", r.id}, {"object", object}, {"created", r.created}, {"model", r.model}};
}

bool chat(const ResponseInfo& r) { return r.endpoint == Endpoint::kChat; }

json finish(const char* reason) { return reason && *reason ? json(reason) : json(nullptr); }

std::string event(const json& j) { return "data: " + dump(j) + "\n\n"; }

json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

// A choice's "logprobs" (see Logprobs).
json logprobs_json(const ResponseInfo& r, const Logprobs* lp) {
  if (!lp) return nullptr;
  const tok::Tokenizer& t = *lp->tokenizer;
  if (chat(r)) {
    json content = json::array();
    for (const runtime::TokenLogprob& x : lp->items) {
      const std::string s = t.token_text(x.token, true);
      json top = json::array();
      for (const auto& [id, v] : x.top) {
        const std::string ts = t.token_text(id, true);
        top.push_back({{"token", ts}, {"logprob", v}, {"bytes", bytes_of(ts)}});
      }
      content.push_back(
          {{"token", s}, {"logprob", x.logprob}, {"bytes", bytes_of(s)}, {"top_logprobs", top}});
    }
    return {{"content", content}, {"refusal", nullptr}};
  }
  json tokens = json::array(), values = json::array(), tops = json::array(),
       offsets = json::array();
  int offset = lp->text_offset;
  for (const runtime::TokenLogprob& x : lp->items) {
    const std::string s = t.token_text(x.token, true);
    tokens.push_back(s);
    values.push_back(x.logprob);
    json top = json::object();
    for (const auto& [id, v] : x.top) top[t.token_text(id, true)] = v;
    tops.push_back(top);
    offsets.push_back(offset);
    offset += static_cast<int>(s.size());
  }
  return {{"tokens", tokens},
          {"token_logprobs", values},
          {"top_logprobs", tops},
          {"text_offset", offsets}};
}

json tool_calls_json(const std::vector<runtime::ToolCall>& calls, bool indexed) {
  json a = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    json c = {{"id", calls[i].id},
              {"type", "function"},
              {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}};
    if (indexed) c["index"] = i;
    a.push_back(std::move(c));
  }
  return a;
}

}  // namespace

std::string ApiError::default_type(int status) {
  switch (status) {
    case 401:
      return "authentication_error";
    case 404:
      return "not_found_error";
    case 413:
      return "invalid_request_error";
    case 429:
      return "rate_limit_error";
    case 503:
      return "server_overloaded";
    default:
      return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

std::string ApiError::json() const {
  nlohmann::json e = {{"message", what()},
                      {"type", type_},
                      {"param", param_.empty() ? nlohmann::json(nullptr) : nlohmann::json(param_)},
                      {"code", code_.empty() ? nlohmann::json(nullptr) : nlohmann::json(code_)}};
  return dump(nlohmann::json{{"error", e}});
}

std::string new_response_id(Endpoint e) {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t salt = [] {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }();
  const uint64_t a =
      salt ^ static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  const uint64_t b = counter.fetch_add(1);
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%s%016llx%08llx", e == Endpoint::kChat ? "chatcmpl-" : "cmpl-",
                static_cast<unsigned long long>(a),
                static_cast<unsigned long long>(b & 0xffffffffu));
  return buf;
}

std::string completion_body(const ResponseInfo& r, const std::vector<Choice>& choices,
                            const Usage& u) {
  json j = base(r, chat(r) ? "chat.completion" : "text_completion");
  j["choices"] = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const Choice& c = choices[i];
    json choice = {{"index", i},
                   {"logprobs", logprobs_json(r, c.logprobs)},
                   {"finish_reason", finish(c.finish_reason)}};
    if (chat(r)) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
      if (!c.reasoning.empty()) choice["message"]["reasoning_content"] = c.reasoning;
      if (!c.tool_calls.empty()) {
        if (c.text.empty()) choice["message"]["content"] = nullptr;
        choice["message"]["tool_calls"] = tool_calls_json(c.tool_calls, false);
      }
    } else {
      choice["text"] = c.text;
    }
    j["choices"].push_back(std::move(choice));
  }
  j["usage"] = usage_json(u);
  return dump(j);
}

std::string completion_body(const ResponseInfo& r, const std::string& text,
                            const char* finish_reason, const Usage& u, const std::string& reasoning,
                            const Logprobs* lp) {
  return completion_body(r, {Choice{text, finish_reason, reasoning, lp, {}}}, u);
}

std::string chunk_role(const ResponseInfo& r, int index) {
  json j = base(r, "chat.completion.chunk");
  j["choices"] = json::array({{{"index", index},
                               {"delta", {{"role", "assistant"}, {"content", ""}}},
                               {"logprobs", nullptr},
                               {"finish_reason", nullptr}}});
  return event(j);
}

std::string chunk_text(const ResponseInfo& r, const std::string& text, const Logprobs* lp,
                       int index) {
  json j = base(r, chat(r) ? "chat.completion.chunk" : "text_completion");
  json choice = {{"index", index}, {"logprobs", logprobs_json(r, lp)}, {"finish_reason", nullptr}};
  if (chat(r)) {
    choice["delta"] = {{"content", text}};
  } else {
    choice["text"] = text;
  }
  j["choices"] = json::array({choice});
  return event(j);
}

std::string chunk_reasoning(const ResponseInfo& r, const std::string& text, int index) {
  json j = base(r, "chat.completion.chunk");
  j["choices"] = json::array({{{"index", index},
                               {"delta", {{"reasoning_content", text}}},
                               {"logprobs", nullptr},
                               {"finish_reason", nullptr}}});
  return event(j);
}

std::string chunk_tool_calls(const ResponseInfo& r, const std::vector<runtime::ToolCall>& calls,
                             int index) {
  json j = base(r, "chat.completion.chunk");
  j["choices"] = json::array({{{"index", index},
                               {"delta", {{"tool_calls", tool_calls_json(calls, true)}}},
                               {"logprobs", nullptr},
                               {"finish_reason", nullptr}}});
  return event(j);
}

std::string new_tool_call_id() {
  static const char kAlnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  static std::mutex mu;
  static std::mt19937_64 rng{std::random_device{}()};
  std::lock_guard<std::mutex> lock(mu);
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kAlnum[rng() % 62];
  return id;
}

std::string chunk_finish(const ResponseInfo& r, const char* finish_reason, const Logprobs* lp,
                         int index) {
  json j = base(r, chat(r) ? "chat.completion.chunk" : "text_completion");
  json choice = {{"index", index},
                 {"logprobs", logprobs_json(r, lp)},
                 {"finish_reason", finish(finish_reason)}};
  if (chat(r)) {
    choice["delta"] = json::object();
  } else {
    choice["text"] = "";
  }
  j["choices"] = json::array({choice});
  return event(j);
}

std::string chunk_usage(const ResponseInfo& r, const Usage& u) {
  json j = base(r, chat(r) ? "chat.completion.chunk" : "text_completion");
  j["choices"] = json::array();
  j["usage"] = usage_json(u);
  return event(j);
}

std::string sse_error(const std::string& error_json) { return "data: " + error_json + "\n\n"; }

std::string model_body(const std::string& model, int64_t created) {
  return dump({{"id", model}, {"object", "model"}, {"created", created}, {"owned_by", "kivi"}});
}

std::string models_body(const std::string& model, int64_t created) {
  return dump(
      {{"object", "list"},
       {"data",
        json::array(
            {{{"id", model}, {"object", "model"}, {"created", created}, {"owned_by", "kivi"}}})}});
}

}  // namespace kivi::server
