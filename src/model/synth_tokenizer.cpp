#include "model/synth_tokenizer.h"

#include <memory>

#include "core/error.h"
#include "tokenizer/hf_tokenizer.h"

namespace kivi::model {

std::string use_hf_tokenizer(SynthSpec& spec, const std::string& json_path,
                             const std::string& config_path, bool vocab_given) {
  auto v = std::make_shared<const tok::GgufVocab>(
      tok::read_hf_tokenizer(json_path, config_path, vocab_given ? spec.config.vocab_size : 0));
  spec.config.vocab_size = static_cast<int>(v->tokens.size());
  spec.tokenizer_bytes = v->metadata_bytes();
  spec.write_tokenizer = [v](io::GgufWriter& w) { tok::add_gguf_vocab_metadata(w, *v); };
  return strfmt("gpt2/%s, %zu tokens, %zu merges%s", v->pre.c_str(), v->tokens.size(),
                v->merges.size(), v->chat_template.empty() ? "" : ", chat template");
}

}  // namespace kivi::model
