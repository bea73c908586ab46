#include "server/embeddings.h"

#include <cstdint>
#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "tokenizer/unicode.h"

namespace kivi::server {

namespace {

using nlohmann::json;

[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw ApiError(400, message, param);
}

// Token ids of one input given as ids, each checked.
std::vector<int> ids_of(const json& a, const std::string& where, int vocab) {
  std::vector<int> ids;
  for (size_t i = 0; i < a.size(); ++i) {
    const json& v = a[i];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= vocab) {
      bad("input", "'" + where + "[" + std::to_string(i) + "]' must be a token id from 0 to " +
                       std::to_string(vocab - 1));
    }
    ids.push_back(static_cast<int>(v.get<int64_t>()));
  }
  return ids;
}

}  // namespace

std::vector<std::vector<int>> parse_embeddings_request(const std::string& text,
                                                       const ApiContext& ctx) {
  const tok::Tokenizer& tk = *ctx.tokenizer;
  if (!tok::utf8_is_valid(text)) throw ApiError(400, "the request body is not valid UTF-8");
  const json body = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) throw ApiError(400, "the request body is not valid JSON");
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
  if (body.contains("model") && !body["model"].is_null()) {
    if (!body["model"].is_string()) bad("model", "'model' must be a string");
    if (body["model"].get<std::string>() != ctx.model_id) {
      throw ApiError(404, "The model '" + body["model"].get<std::string>() + "' does not exist",
                     "model", "model_not_found");
    }
  }
  if (body.contains("encoding_format") && !body["encoding_format"].is_null() &&
      body["encoding_format"] != "float") {
    bad("encoding_format", "'encoding_format' must be \"float\": base64 is not supported");
  }
  if (body.contains("dimensions") && !body["dimensions"].is_null()) {
    bad("dimensions", "'dimensions' is not supported: embeddings have the model's width");
  }
  const auto it = body.find("input");
  if (it == body.end() || it->is_null()) bad("input", "'input' is required");
  std::vector<std::vector<int>> out;
  const int V = tk.vocab_size();
  auto text_ids = [&](const std::string& s) { return tk.encode(s, tk.add_bos()); };
  if (it->is_string()) {
    out.push_back(text_ids(it->get<std::string>()));
  } else if (it->is_array() && !it->empty() && (*it)[0].is_number()) {
    out.push_back(ids_of(*it, "input", V));
  } else if (it->is_array() && !it->empty()) {
    for (size_t i = 0; i < it->size(); ++i) {
      const json& x = (*it)[i];
      const std::string where = "input[" + std::to_string(i) + "]";
      if (x.is_string()) {
        out.push_back(text_ids(x.get<std::string>()));
      } else if (x.is_array()) {
        out.push_back(ids_of(x, where, V));
      } else {
        bad("input", "'" + where + "' must be a string or an array of token ids");
      }
    }
  } else {
    bad("input", "'input' must be a string, an array of strings or token ids, not empty");
  }
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i].empty()) bad("input", "input " + std::to_string(i) + " has no tokens");
    if (static_cast<int>(out[i].size()) > ctx.ctx) {
      throw ApiError(400,
                     "input " + std::to_string(i) + " has " + std::to_string(out[i].size()) +
                         " tokens, more than the context of " + std::to_string(ctx.ctx),
                     "input", "context_length_exceeded");
    }
  }
  return out;
}

std::string embeddings_body(const std::vector<std::vector<float>>& embeddings,
                            const std::string& model, int prompt_tokens) {
  json data = json::array();
  for (size_t i = 0; i < embeddings.size(); ++i) {
    data.push_back({{"object", "embedding"}, {"index", i}, {"embedding", embeddings[i]}});
  }
  return json{{"object", "list"},
              {"data", data},
              {"model", model},
              {"usage", {{"prompt_tokens", prompt_tokens}, {"total_tokens", prompt_tokens}}}}
      .dump();
}

}  // namespace kivi::server
