// JSON Schema to GBNF: a grammar whose sentences are JSON documents valid under a schema,
// for constrained generation (OpenAI's response_format {"type": "json_schema"} and tool
// arguments). The grammar may be stricter than the schema (it never emits properties
// the schema does not declare, and bounds numbers to 16 digits) but every sentence
// validates. A validation keyword the converter does not implement is an error, never
// ignored; annotations (title, description, default, examples, ...) are ignored.
//
// Supported: type (one or a list), properties / required / additionalProperties,
// items / prefixItems / minItems / maxItems, minLength / maxLength, format (date, time,
// date-time, uuid, ipv4), enum / const, anyOf, a one-schema allOf, local $ref (recursive
// definitions included), and minimum / maximum / exclusiveMinimum / exclusiveMaximum
// (any bounds for integers, whole-number bounds for numbers).
//
// Keys keep the schema's order only when it is read into nlohmann::ordered_json;
// nlohmann::json sorts them, and the grammar then emits properties in that order.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace kivi::grammar {

// A schema the converter cannot honour, with the JSON pointer of the place: the keyword
// at fault where there is one ("/properties/age/minimum"), else the schema ("" for the
// root).
class SchemaError : public Error {
 public:
  SchemaError(const std::string& message, std::string pointer);
  const std::string& pointer() const { return pointer_; }
  const std::string& message() const { return message_; }  // without the pointer

 private:
  std::string pointer_, message_;
};

// GBNF text (rule `root`) whose sentences are exactly (a subset of) the JSON documents
// valid under `schema`; throws SchemaError.
std::string json_schema_to_gbnf(const nlohmann::json& schema);
std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema);

// GBNF for any JSON object (response_format {"type": "json_object"}): an object at the
// top, any JSON values inside.
std::string json_object_gbnf();

}  // namespace kivi::grammar
