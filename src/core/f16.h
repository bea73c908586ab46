// IEEE 754 binary16 conversion, in plain C++ so that every path (scalar reference,
// SIMD kernels, file readers) agrees bit for bit. Storage type is uint16_t.
#pragma once

#include <cstdint>

namespace kivi {

using f16_t = uint16_t;

// f16 -> f32, exact (every half is a float).
float f16_to_f32(f16_t h);

// f32 -> f16, round to nearest, ties to even (what F16C's vcvtps2ph with imm 0 does).
f16_t f32_to_f16(float f);

// f32 -> f16 rounded toward +inf / -inf. Used for quantization parameters so that the
// stored range always covers the data (see kv/codec.h).
f16_t f32_to_f16_up(float f);
f16_t f32_to_f16_down(float f);

// Round-trip helpers: the float value a storage type would hold.
inline float round_f16(float f) { return f16_to_f32(f32_to_f16(f)); }
inline float round_f16_up(float f) { return f16_to_f32(f32_to_f16_up(f)); }
inline float round_f16_down(float f) { return f16_to_f32(f32_to_f16_down(f)); }

inline constexpr float kF16Max = 65504.0f;

}  // namespace kivi
