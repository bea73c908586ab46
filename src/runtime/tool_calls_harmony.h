// harmony's side of runtime/tool_calls.h: the texts its generic functions give for
// ToolSyntax::kHarmony.
#pragma once

#include <string>
#include <vector>

#include "runtime/tool_calls.h"

namespace kivi::runtime {

// The developer message's "# Tools" section: "## functions", the namespace of the
// functions' types, "} // namespace functions".
std::string harmony_tools_section(const std::vector<ToolFunction>& tools);
// A reply with calls as rendered text (harmony_reply_with_calls' tokens decoded).
std::string harmony_calls_text(const std::string& content, const std::vector<ToolCall>& calls);
// The grammar of a call from the reply's start or from the trigger " to=functions."
// (the recipient, then the rest of the header, then the arguments): `names[i]` with the
// rule `arg_roots[i]` (a JSON schema's root rule); the rules themselves come after.
std::string harmony_calls_root(const std::vector<std::string>& names,
                               const std::vector<std::string>& arg_roots);

}  // namespace kivi::runtime
