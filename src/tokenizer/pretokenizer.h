// Pre-tokenizers of byte-level BPE vocabularies: the text is split into pieces by
// regular expressions before BPE merges run inside each piece. GGUF's
// `tokenizer.ggml.pre` names the pre-tokenizer; each name here selects the expressions
// of the Hugging Face tokenizer.json it stands for (Split with behavior "Isolated": the
// matches and the text between them become pieces).
//
// The expressions run on PCRE2 with UTF and UCP (\p{L}, \p{N} from Unicode). `\s` is
// written out as Unicode's White_Space property, [\t\n\v\f\r\x85\p{Z}], which is what
// Oniguruma (Hugging Face tokenizers) and llama.cpp match; PCRE2 10.42's UCP `\s`
// leaves out U+0085.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kivi::tok {

class PreTokenizer {
 public:
  // Throws kivi::Error for an unknown name, listing the known ones.
  explicit PreTokenizer(const std::string& name);
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&);
  PreTokenizer& operator=(const PreTokenizer&);

  // Names accepted by the constructor, with what each is, for errors and docs.
  static std::string known_names();

  const std::string& name() const;
  // Whole pieces found in the vocabulary are emitted without merging (tokenizer.json's
  // "ignore_merges": Llama 3).
  bool ignore_merges() const;
  // The text is NFC-normalized first (tokenizer.json's normalizer: Qwen2).
  bool nfc() const;

  // Appends the pieces of `text` (well-formed UTF-8) to `out`, in order; their
  // concatenation is `text`.
  void split(std::string_view text, std::vector<std::string_view>& out) const;

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

}  // namespace kivi::tok
