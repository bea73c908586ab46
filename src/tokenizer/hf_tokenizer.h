// Hugging Face tokenizer.json (with its tokenizer_config.json) read into the GGUF
// vocabulary that llama.cpp's converter (convert_hf_to_gguf.py, the "gpt2" path) writes:
// every id from 0 to the vocabulary size gets a token (gaps become "[PAD<id>]", type
// unused), added tokens that are special or look special ("<|...|>") are control
// tokens and the others user-defined, merges are "left right" strings in rank order,
// and tokenizer.ggml.pre names the pre-tokenizer whose expression tokenizer.json
// carries. Only byte-level BPE models are read.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace kivi::io {
class GgufWriter;
}

namespace kivi::tok {

struct GgufVocab {
  std::string pre;                  // tokenizer.ggml.pre
  std::vector<std::string> tokens;  // byte-level form; added tokens as their text
  std::vector<TokenType> types;
  std::vector<std::string> merges;  // "left right"
  int bos_id = -1, eos_id = -1, eot_id = -1, pad_id = -1;
  bool add_bos = false, add_eos = false;
  std::string chat_template;  // tokenizer_config.json's, or empty

  // The tokenizer this vocabulary gives (validates merges and ids: throws kivi::Error).
  Tokenizer tokenizer(const std::string& source) const;
  // Bytes the metadata takes in a GGUF file (for size estimates).
  uint64_t metadata_bytes() const;
};

// Parses the texts of tokenizer.json and tokenizer_config.json (`config` may be empty).
// vocab_size 0 takes the largest id + 1; a larger one pads with unused tokens, a smaller
// one is an error. Throws kivi::Error with one line naming `name` and the problem.
GgufVocab parse_hf_tokenizer(std::string_view json, std::string_view config,
                             const std::string& name, int vocab_size = 0);
// Reads the files. An empty config_path takes tokenizer_config.json beside the
// tokenizer if there is one.
GgufVocab read_hf_tokenizer(const std::string& path, const std::string& config_path = "",
                            int vocab_size = 0);

// Writes tokenizer.ggml.* (model "gpt2", pre, tokens, token_type, merges, special ids,
// add_bos_token, add_eos_token) and tokenizer.chat_template when there is one.
void add_gguf_vocab_metadata(io::GgufWriter& w, const GgufVocab& v);

}  // namespace kivi::tok
