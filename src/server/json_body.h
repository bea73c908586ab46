// What every request parser of the server reads first: the body as a JSON object, and
// arrays of token ids checked against the vocabulary; ApiErrors (400) otherwise.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/api_error.h"
#include "tokenizer/unicode.h"

namespace kivi::server {

// The body as a JSON object; an ApiError when it is not UTF-8, not JSON or not an object
// (`what` names what it is instead, e.g. "an array").
inline nlohmann::json json_object_body(const std::string& text,
                                       const char* (*what)(const nlohmann::json&) = nullptr) {
  if (!tok::utf8_is_valid(text)) throw ApiError(400, "the request body is not valid UTF-8");
  nlohmann::json body = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) throw ApiError(400, "the request body is not valid JSON");
  if (!body.is_object()) {
    throw ApiError(400, std::string("the request body must be a JSON object") +
                            (what ? std::string(", not ") + what(body) : std::string()));
  }
  return body;
}

// The ids of array `a`, each an integer from 0 to vocab - 1; otherwise an ApiError for
// field `param` naming the element as where[i].
inline std::vector<int> token_ids(const nlohmann::json& a, const std::string& where,
                                  const std::string& param, int vocab) {
  std::vector<int> ids;
  ids.reserve(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const nlohmann::json& v = a[i];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= vocab) {
      throw ApiError(400,
                     "'" + where + "[" + std::to_string(i) + "]' must be a token id from 0 to " +
                         std::to_string(vocab - 1),
                     param);
    }
    ids.push_back(static_cast<int>(v.get<int64_t>()));
  }
  return ids;
}

}  // namespace kivi::server
