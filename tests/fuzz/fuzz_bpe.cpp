// Byte-level BPE: the loader and the encoder. The first byte picks the mode:
//   even: the rest is a tokenizer.json text, loaded (parse, merges, pre-tokenizer) and
//         used to encode a fixed text;
//   odd:  a vocabulary is built from the input (the pre-tokenizer, up to 63 merges of
//         existing tokens, a control and a user-defined token), and the rest is encoded.
//         Besides crashes, it checks that every id is in range, that the tokens' texts
//         join to the (UTF-8-repaired) input, and that streaming decode gives the same.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace {

using kivi::tok::Tokenizer;
using kivi::tok::TokenType;

void check(const Tokenizer& tk, const std::string& text, bool parse_special, bool exact) {
  const auto ids = tk.encode(text, true, true, parse_special);
  std::string joined, streamed;
  kivi::tok::StreamDecoder s(tk);
  for (size_t i = 0; i < ids.size(); ++i) {
    const int id = ids[i];
    if (id < -1 || id >= tk.vocab_size()) __builtin_trap();
    if (id < 0) continue;
    const bool edge = (i == 0 && id == tk.bos_id()) || (i + 1 == ids.size() && id == tk.eos_id());
    if (!edge) joined += tk.token_text(id, true);
    streamed += s.push(id);
  }
  streamed += s.flush();
  if (!kivi::tok::utf8_is_valid(streamed)) __builtin_trap();
  if (exact && joined != kivi::tok::utf8_sanitize(text)) __builtin_trap();
}

void structured(const uint8_t* data, size_t size) {
  static const char* kPre[] = {"llama-bpe", "qwen2", "gpt-2", "default"};
  if (size < 3) return;
  const std::string pre = kPre[data[0] % 4];
  const int n_merges = data[1] % 64;
  size_t p = 2;
  std::vector<std::string> pieces;
  for (int b = 0; b < 256; ++b)
    pieces.push_back(kivi::tok::byte_to_unicode(static_cast<uint8_t>(b)));
  std::vector<std::string> merges;
  for (int m = 0; m < n_merges && p + 1 < size; ++m, p += 2) {
    const std::string& l = pieces[data[p] % pieces.size()];
    const std::string& r = pieces[data[p + 1] % pieces.size()];
    merges.push_back(l + " " + r);
    bool have = false;
    for (const auto& q : pieces) have = have || q == l + r;
    if (!have) pieces.push_back(l + r);
  }
  if (merges.empty()) merges.push_back(pieces['a'] + " " + pieces['b']), pieces.push_back("ab");
  std::vector<TokenType> types(pieces.size(), TokenType::kNormal);
  pieces.push_back("<|c|>");
  types.push_back(TokenType::kControl);
  pieces.push_back("<u>");
  types.push_back(TokenType::kUserDefined);
  const int n = static_cast<int>(pieces.size());
  auto tk = Tokenizer::byte_level_bpe(pieces, types, merges, pre, n - 2, n - 2, "fuzz");
  const std::string text(reinterpret_cast<const char*>(data + p), size - p);
  const bool nfc = pre == "qwen2";  // NFC may change the text; only validity is checked then
  check(tk, text, false, !nfc);
  check(tk, text, true, !nfc);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  try {
    if (data[0] & 1) {
      structured(data + 1, size - 1);
    } else {
      const std::string_view json(reinterpret_cast<const char*>(data + 1), size - 1);
      const auto v = kivi::tok::parse_hf_tokenizer(json, "", "fuzz.json");
      const auto tk = v.tokenizer("fuzz.json");
      check(tk, "Hello, world! 12345 \xC3\xA9\xF0\x9F\x98\x80 <|im_end|>\n\n  x", true, false);
    }
  } catch (const kivi::Error&) {
  }
  return 0;
}
