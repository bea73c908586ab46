// The KV codecs on their own: known values, error bounds, shapes, the KIVI insight.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/f16.h"
#include "core/rng.h"
#include "kv/codec.h"
#include "test_util.h"

namespace kivi {
namespace {

using kv::ParamType;

struct Quantized {
  std::vector<uint8_t> codes;
  std::vector<uint8_t> scale, zero;  // raw parameter storage
  std::vector<float> out;            // dequantized
  float scale_at(size_t i, ParamType pt) const { return kv::load_param(scale.data(), i, pt); }
  float zero_at(size_t i, ParamType pt) const { return kv::load_param(zero.data(), i, pt); }
};

Quantized keys_roundtrip(const std::vector<float>& x, int S, int T, int D, int G, int bits,
                         ParamType pt) {
  Quantized q;
  q.codes.resize(static_cast<size_t>(S) * T * D * bits / 8);
  const size_t np = static_cast<size_t>(S) * (T / G) * D;
  q.scale.resize(np * 4);
  q.zero.resize(np * 4);
  kv::quantize_keys(x.data(), S, T, D, G, bits, pt, q.codes.data(), q.scale.data(), q.zero.data());
  q.out.resize(x.size());
  kv::dequantize_keys(q.codes.data(), q.scale.data(), q.zero.data(), S, T, D, G, bits, pt,
                      q.out.data());
  return q;
}

Quantized values_roundtrip(const std::vector<float>& x, int S, int T, int D, int G, int bits,
                           ParamType pt) {
  Quantized q;
  q.codes.resize(static_cast<size_t>(S) * T * D * bits / 8);
  const size_t np = static_cast<size_t>(S) * T * (D / G);
  q.scale.resize(np * 4);
  q.zero.resize(np * 4);
  kv::quantize_values(x.data(), S, T, D, G, bits, pt, q.codes.data(), q.scale.data(),
                      q.zero.data());
  q.out.resize(x.size());
  kv::dequantize_values(q.codes.data(), q.scale.data(), q.zero.data(), S, T, D, G, bits, pt,
                        q.out.data());
  return q;
}

std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f) {
  Rng r(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = r.normal() * scale;
  return v;
}

// Seed 000's known values: [1, 2, 3, 4] -> scale 1, zero 1, codes 0..3 packed as 228.
TEST(KiviCodec, KnownValuesValues) {
  for (ParamType pt : {ParamType::kF32, ParamType::kF16}) {
    const std::vector<float> v = {1, 2, 3, 4};
    const auto q = values_roundtrip(v, 1, 1, 4, 4, 2, pt);
    EXPECT_EQ(q.scale_at(0, pt), 1.0f);
    EXPECT_EQ(q.zero_at(0, pt), 1.0f);
    EXPECT_EQ(q.codes[0], 228);
    EXPECT_EQ(q.out, v);
  }
}

// Keys are per channel over tokens; a Latin square gives every channel the values
// 1..4 over four tokens, and token 0 the row [1, 2, 3, 4].
TEST(KiviCodec, KnownValuesKeys) {
  for (ParamType pt : {ParamType::kF32, ParamType::kF16}) {
    std::vector<float> k(16);
    for (int t = 0; t < 4; ++t)
      for (int d = 0; d < 4; ++d) k[t * 4 + d] = static_cast<float>((t + d) % 4 + 1);
    const auto q = keys_roundtrip(k, 1, 4, 4, 4, 2, pt);
    for (int d = 0; d < 4; ++d) {
      EXPECT_EQ(q.scale_at(d, pt), 1.0f);
      EXPECT_EQ(q.zero_at(d, pt), 1.0f);
    }
    EXPECT_EQ(q.codes[0], 228);         // token 0: codes 0, 1, 2, 3
    EXPECT_EQ(q.codes[1], 0b00111001);  // token 1: codes 1, 2, 3, 0
    EXPECT_EQ(q.out, k);
  }
}

TEST(KiviCodec, PackingLayout) {
  // 4-bit, 16 channels, W = 8 bytes: byte j = c[j] (low nibble) | c[j + 8] << 4.
  std::vector<float> v(16);
  for (int d = 0; d < 16; ++d) v[d] = static_cast<float>(d);
  const auto q = values_roundtrip(v, 1, 1, 16, 16, 4, ParamType::kF32);
  EXPECT_EQ(q.codes[0], 0x80);  // c0 = 0 low, c8 = 8 high
  EXPECT_EQ(q.codes[7], 0xF7);  // c7 = 7 low, c15 = 15 high
  EXPECT_EQ(q.out, v);
  // 2-bit, 8 channels, W = 2 bytes: byte j = c[j] | c[j+2] << 2 | c[j+4] << 4 | c[j+6] << 6.
  const std::vector<float> w = {0, 1, 2, 3, 3, 2, 1, 0};
  const auto q2 = values_roundtrip(w, 1, 1, 8, 8, 2, ParamType::kF32);
  EXPECT_EQ(q2.codes[0], 0 | 2 << 2 | 3 << 4 | 1 << 6);
  EXPECT_EQ(q2.codes[1], 1 | 3 << 2 | 2 << 4 | 0 << 6);
  EXPECT_EQ(q2.out, w);
}

// Key groups interleave their rows in 32-bit words, with the row bytes 4c .. 4c + 3 of
// word c at positions 0, 2, 1, 3 (kv/codec.h). Positions worked out by hand.
TEST(KiviCodec, KeyGroupLayout) {
  // W = 8 (2-bit, 32 channels), G = 4: word 0 of tokens 0..3, then word 1 of tokens 0..3.
  EXPECT_EQ(kv::key_group_offset(0, 0, 8, 4), 0u);
  EXPECT_EQ(kv::key_group_offset(0, 1, 8, 4), 2u);
  EXPECT_EQ(kv::key_group_offset(0, 2, 8, 4), 1u);
  EXPECT_EQ(kv::key_group_offset(0, 3, 8, 4), 3u);
  EXPECT_EQ(kv::key_group_offset(1, 0, 8, 4), 4u);
  EXPECT_EQ(kv::key_group_offset(3, 3, 8, 4), 15u);
  EXPECT_EQ(kv::key_group_offset(0, 4, 8, 4), 16u);
  EXPECT_EQ(kv::key_group_offset(2, 6, 8, 4), 16u + 8 + 1);
  // W = 2 (2-bit, 8 channels): 2-byte units, in order; W = 1: plain rows.
  EXPECT_EQ(kv::key_group_offset(1, 1, 2, 4), 3u);
  EXPECT_EQ(kv::key_group_offset(3, 0, 1, 4), 3u);

  // Through the quantizer: 2-bit, 16 channels (W = 4), G = 4. Every channel spans [0, 3]
  // (tokens 1 and 2), so token 0 with values d % 4 has codes d % 4.
  std::vector<float> k(4 * 16);
  for (int d = 0; d < 16; ++d) {
    k[d] = static_cast<float>(d % 4);
    k[16 + d] = 0.0f;
    k[32 + d] = 3.0f;
    k[48 + d] = 1.0f;
  }
  const auto q = keys_roundtrip(k, 1, 4, 16, 4, 2, ParamType::kF32);
  // Row bytes of token 0: byte j holds channels j, j + 4, j + 8, j + 12, all with code j.
  // Byte j = j * 0b01010101; word 0 of token 0 keeps bytes 0, 2, 1, 3 in that order.
  const uint8_t b[4] = {0x00, 0x55, 0xAA, 0xFF};
  EXPECT_EQ(q.codes[0], b[0]);
  EXPECT_EQ(q.codes[1], b[2]);
  EXPECT_EQ(q.codes[2], b[1]);
  EXPECT_EQ(q.codes[3], b[3]);
  EXPECT_EQ(q.out, k);
}

// |x - x'| <= scale / 2 for every element (plus float rounding of the dequantization).
TEST(KiviCodec, RoundTripErrorIsAtMostHalfAScale) {
  for (int bits : {2, 4, 8}) {
    for (ParamType pt : {ParamType::kF32, ParamType::kF16}) {
      const int S = 3, T = 64, D = 32, G = 32;
      const auto x = randn(static_cast<size_t>(S) * T * D, bits * 10 + static_cast<int>(pt), 3.0f);
      const auto qk = keys_roundtrip(x, S, T, D, G, bits, pt);
      for (int s = 0; s < S; ++s)
        for (int t = 0; t < T; ++t)
          for (int d = 0; d < D; ++d) {
            const size_t i = (static_cast<size_t>(s) * T + t) * D + d;
            const float sc = qk.scale_at((static_cast<size_t>(s) * (T / G) + t / G) * D + d, pt);
            ASSERT_LE(std::fabs(x[i] - qk.out[i]), 0.5f * sc * (1 + 1e-5f) + 1e-6f)
                << "keys bits " << bits << " " << kv::param_type_name(pt);
          }
      const auto qv = values_roundtrip(x, S, T, D, 8, bits, pt);
      for (size_t i = 0; i < x.size(); ++i) {
        const float sc = qv.scale_at(i / 8, pt);
        ASSERT_LE(std::fabs(x[i] - qv.out[i]), 0.5f * sc * (1 + 1e-5f) + 1e-6f)
            << "values bits " << bits << " " << kv::param_type_name(pt);
      }
    }
  }
}

// Multi-batch, multi-head: S = batch x heads slices are independent.
TEST(KiviCodec, SlicesAreIndependent) {
  const int B = 2, H = 4, T = 32, D = 16, G = 16;
  const auto x = randn(static_cast<size_t>(B) * H * T * D, 5);
  const auto all = keys_roundtrip(x, B * H, T, D, G, 2, ParamType::kF16);
  const auto allv = values_roundtrip(x, B * H, T, D, 8, 4, ParamType::kF16);
  for (int s = 0; s < B * H; ++s) {
    std::vector<float> one(x.begin() + static_cast<size_t>(s) * T * D,
                           x.begin() + static_cast<size_t>(s + 1) * T * D);
    const auto q1 = keys_roundtrip(one, 1, T, D, G, 2, ParamType::kF16);
    ASSERT_TRUE(
        std::equal(q1.out.begin(), q1.out.end(), all.out.begin() + static_cast<size_t>(s) * T * D));
    ASSERT_TRUE(std::equal(q1.codes.begin(), q1.codes.end(),
                           all.codes.begin() + static_cast<size_t>(s) * T * D / 4));
    const auto v1 = values_roundtrip(one, 1, T, D, 8, 4, ParamType::kF16);
    ASSERT_TRUE(std::equal(v1.out.begin(), v1.out.end(),
                           allv.out.begin() + static_cast<size_t>(s) * T * D));
  }
}

TEST(KiviCodec, ConstantInputIsExactAndFinite) {
  for (int bits : {2, 4, 8}) {
    for (float c : {0.0f, 1.5f, -3.25f, 0.1f, 12345.678f}) {
      const std::vector<float> x(64, c);
      const auto k32 = keys_roundtrip(x, 1, 8, 8, 8, bits, ParamType::kF32);
      const auto v32 = values_roundtrip(x, 1, 8, 8, 8, bits, ParamType::kF32);
      for (size_t i = 0; i < x.size(); ++i) {
        ASSERT_EQ(k32.out[i], c);
        ASSERT_EQ(v32.out[i], c);
      }
      // f16 parameters: exact when c is a half, else within half a (tiny) stored scale.
      const auto k16 = keys_roundtrip(x, 1, 8, 8, 8, bits, ParamType::kF16);
      for (size_t i = 0; i < x.size(); ++i) {
        ASSERT_TRUE(std::isfinite(k16.out[i]));
        if (round_f16(c) == c) {
          ASSERT_EQ(k16.out[i], c);
        } else {
          ASSERT_LE(std::fabs(k16.out[i] - c), 0.5f * k16.scale_at(i % 8, ParamType::kF16) + 1e-6f);
        }
      }
    }
  }
}

TEST(KiviCodec, BadParametersAreErrors) {
  std::vector<float> x(64, 1.0f);
  std::vector<uint8_t> c(64), s(256), z(256);
  EXPECT_THROW(
      kv::quantize_keys(x.data(), 1, 8, 8, 8, 3, ParamType::kF16, c.data(), s.data(), z.data()),
      Error);
  EXPECT_THROW(
      kv::quantize_keys(x.data(), 1, 6, 8, 4, 2, ParamType::kF16, c.data(), s.data(), z.data()),
      Error);
  EXPECT_THROW(
      kv::quantize_values(x.data(), 1, 8, 8, 3, 2, ParamType::kF16, c.data(), s.data(), z.data()),
      Error);
  try {
    kv::check_bits(3);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bits = 3"), std::string::npos);
  }
}

// int8 at every granularity: known values, error bound, tensor clamping.
TEST(Int8Codec, GranularitiesRoundTrip) {
  const int T = 5, H = 3, D = 16, G = 8;
  const auto x = randn(static_cast<size_t>(T) * H * D, 8, 2.0f);
  for (auto g : {kv::Int8Granularity::kTensor, kv::Int8Granularity::kToken,
                 kv::Int8Granularity::kHead, kv::Int8Granularity::kGroup}) {
    for (ParamType pt : {ParamType::kF32, ParamType::kF16}) {
      std::vector<int8_t> codes(x.size());
      std::vector<uint8_t> scales(static_cast<size_t>(T) * H * (D / G) * 4 + 4);
      float amax = 0;
      for (float v : x) amax = std::max(amax, std::fabs(v));
      const float ts = kv::int8_scale(amax, pt);
      const int64_t clamped =
          kv::quantize_int8(x.data(), T, H, D, g, G, pt, codes.data(), scales.data(), ts);
      EXPECT_EQ(clamped, 0);
      std::vector<float> out(x.size());
      kv::dequantize_int8(codes.data(), scales.data(), T, H, D, g, G, pt, out.data(), ts);
      for (int t = 0; t < T; ++t)
        for (int h = 0; h < H; ++h)
          for (int d = 0; d < D; ++d) {
            const size_t i = (static_cast<size_t>(t) * H + h) * D + d;
            float s = ts;
            if (g == kv::Int8Granularity::kToken) s = kv::load_param(scales.data(), t, pt);
            if (g == kv::Int8Granularity::kHead) s = kv::load_param(scales.data(), t * H + h, pt);
            if (g == kv::Int8Granularity::kGroup)
              s = kv::load_param(scales.data(), (t * H + h) * (D / G) + d / G, pt);
            ASSERT_LE(std::fabs(out[i] - x[i]), 0.5f * s * (1 + 1e-6f)) << kv::granularity_name(g);
            ASSERT_LE(std::abs(codes[i]), 127);
          }
    }
  }
  // Known values: absmax 127 -> scale 1, codes equal the values.
  const std::vector<float> k = {127, -64, 3, 0};
  std::vector<int8_t> c(4);
  std::vector<uint8_t> s(4);
  kv::quantize_int8(k.data(), 1, 1, 4, kv::Int8Granularity::kHead, 4, ParamType::kF32, c.data(),
                    s.data());
  EXPECT_EQ(kv::load_param(s.data(), 0, ParamType::kF32), 1.0f);
  EXPECT_EQ(c, (std::vector<int8_t>{127, -64, 3, 0}));
  // Tensor scale fixed at 1: values past 127 clamp and are counted.
  const std::vector<float> big = {200, -300, 5, 0};
  const int64_t n = kv::quantize_int8(big.data(), 1, 1, 4, kv::Int8Granularity::kTensor, 4,
                                      ParamType::kF32, c.data(), s.data(), 1.0f);
  EXPECT_EQ(n, 2);
  EXPECT_EQ(c, (std::vector<int8_t>{127, -127, 5, 0}));
  // Constant zero input: scale 0, codes 0, exact.
  const std::vector<float> z(8, 0.0f);
  std::vector<int8_t> cz(8, 9);
  kv::quantize_int8(z.data(), 1, 1, 8, kv::Int8Granularity::kHead, 8, ParamType::kF16, cz.data(),
                    s.data());
  EXPECT_EQ(cz, std::vector<int8_t>(8, 0));
}

// KIVI's observation (Liu et al. 2024, Sec. 3.1): keys have outlier channels, so
// per-channel quantization preserves attention scores better than per-token; values
// have no channel outliers and errors in them mix per token, so per-token wins.
TEST(KiviInsight, PerChannelKeysBeatPerTokenKeys) {
  const int T = 128, D = 64, G = 32;
  for (int bits : {2, 4}) {
    Rng r(21 + bits);
    std::vector<float> k(static_cast<size_t>(T) * D), q(D);
    for (int t = 0; t < T; ++t)
      for (int d = 0; d < D; ++d)
        k[t * D + d] = r.normal() * (d % 16 == 3 ? 20.0f : 1.0f);  // 4 outlier channels
    for (auto& v : q) v = r.normal();
    const auto per_channel = keys_roundtrip(k, 1, T, D, G, bits, ParamType::kF32).out;
    const auto per_token =
        values_roundtrip(k, 1, T, D, G, bits, ParamType::kF32).out;  // groups along channels
    double e_ch = 0, e_tok = 0;
    for (int t = 0; t < T; ++t) {
      double s = 0, sc = 0, st = 0;
      for (int d = 0; d < D; ++d) {
        s += q[d] * k[t * D + d];
        sc += q[d] * per_channel[t * D + d];
        st += q[d] * per_token[t * D + d];
      }
      e_ch += (s - sc) * (s - sc);
      e_tok += (s - st) * (s - st);
    }
    EXPECT_LT(e_ch, e_tok) << bits << "-bit: per-channel score error " << e_ch << " vs per-token "
                           << e_tok;
  }
}

TEST(KiviInsight, PerTokenValuesBeatPerChannelValues) {
  const int T = 128, D = 64, G = 32;
  for (int bits : {2, 4}) {
    Rng r(41 + bits);
    std::vector<float> v(static_cast<size_t>(T) * D), p(T);
    for (int t = 0; t < T; ++t)
      for (int d = 0; d < D; ++d)
        v[t * D + d] = r.normal() * (t % 16 == 5 ? 20.0f : 1.0f);  // outlier tokens
    double psum = 0;
    for (auto& x : p) psum += (x = std::exp(r.normal()));
    for (auto& x : p) x = static_cast<float>(x / psum);
    const auto per_token = values_roundtrip(v, 1, T, D, G, bits, ParamType::kF32).out;
    const auto per_channel =
        keys_roundtrip(v, 1, T, D, G, bits, ParamType::kF32).out;  // groups along tokens
    double e_tok = 0, e_ch = 0;
    for (int d = 0; d < D; ++d) {
      double o = 0, ot = 0, oc = 0;
      for (int t = 0; t < T; ++t) {
        o += p[t] * v[t * D + d];
        ot += p[t] * per_token[t * D + d];
        oc += p[t] * per_channel[t * D + d];
      }
      e_tok += (o - ot) * (o - ot);
      e_ch += (o - oc) * (o - oc);
    }
    EXPECT_LT(e_tok, e_ch) << bits << "-bit: per-token output error " << e_tok << " vs per-channel "
                           << e_ch;
  }
}

// The stored f16 parameters cover their group: zero <= min and zero + L * scale >= max,
// evaluated exactly (in double) with the parameters as stored, on random groups of many
// magnitudes and offsets, for values (per token) and keys (per channel). Offsets such as
// 1000 put the minimum between halves 0.5 apart, where rounding the zero to nearest
// instead of down would leave the minimum below the stored range.
TEST(KiviCodec, StoredF16ParametersCoverEveryGroup) {
  const int D = 32, G = 32, T = 64;
  int groups = 0;
  for (int bits : {2, 4, 8}) {
    const double L = (1 << bits) - 1;
    for (float offset : {0.0f, 0.3f, -7.1f, 1000.0f, -1000.3f, 20000.0f}) {
      for (float spread : {1e-3f, 0.05f, 1.0f, 30.0f}) {
        auto x = randn(static_cast<size_t>(T) * D, 9000 + bits * 101 + groups, spread);
        for (auto& v : x) v += offset;
        const auto qv = values_roundtrip(x, 1, T, D, G, bits, ParamType::kF16);
        for (int t = 0; t < T; ++t) {  // one value group per token (G = D)
          const float* row = &x[static_cast<size_t>(t) * D];
          const double mn = *std::min_element(row, row + D), mx = *std::max_element(row, row + D);
          const double z = qv.zero_at(t, ParamType::kF16), s = qv.scale_at(t, ParamType::kF16);
          EXPECT_LE(z, mn) << bits << "-bit values, offset " << offset << " spread " << spread
                           << " token " << t;
          EXPECT_GE(z + L * s, mx)
              << bits << "-bit values, offset " << offset << " spread " << spread;
          EXPECT_GE(s, 0.0);
          ++groups;
        }
        const auto qk = keys_roundtrip(x, 1, T, D, G, bits, ParamType::kF16);
        for (int g = 0; g < T / G; ++g) {
          for (int d = 0; d < D; ++d) {
            double mn = INFINITY, mx = -INFINITY;
            for (int t = g * G; t < (g + 1) * G; ++t) {
              mn = std::min<double>(mn, x[static_cast<size_t>(t) * D + d]);
              mx = std::max<double>(mx, x[static_cast<size_t>(t) * D + d]);
            }
            const double z = qk.zero_at(static_cast<size_t>(g) * D + d, ParamType::kF16);
            const double s = qk.scale_at(static_cast<size_t>(g) * D + d, ParamType::kF16);
            EXPECT_LE(z, mn) << bits << "-bit keys, offset " << offset << " spread " << spread
                             << " channel " << d;
            EXPECT_GE(z + L * s, mx)
                << bits << "-bit keys, offset " << offset << " spread " << spread;
            ++groups;
          }
        }
      }
    }
  }
  EXPECT_EQ(groups, 3 * 6 * 4 * (T + T / G * D));
}

// Worked by hand: the group {1.0008, 1.5, 1.25, 2.0} at 2 bits with f16 parameters. Halves
// near 1 are 2^-10 apart, so the minimum 1.0008 lies between 1.0 (0x3C00) and 1.0009765625
// (0x3C01), nearer the second: rounding down stores zero = 1.0 (nearest would store
// 0x3C01, above the minimum). scale = (2.0 - 1.0) / 3 = 0.33333 rounded up to a half:
// 0.33349609375 (0x3556; halves in [0.25, 0.5) are 2^-12 apart). Codes: rint((x - 1) /
// 0.33349609375) = 0.0024 -> 0, 1.4993 -> 1, 0.7496 -> 1, 2.9985 -> 3, packed 2-bit in one
// byte as 0 | 1 << 2 | 1 << 4 | 3 << 6 = 212.
TEST(KiviCodec, F16ZeroPointRoundsDown) {
  const std::vector<float> v = {1.0008f, 1.5f, 1.25f, 2.0f};
  const auto q = values_roundtrip(v, 1, 1, 4, 4, 2, ParamType::kF16);
  uint16_t zero = 0, scale = 0;
  std::memcpy(&zero, q.zero.data(), 2);
  std::memcpy(&scale, q.scale.data(), 2);
  EXPECT_EQ(zero, 0x3C00);
  EXPECT_EQ(scale, 0x3556);
  EXPECT_EQ(q.codes[0], 212);
  // Keys: the same numbers down channel 0 of a group of 4 tokens.
  std::vector<float> k(16, 0.0f);
  for (int t = 0; t < 4; ++t) k[t * 4] = v[t];
  const auto qk = keys_roundtrip(k, 1, 4, 4, 4, 2, ParamType::kF16);
  std::memcpy(&zero, qk.zero.data(), 2);
  std::memcpy(&scale, qk.scale.data(), 2);
  EXPECT_EQ(zero, 0x3C00);
  EXPECT_EQ(scale, 0x3556);
  for (int t = 0; t < 4; ++t)
    EXPECT_FLOAT_EQ(qk.out[t * 4], 1.0f + (t == 0 ? 0 : t == 3 ? 3 : 1) * 0.33349609375f);
}

}  // namespace
}  // namespace kivi
