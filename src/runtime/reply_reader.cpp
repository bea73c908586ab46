#include "runtime/reply_reader.h"

namespace kivi::runtime {

ReplyReader::ReplyReader(bool reasoning, ToolSyntax s, std::vector<std::string> tools) {
  if (reasoning) reasoning_ = std::make_unique<HarmonyReplyParser>();
  if (!tools.empty()) tools_ = std::make_unique<ToolCallParser>(s, std::move(tools));
}

ReplyParts ReplyReader::parts(std::string text, bool last) {
  ReplyParts out;
  if (!reasoning_) {
    out.content = std::move(text);
    return out;
  }
  out = reasoning_->push(text);
  if (last) {
    const ReplyParts rest = reasoning_->finish();
    out.reasoning += rest.reasoning;
    out.content += rest.content;
  }
  return out;
}

ReplyParts ReplyReader::push(std::string_view text) {
  return parts(tools_ ? tools_->push(text) : std::string(text), false);
}

ReplyParts ReplyReader::finish() { return parts(tools_ ? tools_->finish() : std::string(), true); }

const std::vector<ToolCall>& ReplyReader::calls() const { return tools_ ? tools_->calls() : none_; }

}  // namespace kivi::runtime
