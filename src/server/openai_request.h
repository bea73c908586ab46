// OpenAI request bodies (POST /v1/completions, POST /v1/chat/completions) read into a
// generation request, with every field checked: a body that is not UTF-8 or not JSON,
// a field of the wrong type or out of range, an unknown model, a prompt longer than
// the context or max_tokens beyond it, a feature this server does not implement
// (best_of, suffix, ...) are ApiErrors naming the field. Unknown fields are
// ignored, as OpenAI's clients send fields servers may not know.
//
// Fields: model, prompt (a string, one string in an array, or token ids) or messages,
// max_tokens (chat: also max_completion_tokens), temperature, top_p, top_k, seed, stop
// (a string or up to 4), n (1), stream, stream_options.include_usage, ignore_eos,
// logprobs (chat: a boolean, with top_logprobs 0 to 20; completions: 0 to 5 alternatives),
// structured output (server/structured_output.h), tools (chat: server/tool_request.h).
// Defaults: max_tokens 16 for completions (OpenAI's), the rest of the context for
// chat; temperature 1, top_p 1, top_k off; a random seed.
#pragma once

#include <string>

#include "runtime/request.h"
#include "server/messages.h"
#include "server/tool_request.h"
#include "tokenizer/tokenizer.h"

namespace kivi::server {

enum class Endpoint { kCompletions, kChat };

struct ApiContext {
  const tok::Tokenizer* tokenizer = nullptr;
  const ChatFormatter* chat = nullptr;
  std::string model_id;     // the name clients use in `model`
  int ctx = 0;              // tokens per sequence
  int64_t pool_tokens = 0;  // tokens the KV pool holds; 0: no limit beside ctx
};

// Most choices one request may ask for (each is a sequence of its own in the batch).
constexpr int kMaxChoices = 16;

struct ParsedRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  runtime::GenerationRequest gen;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with usage
  int n = 1;                   // choices: n sequences from the one prompt (seeds seed + i)
  ToolsRequest tools;          // chat: the functions the reply may call
  runtime::ToolSyntax tool_syntax = runtime::ToolSyntax::kHermes;  // when tools.active()
};

// Throws ApiError.
ParsedRequest parse_request(Endpoint e, const std::string& body, const ApiContext& ctx);

}  // namespace kivi::server
