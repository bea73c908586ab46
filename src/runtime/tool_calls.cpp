#include "runtime/tool_calls.h"

#include <algorithm>
#include <optional>

#include "core/error.h"
#include "grammar/gbnf.h"
#include "grammar/json_schema.h"
#include "grammar/json_schema_rules.h"
#include "runtime/tool_calls_harmony.h"

namespace kivi::runtime {

namespace {

using nlohmann::ordered_json;

constexpr std::string_view kOpen = "<tool_call>";
constexpr std::string_view kClose = "</tool_call>";
constexpr const char* kSpace = " \t\r\n";

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

size_t skip_space(std::string_view s, size_t i) {
  while (i < s.size() && is_space(s[i])) ++i;
  return i;
}

std::string_view trim(std::string_view s) {
  const size_t b = s.find_first_not_of(kSpace);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(kSpace) - b + 1);
}

// The end of the JSON value starting at `i` (strings and nesting followed, not checked:
// the parser checks the span), or npos when it does not end.
size_t value_end(std::string_view s, size_t i) {
  int depth = 0;
  bool in_string = false;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
        if (depth == 0) return i + 1;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      if (--depth == 0) return i + 1;
      if (depth < 0) return std::string_view::npos;
    } else if (depth == 0 && (c == ',' || is_space(c))) {
      return i;  // a number, true, false or null ends here
    }
  }
  return depth == 0 && !in_string ? s.size() : std::string_view::npos;
}

// The members of a JSON object as the text of each value, when `s` is exactly one object.
std::optional<std::vector<std::pair<std::string, std::string_view>>> object_members(
    std::string_view s) {
  if (!ordered_json::accept(s)) return std::nullopt;
  std::vector<std::pair<std::string, std::string_view>> out;
  size_t i = skip_space(s, 0);
  if (i >= s.size() || s[i] != '{') return std::nullopt;
  i = skip_space(s, i + 1);
  if (i < s.size() && s[i] == '}') return out;
  for (;;) {
    const size_t key_end = value_end(s, i);
    if (key_end == std::string_view::npos) return std::nullopt;
    const std::string key = ordered_json::parse(s.substr(i, key_end - i)).get<std::string>();
    i = skip_space(s, key_end);
    if (i >= s.size() || s[i] != ':') return std::nullopt;
    i = skip_space(s, i + 1);
    const size_t end = value_end(s, i);
    if (end == std::string_view::npos) return std::nullopt;
    out.emplace_back(key, s.substr(i, end - i));
    i = skip_space(s, end);
    if (i < s.size() && s[i] == ',') {
      i = skip_space(s, i + 1);
      continue;
    }
    return out;
  }
}

}  // namespace

ToolSyntax tool_syntax(ChatFormat f) {
  if (f == ChatFormat::kHarmony) return ToolSyntax::kHarmony;
  return f == ChatFormat::kLlama3 ? ToolSyntax::kLlama3 : ToolSyntax::kHermes;
}

bool valid_function_name(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-' || c == '.';
  });
}

std::string python_json(const ordered_json& v) {
  if (v.is_object()) {
    std::string out = "{";
    bool first = true;
    for (const auto& [k, x] : v.items()) {
      out += (first ? "" : ", ") + ordered_json(k).dump(-1, ' ', false) + ": " + python_json(x);
      first = false;
    }
    return out + "}";
  }
  if (v.is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + python_json(v[i]);
    return out + "]";
  }
  return v.dump(-1, ' ', false);
}

std::string tools_instructions(ToolSyntax s, const std::vector<ToolFunction>& tools) {
  if (s == ToolSyntax::kHarmony) return harmony_tools_section(tools);
  std::string out;
  if (s == ToolSyntax::kLlama3) {
    out =
        "Given the following functions, please respond with a JSON for a function call with its "
        "proper arguments that best answers the given prompt.\n\n"
        "Respond in the format {\"name\": function name, \"parameters\": dictionary of argument "
        "name and its value}.Do not use variables.\n\n";
    for (const ToolFunction& t : tools) out += t.tool.dump(4, ' ', false) + "\n\n";
    return out;
  }
  out =
      "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
      "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
  for (const ToolFunction& t : tools) out += "\n" + python_json(t.tool);
  out +=
      "\n</tools>\n\nFor each function call, return a json object with function name and "
      "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
      "<function-name>, \"arguments\": <args-json-object>}\n</tool_call>";
  return out;
}

std::string reply_with_calls(ToolSyntax s, const std::string& content,
                             const std::vector<ToolCall>& calls) {
  if (calls.empty()) return content;
  if (s == ToolSyntax::kHarmony) return harmony_calls_text(content, calls);
  const auto name = [](const ToolCall& c) { return ordered_json(c.name).dump(-1, ' ', false); };
  if (s == ToolSyntax::kLlama3) {
    return "{\"name\": " + name(calls[0]) + ", \"parameters\": " + calls[0].arguments + "}";
  }
  std::string out = content.empty() ? "" : content + "\n";
  for (size_t i = 0; i < calls.size(); ++i) {
    out += std::string(i ? "\n" : "") + "<tool_call>\n{\"name\": " + name(calls[i]) +
           ", \"arguments\": " + calls[i].arguments + "}\n</tool_call>";
  }
  return out;
}

std::string tool_results_text(const std::vector<std::string>& results) {
  std::string out;
  for (size_t i = 0; i < results.size(); ++i)
    out += std::string(i ? "\n" : "") + "<tool_response>\n" + results[i] + "\n</tool_response>";
  return out;
}

std::string tool_calls_gbnf(ToolSyntax s, const std::vector<ToolFunction>& tools,
                            const std::string& only, bool parallel) {
  std::string rules, calls;
  std::vector<std::string> names, arg_roots;  // harmony
  for (size_t i = 0; i < tools.size(); ++i) {
    const ToolFunction& t = tools[i];
    if (!only.empty() && t.name != only) continue;
    if (!valid_function_name(t.name)) fail("tool function name '%s' is not valid", t.name.c_str());
    std::string args;
    try {
      args = grammar::json_schema_to_gbnf(t.parameters);
    } catch (const grammar::SchemaError& e) {
      throw grammar::SchemaError(e.message(),
                                 "/" + std::to_string(i) + "/function/parameters" + e.pointer());
    }
    const std::string prefix = "f" + std::to_string(i) + "-";
    rules += grammar::prefix_rule_names(args, prefix);
    names.push_back(t.name);
    arg_roots.push_back(prefix + "root");
    const std::string head = s == ToolSyntax::kLlama3
                                 ? "{\"name\": \"" + t.name + "\", \"parameters\": "
                                 : "<tool_call>\n{\"name\": \"" + t.name + "\", \"arguments\": ";
    const std::string tail = s == ToolSyntax::kLlama3 ? "}" : "}\n</tool_call>";
    calls += std::string(calls.empty() ? "" : " | ") +
             grammar::schema_rules::gbnf_literal(head, "") + " " + prefix + "root " +
             grammar::schema_rules::gbnf_literal(tail, "");
  }
  if (calls.empty()) fail("no tool function named '%s'", only.c_str());
  if (s == ToolSyntax::kHarmony) return harmony_calls_root(names, arg_roots) + rules;
  std::string root = "root ::= call";
  if (s == ToolSyntax::kHermes && parallel)
    root += " (" + grammar::schema_rules::gbnf_literal("\n", "") + " call)*";
  return root + "\ncall ::= " + calls + "\n" + rules;
}

GrammarTrigger tool_call_trigger(ToolSyntax s) {
  if (s == ToolSyntax::kLlama3) return {"{", true};
  if (s == ToolSyntax::kHarmony) return {" to=functions.", false};
  return {std::string(kOpen), false};
}

ToolCallParser::ToolCallParser(ToolSyntax s, std::vector<std::string> names)
    : s_(s), names_(std::move(names)), in_header_(s == ToolSyntax::kHarmony) {}

bool ToolCallParser::known(const std::string& name) const {
  return std::find(names_.begin(), names_.end(), name) != names_.end();
}

std::string ToolCallParser::push(std::string_view text) {
  held_ += text;
  if (in_calls_) return {};
  if (s_ == ToolSyntax::kHarmony) return push_harmony();
  std::string out;
  if (s_ == ToolSyntax::kLlama3) {
    if (!decided_) {
      const size_t b = held_.find_first_not_of(kSpace);
      if (b == std::string::npos) return {};  // white space so far: held
      decided_ = true;
      if (held_[b] == '{') {
        in_calls_ = true;
        return {};
      }
    }
    out.swap(held_);
    return out;
  }
  // hermes: release up to the white space before a call's start (or before a possible
  // start at the end).
  size_t cut = held_.find(kOpen);
  if (cut != std::string::npos) {
    in_calls_ = true;
  } else {
    cut = held_.size();
    const size_t lt = held_.rfind('<');
    if (lt != std::string::npos && held_.size() - lt < kOpen.size() &&
        kOpen.substr(0, held_.size() - lt) == std::string_view(held_).substr(lt)) {
      cut = lt;
    }
  }
  while (cut > 0 && is_space(held_[cut - 1])) --cut;
  out = held_.substr(0, cut);
  held_.erase(0, cut);
  return out;
}

std::string ToolCallParser::finish() {
  std::string out;
  if (in_calls_ && parse_calls(held_)) {
    held_.clear();
    return out;
  }
  calls_.clear();
  out.swap(held_);
  return out;
}

bool ToolCallParser::parse_calls(std::string_view text) {
  // One call's JSON object: its name, and its arguments' text.
  auto read_call = [&](std::string_view json) {
    const auto members = object_members(json);
    if (!members) return false;
    ToolCall c;
    bool have_name = false, have_args = false;
    for (const auto& [key, value] : *members) {
      if (key == "name") {
        const ordered_json v = ordered_json::parse(value);
        if (!v.is_string()) return false;
        c.name = v.get<std::string>();
        have_name = true;
      } else if (key == "arguments" || key == "parameters") {
        if (value.empty() || value[0] != '{') return false;
        c.arguments = std::string(value);
        have_args = true;
      } else {
        return false;
      }
    }
    if (!have_name || !have_args || !known(c.name)) return false;
    calls_.push_back(std::move(c));
    return true;
  };
  calls_.clear();
  if (s_ == ToolSyntax::kHarmony) return parse_harmony_call(text);
  if (s_ == ToolSyntax::kLlama3) return read_call(trim(text));
  size_t i = skip_space(text, 0);
  while (i < text.size()) {
    if (text.compare(i, kOpen.size(), kOpen) != 0) return false;
    const size_t body = i + kOpen.size();
    const size_t close = text.find(kClose, body);
    if (close == std::string_view::npos || !read_call(trim(text.substr(body, close - body))))
      return false;
    i = skip_space(text, close + kClose.size());
  }
  return !calls_.empty();
}

ReplyWithCalls parse_tool_calls(ToolSyntax s, std::vector<std::string> names,
                                std::string_view reply) {
  ToolCallParser p(s, std::move(names));
  ReplyWithCalls r;
  r.content = p.push(reply);
  r.content += p.finish();
  r.calls = p.calls();
  return r;
}

}  // namespace kivi::runtime
