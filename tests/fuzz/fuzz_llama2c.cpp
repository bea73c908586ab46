// llama2.c checkpoint reader: parse, then read the first and last float of every array.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/error.h"
#include "io/llama2c.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto ck = kivi::io::parse_llama2c(data, size, "fuzz.bin");
    const auto& h = ck->header;
    const uint64_t dim = h.dim, L = h.n_layers, hid = h.hidden_dim,
                   kv = h.n_kv_heads * (h.dim / h.n_heads);
    float f;
    auto touch = [&](const float* p, uint64_t n) {
      std::memcpy(&f, p, 4);
      std::memcpy(&f, p + n - 1, 4);
    };
    touch(ck->token_embd, h.vocab_size * dim);
    touch(ck->wq, L * dim * dim);
    touch(ck->wk, L * kv * dim);
    touch(ck->w2, L * dim * hid);
    touch(ck->rms_final, dim);
    touch(ck->wcls, h.vocab_size * dim);
  } catch (const kivi::Error&) {
  }
  return 0;
}
