// The GGUF block types: the type table, dequantization against ggml's own results
// (fixtures written by ggml, ../shared/fixtures/quants), quantization (bytes equal to
// ggml's for the 32-value types, RMS error within 2% of ggml's for the K-quants), MXFP4
// against values worked out from the format's definition, and the reader's checks of
// tensor types and sizes.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "io/gguf.h"
#include "io/gguf_writer.h"
#include "quant/blocks.h"
#include "quant/dequant.h"
#include "quant/quantize.h"
#include "quant/types.h"
#include "test_util.h"

namespace kivi {
namespace {

using quant::Type;

std::string fixture(const std::string& name) {
  return test::shared_dir() + "/fixtures/quants/" + name;
}

#define KIVI_REQUIRE_FIXTURES()                                \
  ASSERT_TRUE(::kivi::test::file_exists(fixture("q4_k.gguf"))) \
      << "missing " << fixture("q4_k.gguf") << " (set KIVI_SHARED_DIR to a folder with fixtures/)"

struct FixtureType {
  const char* file;
  Type type;
};
const FixtureType kFixtures[] = {
    {"f16.gguf", Type::kF16},   {"bf16.gguf", Type::kBF16}, {"q8_0.gguf", Type::kQ8_0},
    {"q4_0.gguf", Type::kQ4_0}, {"q4_1.gguf", Type::kQ4_1}, {"q5_0.gguf", Type::kQ5_0},
    {"q5_1.gguf", Type::kQ5_1}, {"q2_k.gguf", Type::kQ2_K}, {"q3_k.gguf", Type::kQ3_K},
    {"q4_k.gguf", Type::kQ4_K}, {"q5_k.gguf", Type::kQ5_K}, {"q6_k.gguf", Type::kQ6_K},
    {"q8_k.gguf", Type::kQ8_K},
};

std::vector<float> tensor_f32(const io::GgufFile& f, const std::string& name) {
  const io::GgufTensor* t = f.find_tensor(name);
  EXPECT_NE(t, nullptr) << name;
  if (!t) return {};
  EXPECT_EQ(t->type, 0u) << name;
  std::vector<float> v(t->n_elements);
  std::memcpy(v.data(), t->data, v.size() * 4);
  return v;
}

TEST(QuantTypes, TableMatchesGgml) {
  struct Row {
    uint32_t id;
    const char* name;
    int block, bytes;
  };
  // ggml's type ids, block sizes and block bytes (ggml.h, ggml-common.h).
  const Row rows[] = {{0, "F32", 1, 4},       {1, "F16", 1, 2},       {30, "BF16", 1, 2},
                      {2, "Q4_0", 32, 18},    {3, "Q4_1", 32, 20},    {6, "Q5_0", 32, 22},
                      {7, "Q5_1", 32, 24},    {8, "Q8_0", 32, 34},    {10, "Q2_K", 256, 84},
                      {11, "Q3_K", 256, 110}, {12, "Q4_K", 256, 144}, {13, "Q5_K", 256, 176},
                      {14, "Q6_K", 256, 210}, {15, "Q8_K", 256, 292}, {39, "MXFP4", 32, 17}};
  for (const Row& r : rows) {
    const quant::TypeInfo* t = quant::find_type(r.id);
    ASSERT_NE(t, nullptr) << r.name;
    EXPECT_STREQ(t->name, r.name);
    EXPECT_EQ(t->block, r.block) << r.name;
    EXPECT_EQ(t->block_bytes, r.bytes) << r.name;
    EXPECT_EQ(quant::type_name(r.id), r.name);
    Type parsed;
    EXPECT_TRUE(quant::parse_type(r.name, &parsed));
    EXPECT_EQ(static_cast<uint32_t>(parsed), r.id);
  }
  EXPECT_FALSE(quant::find_type(15)->weight);  // Q8_K is an activation format
  EXPECT_TRUE(quant::find_type(39)->weight);
  for (uint32_t id : {4u, 5u, 9u, 16u, 20u, 23u, 24u, 28u, 29u, 34u, 35u, 40u, 1000u}) {
    EXPECT_EQ(quant::find_type(id), nullptr) << id;
  }
  EXPECT_EQ(quant::type_name(16), "IQ2_XXS");
  EXPECT_EQ(quant::type_name(34), "TQ1_0");
  EXPECT_EQ(quant::type_name(1000), "type 1000");
  Type t;
  EXPECT_FALSE(quant::parse_type("iq2_xxs", &t));
  EXPECT_TRUE(quant::parse_type("q4_k", &t));
  EXPECT_EQ(t, Type::kQ4_K);
  EXPECT_EQ(quant::row_bytes(Type::kQ4_K, 4096), 16u * 144u);
  EXPECT_DOUBLE_EQ(quant::bits_per_weight(Type::kQ6_K), 6.5625);
  EXPECT_DOUBLE_EQ(quant::bits_per_weight(Type::kMXFP4), 4.25);
  EXPECT_TRUE(quant::parse_type("mxfp4", &t));
  EXPECT_EQ(t, Type::kMXFP4);
  EXPECT_NE(std::string(quant::supported_weight_types()).find("MXFP4"), std::string::npos);
}

TEST(QuantTypes, ScalePackingRoundTrips) {
  for (int seed = 0; seed < 64; ++seed) {
    uint8_t sc[8], mn[8], packed[12], sc2[8], mn2[8];
    for (int j = 0; j < 8; ++j) {
      sc[j] = static_cast<uint8_t>((seed * 7 + j * 13) % 64);
      mn[j] = static_cast<uint8_t>((seed * 11 + j * 5) % 64);
    }
    quant::pack_k4_scales(sc, mn, packed);
    quant::unpack_k4_scales(packed, sc2, mn2);
    EXPECT_EQ(std::memcmp(sc, sc2, 8), 0);
    EXPECT_EQ(std::memcmp(mn, mn2, 8), 0);
    int8_t s3[16], s3b[16];
    for (int j = 0; j < 16; ++j) s3[j] = static_cast<int8_t>((seed * 5 + j * 9) % 64 - 32);
    quant::pack_q3_k_scales(s3, packed);
    quant::unpack_q3_k_scales(packed, s3b);
    EXPECT_EQ(std::memcmp(s3, s3b, 16), 0);
  }
}

// Dequantization reproduces ggml's to_float bit for bit, for every type, including the
// fp16-subnormal scales of row 7 and the signed zeros of the all-zero row.
TEST(QuantFixtures, DequantizationIsBitExact) {
  KIVI_REQUIRE_FIXTURES();
  for (const auto& fx : kFixtures) {
    io::GgufFile f(fixture(fx.file));
    const io::GgufTensor* q = f.find_tensor("quantized");
    ASSERT_NE(q, nullptr) << fx.file;
    ASSERT_EQ(q->type, static_cast<uint32_t>(fx.type)) << fx.file;
    ASSERT_EQ(q->dims, (std::vector<uint64_t>{512, 8})) << fx.file;
    const auto want = tensor_f32(f, "dequantized");
    std::vector<float> got(want.size());
    const uint64_t rb = quant::row_bytes(fx.type, 512);
    ASSERT_EQ(q->n_bytes, 8 * rb) << fx.file;
    for (int r = 0; r < 8; ++r)
      quant::dequantize_row(fx.type, q->data + r * rb, got.data() + r * 512, 512);
    for (size_t i = 0; i < got.size(); ++i) {
      uint32_t a, b;
      std::memcpy(&a, &got[i], 4);
      std::memcpy(&b, &want[i], 4);
      ASSERT_EQ(a, b) << fx.file << " element " << i << " (row " << i / 512 << "): " << got[i]
                      << " vs ggml " << want[i];
    }
  }
}

TEST(QuantFixtures, Bf16Conversion) {
  EXPECT_EQ(quant::f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(quant::bf16_to_f32(0x3F80), 1.0f);
  EXPECT_EQ(quant::f32_to_bf16(1.00390625f), 0x3F80);  // halfway, even stays
  EXPECT_EQ(quant::f32_to_bf16(1.01171875f), 0x3F82);  // halfway, odd rounds up
  EXPECT_EQ(quant::f32_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(quant::f32_to_bf16(NAN) & 0x7FC0, 0x7FC0);  // quiet NaN
}

// Quantization of the fixtures' source: the 32-value types (and Q8_K) give ggml's
// bytes exactly; the K-quants' RMS error is at most 2% above ggml's.
TEST(QuantFixtures, QuantizationMatchesGgml) {
  KIVI_REQUIRE_FIXTURES();
  for (const auto& fx : kFixtures) {
    if (quant::is_float(fx.type)) continue;
    io::GgufFile f(fixture(fx.file));
    const auto src = tensor_f32(f, "source");
    const auto ggml_deq = tensor_f32(f, "dequantized");
    const io::GgufTensor* q = f.find_tensor("quantized");
    ASSERT_EQ(src.size(), 4096u);
    const uint64_t rb = quant::row_bytes(fx.type, 512);
    std::vector<uint8_t> mine(8 * rb);
    for (int r = 0; r < 8; ++r)
      quant::quantize_row(fx.type, src.data() + r * 512, mine.data() + r * rb, 512);
    const auto& ti = quant::info(fx.type);
    if (!quant::is_k_quant(fx.type) || fx.type == Type::kQ8_K) {
      for (size_t i = 0; i < mine.size(); ++i) {
        ASSERT_EQ(mine[i], q->data[i])
            << ti.name << " byte " << i << " (row " << i / rb << ", block "
            << (i % rb) / ti.block_bytes << ", offset " << (i % rb) % ti.block_bytes << ")";
      }
      continue;
    }
    std::vector<float> deq(4096);
    for (int r = 0; r < 8; ++r)
      quant::dequantize_row(fx.type, mine.data() + r * rb, deq.data() + r * 512, 512);
    double e_mine = 0, e_ggml = 0;
    for (size_t i = 0; i < 4096; ++i) {
      e_mine += (deq[i] - static_cast<double>(src[i])) * (deq[i] - static_cast<double>(src[i]));
      e_ggml +=
          (ggml_deq[i] - static_cast<double>(src[i])) * (ggml_deq[i] - static_cast<double>(src[i]));
    }
    const double rms_mine = std::sqrt(e_mine / 4096), rms_ggml = std::sqrt(e_ggml / 4096);
    std::printf("  %s RMS error %.4e (ggml %.4e, ratio %.4f)\n", ti.name, rms_mine, rms_ggml,
                rms_mine / rms_ggml);
    EXPECT_LE(rms_mine, 1.02 * rms_ggml) << ti.name;
    // The special rows: zeros stay zero, the constant row stays close.
    for (int c = 0; c < 512; ++c) ASSERT_EQ(deq[2 * 512 + c], 0.0f) << ti.name;
    for (int c = 0; c < 512; ++c) ASSERT_NEAR(deq[5 * 512 + c], 0.3f, 2e-3f) << ti.name;
  }
}

// ---------------------------------------------------------------------------------
// MXFP4, against its definition: 32 values share an E8M0 exponent e (scale 2^(e-127)),
// and each value is an FP4 E2M1 number (sign, 2 exponent bits, 1 mantissa bit: 0, 0.5,
// 1, 1.5, 2, 3, 4, 6). Value j sits in the low nibble of byte 1 + j, value j + 16 in its
// high nibble; byte 0 is e.

// The E2M1 number of a 4-bit code, decoded from its bits (code 8, "-0", is 0).
double e2m1(int code) {
  const int exp = (code >> 1) & 3, man = code & 1;
  const double mag = exp == 0 ? 0.5 * man : (1.0 + 0.5 * man) * std::ldexp(1.0, exp - 1);
  return (code & 8) ? -mag : mag;
}

// 17 bytes of a block with exponent e and codes lo[16] (values 0-15), hi[16] (16-31).
std::vector<uint8_t> mxfp4_block(uint8_t e, const int* lo, const int* hi) {
  std::vector<uint8_t> b(17);
  b[0] = e;
  for (int j = 0; j < 16; ++j) b[1 + j] = static_cast<uint8_t>(lo[j] | (hi[j] << 4));
  return b;
}

TEST(QuantMxfp4, DequantizesHandBuiltBlocks) {
  // The E2M1 table, written out, against the bit decoding above.
  const double table[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (int c = 0; c < 16; ++c) EXPECT_EQ(e2m1(c), (c & 8 ? -1 : 1) * table[c & 7]) << c;
  // Every code in both halves of the block: 0..15 in the low nibbles, 15..0 in the high.
  int lo[16], hi[16];
  for (int j = 0; j < 16; ++j) lo[j] = j, hi[j] = 15 - j;
  // e = 0 and 1 give subnormal floats (0.5 * 2^-127 = 2^-128), 127 is scale 1, 254 scale
  // 2^127, where values of 2 and more overflow f32 to infinity (in ggml too); 255 (NaN in
  // E8M0) reads as scale 2^128.
  for (int e = 0; e < 256; ++e) {
    const auto blk = mxfp4_block(static_cast<uint8_t>(e), lo, hi);
    float y[32];
    quant::dequantize_row(Type::kMXFP4, blk.data(), y, 32);
    const double scale = std::ldexp(1.0, e - 127);
    for (int j = 0; j < 32; ++j) {
      const int code = j < 16 ? lo[j] : hi[j - 16];
      const double v = e2m1(code) * scale;  // exact in a float unless it overflows
      const float want =
          std::fabs(v) >= 0x1p128 ? std::copysign(INFINITY, v) : static_cast<float>(v);
      ASSERT_EQ(y[j], want) << "e " << e << " value " << j << " code " << code;
      // Code 8 (E2M1's -0) is +0, as ggml stores the codes' values as integers.
      if (code == 0 || code == 8) {
        ASSERT_FALSE(std::signbit(y[j])) << "e " << e;
      }
    }
  }
  // Scales by hand at a few exponents: value 1.0 (code 2) times 2^(e - 127).
  struct Case {
    int e;
    float one;
  };
  for (const Case& c : {Case{127, 1.0f}, Case{128, 2.0f}, Case{126, 0.5f}, Case{130, 8.0f},
                        Case{0, 0x1p-127f}, Case{1, 0x1p-126f}, Case{254, 0x1p127f}}) {
    int l[16] = {2}, h[16] = {};
    float y[32];
    quant::dequantize_row(Type::kMXFP4, mxfp4_block(static_cast<uint8_t>(c.e), l, h).data(), y, 32);
    EXPECT_EQ(y[0], c.one) << "e " << c.e;
    EXPECT_EQ(y[1], 0.0f);
  }
  EXPECT_EQ(quant::e8m0_to_f32_half(0), 0x1p-128f);
  EXPECT_EQ(quant::e8m0_to_f32_half(1), 0x1p-127f);
  EXPECT_EQ(quant::e8m0_to_f32_half(128), 1.0f);
  EXPECT_EQ(quant::e8m0_to_f32_half(255), 0x1p127f);
}

// Random blocks at magnitudes from 2^-30 to 2^30, a few outliers, an all-zero block.
std::vector<float> mxfp4_source(int64_t n, uint64_t seed) {
  Rng r(seed);
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t b = 0; b < n / 32; ++b) {
    const float mag = std::ldexp(1.0f, static_cast<int>(r.next_u64() % 61) - 30);
    for (int j = 0; j < 32; ++j) {
      x[32 * b + j] = b == 5 ? 0.0f : r.normal() * mag * (j == 7 && b % 3 == 0 ? 10.0f : 1.0f);
    }
  }
  return x;
}

// With the block's largest magnitude amax between 8 and 16 times the half scale d (and
// 12 d the largest value), a value within 12 d is at most half a gap from a code (the
// widest gap, 8 d to 12 d, gives 2 d <= amax / 4), and one above 12 d clips to it
// (error < 4 d <= amax / 2). On normal data the RMS error is about a tenth of the RMS
// value.
TEST(QuantMxfp4, RoundTripErrorIsBounded) {
  const int64_t n = 32 * 512;
  const auto x = mxfp4_source(n, 42);
  std::vector<uint8_t> q(quant::row_bytes(Type::kMXFP4, n));
  std::vector<float> y(static_cast<size_t>(n));
  quant::quantize_row(Type::kMXFP4, x.data(), q.data(), n);
  quant::dequantize_row(Type::kMXFP4, q.data(), y.data(), n);
  double rel_sum = 0;
  int rel_n = 0;
  for (int64_t b = 0; b < n / 32; ++b) {
    double amax = 0;
    for (int j = 0; j < 32; ++j)
      amax = std::max(amax, std::fabs(static_cast<double>(x[32 * b + j])));
    const double d = std::ldexp(1.0, q[17 * b] - 128);
    if (amax == 0) {
      ASSERT_EQ(q[17 * b], 0) << b;
      for (int j = 0; j < 32; ++j) ASSERT_EQ(y[32 * b + j], 0.0f) << b;
      continue;
    }
    ASSERT_GE(amax / d, 7.99) << "block " << b;  // 8, less log2f's rounding just below 2^k
    ASSERT_LT(amax / d, 16.0) << "block " << b;
    double err2 = 0, x2 = 0;
    for (int j = 0; j < 32; ++j) {
      const double v = x[32 * b + j], err = std::fabs(y[32 * b + j] - v);
      ASSERT_LE(err, std::fabs(v) <= 12 * d ? 2 * d : std::fabs(v) - 12 * d)
          << "block " << b << " value " << j << ": " << v << " -> " << y[32 * b + j];
      ASSERT_LE(err, amax / 2);
      err2 += err * err;
      x2 += v * v;
    }
    rel_sum += std::sqrt(err2 / x2);
    ++rel_n;
  }
  const double rel = rel_sum / rel_n;
  std::printf("  MXFP4 mean per-block RMS error / RMS value: %.4f\n", rel);
  EXPECT_LT(rel, 0.15);
  EXPECT_GT(rel, 0.03);  // a 4-bit format: a smaller error would mean a broken test
  // A parallel quantization gives the same bytes.
  std::vector<uint8_t> q2(q.size());
  quant::quantize_parallel(Type::kMXFP4, x.data(), q2.data(), n, nullptr);
  EXPECT_EQ(q, q2);
}

// Each value's code is the nearest one for the block's exponent, the lowest code on ties
// (0 rather than 8 for zero; 4 d for 5 d), checked by a search over the 16 codes; the
// exponent follows floor(log2(amax)) + 125 at exact powers of two and between them.
TEST(QuantMxfp4, QuantizerPicksTheNearestCode) {
  auto x = mxfp4_source(32 * 256, 7);
  // Exact ties and values on the grid, in block 10 (amax 12 -> e = 128, d = 1): midpoints
  // 0.5, 2.5, 3.5, 5, 7, 10, 14 (above 12: clipped) and their negatives.
  const float ties[] = {12.0f, 0.5f,   2.5f, 3.5f,  5.0f, 7.0f,   10.0f, -0.5f, -2.5f, -5.0f,
                        -7.0f, -10.0f, 0.0f, -0.0f, 6.0f, -12.0f, 1.5f,  0.25f, 11.0f, 9.0f};
  for (size_t j = 0; j < 32; ++j) x[320 + j] = j < std::size(ties) ? ties[j] : 0.75f;
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<uint8_t> q(quant::row_bytes(Type::kMXFP4, n));
  quant::quantize_row(Type::kMXFP4, x.data(), q.data(), n);
  EXPECT_EQ(q[17 * 10], 128);
  for (int64_t b = 0; b < n / 32; ++b) {
    const uint8_t e = q[17 * b];
    const double d = std::ldexp(1.0, e - 127);  // the E2M1 numbers' scale
    for (int j = 0; j < 32; ++j) {
      const int code = j < 16 ? q[17 * b + 1 + j] & 15 : q[17 * b + 1 + j - 16] >> 4;
      const double v = x[32 * b + j];
      int best = 0;
      for (int c = 1; c < 16; ++c) {
        if (std::fabs(e2m1(c) * d - v) < std::fabs(e2m1(best) * d - v)) best = c;
      }
      ASSERT_EQ(code, best) << "block " << b << " value " << j << " (" << v << ", e " << int(e)
                            << ")";
    }
  }
  // Exponents by hand: amax in [2^k, 2^(k+1)) gives e = k + 125.
  struct Case {
    float amax;
    int e;
  };
  for (const Case& c :
       {Case{1.0f, 125}, Case{1.5f, 125}, Case{2.0f, 126}, Case{6.0f, 127}, Case{0.75f, 124},
        Case{0x1p-100f, 25}, Case{0x1p100f, 225}, Case{0x1.8p127f, 252}, Case{0.0f, 0}}) {
    EXPECT_EQ(quant::mxfp4_exponent(c.amax), c.e) << c.amax;
    float blk[32] = {};
    blk[3] = -c.amax;  // the sign does not matter
    uint8_t out[17];
    quant::quantize_row(Type::kMXFP4, blk, out, 32);
    EXPECT_EQ(out[0], c.e) << c.amax;
  }
}

// ---------------------------------------------------------------------------------
// The reader's checks of tensor types and sizes.

// A GGUF image with one tensor `t` of type id `type` and shape `dims`, followed by
// `data_bytes` bytes of tensor data (then a second tensor 'next' if `next_offset` > 0).
std::vector<uint8_t> one_tensor_image(uint32_t type, std::vector<uint64_t> dims, size_t data_bytes,
                                      uint64_t next_offset = 0) {
  std::vector<uint8_t> img;
  auto put = [&](const void* p, size_t n) {
    img.insert(img.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
  };
  auto u32 = [&](uint32_t v) { put(&v, 4); };
  auto u64 = [&](uint64_t v) { put(&v, 8); };
  auto str = [&](const std::string& s) {
    u64(s.size());
    put(s.data(), s.size());
  };
  u32(io::kGgufMagic);
  u32(3);
  u64(next_offset ? 2 : 1);
  u64(0);
  str("t");
  u32(static_cast<uint32_t>(dims.size()));
  for (auto d : dims) u64(d);
  u32(type);
  u64(0);
  if (next_offset) {
    str("next");
    u32(1);
    u64(8);
    u32(0);
    u64(next_offset);
  }
  img.resize((img.size() + 31) / 32 * 32, 0);
  img.resize(img.size() + data_bytes + (next_offset ? next_offset + 32 : 0), 0x11);
  return img;
}

std::string parse_error(const std::vector<uint8_t>& img) {
  try {
    io::GgufFile f(img.data(), img.size(), "x.gguf");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(QuantReader, SizesComeFromTypeAndShape) {
  for (Type t : {Type::kF32, Type::kF16, Type::kBF16, Type::kQ4_0, Type::kQ4_1, Type::kQ5_0,
                 Type::kQ5_1, Type::kQ8_0, Type::kQ2_K, Type::kQ3_K, Type::kQ4_K, Type::kQ5_K,
                 Type::kQ6_K, Type::kQ8_K, Type::kMXFP4}) {
    const auto& ti = quant::info(t);
    const uint64_t cols = 2 * 256, rows = 3;
    const size_t bytes = quant::row_bytes(t, cols) * rows;
    auto img = one_tensor_image(static_cast<uint32_t>(t), {cols, rows}, bytes);
    io::GgufFile f(img.data(), img.size(), "x.gguf");
    EXPECT_EQ(f.tensors()[0].n_bytes, bytes) << ti.name;
    EXPECT_NE(f.tensors()[0].data, nullptr) << ti.name;
    // One byte short: truncated.
    img.pop_back();  // (resize(size - 1) trips -Wstringop-overflow at -O1)
    EXPECT_NE(parse_error(img).find("runs past the end of the file"), std::string::npos) << ti.name;
    if (ti.block > 1) {
      // A row that is not a whole number of blocks.
      auto bad = one_tensor_image(static_cast<uint32_t>(t), {cols + 16, rows}, bytes + 4096);
      EXPECT_NE(
          parse_error(bad).find("not a multiple of the " + std::string(ti.name) + " block size"),
          std::string::npos)
          << ti.name << ": " << parse_error(bad);
    }
  }
}

TEST(QuantReader, SizeThatDisagreesWithTheNextTensorIsRejected) {
  // Q4_K 512 x 2 is 576 bytes; a next tensor starting at 544 means the file stored
  // fewer bytes than the type and shape need.
  auto img = one_tensor_image(static_cast<uint32_t>(Type::kQ4_K), {512, 2}, 576, 544);
  const std::string e = parse_error(img);
  EXPECT_NE(e.find("tensor 't' (Q4_K, 576 bytes at offset 0) overlaps tensor 'next' at offset 544"),
            std::string::npos)
      << e;
  EXPECT_EQ(parse_error(one_tensor_image(static_cast<uint32_t>(Type::kQ4_K), {512, 2}, 576, 576)),
            "");
}

TEST(QuantReader, UnreadableTypesAreListedWithoutData) {
  for (uint32_t id : {16u, 23u, 34u, 40u, 200u}) {
    auto img = one_tensor_image(id, {256, 2}, 512);
    io::GgufFile f(img.data(), img.size(), "x.gguf");
    EXPECT_EQ(f.tensors()[0].data, nullptr);
    EXPECT_EQ(f.tensors()[0].type_info(), nullptr);
  }
}

TEST(QuantReader, WriterRejectsPartialBlocks) {
  io::GgufWriter w;
  std::vector<uint8_t> data(1024);
  EXPECT_THROW(w.add_tensor("x", {100, 2}, Type::kQ8_0, static_cast<const void*>(data.data())),
               Error);
  EXPECT_NO_THROW(w.add_tensor("y", {256, 2}, Type::kQ4_K, static_cast<const void*>(data.data())));
}

}  // namespace
}  // namespace kivi
