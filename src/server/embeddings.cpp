#include "server/embeddings.h"

#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "server/json_body.h"

namespace kivi::server {

namespace {

using nlohmann::json;

[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw ApiError(400, message, param);
}

}  // namespace

std::vector<std::vector<int>> parse_embeddings_request(const std::string& text,
                                                       const ApiContext& ctx) {
  const tok::Tokenizer& tk = *ctx.tokenizer;
  const json body = json_object_body(text);
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
    out.push_back(token_ids(*it, "input", "input", V));
  } else if (it->is_array() && !it->empty()) {
    for (size_t i = 0; i < it->size(); ++i) {
      const json& x = (*it)[i];
      const std::string where = "input[" + std::to_string(i) + "]";
      if (x.is_string()) {
        out.push_back(text_ids(x.get<std::string>()));
      } else if (x.is_array()) {
        out.push_back(token_ids(x, where, "input", V));
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
