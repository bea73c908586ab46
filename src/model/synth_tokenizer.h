// A real tokenizer in a synthetic model (`kivi synth --tokenizer-json`): the vocabulary
// of a Hugging Face tokenizer.json is written into the GGUF as llama.cpp's converter
// writes it (tokenizer/hf_tokenizer.h), so benchmarks and tokenizer tests run through
// the same path as downloaded models.
#pragma once

#include <string>

#include "model/synth.h"

namespace kivi::model {

// Reads and validates the tokenizer (and tokenizer_config.json: `config_path`, or the
// file beside it when empty) and makes `spec` write it. Without `vocab_given` the
// model's vocabulary size becomes the tokenizer's; with it, the tokenizer is padded
// with unused tokens up to that size (a smaller size is an error). Returns a short
// description ("gpt2/llama-bpe, 128256 tokens, 280147 merges").
std::string use_hf_tokenizer(SynthSpec& spec, const std::string& json_path,
                             const std::string& config_path, bool vocab_given);

}  // namespace kivi::model
