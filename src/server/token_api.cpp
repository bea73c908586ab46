#include "server/token_api.h"

#include <nlohmann/json.hpp>
#include <vector>

#include "server/api_error.h"
#include "server/json_body.h"
#include "tokenizer/unicode.h"

namespace kivi::server {

namespace {

using nlohmann::json;

bool flag(const json& body, const char* name, bool fallback) {
  const auto it = body.find(name);
  if (it == body.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) throw ApiError(400, std::string("'") + name + "' must be a boolean", name);
  return it->get<bool>();
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace

std::string tokenize_body(const std::string& text, const tok::Tokenizer& t) {
  const json body = json_object_body(text);
  const auto it = body.find("content");
  if (it == body.end() || it->is_null())
    throw ApiError(400, "'content' is required: the text to tokenize", "content");
  if (!it->is_string()) throw ApiError(400, "'content' must be a string", "content");
  const bool add_special = flag(body, "add_special", false);
  const bool parse_special = flag(body, "parse_special", true);
  const bool with_pieces = flag(body, "with_pieces", false);
  const std::vector<int> ids = t.encode(it->get<std::string>(), add_special && t.add_bos(),
                                        add_special && t.add_eos(), parse_special);
  json tokens = json::array();
  for (int id : ids) {
    if (!with_pieces) {
      tokens.push_back(id);
      continue;
    }
    const std::string piece = t.token_text(id, true);
    json p = {{"id", id}};
    if (tok::utf8_is_valid(piece)) {
      p["piece"] = piece;
    } else {
      json bytes = json::array();
      for (unsigned char c : piece) bytes.push_back(static_cast<int>(c));
      p["piece"] = bytes;
    }
    tokens.push_back(p);
  }
  return dump(json{{"tokens", tokens}});
}

std::string detokenize_body(const std::string& text, const tok::Tokenizer& t) {
  const json body = json_object_body(text);
  const auto it = body.find("tokens");
  if (it == body.end() || it->is_null())
    throw ApiError(400, "'tokens' is required: an array of token ids", "tokens");
  if (!it->is_array()) throw ApiError(400, "'tokens' must be an array of token ids", "tokens");
  const std::vector<int> ids = token_ids(*it, "tokens", "tokens", t.vocab_size());
  return dump(json{{"content", t.decode_all(ids)}});
}

}  // namespace kivi::server
