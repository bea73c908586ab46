// The tool fields of a chat completion request, checked, and the grammar they put on the
// reply (runtime/tool_calls.h):
//   tools                [{"type": "function", "function": {"name", "description",
//                        "parameters" (a JSON schema; absent: no arguments), "strict"}}]
//   tool_choice          "auto" (the default with tools: text, or calls held to their
//                        schemas from the moment one starts), "none" (the tools are not
//                        shown; the reply is text), "required" (calls only), or
//                        {"type": "function", "function": {"name": NAME}} (calls of NAME)
//   parallel_tool_calls  false: at most one call per reply (default true)
// and in messages, an assistant's "tool_calls" ([{"id", "type": "function", "function":
// {"name", "arguments" (a JSON object's text)}}]) and "tool" messages with the results.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/request.h"
#include "runtime/tool_calls.h"

namespace kivi::server {

struct ToolsRequest {
  enum class Choice { kAuto, kNone, kRequired, kFunction };
  std::vector<runtime::ToolFunction> tools;
  Choice choice = Choice::kAuto;
  std::string function;  // kFunction: its name
  bool parallel = true;
  // Whether the reply may hold calls (and the prompt shows the tools).
  bool active() const { return !tools.empty() && choice != Choice::kNone; }
  std::vector<std::string> names() const;
};

// From the request's body (`raw`: its text, read again to keep the schemas' key order).
// Throws ApiError naming the field.
ToolsRequest parse_tools(const nlohmann::json& body, const std::string& raw);

// An assistant message's "tool_calls" (`where`: "messages[i]"). Throws ApiError.
std::vector<runtime::ToolCall> parse_message_tool_calls(const nlohmann::json& calls,
                                                        const std::string& where);

// Puts the tools' grammar on the request: whole for "required" and a named function,
// lazy (from a call's first text) for "auto". Throws ApiError (400 invalid_schema for a
// function's parameters the converter cannot honour).
void constrain_to_tools(const ToolsRequest& t, runtime::ToolSyntax syntax,
                        runtime::GenerationRequest& gen);

}  // namespace kivi::server
