// Request bodies of the server: the first byte picks the endpoint (bits 1-2: 0 the
// OpenAI generation endpoints, bit 0 completions or chat; 2 /tokenize, 4 /detokenize,
// 6 /v1/embeddings), the rest is the body. Every input must give a request within the
// context (ids within the vocabulary) or an ApiError; anything else (a crash, a
// sanitizer report, another exception) is a failure.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "server/api_error.h"
#include "server/embeddings.h"
#include "server/messages.h"
#include "server/openai_request.h"
#include "server/token_api.h"
#include "tokenizer/tokenizer.h"

namespace {

// A SentencePiece-style vocabulary: control tokens, the 256 byte pieces, a few words.
const kivi::tok::Tokenizer& tokenizer() {
  static const kivi::tok::Tokenizer tk = [] {
    std::vector<std::string> pieces = {"<unk>", "<s>", "</s>"};
    std::vector<kivi::tok::TokenType> types = {kivi::tok::TokenType::kUnknown,
                                               kivi::tok::TokenType::kControl,
                                               kivi::tok::TokenType::kControl};
    char buf[8];
    for (int b = 0; b < 256; ++b) {
      std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
      pieces.push_back(buf);
      types.push_back(kivi::tok::TokenType::kByte);
    }
    for (const char* w : {"\xE2\x96\x81", "a",
                          "\xE2\x96\x81"
                          "a",
                          "User", ":",
                          "\xE2\x96\x81"
                          "the"}) {
      pieces.push_back(w);
      types.push_back(kivi::tok::TokenType::kNormal);
    }
    std::vector<float> scores(pieces.size());
    for (size_t i = 0; i < scores.size(); ++i) scores[i] = static_cast<float>(i % 7);
    return kivi::tok::Tokenizer(pieces, scores, types, 1, 2, 0);
  }();
  return tk;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static const kivi::server::ChatFormatter chat(tokenizer(), "plain");
  kivi::server::ApiContext ctx;
  ctx.tokenizer = &tokenizer();
  ctx.chat = &chat;
  ctx.model_id = "m";
  ctx.ctx = 64;
  const auto e = data[0] & 1 ? kivi::server::Endpoint::kChat : kivi::server::Endpoint::kCompletions;
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    switch (data[0] & 6) {
      case 2:
        (void)kivi::server::tokenize_body(body, tokenizer());
        return 0;
      case 4:
        (void)kivi::server::detokenize_body(body, tokenizer());
        return 0;
      case 6: {
        for (const auto& ids : kivi::server::parse_embeddings_request(body, ctx)) {
          if (ids.empty() || static_cast<int>(ids.size()) > ctx.ctx) __builtin_trap();
          for (int id : ids) {
            if (id < 0 || id >= tokenizer().vocab_size()) __builtin_trap();
          }
        }
        return 0;
      }
      default:
        break;
    }
    const auto r = kivi::server::parse_request(e, body, ctx);
    const int n = static_cast<int>(r.gen.prompt.size());
    if (n < 1 || n >= ctx.ctx || r.gen.max_tokens < 1 || n + r.gen.max_tokens > ctx.ctx)
      __builtin_trap();
    for (int id : r.gen.prompt) {
      if (id < 0 || id >= tokenizer().vocab_size()) __builtin_trap();
    }
  } catch (const kivi::server::ApiError& err) {
    if (err.status() < 400 || err.status() > 599) __builtin_trap();
    (void)err.json();
  } catch (const kivi::Error&) {
  }
  return 0;
}
