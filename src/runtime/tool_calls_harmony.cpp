// harmony's tool syntax (gpt-oss): the functions as a TypeScript namespace in the developer
// message, calls as commentary messages to "functions.NAME", results as messages from the
// function. The texts follow gpt-oss's chat template (render_tool_namespace,
// render_typescript_type) and OpenAI's harmony guide.
#include "runtime/tool_calls_harmony.h"

#include <algorithm>

#include "core/error.h"
#include "runtime/tool_calls.h"

namespace kivi::runtime {

namespace {

using nlohmann::ordered_json;

constexpr std::string_view kMessage = "<|message|>";

std::string text_of(const ordered_json& v) {
  return v.is_string() ? v.get<std::string>() : v.dump(-1, ' ', false);
}

std::string join(const std::vector<std::string>& parts, const char* sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? sep : "") + parts[i];
  return out;
}

// A call's header after the assistant's: the channel, the recipient, the content type.
std::string call_header(const std::string& name) {
  return "<|channel|>commentary to=functions." + name + " <|constrain|>json<|message|>";
}

// A result's text as the template writes it (message.content|tojson: a JSON string).
std::string result_json(const std::string& result) { return python_json(ordered_json(result)); }

}  // namespace

std::string typescript_type(const ordered_json& s) {
  if (!s.is_object()) return "any";
  const ordered_json* type = s.contains("type") ? &s["type"] : nullptr;
  const bool nullable = s.contains("nullable") && s["nullable"] == true;
  if (type && *type == "array") {
    std::string out = "any[]";
    if (s.contains("items") && s["items"].is_object()) {
      const ordered_json& items = s["items"];
      const std::string it = items.contains("type") ? text_of(items["type"]) : "";
      if (it == "string" || it == "boolean") {
        out = it + "[]";
      } else if (it == "number" || it == "integer") {
        out = "number[]";
      } else {
        const std::string inner = typescript_type(items);
        out = inner == "object | object" || inner.size() > 50 ? "any[]" : inner + "[]";
      }
    }
    return nullable ? out + " | null" : out;
  }
  if (type && type->is_array() && !type->empty()) {
    std::vector<std::string> names;
    for (const ordered_json& t : *type) names.push_back(text_of(t));
    return join(names, " | ");
  }
  if (s.contains("oneOf") && s["oneOf"].is_array() && !s["oneOf"].empty()) {
    const ordered_json& variants = s["oneOf"];
    const bool objects = std::any_of(variants.begin(), variants.end(), [](const ordered_json& v) {
      return v.is_object() && v.value("type", ordered_json()) == "object";
    });
    if (objects && variants.size() > 1) return "any";
    std::vector<std::string> names;
    for (const ordered_json& v : variants) names.push_back(typescript_type(v));
    return join(names, " | ");
  }
  if (type && *type == "string") {
    if (s.contains("enum") && s["enum"].is_array() && !s["enum"].empty()) {
      std::vector<std::string> values;
      for (const ordered_json& v : s["enum"]) values.push_back("\"" + text_of(v) + "\"");
      return join(values, " | ");
    }
    return nullable ? "string | null" : "string";
  }
  if (type && (*type == "number" || *type == "integer")) return "number";
  if (type && *type == "boolean") return "boolean";
  if (type && *type == "object") {
    if (!s.contains("properties") || !s["properties"].is_object() || s["properties"].empty())
      return "object";
    const ordered_json required = s.value("required", ordered_json::array());
    std::vector<std::string> props;
    for (const auto& [name, spec] : s["properties"].items()) {
      const bool req = std::find(required.begin(), required.end(), name) != required.end();
      props.push_back(name + (req ? "" : "?") + ": " + typescript_type(spec));
    }
    return "{\n" + join(props, ", ") + "}";
  }
  return "any";
}

std::string harmony_function_type(const ordered_json& p) {
  if (!p.is_object() || !p.contains("properties") || !p["properties"].is_object() ||
      p["properties"].empty()) {
    return "() => any";
  }
  const ordered_json required = p.value("required", ordered_json::array());
  std::string out = "(_: {\n";
  for (const auto& [name, spec] : p["properties"].items()) {
    if (spec.is_object() && spec.contains("description") && spec["description"].is_string())
      out += "// " + spec["description"].get<std::string>() + "\n";
    const bool req = std::find(required.begin(), required.end(), name) != required.end();
    out += name + (req ? "" : "?") + ": " + typescript_type(spec);
    if (spec.is_object() && spec.contains("default")) {
      const ordered_json& d = spec["default"];
      if (spec.contains("enum")) {
        out += ", // default: " + text_of(d);
      } else if (spec.contains("oneOf")) {
        out += "// default: " + text_of(d);
      } else {
        out += ", // default: " + python_json(d);
      }
    }
    out += ",\n";
  }
  return out + "}) => any";
}

std::string harmony_tools_section(const std::vector<ToolFunction>& tools) {
  std::string out = "# Tools\n\n## functions\n\nnamespace functions {\n\n";
  for (const ToolFunction& t : tools) {
    const ordered_json& f = t.tool.contains("function") ? t.tool["function"] : t.tool;
    if (f.contains("description") && f["description"].is_string())
      out += "// " + f["description"].get<std::string>() + "\n";
    out += "type " + t.name + " = " + harmony_function_type(t.parameters) + ";\n\n";
  }
  return out + "} // namespace functions";
}

std::string harmony_calls_text(const std::string& content, const std::vector<ToolCall>& calls) {
  std::string out;
  if (!content.empty())
    out = "<|channel|>analysis<|message|>" + content + "<|end|><|start|>assistant";
  for (size_t i = 0; i < calls.size(); ++i) {
    if (i) out += "<|call|><|start|>assistant";
    out += call_header(calls[i].name) + calls[i].arguments;
  }
  return out;
}

std::vector<int> harmony_reply_with_calls(const tok::Tokenizer& tk, const std::string& content,
                                          const std::vector<ToolCall>& calls) {
  std::vector<std::string> keep;
  keep.reserve(2 * calls.size() + 1);
  std::vector<tok::TextSegment> seg;
  if (!content.empty()) {
    seg.push_back({"<|channel|>analysis<|message|>", true});
    seg.push_back({content, false});
    seg.push_back({"<|end|><|start|>assistant", true});
  }
  for (size_t i = 0; i < calls.size(); ++i) {
    if (!valid_function_name(calls[i].name))
      fail("tool function name '%s' is not valid", calls[i].name.c_str());
    keep.push_back((i ? "<|call|><|start|>assistant" : "") + call_header(calls[i].name));
    seg.push_back({keep.back(), true});
    seg.push_back({calls[i].arguments, false});
  }
  return tk.encode_segments(seg);
}

std::vector<int> harmony_tool_results(const tok::Tokenizer& tk, const std::vector<ToolCall>& calls,
                                      const std::vector<std::string>& results) {
  if (calls.empty()) fail("internal: tool results without calls");
  std::vector<std::string> keep;
  keep.reserve(2 * results.size());
  std::vector<tok::TextSegment> seg = {{"<|call|>", true}};
  for (size_t i = 0; i < results.size(); ++i) {
    const ToolCall& c = calls[std::min(i, calls.size() - 1)];
    if (!valid_function_name(c.name)) fail("tool function name '%s' is not valid", c.name.c_str());
    keep.push_back("<|start|>functions." + c.name +
                   " to=assistant<|channel|>commentary<|message|>");
    seg.push_back({keep.back(), true});
    keep.push_back(result_json(results[i]));
    seg.push_back({keep.back(), false});
    seg.push_back({"<|end|>", true});
  }
  seg.push_back({"<|start|>assistant", true});
  return tk.encode_segments(seg);
}

std::string harmony_calls_root(const std::vector<std::string>& names,
                               const std::vector<std::string>& arg_roots) {
  std::string calls;
  for (size_t i = 0; i < names.size(); ++i)
    calls += std::string(i ? " | " : "") + "\"" + names[i] + "\" tail " + arg_roots[i];
  // From the reply's start the channel may come first; after the recipient the channel
  // (when the recipient came first), the content type and <|message|>.
  return "root ::= \"<|channel|>commentary\"? call\n"
         "call ::= \" to=functions.\" (" +
         calls +
         ")\n"
         "tail ::= \"<|channel|>commentary\"? content-type? \"<|message|>\"\n"
         "content-type ::= \" \" \"<|constrain|>\"? \"json\" | \"<|constrain|>json\"\n";
}

bool ToolCallParser::parse_harmony_call(std::string_view text) {
  static constexpr std::string_view kTo = "to=functions.";
  const size_t to = text.find(kTo);
  const size_t msg = text.find(kMessage);
  if (to == std::string_view::npos || msg == std::string_view::npos || msg < to) return false;
  size_t e = to + kTo.size();
  while (e < msg && text[e] != ' ' && text[e] != '<') ++e;
  ToolCall c;
  c.name = std::string(text.substr(to + kTo.size(), e - to - kTo.size()));
  std::string_view args = text.substr(msg + kMessage.size());
  const size_t b = args.find_first_not_of(" \t\r\n");
  args = b == std::string_view::npos ? std::string_view() : args.substr(b);
  while (!args.empty() && (args.back() == ' ' || args.back() == '\n' || args.back() == '\t' ||
                           args.back() == '\r')) {
    args.remove_suffix(1);
  }
  const ordered_json v = ordered_json::parse(args, nullptr, false);
  if (v.is_discarded() || !v.is_object() || !known(c.name)) return false;
  c.arguments = std::string(args);
  calls_.push_back(std::move(c));
  return true;
}

std::string ToolCallParser::push_harmony() {
  // Release text up to each message's header; hold a header until its <|message|>, and
  // everything from a header that addresses a function.
  static constexpr std::string_view kOpens[] = {"<|start|>", "<|channel|>"};
  std::string out;
  for (;;) {
    if (in_header_) {
      const size_t m = held_.find(kMessage);
      if (m == std::string::npos) return out;
      if (std::string_view(held_).substr(0, m).find("to=functions.") != std::string_view::npos) {
        in_calls_ = true;
        return out;
      }
      out += held_.substr(0, m + kMessage.size());
      held_.erase(0, m + kMessage.size());
      in_header_ = false;
    }
    size_t at = std::string::npos;
    for (std::string_view o : kOpens) at = std::min(at, held_.find(o));
    if (at != std::string::npos) {
      out += held_.substr(0, at);
      held_.erase(0, at);
      in_header_ = true;
      continue;
    }
    // No header opens: release all but a possible marker's start at the end.
    size_t cut = held_.size();
    const size_t lt = held_.rfind('<');
    if (lt != std::string::npos) {
      const std::string_view tail = std::string_view(held_).substr(lt);
      for (std::string_view o : kOpens)
        if (tail.size() < o.size() && o.substr(0, tail.size()) == tail) cut = lt;
    }
    out += held_.substr(0, cut);
    held_.erase(0, cut);
    return out;
  }
}

}  // namespace kivi::runtime
