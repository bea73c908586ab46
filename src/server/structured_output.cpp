#include "server/structured_output.h"

#include <string>

#include "grammar/json_schema.h"
#include "server/api_error.h"

namespace kivi::server {

namespace {

using nlohmann::json;

std::shared_ptr<const grammar::Grammar> compile(const std::string& gbnf, const char* param,
                                                const char* what) {
  try {
    return std::make_shared<const grammar::Grammar>(grammar::Grammar::parse(gbnf));
  } catch (const grammar::GrammarError& e) {
    // A grammar made from a schema that does not compile is the converter's fault.
    if (what != nullptr) throw ApiError(500, std::string(what) + ": " + e.what(), param);
    throw ApiError(400, std::string("'") + param + "': " + e.what(), param, "invalid_grammar");
  }
}

// The schema read again from the body's text in its own key order, so the grammar emits
// properties in the order the schema declares them.
std::shared_ptr<const grammar::Grammar> from_schema(const std::string& raw, const char* pointer,
                                                    const char* param) {
  std::string gbnf;
  try {
    const nlohmann::ordered_json body = nlohmann::ordered_json::parse(raw);
    gbnf = grammar::json_schema_to_gbnf(body.at(nlohmann::ordered_json::json_pointer(pointer)));
  } catch (const grammar::SchemaError& e) {
    throw ApiError(400, std::string("'") + param + "': " + e.what(), param, "invalid_schema");
  }
  return compile(gbnf, param, "the grammar made from the JSON schema does not compile");
}

}  // namespace

std::shared_ptr<const grammar::Grammar> parse_structured_output(const json& body,
                                                                const std::string& raw) {
  auto present = [&](const char* name) {
    const auto it = body.find(name);
    return it != body.end() && !it->is_null();
  };
  const json* rf = present("response_format") ? &body["response_format"] : nullptr;
  bool rf_constrains = false;
  if (rf) {
    if (!rf->is_object())
      throw ApiError(400, "'response_format' must be an object", "response_format");
    const auto t = rf->find("type");
    if (t == rf->end() || !t->is_string()) {
      throw ApiError(400, "'response_format.type' must be a string", "response_format.type");
    }
    const std::string type = t->get<std::string>();
    if (type != "text" && type != "json_object" && type != "json_schema") {
      throw ApiError(400,
                     "'response_format.type' = '" + type +
                         "' is not supported (valid: text, json_object, json_schema)",
                     "response_format.type");
    }
    rf_constrains = type != "text";
  }
  const int given = rf_constrains + present("grammar") + present("json_schema");
  if (given > 1) {
    throw ApiError(400,
                   "'response_format', 'grammar' and 'json_schema' each constrain the reply; "
                   "give one of them",
                   present("grammar") ? "grammar" : "json_schema");
  }
  if (present("grammar")) {
    const json& g = body["grammar"];
    if (!g.is_string()) throw ApiError(400, "'grammar' must be a string of GBNF", "grammar");
    return compile(g.get<std::string>(), "grammar", nullptr);
  }
  if (present("json_schema")) return from_schema(raw, "/json_schema", "json_schema");
  if (!rf_constrains) return nullptr;
  if ((*rf)["type"] == "json_object") {
    return compile(grammar::json_object_gbnf(), "response_format", "the JSON object grammar");
  }
  const auto js = rf->find("json_schema");
  if (js == rf->end() || !js->is_object()) {
    throw ApiError(400, "'response_format.json_schema' must be an object holding 'schema'",
                   "response_format.json_schema");
  }
  const auto name = js->find("name");
  if (name != js->end() && !name->is_string()) {
    throw ApiError(400, "'response_format.json_schema.name' must be a string",
                   "response_format.json_schema.name");
  }
  const auto strict = js->find("strict");
  if (strict != js->end() && !strict->is_null() && !strict->is_boolean()) {
    throw ApiError(400, "'response_format.json_schema.strict' must be a boolean",
                   "response_format.json_schema.strict");
  }
  const auto schema = js->find("schema");
  if (schema == js->end()) {
    throw ApiError(400, "'response_format.json_schema' has no 'schema'",
                   "response_format.json_schema.schema");
  }
  return from_schema(raw, "/response_format/json_schema/schema",
                     "response_format.json_schema.schema");
}

}  // namespace kivi::server
