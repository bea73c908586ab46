#include "server/tool_request.h"

#include <set>

#include "core/error.h"
#include "grammar/gbnf.h"
#include "grammar/json_schema.h"
#include "server/api_error.h"

namespace kivi::server {

namespace {

using nlohmann::json;
using nlohmann::ordered_json;

[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw ApiError(400, message, param);
}

// A member, or null when absent or JSON null.
template <class Json>
const Json* member(const Json& o, const char* name) {
  const auto it = o.find(name);
  if (it == o.end() || it->is_null()) return nullptr;
  return &*it;
}

template <class Json>
std::string string_member(const Json& o, const char* name, const std::string& where) {
  const Json* v = member(o, name);
  if (!v || !v->is_string())
    bad(where + "." + name, "'" + where + "." + name + "' must be a string");
  return v->template get<std::string>();
}

void check_name(const std::string& name, const std::string& param) {
  if (!runtime::valid_function_name(name)) {
    bad(param, "'" + param + "' = '" + name +
                   "' is not a valid function name (1 to 64 letters, digits, '_', '-' or '.')");
  }
}

}  // namespace

std::vector<std::string> ToolsRequest::names() const {
  std::vector<std::string> out;
  for (const auto& t : tools) out.push_back(t.name);
  return out;
}

ToolsRequest parse_tools(const json& body, const std::string& raw) {
  ToolsRequest r;
  if (member(body, "functions") || member(body, "function_call")) {
    bad(member(body, "functions") ? "functions" : "function_call",
        "'functions' and 'function_call' are deprecated and not supported; use 'tools' and "
        "'tool_choice'");
  }
  if (const json* tools = member(body, "tools")) {
    if (!tools->is_array()) bad("tools", "'tools' must be an array");
    // The schemas in their own key order, so arguments follow the order they declare.
    const ordered_json ordered = ordered_json::parse(raw)["tools"];
    std::set<std::string> seen;
    for (size_t i = 0; i < ordered.size(); ++i) {
      const std::string where = strfmt("tools[%zu]", i);
      const ordered_json& t = ordered[i];
      if (!t.is_object()) bad(where, "'" + where + "' must be an object");
      if (string_member(t, "type", where) != "function") {
        bad(where + ".type", "'" + where + ".type' must be \"function\"");
      }
      const ordered_json* f = member(t, "function");
      if (!f || !f->is_object()) {
        bad(where + ".function", "'" + where + ".function' must be an object");
      }
      runtime::ToolFunction fn;
      fn.name = string_member(*f, "name", where + ".function");
      check_name(fn.name, where + ".function.name");
      if (!seen.insert(fn.name).second) {
        bad(where + ".function.name",
            "'" + where + ".function.name': '" + fn.name + "' is the name of an earlier tool too");
      }
      if (const ordered_json* d = member(*f, "description"); d && !d->is_string()) {
        bad(where + ".function.description",
            "'" + where + ".function.description' must be a string");
      }
      if (const ordered_json* s = member(*f, "strict"); s && !s->is_boolean()) {
        bad(where + ".function.strict", "'" + where + ".function.strict' must be a boolean");
      }
      if (const ordered_json* p = member(*f, "parameters")) {
        if (!p->is_object()) {
          bad(where + ".function.parameters",
              "'" + where + ".function.parameters' must be a JSON schema (an object)");
        }
        fn.parameters = *p;
      } else {  // no parameters: a function of no arguments
        fn.parameters = {{"type", "object"},
                         {"properties", ordered_json::object()},
                         {"additionalProperties", false}};
      }
      fn.tool = t;
      r.tools.push_back(std::move(fn));
    }
  }
  if (const json* c = member(body, "tool_choice")) {
    if (c->is_string()) {
      const std::string s = c->get<std::string>();
      if (s == "auto") {
        r.choice = ToolsRequest::Choice::kAuto;
      } else if (s == "none") {
        r.choice = ToolsRequest::Choice::kNone;
      } else if (s == "required") {
        r.choice = ToolsRequest::Choice::kRequired;
      } else {
        bad("tool_choice",
            "'tool_choice' = '" + s + "' is not supported (auto, none, required, or a function)");
      }
    } else if (c->is_object()) {
      if (string_member(*c, "type", "tool_choice") != "function")
        bad("tool_choice.type", "'tool_choice.type' must be \"function\"");
      const json* f = member(*c, "function");
      if (!f || !f->is_object())
        bad("tool_choice.function", "'tool_choice.function' must be an object");
      r.choice = ToolsRequest::Choice::kFunction;
      r.function = string_member(*f, "name", "tool_choice.function");
      bool found = false;
      for (const auto& t : r.tools) found = found || t.name == r.function;
      if (!found) {
        bad("tool_choice.function.name",
            "'tool_choice.function.name' = '" + r.function + "' is not one of the tools");
      }
    } else {
      bad("tool_choice", "'tool_choice' must be a string or an object");
    }
    if (r.tools.empty() && (r.choice == ToolsRequest::Choice::kRequired ||
                            r.choice == ToolsRequest::Choice::kFunction)) {
      bad("tool_choice", "'tool_choice' asks for a tool call but 'tools' is empty");
    }
  }
  if (const json* p = member(body, "parallel_tool_calls")) {
    if (!p->is_boolean()) bad("parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
    r.parallel = p->get<bool>();
  }
  return r;
}

std::vector<runtime::ToolCall> parse_message_tool_calls(const json& calls,
                                                        const std::string& where) {
  const std::string param = where + ".tool_calls";
  if (!calls.is_array()) bad(param, "'" + param + "' must be an array");
  std::vector<runtime::ToolCall> out;
  for (size_t i = 0; i < calls.size(); ++i) {
    const std::string w = strfmt("%s[%zu]", param.c_str(), i);
    const json& c = calls[i];
    if (!c.is_object()) bad(w, "'" + w + "' must be an object");
    if (const json* t = member(c, "type"); t && (!t->is_string() || *t != "function"))
      bad(w + ".type", "'" + w + ".type' must be \"function\"");
    const json* f = member(c, "function");
    if (!f || !f->is_object()) bad(w + ".function", "'" + w + ".function' must be an object");
    runtime::ToolCall call;
    if (const json* id = member(c, "id")) {
      if (!id->is_string()) bad(w + ".id", "'" + w + ".id' must be a string");
      call.id = id->get<std::string>();
    }
    call.name = string_member(*f, "name", w + ".function");
    check_name(call.name, w + ".function.name");
    call.arguments = string_member(*f, "arguments", w + ".function");
    const json args = json::parse(call.arguments, nullptr, false);
    if (args.is_discarded() || !args.is_object()) {
      bad(w + ".function.arguments",
          "'" + w + ".function.arguments' must be the text of a JSON object");
    }
    out.push_back(std::move(call));
  }
  return out;
}

void constrain_to_tools(const ToolsRequest& t, runtime::ToolSyntax syntax,
                        runtime::GenerationRequest& gen) {
  if (!t.active()) return;
  if (gen.grammar) {
    bad("tools",
        "'tools' and 'response_format', 'grammar' or 'json_schema' each constrain the reply; "
        "give one of them (or tool_choice \"none\")");
  }
  std::string gbnf;
  try {
    gbnf = runtime::tool_calls_gbnf(syntax, t.tools, t.function, t.parallel);
  } catch (const grammar::SchemaError& e) {
    throw ApiError(400, "'tools': json schema at " + e.pointer() + ": " + e.message(), "tools",
                   "invalid_schema");
  }
  try {
    gen.grammar = std::make_shared<const grammar::Grammar>(grammar::Grammar::parse(gbnf));
  } catch (const grammar::GrammarError& e) {
    throw ApiError(
        500, std::string("the grammar made from the tools does not compile: ") + e.what(), "tools");
  }
  if (t.choice == ToolsRequest::Choice::kAuto)
    gen.grammar_trigger = runtime::tool_call_trigger(syntax);
  gen.grammar_markup = syntax == runtime::ToolSyntax::kHarmony;
}

}  // namespace kivi::server
