// Byte-level BPE (GPT-2, Llama 3, Qwen2/3; GGUF tokenizer.ggml.model = "gpt2"), after
// Sennrich et al. 2016 and openai/gpt-2's encoder.py: the text is pre-tokenized into
// pieces (pretokenizer.h), each piece's bytes become characters of the byte-level
// alphabet (unicode.h), and within a piece the adjacent pair with the lowest merge rank
// is merged until no pair has a rank; ties go to the leftmost pair. Tokens are stored
// in byte-level form, so decoding maps their characters back to bytes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/pretokenizer.h"

namespace kivi::tok {

class BpeModel {
 public:
  // `pieces` are all tokens in byte-level form (special tokens included: they are only
  // indexed when `mergeable[i]`), `merges` are "left right" strings in rank order.
  // Throws kivi::Error naming `source` when there are no merges, a merge is not two
  // tokens, names a token that is not in the vocabulary or makes one that is not, or a
  // byte of the alphabet has no token.
  BpeModel(const std::vector<std::string>& pieces, const std::vector<bool>& mergeable,
           const std::vector<std::string>& merges, const std::string& pre,
           const std::string& source);

  const PreTokenizer& pre() const { return pre_; }
  int n_merges() const { return n_merges_; }

  // Appends the tokens of `text` (any bytes: ill-formed UTF-8 is replaced by U+FFFD
  // first, as reference tokenizers do with the decoded string).
  void encode(std::string_view text, std::vector<int>& out) const;
  // BPE of one pre-tokenized piece (well-formed UTF-8).
  void encode_piece(std::string_view piece, std::vector<int>& out) const;

 private:
  struct Merge {
    int32_t rank, id;
  };
  static uint64_t pair_key(int a, int b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  PreTokenizer pre_;
  std::unordered_map<std::string, int> index_;  // byte-level piece -> id (mergeable tokens)
  std::unordered_map<uint64_t, Merge> merges_;  // (left id, right id) -> rank, merged id
  int byte_id_[256];
  int n_merges_ = 0;
};

}  // namespace kivi::tok
