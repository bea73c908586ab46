#include "quant/dequant.h"

#include <cstring>

#include "core/f16.h"
#include "quant/blocks.h"

namespace kivi::quant {

float bf16_to_f32(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

namespace {

template <class B>
B load_block(const uint8_t* p) {
  B b;
  std::memcpy(&b, p, sizeof(B));
  return b;
}

// One block of each type: y[block] from the block at p. The arithmetic is f32 with
// the expression shapes of the format definitions (see the header).
void block_q4_0(const uint8_t* p, float* y) {
  const auto b = load_block<BlockQ4_0>(p);
  const float d = f16_to_f32(b.d);
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>((b.qs[j] & 15) - 8) * d;
    y[j + 16] = static_cast<float>((b.qs[j] >> 4) - 8) * d;
  }
}

void block_q4_1(const uint8_t* p, float* y) {
  const auto b = load_block<BlockQ4_1>(p);
  const float d = f16_to_f32(b.d), m = f16_to_f32(b.m);
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>(b.qs[j] & 15) * d + m;
    y[j + 16] = static_cast<float>(b.qs[j] >> 4) * d + m;
  }
}

void block_q5_0(const uint8_t* p, float* y) {
  const auto b = load_block<BlockQ5_0>(p);
  const float d = f16_to_f32(b.d);
  uint32_t qh;
  std::memcpy(&qh, b.qh, 4);
  for (int j = 0; j < 16; ++j) {
    const int lo = (b.qs[j] & 15) | static_cast<int>(((qh >> j) & 1u) << 4);
    const int hi = (b.qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
    y[j] = static_cast<float>(lo - 16) * d;
    y[j + 16] = static_cast<float>(hi - 16) * d;
  }
}

void block_q5_1(const uint8_t* p, float* y) {
  const auto b = load_block<BlockQ5_1>(p);
  const float d = f16_to_f32(b.d), m = f16_to_f32(b.m);
  uint32_t qh;
  std::memcpy(&qh, b.qh, 4);
  for (int j = 0; j < 16; ++j) {
    const int lo = (b.qs[j] & 15) | static_cast<int>(((qh >> j) & 1u) << 4);
    const int hi = (b.qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
    y[j] = static_cast<float>(lo) * d + m;
    y[j + 16] = static_cast<float>(hi) * d + m;
  }
}

void block_q8_0(const uint8_t* p, float* y) {
  const auto b = load_block<BlockQ8_0>(p);
  const float d = f16_to_f32(b.d);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(b.qs[j]) * d;
}

void block_q2_k(const uint8_t* p, float* y) {
  const auto b = load_block<BlockQ2_K>(p);
  const float d = f16_to_f32(b.d), dmin = f16_to_f32(b.dmin);
  for (int e = 0; e < 256; ++e) {
    const int q = (b.qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
    const uint8_t s = b.scales[e / 16];
    const float dl = d * static_cast<float>(s & 15), ml = dmin * static_cast<float>(s >> 4);
    y[e] = dl * static_cast<float>(q) - ml;
  }
}

void block_q3_k(const uint8_t* p, float* y) {
  const auto b = load_block<BlockQ3_K>(p);
  const float d = f16_to_f32(b.d);
  int8_t sc[16];
  unpack_q3_k_scales(b.scales, sc);
  for (int e = 0; e < 256; ++e) {
    const int q2 = (b.qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
    const int h = (b.hmask[e % 32] >> (e / 32)) & 1;
    const float dl = d * static_cast<float>(sc[e / 16]);
    y[e] = dl * static_cast<float>(q2 - (h ? 0 : 4));
  }
}

void block_q4_k(const uint8_t* p, float* y) {
  const auto b = load_block<BlockQ4_K>(p);
  const float d = f16_to_f32(b.d), dmin = f16_to_f32(b.dmin);
  uint8_t sc[8], mn[8];
  unpack_k4_scales(b.scales, sc, mn);
  for (int e = 0; e < 256; ++e) {
    const uint8_t byte = b.qs[32 * (e / 64) + e % 32];
    const int q = (e % 64) < 32 ? (byte & 15) : (byte >> 4);
    const float d1 = d * static_cast<float>(sc[e / 32]), m1 = dmin * static_cast<float>(mn[e / 32]);
    y[e] = d1 * static_cast<float>(q) - m1;
  }
}

void block_q5_k(const uint8_t* p, float* y) {
  const auto b = load_block<BlockQ5_K>(p);
  const float d = f16_to_f32(b.d), dmin = f16_to_f32(b.dmin);
  uint8_t sc[8], mn[8];
  unpack_k4_scales(b.scales, sc, mn);
  for (int e = 0; e < 256; ++e) {
    const uint8_t byte = b.qs[32 * (e / 64) + e % 32];
    const int lo = (e % 64) < 32 ? (byte & 15) : (byte >> 4);
    const int q = lo | (((b.qh[e % 32] >> (e / 32)) & 1) << 4);
    const float d1 = d * static_cast<float>(sc[e / 32]), m1 = dmin * static_cast<float>(mn[e / 32]);
    y[e] = d1 * static_cast<float>(q) - m1;
  }
}

void block_q6_k(const uint8_t* p, float* y) {
  const auto b = load_block<BlockQ6_K>(p);
  const float d = f16_to_f32(b.d);
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, k = (e % 128) / 32, l = e % 32;
    const uint8_t byte = b.ql[64 * h + 32 * (k % 2) + l];
    const int lo = k < 2 ? (byte & 15) : (byte >> 4);
    const int q = lo | (((b.qh[32 * h + l] >> (2 * k)) & 3) << 4);
    y[e] = d * static_cast<float>(b.scales[e / 16]) * static_cast<float>(q - 32);
  }
}

void block_q8_k(const uint8_t* p, float* y) {
  const auto b = load_block<BlockQ8_K>(p);
  for (int e = 0; e < 256; ++e) y[e] = b.d * static_cast<float>(b.qs[e]);
}

void block_mxfp4(const uint8_t* p, float* y) {
  const auto b = load_block<BlockMXFP4>(p);
  const float d = e8m0_to_f32_half(b.e);
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>(kMxfp4Values[b.qs[j] & 15]) * d;
    y[j + 16] = static_cast<float>(kMxfp4Values[b.qs[j] >> 4]) * d;
  }
}

}  // namespace

void dequantize_row(Type t, const void* src, float* dst, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(src);
  switch (t) {
    case Type::kF32:
      std::memcpy(dst, p, static_cast<size_t>(n) * 4);
      return;
    case Type::kF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        dst[i] = f16_to_f32(h);
      }
      return;
    case Type::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        dst[i] = bf16_to_f32(h);
      }
      return;
    default:
      break;
  }
  void (*block)(const uint8_t*, float*) = nullptr;
  switch (t) {
    case Type::kQ4_0:
      block = block_q4_0;
      break;
    case Type::kQ4_1:
      block = block_q4_1;
      break;
    case Type::kQ5_0:
      block = block_q5_0;
      break;
    case Type::kQ5_1:
      block = block_q5_1;
      break;
    case Type::kQ8_0:
      block = block_q8_0;
      break;
    case Type::kQ2_K:
      block = block_q2_k;
      break;
    case Type::kQ3_K:
      block = block_q3_k;
      break;
    case Type::kQ4_K:
      block = block_q4_k;
      break;
    case Type::kQ5_K:
      block = block_q5_k;
      break;
    case Type::kQ6_K:
      block = block_q6_k;
      break;
    case Type::kQ8_K:
      block = block_q8_k;
      break;
    case Type::kMXFP4:
      block = block_mxfp4;
      break;
    default:
      return;
  }
  const TypeInfo& ti = info(t);
  for (int64_t b = 0; b < n / ti.block; ++b) block(p + b * ti.block_bytes, dst + b * ti.block);
}

}  // namespace kivi::quant
