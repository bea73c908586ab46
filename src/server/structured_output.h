// Structured output: the request fields that constrain a reply's text, compiled to a
// grammar the sampler follows.
//   response_format  {"type": "text"} (nothing), {"type": "json_object"} (any JSON
//                    object), {"type": "json_schema", "json_schema": {"name": ...,
//                    "schema": {...}, "strict": ...}} (a document valid under the schema);
//   grammar          a GBNF grammar (llama.cpp's field);
//   json_schema      a JSON schema (llama.cpp's field).
// At most one of them. A grammar or schema that does not compile is a 400 whose message
// gives the line and column (GBNF) or the JSON pointer (schema) of the problem.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>

#include "grammar/gbnf.h"

namespace kivi::server {

// The request's grammar, or null when it asks for free text; `raw` is the body's text
// (a schema is read from it again to keep its key order). Throws ApiError.
std::shared_ptr<const grammar::Grammar> parse_structured_output(const nlohmann::json& body,
                                                                const std::string& raw);

}  // namespace kivi::server
