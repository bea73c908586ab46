#include "io/llama2c.h"

#include <cmath>
#include <cstring>

#include "core/error.h"

namespace kivi::io {

uint64_t llama2c_expected_size(const Llama2cHeader& h, bool shared) {
  const uint64_t dim = h.dim, hidden = h.hidden_dim, L = h.n_layers, vocab = h.vocab_size;
  const uint64_t hs = h.dim / h.n_heads;
  const uint64_t kv_dim = static_cast<uint64_t>(h.n_kv_heads) * hs;
  uint64_t floats = vocab * dim;                    // token embedding
  floats += L * dim;                                // rms_att
  floats += L * dim * dim;                          // wq
  floats += 2 * L * kv_dim * dim;                   // wk, wv
  floats += L * dim * dim;                          // wo
  floats += L * dim;                                // rms_ffn
  floats += 3 * L * hidden * dim;                   // w1, w2, w3
  floats += dim;                                    // rms_final
  floats += static_cast<uint64_t>(h.seq_len) * hs;  // freq_cis real + imag (hs/2 each)
  if (!shared) floats += vocab * dim;
  return 7 * 4 + floats * 4;
}

static void check_range(const std::string& name, const char* field, int64_t v, int64_t lo,
                        int64_t hi) {
  if (v < lo || v > hi) {
    fail("%s: llama2.c header field '%s' = %lld, expected %lld to %lld", name.c_str(), field,
         static_cast<long long>(v), static_cast<long long>(lo), static_cast<long long>(hi));
  }
}

std::unique_ptr<Llama2cCheckpoint> parse_llama2c(const uint8_t* data, size_t size,
                                                 const std::string& name) {
  if (size < 28) {
    fail("%s: truncated llama2.c checkpoint: %zu bytes, the header alone needs 28", name.c_str(),
         size);
  }
  auto ck = std::make_unique<Llama2cCheckpoint>();
  Llama2cHeader h;
  std::memcpy(&h, data, 28);
  check_range(name, "dim", h.dim, 1, 65536);
  check_range(name, "hidden_dim", h.hidden_dim, 1, 1 << 20);
  check_range(name, "n_layers", h.n_layers, 1, 1024);
  check_range(name, "n_heads", h.n_heads, 1, 4096);
  check_range(name, "n_kv_heads", h.n_kv_heads, 1, h.n_heads);
  if (h.vocab_size == 0 || h.vocab_size < -(1 << 22) || h.vocab_size > (1 << 22)) {
    fail(
        "%s: llama2.c header field 'vocab_size' = %d, expected 1 to 4194304 (negative for a "
        "separate classifier)",
        name.c_str(), h.vocab_size);
  }
  check_range(name, "seq_len", h.seq_len, 1, 1 << 24);  // model::kMaxContext
  if (h.dim % h.n_heads != 0) {
    fail("%s: llama2.c header: n_heads = %d does not divide dim = %d", name.c_str(), h.n_heads,
         h.dim);
  }
  if (h.n_heads % h.n_kv_heads != 0) {
    fail("%s: llama2.c header: n_kv_heads = %d does not divide n_heads = %d", name.c_str(),
         h.n_kv_heads, h.n_heads);
  }
  if ((h.dim / h.n_heads) % 2 != 0) {
    fail("%s: llama2.c header: head size %d is odd; RoPE needs an even head size", name.c_str(),
         h.dim / h.n_heads);
  }
  ck->shared_classifier = h.vocab_size > 0;
  h.vocab_size = std::abs(h.vocab_size);
  ck->header = h;
  const uint64_t expected = llama2c_expected_size(h, ck->shared_classifier);
  if (expected != size) {
    fail(
        "%s: llama2.c checkpoint size mismatch: the header (dim %d, hidden_dim %d, n_layers %d, "
        "n_heads %d, n_kv_heads %d, vocab %d, seq_len %d, %s classifier) implies %llu bytes but "
        "the file has %zu%s",
        name.c_str(), h.dim, h.hidden_dim, h.n_layers, h.n_heads, h.n_kv_heads, h.vocab_size,
        h.seq_len, ck->shared_classifier ? "shared" : "separate",
        static_cast<unsigned long long>(expected), size,
        expected > size ? " (truncated?)" : " (trailing data?)");
  }
  // All pointers are into a validated range; floats are 4-byte aligned because the
  // header is 28 bytes and the map is page aligned.
  const float* p = reinterpret_cast<const float*>(data + 28);
  const uint64_t dim = h.dim, hidden = h.hidden_dim, L = h.n_layers, vocab = h.vocab_size;
  const uint64_t hs = dim / h.n_heads, kv_dim = h.n_kv_heads * hs;
  ck->token_embd = p;
  p += vocab * dim;
  ck->rms_att = p;
  p += L * dim;
  ck->wq = p;
  p += L * dim * dim;
  ck->wk = p;
  p += L * kv_dim * dim;
  ck->wv = p;
  p += L * kv_dim * dim;
  ck->wo = p;
  p += L * dim * dim;
  ck->rms_ffn = p;
  p += L * dim;
  ck->w1 = p;
  p += L * hidden * dim;
  ck->w2 = p;
  p += L * dim * hidden;
  ck->w3 = p;
  p += L * hidden * dim;
  ck->rms_final = p;
  p += dim;
  p += static_cast<uint64_t>(h.seq_len) * hs;  // freq_cis_real and freq_cis_imag
  ck->wcls = ck->shared_classifier ? ck->token_embd : p;
  return ck;
}

std::unique_ptr<Llama2cCheckpoint> read_llama2c(const std::string& path) {
  check_regular_file(path, "model");
  auto map = std::make_unique<MappedFile>(path);
  auto ck = parse_llama2c(map->data(), map->size(), path);
  ck->map = std::move(map);
  return ck;
}

Llama2cVocab parse_llama2c_tokenizer(const uint8_t* data, size_t size, int vocab_size,
                                     const std::string& name) {
  Llama2cVocab v;
  size_t pos = 0;
  auto need = [&](size_t n, const char* what, int tok) {
    if (n > size - pos) {
      if (tok >= 0) {
        fail(
            "%s: tokenizer file ends inside token %d of %d (%s): it has fewer tokens than the "
            "model's vocabulary size %d, or is truncated",
            name.c_str(), tok, vocab_size, what, vocab_size);
      }
      fail("%s: truncated tokenizer file (%s)", name.c_str(), what);
    }
  };
  need(4, "max_token_length", -1);
  std::memcpy(&v.max_token_length, data, 4);
  pos = 4;
  if (v.max_token_length < 1 || v.max_token_length > 65536) {
    fail("%s: tokenizer max_token_length = %d, expected 1 to 65536", name.c_str(),
         v.max_token_length);
  }
  v.pieces.reserve(vocab_size);
  v.scores.reserve(vocab_size);
  for (int i = 0; i < vocab_size; ++i) {
    float score;
    int32_t len;
    need(4, "score", i);
    std::memcpy(&score, data + pos, 4);
    pos += 4;
    need(4, "length", i);
    std::memcpy(&len, data + pos, 4);
    pos += 4;
    if (len < 0 || len > v.max_token_length) {
      fail("%s: token %d has length %d, expected 0 to max_token_length %d", name.c_str(), i, len,
           v.max_token_length);
    }
    need(static_cast<size_t>(len), "bytes", i);
    if (!std::isfinite(score)) fail("%s: token %d has a non-finite score", name.c_str(), i);
    v.pieces.emplace_back(reinterpret_cast<const char*>(data + pos), static_cast<size_t>(len));
    v.scores.push_back(score);
    pos += static_cast<size_t>(len);
  }
  if (pos != size) {
    fail(
        "%s: tokenizer file has %zu bytes left after %d tokens: it holds more tokens than the "
        "model's vocabulary size %d (wrong tokenizer for this model?)",
        name.c_str(), size - pos, vocab_size, vocab_size);
  }
  return v;
}

Llama2cVocab read_llama2c_tokenizer(const std::string& path, int vocab_size) {
  check_regular_file(path, "tokenizer");
  MappedFile map(path);
  return parse_llama2c_tokenizer(map.data(), map.size(), vocab_size, path);
}

}  // namespace kivi::io
