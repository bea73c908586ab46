// SentencePiece-style BPE driven by piece scores (the tokenizer of Llama 1/2 and of
// llama2.c's models): the text gets a dummy-prefix space, spaces become U+2581,
// every character maps to its piece (or to <0xNN> byte pieces when it has none),
// then the adjacent pair whose merged piece has the highest score is merged until no
// merge applies. Ties go to the leftmost pair.
//
// Pieces are held internally in SentencePiece form ("\xE2\x96\x81" for a space);
// llama2.c tokenizer files, which store plain spaces, are converted on load.
//
// The same class also runs byte-level BPE (GGUF "gpt2": Llama 3, Qwen2/3; bpe.h), so
// the engine sees one interface whatever the vocabulary: encode, decode, BOS/EOS/EOT.
// In both, control tokens (<|eot_id|>, <s>, ...) are recognized in text only where the
// caller asks for it (parse_special: a chat template's markup), never in user text;
// user-defined tokens (tokenizer.json's added tokens that are not special) always are.
//
// A harmony vocabulary (gpt-oss's o200k_harmony: control tokens <|return|> and <|call|>)
// is told by those two tokens, as llama.cpp tells it: a reply ends at <|return|> or
// <|call|>, and <|end|>, which only closes a message inside the reply (its reasoning),
// is not an end of generation; the markup between messages (<|start|>, <|channel|>,
// <|message|>, <|constrain|>, <|end|>) decodes to its text, so that a reply's channels
// can be told apart (runtime/chat.h). They stay control tokens: user text that spells
// them is still text.
#pragma once

#include <cstdint>
#include <memory>
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
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

inline constexpr const char* kSpaceMark = "\xE2\x96\x81";  // U+2581, SentencePiece's space

enum class TokenizerKind { kSentencePiece, kByteLevelBpe };

class BpeModel;

// Text to encode in parts: template markup (parse_special) and user text (not).
struct TextSegment {
  std::string_view text;
  bool parse_special = false;
};

class Tokenizer {
 public:
  // From a llama2.c tokenizer file with exactly `vocab_size` tokens.
  static Tokenizer from_llama2c(const std::string& path, int vocab_size);
  static Tokenizer from_llama2c_memory(const uint8_t* data, size_t size, int vocab_size,
                                       const std::string& name);
  // From GGUF metadata (tokenizer.ggml.*): "llama" (SentencePiece) or "gpt2" (byte-level
  // BPE with tokenizer.ggml.merges and tokenizer.ggml.pre). Throws kivi::Error naming
  // the key for anything missing, malformed or out of range.
  static Tokenizer from_gguf(const io::GgufFile& f, int vocab_size);
  // From pieces in SentencePiece form, scores and types (used by the above and tests).
  Tokenizer(std::vector<std::string> pieces, std::vector<float> scores,
            std::vector<TokenType> types, int bos_id, int eos_id, int unk_id);
  // Byte-level BPE from tokens in byte-level form (special tokens in plain text), their
  // types, "left right" merges in rank order and the pre-tokenizer name. `source` names
  // the origin in errors. BOS/EOS may be -1 (none).
  static Tokenizer byte_level_bpe(std::vector<std::string> pieces, std::vector<TokenType> types,
                                  const std::vector<std::string>& merges, const std::string& pre,
                                  int bos_id, int eos_id, const std::string& source);

  // Encodes UTF-8 text. add_bos prepends BOS, add_eos appends EOS (callers pass
  // add_bos() for "as the vocabulary asks": SentencePiece and Llama 3 want BOS, Qwen
  // does not). SentencePiece's dummy prefix adds a space before non-empty text.
  // parse_special recognizes control tokens written in the text.
  std::vector<int> encode(std::string_view text, bool add_bos, bool add_eos = false,
                          bool parse_special = false) const;
  // Encodes text that continues an earlier one (a follow-up after a saved cache; no
  // BOS). SentencePiece starts every text with a word boundary (its dummy prefix), which
  // stands for a space the follow-up already begins with: " there was" and "there was"
  // both continue with "▁there▁was", as in the whole text. Byte-level BPE encodes the
  // text as written.
  std::vector<int> encode_continuation(std::string_view text) const;
  // Encodes the concatenation of the segments (no BOS/EOS): control tokens are
  // recognized only inside segments that allow it, and the text between special tokens
  // is encoded as one run even when it spans segments, exactly as encoding the joined
  // string would.
  std::vector<int> encode_segments(const std::vector<TextSegment>& segments) const;

  // Text of `token` following `prev`: U+2581 becomes a space, the leading space of
  // the first piece after BOS is dropped, <0xNN> pieces become the raw byte, and
  // control tokens decode to nothing (harmony's markup to its text: see above).
  std::string decode(int prev, int token) const;
  // Concatenated decode of a sequence (the first token's predecessor is `prev`).
  std::string decode_all(const std::vector<int>& tokens, int prev = -1) const;

  // Bytes of a token as text: control tokens give their text when `special` is set,
  // nothing otherwise; byte-level pieces give their bytes (possibly part of a UTF-8
  // character: see StreamDecoder).
  std::string token_text(int token, bool special = false) const;
  // Whether `token` is a control token that decodes to its text (harmony's markup).
  bool renders(int token) const;

  TokenizerKind kind() const {
    return bpe_ ? TokenizerKind::kByteLevelBpe : TokenizerKind::kSentencePiece;
  }
  // One line for `kivi info`: kind, size, special ids, pre-tokenizer or byte pieces.
  std::string describe() const;
  // "llama" or "gpt2", as in tokenizer.ggml.model.
  const char* model_name() const { return bpe_ ? "gpt2" : "llama"; }
  const BpeModel* bpe() const { return bpe_.get(); }
  int vocab_size() const { return static_cast<int>(pieces_.size()); }
  int bos_id() const { return bos_id_; }
  int eos_id() const { return eos_id_; }
  int unk_id() const { return unk_id_; }
  // End of turn (<|eot_id|>, <|im_end|>) or -1.
  int eot_id() const { return eot_id_; }
  // Tokens that end generation: EOS, EOT, end-of-message, and control tokens whose text
  // is a known end marker (as llama.cpp's end-of-generation set; harmony's <|end|> is not).
  bool is_end_of_generation(int token) const;
  bool add_bos() const { return add_bos_; }
  bool add_eos() const { return add_eos_; }
  void set_add_bos(bool b) { add_bos_ = b; }
  void set_add_eos(bool b) { add_eos_ = b; }
  void set_eot_id(int id);
  void set_eom_id(int id);
  // tokenizer.chat_template (Jinja source) or empty.
  const std::string& chat_template() const { return chat_template_; }
  void set_chat_template(std::string t) { chat_template_ = std::move(t); }
  // Id of the control or user-defined token whose text is exactly `text`, or -1.
  int find_special(std::string_view text) const;
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
  int bos_id_ = 1, eos_id_ = 2, unk_id_ = 0, eot_id_ = -1, eom_id_ = -1;
  bool add_dummy_prefix_ = true;
  bool add_bos_ = true, add_eos_ = false;
  std::string chat_template_;
  std::shared_ptr<const BpeModel> bpe_;  // set for byte-level BPE
  // Control and user-defined tokens by first byte, longest first, for recognizing them in text.
  std::vector<std::vector<int>> special_by_byte_;
  std::vector<int> eog_;       // sorted
  std::vector<int> rendered_;  // sorted: control tokens that decode to their text (harmony)

  Tokenizer() = default;
  void index_specials();
  void encode_text(std::string_view text, bool first, std::vector<int>& out) const;
  void encode_spm(std::string_view text, bool dummy_prefix, std::vector<int>& out) const;
};

// Streams decoded text: push() returns only whole UTF-8 characters, holding back a
// character split across tokens until its last byte arrives; bytes that can never form
// a character come out as U+FFFD. flush() returns what is left.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tk, int prev = -1) : tk_(tk), prev_(prev) {}
  std::string push(int token);
  std::string flush();

 private:
  const Tokenizer& tk_;
  int prev_;
  std::string pending_;
};

// Replaces every ' ' with U+2581 and back.
std::string to_sentencepiece(std::string_view s);
std::string from_sentencepiece(std::string_view s);

}  // namespace kivi::tok
