// SentencePiece-style BPE driven by piece scores (the tokenizer of Llama 1/2 and of
// llama2.c's models): the text gets a dummy-prefix space, spaces become U+2581,
// every character maps to its piece (or to <0xNN> byte pieces when it has none),
// then the adjacent pair whose merged piece has the highest score is merged until no
// merge applies. Ties go to the leftmost pair.
//
// Pieces are held internally in SentencePiece form ("\xE2\x96\x81" for a space);
// llama2.c tokenizer files, which store plain spaces, are converted on load.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kivi::io {
class GgufFile;
}

namespace kivi::tok {

// GGUF token types (llama.cpp's llama_token_type).
enum class TokenType : int32_t {
  kUndefined = 0, kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6,
};

inline constexpr const char* kSpaceMark = "\xE2\x96\x81";  // U+2581, SentencePiece's space

class Tokenizer {
 public:
  // From a llama2.c tokenizer file with exactly `vocab_size` tokens.
  static Tokenizer from_llama2c(const std::string& path, int vocab_size);
  static Tokenizer from_llama2c_memory(const uint8_t* data, size_t size, int vocab_size,
                                       const std::string& name);
  // From GGUF metadata (tokenizer.ggml.*). Throws "unsupported tokenizer" for models
  // other than "llama" (SentencePiece); byte-level BPE ("gpt2") is not supported yet.
  static Tokenizer from_gguf(const io::GgufFile& f, int vocab_size);
  // From pieces in SentencePiece form, scores and types (used by the above and tests).
  Tokenizer(std::vector<std::string> pieces, std::vector<float> scores,
            std::vector<TokenType> types, int bos_id, int eos_id, int unk_id);

  // Encodes UTF-8 text. add_bos prepends BOS; the dummy prefix adds a space before
  // non-empty text (SentencePiece's add_dummy_prefix).
  std::vector<int> encode(std::string_view text, bool add_bos, bool add_eos = false) const;

  // Text of `token` following `prev`: U+2581 becomes a space, the leading space of
  // the first piece after BOS is dropped, <0xNN> pieces become the raw byte, and
  // control tokens decode to nothing.
  std::string decode(int prev, int token) const;
  // Concatenated decode of a sequence (the first token's predecessor is `prev`).
  std::string decode_all(const std::vector<int>& tokens, int prev = -1) const;

  int vocab_size() const { return static_cast<int>(pieces_.size()); }
  int bos_id() const { return bos_id_; }
  int eos_id() const { return eos_id_; }
  int unk_id() const { return unk_id_; }
  bool add_dummy_prefix() const { return add_dummy_prefix_; }
  void set_add_dummy_prefix(bool b) { add_dummy_prefix_ = b; }
  const std::string& piece(int id) const { return pieces_.at(id); }
  float score(int id) const { return scores_.at(id); }
  TokenType type(int id) const { return types_.at(id); }
  const std::vector<std::string>& pieces() const { return pieces_; }
  const std::vector<float>& scores() const { return scores_; }
  const std::vector<TokenType>& types() const { return types_; }
  int n_byte_pieces() const;
  // Piece id or -1.
  int find(std::string_view piece) const;

 private:
  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::vector<TokenType> types_;
  std::unordered_map<std::string, int> index_;
  int byte_ids_[256];
  int bos_id_ = 1, eos_id_ = 2, unk_id_ = 0;
  bool add_dummy_prefix_ = true;
};

// Replaces every ' ' with U+2581 and back.
std::string to_sentencepiece(std::string_view s);
std::string from_sentencepiece(std::string_view s);

}  // namespace kivi::tok
