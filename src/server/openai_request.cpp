#include "server/openai_request.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "server/api_error.h"
#include "server/json_body.h"
#include "server/structured_output.h"
#include "tokenizer/unicode.h"

namespace kivi::server {

namespace {

using nlohmann::json;

[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw ApiError(400, message, param);
}

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return "an integer";
    case json::value_t::number_float:
      return "a number";
    case json::value_t::string:
      return "a string";
    case json::value_t::array:
      return "an array";
    case json::value_t::object:
      return "an object";
    default:
      return "a value";
  }
}

[[noreturn]] void wrong_type(const std::string& param, const json& v, const char* expected) {
  bad(param, "'" + param + "' must be " + expected + ", not " + type_name(v));
}

// A field, or null when absent (JSON null counts as absent).
const json* field(const json& body, const char* name) {
  const auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

int64_t integer(const json& v, const std::string& param, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) wrong_type(param, v, "an integer");
  int64_t x = 0;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) bad(param, "'" + param + "' is out of range");
    x = static_cast<int64_t>(u);
  } else {
    x = v.get<int64_t>();
  }
  if (x < lo || x > hi) {
    bad(param,
        strfmt("'%s' = %lld is out of range (%lld to %lld)", param.c_str(),
               static_cast<long long>(x), static_cast<long long>(lo), static_cast<long long>(hi)));
  }
  return x;
}

double number(const json& v, const std::string& param, double lo, double hi) {
  if (!v.is_number()) wrong_type(param, v, "a number");
  const double x = v.get<double>();
  if (!std::isfinite(x) || x < lo || x > hi) {
    bad(param, strfmt("'%s' = %g is out of range (%g to %g)", param.c_str(), x, lo, hi));
  }
  return x;
}

bool boolean(const json& v, const std::string& param) {
  if (!v.is_boolean()) wrong_type(param, v, "a boolean");
  return v.get<bool>();
}

// Rejects a field that asks for something this server does not do.
void unsupported(const json& body, const char* name,
                 const std::function<bool(const json&)>& harmless) {
  const json* v = field(body, name);
  if (v && !harmless(*v)) {
    bad(name, std::string("'") + name + "' is not supported by this server");
  }
}

uint64_t random_seed() {
  static std::atomic<uint64_t> counter{0};
  const uint64_t t =
      static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  return t ^ (counter.fetch_add(1) * 0x9E3779B97F4A7C15ull);
}

std::vector<int> token_ids(const json& a, const std::string& param, const tok::Tokenizer& tk) {
  std::vector<int> ids;
  ids.reserve(a.size());
  for (const json& x : a) {
    if (!x.is_number_integer()) bad(param, "'" + param + "' holds something other than token ids");
    ids.push_back(static_cast<int>(integer(x, param, 0, tk.vocab_size() - 1)));
  }
  return ids;
}

// The completion prompt: a string, one string in an array, token ids, or one array of them.
std::vector<int> completion_prompt(const json& body, const tok::Tokenizer& tk) {
  const json* p = field(body, "prompt");
  if (!p) bad("prompt", "'prompt' is required");
  if (p->is_string()) return tk.encode(p->get<std::string>(), tk.add_bos());
  if (!p->is_array())
    wrong_type("prompt", *p, "a string, an array of strings or an array of token ids");
  if (p->empty()) bad("prompt", "'prompt' is empty");
  const json& first = (*p)[0];
  if (first.is_number_integer()) return token_ids(*p, "prompt", tk);
  if (p->size() > 1)
    bad("prompt", "'prompt' holds several prompts; this server takes one per request");
  if (first.is_string()) return tk.encode(first.get<std::string>(), tk.add_bos());
  if (first.is_array()) {
    if (first.empty()) bad("prompt", "'prompt' is empty");
    return token_ids(first, "prompt", tk);
  }
  wrong_type("prompt", *p, "a string, an array of strings or an array of token ids");
}

std::vector<ChatMessage> chat_messages(const json& body) {
  const json* m = field(body, "messages");
  if (!m) bad("messages", "'messages' is required");
  if (!m->is_array()) wrong_type("messages", *m, "an array");
  if (m->empty()) bad("messages", "'messages' is empty");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < m->size(); ++i) {
    const json& x = (*m)[i];
    const std::string where = strfmt("messages[%zu]", i);
    if (!x.is_object()) wrong_type(where, x, "an object");
    const json* role = field(x, "role");
    if (!role || !role->is_string()) bad(where + ".role", "'" + where + ".role' must be a string");
    ChatMessage msg;
    msg.role = role->get<std::string>();
    if (msg.role != "system" && msg.role != "developer" && msg.role != "user" &&
        msg.role != "assistant" && msg.role != "tool") {
      bad(where + ".role", "'" + where + ".role' = '" + msg.role +
                               "' is not supported (system, developer, user, assistant, tool)");
    }
    if (field(x, "function_call")) {
      bad(where + ".function_call",
          "'function_call' is deprecated and not supported; use 'tool_calls'");
    }
    if (const json* calls = field(x, "tool_calls")) {
      if (msg.role != "assistant")
        bad(where + ".tool_calls", "only an assistant's message has tool_calls");
      msg.tool_calls = parse_message_tool_calls(*calls, where);
    }
    if (const json* id = field(x, "tool_call_id"); id && !id->is_string())
      wrong_type(where + ".tool_call_id", *id, "a string");
    const json* content = field(x, "content");
    if (!content && !msg.tool_calls.empty()) {  // a reply that is only calls
      out.push_back(std::move(msg));
      continue;
    }
    if (!content) bad(where + ".content", "'" + where + ".content' is required");
    if (content->is_string()) {
      msg.content = content->get<std::string>();
    } else if (content->is_array()) {
      // Content parts: text only.
      for (const json& part : *content) {
        const json* type = part.is_object() ? field(part, "type") : nullptr;
        const json* text = part.is_object() ? field(part, "text") : nullptr;
        if (!type || !type->is_string() || type->get<std::string>() != "text" || !text ||
            !text->is_string()) {
          bad(where + ".content",
              "'" + where + ".content' parts must be {\"type\": \"text\", \"text\": ...}");
        }
        msg.content += text->get<std::string>();
      }
    } else {
      wrong_type(where + ".content", *content, "a string or an array of text parts");
    }
    out.push_back(std::move(msg));
  }
  return out;
}

}  // namespace

ParsedRequest parse_request(Endpoint e, const std::string& body_text, const ApiContext& ctx) {
  const tok::Tokenizer& tk = *ctx.tokenizer;
  json body = json_object_body(body_text, type_name);

  ParsedRequest r;
  r.endpoint = e;
  if (const json* m = field(body, "model")) {
    if (!m->is_string()) wrong_type("model", *m, "a string");
    if (m->get<std::string>() != ctx.model_id) {
      throw ApiError(404,
                     "The model '" + m->get<std::string>() + "' does not exist (this server has '" +
                         ctx.model_id + "')",
                     "model", "model_not_found");
    }
  }
  // What this server does not do is refused rather than ignored.
  auto is_one = [](const json& v) { return v.is_number_integer() && v.get<int64_t>() == 1; };
  auto is_false = [](const json& v) { return v.is_boolean() && !v.get<bool>(); };
  auto is_zero = [](const json& v) { return v.is_number() && v.get<double>() == 0.0; };
  auto is_empty = [](const json& v) { return (v.is_object() || v.is_array()) && v.empty(); };
  if (const json* n = field(body, "n")) r.n = static_cast<int>(integer(*n, "n", 1, kMaxChoices));
  unsupported(body, "best_of", is_one);
  unsupported(body, "echo", is_false);
  unsupported(body, "suffix", [](const json&) { return false; });
  if (e == Endpoint::kChat) {
    r.tools = parse_tools(body, body_text);
  } else {
    unsupported(body, "tools", is_empty);
    unsupported(body, "functions", is_empty);
    unsupported(body, "tool_choice", [](const json& v) { return v.is_string() && v == "none"; });
  }
  // Log-probabilities: chat takes logprobs (a boolean) and top_logprobs (0 to 20), a
  // completion logprobs (the alternatives, 0 to 5; null or absent for none).
  if (e == Endpoint::kChat) {
    bool want = false;
    if (const json* lp = field(body, "logprobs")) {
      if (!lp->is_boolean()) wrong_type("logprobs", *lp, "a boolean");
      want = lp->get<bool>();
    }
    int top = 0;
    if (const json* t = field(body, "top_logprobs")) {
      top = static_cast<int>(integer(*t, "top_logprobs", 0, 20));
      if (!want && top > 0) bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    }
    r.gen.logprobs = want ? top : -1;
  } else {
    if (const json* lp = field(body, "logprobs")) {
      if (lp->is_boolean()) wrong_type("logprobs", *lp, "an integer");
      r.gen.logprobs = static_cast<int>(integer(*lp, "logprobs", 0, 5));
    }
    unsupported(body, "top_logprobs", is_zero);
  }
  r.gen.grammar = parse_structured_output(body, body_text);
  // Fields llama.cpp's server and other clients send that this server does not implement.
  auto is_value = [](double x) {
    return [x](const json& v) { return v.is_number() && v.get<double>() == x; };
  };
  auto never = [](const json&) { return false; };
  unsupported(body, "n_predict", never);
  unsupported(body, "typical_p", is_value(1.0));
  unsupported(body, "tfs_z", is_value(1.0));
  unsupported(body, "mirostat", is_zero);
  unsupported(body, "n_probs", is_zero);

  if (const json* s = field(body, "stream")) r.stream = boolean(*s, "stream");
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object()) wrong_type("stream_options", *so, "an object");
    if (const json* u = field(*so, "include_usage"))
      r.include_usage = boolean(*u, "stream_options.include_usage");
  }
  runtime::SamplerOptions& s = r.gen.sampling;
  s.temperature = 1.0f;
  s.top_p = 1.0f;
  s.top_k = 0;
  if (const json* v = field(body, "temperature"))
    s.temperature = static_cast<float>(number(*v, "temperature", 0, 2));
  if (const json* v = field(body, "top_p")) {
    s.top_p = static_cast<float>(number(*v, "top_p", 0, 1));
    if (s.top_p <= 0.0f) bad("top_p", "'top_p' must be greater than 0");
  }
  if (const json* v = field(body, "top_k"))
    s.top_k = static_cast<int>(integer(*v, "top_k", 0, tk.vocab_size()));
  if (const json* v = field(body, "min_p")) s.min_p = static_cast<float>(number(*v, "min_p", 0, 1));
  // OpenAI's penalties over the generated tokens, llama.cpp's repeat penalty over a window.
  if (const json* v = field(body, "presence_penalty"))
    s.presence_penalty = static_cast<float>(number(*v, "presence_penalty", -2, 2));
  if (const json* v = field(body, "frequency_penalty"))
    s.frequency_penalty = static_cast<float>(number(*v, "frequency_penalty", -2, 2));
  if (const json* v = field(body, "repeat_penalty")) {
    s.repeat_penalty = static_cast<float>(number(*v, "repeat_penalty", 0, 10));
    if (s.repeat_penalty <= 0.0f) bad("repeat_penalty", "'repeat_penalty' must be greater than 0");
  }
  if (const json* v = field(body, "repeat_last_n"))
    s.repeat_last_n = static_cast<int>(integer(*v, "repeat_last_n", -1, 1 << 24));
  if (const json* v = field(body, "logit_bias")) {
    // {"token id": bias}, as OpenAI's clients send it.
    if (!v->is_object()) wrong_type("logit_bias", *v, "an object of token ids to biases");
    for (const auto& [key, bias] : v->items()) {
      char* end = nullptr;
      const long id = std::strtol(key.c_str(), &end, 10);
      if (key.empty() || *end != '\0' || id < 0 || id >= tk.vocab_size()) {
        bad("logit_bias", "'logit_bias' key '" + key + "' is not a token id of this model (0 to " +
                              std::to_string(tk.vocab_size() - 1) + ")");
      }
      s.logit_bias.emplace_back(static_cast<int>(id),
                                static_cast<float>(number(bias, "logit_bias", -100, 100)));
    }
  }
  s.seed = random_seed();
  if (const json* v = field(body, "seed")) {
    if (!v->is_number_integer()) wrong_type("seed", *v, "an integer");
    s.seed =
        v->is_number_unsigned() ? v->get<uint64_t>() : static_cast<uint64_t>(v->get<int64_t>());
  }
  if (const json* v = field(body, "stop")) {
    if (v->is_string()) {
      r.gen.stop.push_back(v->get<std::string>());
    } else if (v->is_array()) {
      if (v->size() > 4) bad("stop", "'stop' holds more than 4 strings");
      for (const json& x : *v) {
        if (!x.is_string()) bad("stop", "'stop' must be a string or an array of strings");
        r.gen.stop.push_back(x.get<std::string>());
      }
    } else {
      wrong_type("stop", *v, "a string or an array of strings");
    }
  }
  if (const json* v = field(body, "ignore_eos")) r.gen.ignore_eos = boolean(*v, "ignore_eos");

  if (e == Endpoint::kCompletions) {
    r.gen.prompt = completion_prompt(body, tk);
  } else {
    if (r.tools.active()) {
      r.tool_syntax = ctx.chat->tool_syntax();
      constrain_to_tools(r.tools, r.tool_syntax, r.gen);
    }
    ChatFormatter::Prompt p =
        ctx.chat->format(chat_messages(body), r.tools.active() ? &r.tools.tools : nullptr);
    r.gen.prompt = std::move(p.tokens);
    r.gen.end_tokens = std::move(p.end_tokens);
    r.gen.stop.insert(r.gen.stop.end(), p.stop.begin(), p.stop.end());
  }
  const int n_prompt = static_cast<int>(r.gen.prompt.size());
  if (n_prompt == 0) bad(e == Endpoint::kChat ? "messages" : "prompt", "the prompt has no tokens");
  if (n_prompt >= ctx.ctx) {
    throw ApiError(
        400,
        strfmt(
            "This model's maximum context length is %d tokens. However, your prompt is %d tokens, "
            "which leaves no room for a completion.",
            ctx.ctx, n_prompt),
        e == Endpoint::kChat ? "messages" : "prompt", "context_length_exceeded");
  }
  const char* max_name = "max_tokens";
  const json* max = field(body, "max_tokens");
  if (!max && e == Endpoint::kChat && field(body, "max_completion_tokens")) {
    max_name = "max_completion_tokens";
    max = field(body, max_name);
  }
  // A chat reply without max_tokens may run to the end of the context, or of the pool
  // when the pool holds less (one sequence alone must fit it).
  const int64_t room = ctx.pool_tokens > 0 ? std::min<int64_t>(ctx.ctx, ctx.pool_tokens) : ctx.ctx;
  int64_t max_tokens = e == Endpoint::kChat ? std::max<int64_t>(1, room - n_prompt)
                                            : std::min(16, ctx.ctx - n_prompt);
  if (max) max_tokens = integer(*max, max_name, 1, INT32_MAX);
  if (n_prompt + max_tokens > ctx.ctx) {
    throw ApiError(
        400,
        strfmt(
            "This model's maximum context length is %d tokens. However, you requested %lld tokens "
            "(%d in the prompt, %lld in the completion). Please reduce the prompt or the "
            "completion length.",
            ctx.ctx, static_cast<long long>(n_prompt + max_tokens), n_prompt,
            static_cast<long long>(max_tokens)),
        max_name, "context_length_exceeded");
  }
  r.gen.max_tokens = static_cast<int>(max_tokens);
  return r;
}

}  // namespace kivi::server
