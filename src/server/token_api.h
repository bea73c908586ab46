// POST /tokenize and POST /detokenize, as llama-server answers them: text to the model's
// token ids and back, for clients that count or budget tokens.
//   /tokenize    {"content": TEXT, "add_special": false, "parse_special": true,
//                 "with_pieces": false}
//                -> {"tokens": [ID, ...]}, or with pieces [{"id": ID, "piece": TEXT}, ...]
//                   (a piece that is not whole UTF-8, part of a character, is its bytes:
//                   [B, ...]). add_special adds BOS/EOS as the vocabulary asks;
//                   parse_special recognizes control tokens written in the text.
//   /detokenize  {"tokens": [ID, ...]} -> {"content": TEXT}
// A body that is not a JSON object, a missing or mistyped field, or an id outside the
// vocabulary is an ApiError (400) naming the field; other fields are ignored.
#pragma once

#include <string>

#include "tokenizer/tokenizer.h"

namespace kivi::server {

// The response bodies; throw ApiError.
std::string tokenize_body(const std::string& body, const tok::Tokenizer& t);
std::string detokenize_body(const std::string& body, const tok::Tokenizer& t);

}  // namespace kivi::server
