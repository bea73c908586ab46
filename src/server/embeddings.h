// POST /v1/embeddings (OpenAI's shape, as llama-server answers it for a generative
// model): `input` a string, an array of strings, an array of token ids or an array of
// such arrays; each becomes the unit-length mean (or, with `kivi serve --pooling last`,
// the last token's) of the model's final hidden states after its output norm.
//   {"object": "list", "data": [{"object": "embedding", "index": I, "embedding": [...]}],
//    "model": ..., "usage": {"prompt_tokens": N, "total_tokens": N}}
// Fields: input (required), model (the server's), encoding_format ("float" only),
// user (ignored); `dimensions` and anything else that changes the answer is a 400 naming
// it, as are an empty input, ids outside the vocabulary and inputs longer than the
// context.
#pragma once

#include <string>
#include <vector>

#include "server/openai_request.h"

namespace kivi::server {

// The token ids of each input (strings with BOS as the vocabulary asks); throws ApiError.
std::vector<std::vector<int>> parse_embeddings_request(const std::string& body,
                                                       const ApiContext& ctx);

std::string embeddings_body(const std::vector<std::vector<float>>& embeddings,
                            const std::string& model, int prompt_tokens);

}  // namespace kivi::server
