// The GGUF block layouts (ggml's, byte for byte), and the small helpers that unpack
// their packed fields. `d`, `m`, `dmin` are IEEE half floats stored as uint16_t; every
// struct is byte-aligned in files (a Q8_0 block is 34 bytes), so code reads blocks
// through memcpy or unaligned loads.
//
// Values (q are the unpacked integers, sc/m the sub-block scale and min):
//   Q4_0  (q - 8) * d                 32 values, 4-bit q
//   Q4_1  q * d + m                   32 values, 4-bit q
//   Q5_0  (q - 16) * d                32 values, 5-bit q (low 4 bits in qs, bit 4 in qh)
//   Q5_1  q * d + m                   32 values, 5-bit q
//   Q8_0  q * d                       32 values, int8 q
//   Q2_K  d*sc*q - dmin*m             256 values, 16 sub-blocks of 16, 2-bit q, 4-bit sc and m
//   Q3_K  d*(sc - 32)*(q - 4)         256 values, 16 sub-blocks of 16, 3-bit q, 6-bit sc
//   Q4_K  d*sc*q - dmin*m             256 values, 8 sub-blocks of 32, 4-bit q, 6-bit sc and m
//   Q5_K  d*sc*q - dmin*m             256 values, 8 sub-blocks of 32, 5-bit q, 6-bit sc and m
//   Q6_K  d*sc*(q - 32)               256 values, 16 sub-blocks of 16, 6-bit q, int8 sc
//   Q8_K  d*q (d is f32)              256 values, int8 q, with the sums of each 16 q
//   MXFP4 kMxfp4Values[q] * 2^(e-128) 32 values, 4-bit q (an FP4 E2M1 code), 8-bit e
//         (an E8M0 exponent shared by the block; see e8m0_to_f32_half)
//
// Where each value's bits sit (e = index in the block):
//   Q4_0/Q4_1/MXFP4: e < 16 in the low nibble of qs[e], e >= 16 in the high nibble of
//         qs[e-16].
//   Q5_0/Q5_1: as Q4, plus bit 4 of value e in bit e of the little-endian u32 qh.
//   Q2_K: qs[32*(e/128) + e%32] bits 2*((e%128)/32) and up; scale/min byte scales[e/16]
//         (low nibble scale, high nibble min).
//   Q3_K: low 2 bits as Q2_K; bit 2 is bit (e/32) of hmask[e%32]; the 16 6-bit scales
//         are packed in 12 bytes (unpack_q3_k_scales).
//   Q4_K: qs[32*(e/64) + e%32], low nibble if (e%64) < 32 else high; sub-block e/32;
//         8 6-bit scales and 8 6-bit mins packed in 12 bytes (unpack_k4_scales).
//   Q5_K: as Q4_K, plus bit 4 in bit (e/32) of qh[e%32].
//   Q6_K: with h = e/128, r = e%128, k = r/32, l = r%32: low 4 bits are the low (k < 2)
//         or high (k >= 2) nibble of ql[64h + 32*(k%2) + l], bits 4-5 are bits 2k, 2k+1
//         of qh[32h + l]; scale scales[e/16].
#pragma once

#include <cstdint>
#include <cstring>

namespace kivi::quant {

#pragma pack(push, 1)
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[16];
};
struct BlockQ4_1 {
  uint16_t d, m;
  uint8_t qs[16];
};
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[16];
};
struct BlockQ5_1 {
  uint16_t d, m;
  uint8_t qh[4];
  uint8_t qs[16];
};
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[32];
};
struct BlockQ2_K {
  uint8_t scales[16];
  uint8_t qs[64];
  uint16_t d, dmin;
};
struct BlockQ3_K {
  uint8_t hmask[32];
  uint8_t qs[64];
  uint8_t scales[12];
  uint16_t d;
};
struct BlockQ4_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qs[128];
};
struct BlockQ5_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
};
struct BlockQ6_K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
};
struct BlockQ8_K {
  float d;
  int8_t qs[256];
  int16_t bsums[16];
};
struct BlockMXFP4 {
  uint8_t e;  // E8M0: the block's scale is 2^(e - 127)
  uint8_t qs[16];
};
#pragma pack(pop)

static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 &&
              sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110 && sizeof(BlockQ4_K) == 144 &&
              sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210 && sizeof(BlockQ8_K) == 292);
static_assert(sizeof(BlockMXFP4) == 17);

// MXFP4's 16 codes: the FP4 E2M1 values (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their
// negatives; code 8 is -0) doubled, so that they are integers; e8m0_to_f32_half halves
// the block scale to compensate.
inline constexpr int8_t kMxfp4Values[16] = {0, 1,  2,  3,  4,  6,  8,  12,
                                            0, -1, -2, -3, -4, -6, -8, -12};

// Half the E8M0 scale, 2^(e - 128), built from float bits: e >= 2 is the normal float
// with exponent field e - 1; e = 1 (2^-127) and e = 0 (2^-128) are subnormals. e = 255,
// NaN in E8M0, is read as the number 2^127, as ggml reads it.
inline float e8m0_to_f32_half(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Q4_K / Q5_K: 8 six-bit scales and 8 six-bit mins in 12 bytes. Bytes 0-3 hold scales
// 0-3 in their low 6 bits, bytes 4-7 mins 0-3; scales 4-7 have their low 4 bits in the
// low nibbles of bytes 8-11 and their top 2 bits in the top 2 bits of bytes 0-3; mins 4-7
// likewise in the high nibbles of bytes 8-11 and the top bits of bytes 4-7.
inline void unpack_k4_scales(const uint8_t* p, uint8_t sc[8], uint8_t mn[8]) {
  uint32_t a0, a1, a2;
  std::memcpy(&a0, p, 4);
  std::memcpy(&a1, p + 4, 4);
  std::memcpy(&a2, p + 8, 4);
  const uint32_t s_lo = a0 & 0x3f3f3f3fu, m_lo = a1 & 0x3f3f3f3fu;
  const uint32_t s_hi = (a2 & 0x0f0f0f0fu) | (((a0 >> 6) & 0x03030303u) << 4);
  const uint32_t m_hi = ((a2 >> 4) & 0x0f0f0f0fu) | (((a1 >> 6) & 0x03030303u) << 4);
  std::memcpy(sc, &s_lo, 4);
  std::memcpy(sc + 4, &s_hi, 4);
  std::memcpy(mn, &m_lo, 4);
  std::memcpy(mn + 4, &m_hi, 4);
}

// The inverse of unpack_k4_scales (values < 64).
inline void pack_k4_scales(const uint8_t sc[8], const uint8_t mn[8], uint8_t* p) {
  for (int j = 0; j < 4; ++j) {
    p[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    p[j + 4] = static_cast<uint8_t>(mn[j] | ((mn[j + 4] >> 4) << 6));
    p[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
  }
}

// Q3_K: 16 six-bit scales (stored with a bias of 32) in 12 bytes. Scale i has its low
// 4 bits in the low nibble of byte i (i < 8) or the high nibble of byte i - 8 (i >= 8),
// and its top 2 bits in bits 2*(i/4), 2*(i/4)+1 of byte 8 + i%4. unpack_q3_k_scales
// returns sc - 32, unpack_q3_k_scales_biased the stored sc.
inline void unpack_q3_k_scales_biased(const uint8_t* p, uint8_t sc[16]) {
  // Four scales per 32-bit word: low nibbles of bytes 0-7, then their high nibbles; the
  // top 2 bits of word k's scales are bits 2k, 2k+1 of bytes 8-11.
  uint32_t a0, a1, a2;
  std::memcpy(&a0, p, 4);
  std::memcpy(&a1, p + 4, 4);
  std::memcpy(&a2, p + 8, 4);
  const uint32_t lo4 = 0x0f0f0f0fu, hi2 = 0x03030303u;
  const uint32_t w[4] = {(a0 & lo4) | ((a2 & hi2) << 4), (a1 & lo4) | (((a2 >> 2) & hi2) << 4),
                         ((a0 >> 4) & lo4) | (((a2 >> 4) & hi2) << 4),
                         ((a1 >> 4) & lo4) | (((a2 >> 6) & hi2) << 4)};
  std::memcpy(sc, w, 16);
}
inline void unpack_q3_k_scales(const uint8_t* p, int8_t sc[16]) {
  uint8_t b[16];
  unpack_q3_k_scales_biased(p, b);
  for (int i = 0; i < 16; ++i) sc[i] = static_cast<int8_t>(b[i] - 32);
}

// The inverse (sc + 32 in [0, 63]).
inline void pack_q3_k_scales(const int8_t sc[16], uint8_t* p) {
  std::memset(p, 0, 12);
  for (int i = 0; i < 16; ++i) {
    const int v = sc[i] + 32;
    if (i < 8) {
      p[i] |= static_cast<uint8_t>(v & 15);
    } else {
      p[i - 8] |= static_cast<uint8_t>((v & 15) << 4);
    }
    p[8 + i % 4] |= static_cast<uint8_t>(((v >> 4) & 3) << (2 * (i / 4)));
  }
}

}  // namespace kivi::quant
