// OpenAI response bodies: a whole completion (text_completion / chat.completion) and
// the server-sent events of a streamed one (text_completion / chat.completion.chunk),
// each carrying the request's id, creation time and model. Text is written as JSON
// with ill-formed UTF-8 replaced by U+FFFD.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/request.h"
#include "runtime/tool_calls.h"
#include "server/openai_request.h"
#include "tokenizer/tokenizer.h"

namespace kivi::server {

struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_tokens = 0;  // prompt tokens taken from the prefix cache, not prefilled
};

struct ResponseInfo {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string id;       // "cmpl-..." or "chatcmpl-..."
  int64_t created = 0;  // Unix seconds
  std::string model;
};

// Log-probabilities of generated tokens, written as a choice's "logprobs" (null without
// them): chat {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token",
// "logprob", "bytes"}]}], "refusal": null}; completions {"tokens", "token_logprobs",
// "top_logprobs": [{TOKEN: LOGPROB}], "text_offset"}, offsets counted from text_offset.
struct Logprobs {
  const tok::Tokenizer* tokenizer = nullptr;
  std::vector<runtime::TokenLogprob> items;
  int text_offset = 0;  // completions: where the first token's text starts in the reply
};

// A new id for an endpoint: "cmpl-" or "chatcmpl-" and 24 hex digits.
std::string new_response_id(Endpoint e);

// One choice of a whole completion. `reasoning`: a chat reply's reasoning apart from its
// answer (harmony), written as message.reasoning_content (llama-server's field) when not
// empty. `tool_calls`: the calls of a chat reply (message.tool_calls; content null when
// the reply is only calls).
struct Choice {
  std::string text;
  const char* finish_reason = "stop";
  std::string reasoning;
  const Logprobs* logprobs = nullptr;
  std::vector<runtime::ToolCall> tool_calls;
};
std::string completion_body(const ResponseInfo& r, const std::vector<Choice>& choices,
                            const Usage& u);
// One choice (index 0).
std::string completion_body(const ResponseInfo& r, const std::string& text,
                            const char* finish_reason, const Usage& u,
                            const std::string& reasoning = "", const Logprobs* lp = nullptr);

// One SSE event ("data: {...}\n\n") about choice `index`. chunk_role: a chat choice's
// first chunk, which names the assistant's role; chunk_text: new text; chunk_reasoning:
// new reasoning of a chat reply (delta.reasoning_content); chunk_finish: the choice's last
// chunk with the finish reason; chunk_usage: the usage chunk (stream_options.include_usage).
std::string chunk_role(const ResponseInfo& r, int index = 0);
std::string chunk_text(const ResponseInfo& r, const std::string& text, const Logprobs* lp = nullptr,
                       int index = 0);
std::string chunk_reasoning(const ResponseInfo& r, const std::string& text, int index = 0);
// The calls of a chat reply, whole (delta.tool_calls with index, id, type, name and
// arguments).
std::string chunk_tool_calls(const ResponseInfo& r, const std::vector<runtime::ToolCall>& calls,
                             int index = 0);
// A new id for a tool call: "call_" and 24 letters and digits.
std::string new_tool_call_id();
std::string chunk_finish(const ResponseInfo& r, const char* finish_reason,
                         const Logprobs* lp = nullptr, int index = 0);
std::string chunk_usage(const ResponseInfo& r, const Usage& u);
std::string sse_error(const std::string& error_json);
inline const char* sse_done() { return "data: [DONE]\n\n"; }

// GET /v1/models and /v1/models/{id}.
std::string models_body(const std::string& model, int64_t created);
std::string model_body(const std::string& model, int64_t created);

}  // namespace kivi::server
