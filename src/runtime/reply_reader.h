// A chat reply read as it arrives, for a client: tool calls taken out of it
// (runtime/tool_calls.h) and, in a format whose replies carry reasoning (harmony), the
// reasoning told from the answer (runtime/chat.h). Either, both or neither.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/chat.h"
#include "runtime/tool_calls.h"

namespace kivi::runtime {

class ReplyReader {
 public:
  // `reasoning`: split harmony replies. `tools`: read calls of these functions in syntax
  // `s` (none: the reply is text).
  ReplyReader(bool reasoning, ToolSyntax s, std::vector<std::string> tools);
  // What this piece of the reply releases.
  ReplyParts push(std::string_view text);
  // What is still held; calls() is complete after it.
  ReplyParts finish();
  const std::vector<ToolCall>& calls() const;

 private:
  ReplyParts parts(std::string text, bool last);
  std::unique_ptr<HarmonyReplyParser> reasoning_;
  std::unique_ptr<ToolCallParser> tools_;
  std::vector<ToolCall> none_;
};

}  // namespace kivi::runtime
