// A chat conversation (OpenAI `messages`) written as prompt tokens. Models with a known
// chat format (llama3, chatml, gemma, phi3, harmony: runtime/chat.h, detected from the model's
// template or chosen with --chat-template) get it; other models (base models such as stories260K)
// get a plain transcript:
//   {system}\n\nUser: {user}\nAssistant: {reply}\nUser: {user}\nAssistant:
// with "\nUser:" as a stop string, so a base model's continuation ends where it starts
// writing the user's next line.
//
// Leading system (or developer) messages form the system prompt; then user and
// assistant messages alternate (consecutive messages of one role are joined with a blank
// line), and the last one is the user's. With tools (runtime/tool_calls.h) an assistant
// message may carry calls, and the results follow it as tool messages (consecutive ones
// return together); the conversation may then end with them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "runtime/chat.h"
#include "runtime/tool_calls.h"
#include "tokenizer/tokenizer.h"

namespace kivi::server {

struct ChatMessage {
  std::string role;  // system, developer, user, assistant, tool
  std::string content;
  std::vector<runtime::ToolCall> tool_calls = {};  // an assistant's calls
};

class ChatFormatter {
 public:
  // name: "llama3", "chatml", "plain", or "" for the model's own format (plain if it
  // has none that is known). Throws kivi::Error for a format the vocabulary cannot write.
  ChatFormatter(const tok::Tokenizer& tk, const std::string& name);

  const char* name() const;
  // Whether replies carry reasoning apart from the answer (harmony: runtime/chat.h's
  // HarmonyReplyParser splits them into reasoning_content and content).
  bool has_reasoning() const { return chat_ && chat_->has_reasoning(); }

  struct Prompt {
    std::vector<int> tokens;
    std::vector<int> end_tokens;    // tokens that end the reply
    std::vector<std::string> stop;  // stop strings the format implies
  };
  // The syntax of tool calls in this format; throws ApiError (400, param "tools") for a
  // format that has none.
  runtime::ToolSyntax tool_syntax() const;
  // Throws ApiError (400, param "messages") for a conversation it cannot write. `tools`
  // (may be null or empty) are shown to the model as the format's syntax does.
  Prompt format(const std::vector<ChatMessage>& messages,
                const std::vector<runtime::ToolFunction>* tools = nullptr) const;

 private:
  const tok::Tokenizer& tk_;
  std::unique_ptr<runtime::ChatPrompt> chat_;  // null: plain
  std::vector<int> end_tokens_;                // the tokens chat_ ends a reply at
};

}  // namespace kivi::server
