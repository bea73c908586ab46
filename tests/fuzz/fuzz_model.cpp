// Model loader: the bytes become a file (an anonymous memory file, so the loader maps it
// as it maps a model on disk), Model::load checks the architecture, hyperparameters,
// every tensor's name, type and shape and the tokenizer; then every weight matrix's
// first and last rows are dequantized and the tokenizer encodes and decodes a string.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/model.h"
#include "quant/dequant.h"

namespace {

void touch(const kivi::ops::Matrix& m, std::vector<float>& row) {
  if (!m.data || m.rows <= 0 || m.cols <= 0) return;
  row.resize(static_cast<size_t>(m.cols));
  kivi::quant::dequantize_row(m.dtype, m.row(0), row.data(), m.cols);
  kivi::quant::dequantize_row(m.dtype, m.row(m.rows - 1), row.data(), m.cols);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = memfd_create("fuzz_model", MFD_CLOEXEC);
  if (fd < 0) return 0;
  size_t done = 0;
  while (done < size) {
    const ssize_t n = write(fd, data + done, size - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  try {
    auto m = kivi::model::Model::load(path);
    const auto& w = m->weights();
    std::vector<float> row;
    touch(w.token_embd, row);
    touch(w.output, row);
    for (const auto& L : w.layers) {
      for (const auto* x : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_down, &L.w_up})
        touch(*x, row);
    }
    if (m->has_tokenizer()) {
      const auto ids = m->tokenizer().encode("Once upon a time, <s> caf\xc3\xa9 42!", true);
      (void)m->tokenizer().decode_all(ids);
    }
  } catch (const kivi::Error&) {
  }
  close(fd);
  return 0;
}
