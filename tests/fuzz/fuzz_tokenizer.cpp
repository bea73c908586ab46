// Tokenizer: the first 2 bytes pick a vocabulary size, the rest is split between a
// llama2.c tokenizer file and a text to encode and decode.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  const int vocab = 1 + (data[0] | (data[1] << 8)) % 600;
  const size_t split = 4 + (size - 4) * data[2] / 255;
  try {
    auto tk = kivi::tok::Tokenizer::from_llama2c_memory(data + 4, split - 4, vocab, "fuzz-tok.bin");
    const std::string text(reinterpret_cast<const char*>(data + split), size - split);
    const auto ids = tk.encode(text, data[3] & 1, data[3] & 2);
    for (int id : ids) {
      if (id < 0 || id >= tk.vocab_size()) __builtin_trap();
    }
    (void)tk.decode_all(ids);
  } catch (const kivi::Error&) {
  }
  return 0;
}
