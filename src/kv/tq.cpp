#include "kv/tq.h"

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include "core/error.h"
#include "kv/lloyd_max.h"

namespace kivi::kv {

TqCodec::TqCodec(Format f, int dim) : format_(f), dim_(dim) {
  if (!is_tq(f)) fail("tq codec: %s is not a tq format", format_name(f));
  if (dim < 4 || dim > 65536) fail("tq codec: head_dim %d is outside [4, 65536]", dim);
  bits_ = format_bits(f);
  wide_ = f == Format::kTq25 || f == Format::kTq35 ? dim / 4 : 0;
  row_bytes_ = code_row_bytes(f, dim);
  const LloydMaxCodebook& n = lloyd_max_codebook(dim, bits_);
  narrow_c_ = n.centroids_f;
  narrow_t_ = n.thresholds_f;
  if (wide_ > 0) {
    const LloydMaxCodebook& w = lloyd_max_codebook(dim, bits_ + 1);
    wide_c_ = w.centroids_f;
    wide_t_ = w.thresholds_f;
  }
}

float TqCodec::encode(const float* x, const HadamardRotation& rot, uint8_t* codes,
                      float* tmp) const {
  std::memcpy(tmp, x, static_cast<size_t>(dim_) * sizeof(float));
  rot.forward(tmp);
  double n2 = 0.0;
  for (int i = 0; i < dim_; ++i) n2 += static_cast<double>(tmp[i]) * tmp[i];
  std::memset(codes, 0, row_bytes_);
  if (!(n2 > 0.0)) return 0.0f;
  const float inv = static_cast<float>(1.0 / std::sqrt(n2));
  double dot = 0.0;
  size_t o = 0;
  for (int i = 0; i < dim_; ++i) {
    const bool w = i < wide_;
    const std::vector<float>& t = w ? wide_t_ : narrow_t_;
    const float u = tmp[i] * inv;
    unsigned c = 0;
    for (float th : t) c += u > th;
    const int b = w ? bits_ + 1 : bits_;
    const size_t byte = o >> 3, shift = o & 7;
    codes[byte] = static_cast<uint8_t>(codes[byte] | (c << shift));
    if (shift + b > 8) codes[byte + 1] = static_cast<uint8_t>(codes[byte + 1] | (c >> (8 - shift)));
    o += static_cast<size_t>(b);
    dot += static_cast<double>(tmp[i]) * (w ? wide_c_[c] : narrow_c_[c]);
  }
  // Each coordinate's centroid has its sign (the codebooks are symmetric with no centroid at
  // 0), so dot > 0 for x != 0.
  return static_cast<float>(n2 / dot);
}

int TqCodec::code(const uint8_t* codes, int i) const {
  const int b = bits(i);
  const size_t o =
      i < wide_ ? static_cast<size_t>(i) * (bits_ + 1)
                : static_cast<size_t>(wide_) * (bits_ + 1) + static_cast<size_t>(i - wide_) * bits_;
  const size_t byte = o >> 3, shift = o & 7;
  unsigned v = codes[byte] >> shift;
  if (shift + b > 8) v |= static_cast<unsigned>(codes[byte + 1]) << (8 - shift);
  return static_cast<int>(v & ((1u << b) - 1));
}

namespace {

// out[0..n) = c[code i] for the n codes of b bits starting at bit offset o of a row: whole
// groups of 8 codes (b bytes) at a time where o is on a byte, then one code at a time.
void decode_run(const uint8_t* row, size_t o, int n, int b, const float* c, float* out) {
  int i = 0;
  if (o % 8 == 0) {
    const uint8_t* p = row + o / 8;
    const unsigned m = (1u << b) - 1;
    for (; i + 8 <= n; i += 8, p += b) {
      uint32_t v = p[0];  // the 8 codes of b bytes: b <= 4, so they fit 32 bits
      for (int k = 1; k < b; ++k) v |= static_cast<uint32_t>(p[k]) << (8 * k);
      for (int k = 0; k < 8; ++k) out[i + k] = c[(v >> (b * k)) & m];
    }
    o += static_cast<size_t>(i) * b;
  }
  for (; i < n; ++i, o += static_cast<size_t>(b)) {
    const size_t byte = o >> 3, shift = o & 7;
    unsigned v = row[byte] >> shift;
    if (shift + b > 8) v |= static_cast<unsigned>(row[byte + 1]) << (8 - shift);
    out[i] = c[v & ((1u << b) - 1)];
  }
}

}  // namespace

void TqCodec::decode_rotated(const uint8_t* codes, float scale, float* out) const {
  // The codebooks times the scale (at most 16 + 32 entries), then the two runs of codes.
  float cw[32], cn[16];
  for (size_t k = 0; k < wide_c_.size(); ++k) cw[k] = wide_c_[k] * scale;
  for (size_t k = 0; k < narrow_c_.size(); ++k) cn[k] = narrow_c_[k] * scale;
  if (wide_ > 0) decode_run(codes, 0, wide_, bits_ + 1, cw, out);
  decode_run(codes, static_cast<size_t>(wide_) * (bits_ + 1), dim_ - wide_, bits_, cn, out + wide_);
}

void TqCodec::decode(const uint8_t* codes, float scale, const HadamardRotation& rot,
                     float* out) const {
  decode_rotated(codes, scale, out);
  rot.inverse(out);
}

uint32_t TqCodec::fingerprint() const {
  uint32_t h = 2166136261u;  // FNV-1a over (format, dim, the centroids' bits)
  auto mix = [&h](const void* p, size_t n) {
    const uint8_t* b = static_cast<const uint8_t*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 16777619u;
  };
  const int32_t head[2] = {static_cast<int32_t>(format_), dim_};
  mix(head, sizeof(head));
  mix(narrow_c_.data(), narrow_c_.size() * sizeof(float));
  mix(wide_c_.data(), wide_c_.size() * sizeof(float));
  return h & 0x7fffffffu;
}

const TqCodec* tq_codec(Format f, int dim) {
  if (!is_tq(f)) return nullptr;
  static std::mutex mu;
  static std::map<std::pair<int, int>, std::unique_ptr<TqCodec>> codecs;
  std::lock_guard<std::mutex> lock(mu);
  auto& c = codecs[{static_cast<int>(f), dim}];
  if (!c) c = std::make_unique<TqCodec>(f, dim);
  return c.get();
}

}  // namespace kivi::kv
