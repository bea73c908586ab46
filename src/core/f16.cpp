#include "core/f16.h"

#include <cmath>
#include <cstring>

namespace kivi {

float f16_to_f32(f16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      int e = -1;
      do {
        mant <<= 1;
        ++e;
      } while ((mant & 0x400u) == 0);
      mant &= 0x3FFu;
      bits = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | (mant << 13);
    }
  } else if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

f16_t f32_to_f16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t abs = bits & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) {  // Inf or NaN
    return static_cast<f16_t>(sign | 0x7C00u | (abs > 0x7F800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477FF000u) return static_cast<f16_t>(sign | 0x7C00u);  // rounds to Inf
  if (abs < 0x38800000u) {                                            // result is subnormal or zero
    if (abs < 0x33000000u) return static_cast<f16_t>(sign);           // < 2^-25: rounds to 0
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift =
        126 - exp;  // 14 + (112 - exp) + ... : mant >> (shift) gives half mantissa
    const uint32_t half_mant = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    uint32_t r = half_mant;
    if (rem > halfway || (rem == halfway && (half_mant & 1u))) ++r;
    return static_cast<f16_t>(sign | r);
  }
  // normal
  uint32_t r = ((abs >> 13) - ((127 - 15) << 10));
  const uint32_t rem = abs & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return static_cast<f16_t>(sign | r);
}

// Next representable half toward +inf.
static f16_t next_up(f16_t h) {
  if ((h & 0x7FFFu) == 0) return 0x0001u;             // +-0 -> smallest positive subnormal
  if (h & 0x8000u) return static_cast<f16_t>(h - 1);  // negative: toward zero
  if (h >= 0x7C00u) return h;                         // +Inf/NaN stays
  return static_cast<f16_t>(h + 1);
}
static f16_t next_down(f16_t h) {
  if ((h & 0x7FFFu) == 0) return 0x8001u;
  if (h & 0x8000u) return h >= 0xFC00u ? h : static_cast<f16_t>(h + 1);
  return static_cast<f16_t>(h - 1);
}

f16_t f32_to_f16_up(float f) {
  f16_t h = f32_to_f16(f);
  if (std::isnan(f)) return h;
  if (f16_to_f32(h) < f) h = next_up(h);
  return h;
}

f16_t f32_to_f16_down(float f) {
  f16_t h = f32_to_f16(f);
  if (std::isnan(f)) return h;
  if (f16_to_f32(h) > f) h = next_down(h);
  return h;
}

}  // namespace kivi
