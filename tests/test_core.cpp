#include <fcntl.h>
#include <immintrin.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/aligned.h"
#include "core/error.h"
#include "core/f16.h"
#include "core/json.h"
#include "core/rng.h"
#include "test_util.h"

namespace kivi {
namespace {

__attribute__((target("f16c"))) uint16_t hw_f32_to_f16(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}
__attribute__((target("f16c"))) float hw_f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }

bool have_f16c() { return __builtin_cpu_supports("avx2"); }  // every AVX2 CPU has F16C

// Buffers of a huge page or more start on a 2 MiB boundary (their whole 2 MiB pages are
// offered as transparent huge pages); smaller ones on a cache line. Every byte up to
// the requested size is zeroed and writable (AddressSanitizer checks the bounds), and
// the size is not rounded up.
TEST(AlignedBuffer, AlignmentZeroingAndSize) {
  for (size_t n : {size_t{1}, size_t{63}, size_t{4096}, kHugePage - 1, kHugePage, 3 * kHugePage + 5,
                   9 * kHugePage + 100}) {
    AlignedBuffer<uint8_t> b(n);
    ASSERT_NE(b.data(), nullptr);
    EXPECT_EQ(b.size(), n);
    const auto addr = reinterpret_cast<uintptr_t>(b.data());
    EXPECT_EQ(addr % (n >= kHugePage ? kHugePage : kAlign), 0u) << n;
    size_t nonzero = 0;
    for (size_t i = 0; i < n; ++i) nonzero += b[i] != 0;
    EXPECT_EQ(nonzero, 0u) << n;
    std::memset(b.data(), 0xAB, n);
    EXPECT_EQ(b[n - 1], 0xAB);
  }
  AlignedBuffer<float> f(kHugePage / sizeof(float) + 3);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(f.data()) % kHugePage, 0u);
  f.reset(5);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(f.data()) % kAlign, 0u);
  EXPECT_EQ(f.size(), 5u);
}

// Pieces of a buffer of its own map can be replaced by private maps of a file: reads see
// the file, writes stay in the buffer (the file is unchanged), and only whole pages of a
// mapped buffer are taken; anything else is refused with the buffer unchanged.
TEST(AlignedBuffer, MapFileReplacesWholePagesCopyOnWrite) {
  test::TempDir dir;
  const std::string path = dir.file("pages.bin");
  std::vector<uint8_t> file(5 * kPageBytes);
  for (size_t i = 0; i < file.size(); ++i) file[i] = static_cast<uint8_t>(i * 7 + i / 4096);
  test::write_file(path, file);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);

  AlignedBuffer<uint8_t> b(kMappedMin + 3 * kPageBytes + 10);
  ASSERT_TRUE(b.mapped());
  std::memset(b.data(), 0x5A, b.size());
  ASSERT_TRUE(b.map_file(2 * kPageBytes, fd, kPageBytes, 3 * kPageBytes));
  for (size_t i = 0; i < 3 * kPageBytes; ++i)
    ASSERT_EQ(b[2 * kPageBytes + i], file[kPageBytes + i]) << i;
  EXPECT_EQ(b[2 * kPageBytes - 1], 0x5A);
  EXPECT_EQ(b[5 * kPageBytes], 0x5A);
  b[3 * kPageBytes + 1] = 0xEE;  // copy on write
  EXPECT_EQ(b[3 * kPageBytes + 1], 0xEE);
  EXPECT_EQ(test::read_file(path), file);

  // Refused: not whole pages, past the end, or a heap buffer.
  EXPECT_FALSE(b.map_file(100, fd, 0, kPageBytes));
  EXPECT_FALSE(b.map_file(0, fd, 100, kPageBytes));
  EXPECT_FALSE(b.map_file(0, fd, 0, 100));
  EXPECT_FALSE(b.map_file(b.size() / kPageBytes * kPageBytes, fd, 0, 2 * kPageBytes));
  EXPECT_EQ(b[100], 0x5A);
  AlignedBuffer<uint8_t> small(kPageBytes * 2);
  EXPECT_FALSE(small.mapped());
  EXPECT_FALSE(small.map_file(0, fd, 0, kPageBytes));

  // Moving keeps the map; reset releases it.
  AlignedBuffer<uint8_t> moved(std::move(b));
  EXPECT_TRUE(moved.mapped());
  EXPECT_EQ(moved[2 * kPageBytes], file[kPageBytes]);
  moved.reset(10);
  EXPECT_FALSE(moved.mapped());
  ::close(fd);
}

// A file that cannot be mapped there (no open file, a file not open for reading, pages
// past its end, which would fault when read) is refused before the buffer is touched.
TEST(AlignedBuffer, MapFileRefusesUnusableFilesWithTheBufferUnchanged) {
  test::TempDir dir;
  const std::string path = dir.file("short.bin");
  test::write_file(path, std::vector<uint8_t>(kPageBytes + 100, 7));
  AlignedBuffer<uint8_t> b(kMappedMin);
  ASSERT_TRUE(b.mapped());
  std::memset(b.data(), 0x5A, b.size());
  EXPECT_FALSE(b.map_file(0, -1, 0, kPageBytes));
  const int wfd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  ASSERT_GE(wfd, 0);
  EXPECT_FALSE(b.map_file(0, wfd, 0, kPageBytes));
  ::close(wfd);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  EXPECT_FALSE(b.map_file(0, fd, 0, 2 * kPageBytes));  // the second page is past the end
  EXPECT_FALSE(b.map_file(0, fd, kPageBytes, kPageBytes));
  for (size_t i = 0; i < 2 * kPageBytes; ++i) ASSERT_EQ(b[i], 0x5A) << i;
  EXPECT_TRUE(b.map_file(0, fd, 0, kPageBytes));
  EXPECT_EQ(b[0], 7);
  ::close(fd);
}

TEST(F16, AllHalvesRoundTripExactly) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(f32_to_f16(f), h) << "half 0x" << std::hex << h;
    if (have_f16c()) {
      const float hw = hw_f16_to_f32(static_cast<uint16_t>(h));
      EXPECT_EQ(std::memcmp(&f, &hw, 4), 0) << "half 0x" << std::hex << h;
    }
  }
}

TEST(F16, RoundToNearestEvenMatchesF16C) {
  if (!have_f16c()) GTEST_SKIP() << "no F16C on this CPU";
  Rng rng(7);
  for (int i = 0; i < 2000000; ++i) {
    uint32_t bits = static_cast<uint32_t>(rng.next_u64());
    float f;
    std::memcpy(&f, &bits, 4);
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_f16(f), hw_f32_to_f16(f)) << "float bits 0x" << std::hex << bits;
  }
  // Ties, subnormals and the overflow edge.
  for (float f : {65504.0f, 65519.0f, 65520.0f, 1e-8f, 2.98023224e-8f, 5.96046448e-8f, -0.0f,
                  6.1035156e-5f, 1.0009765625f + 0.00048828125f}) {
    EXPECT_EQ(f32_to_f16(f), hw_f32_to_f16(f)) << f;
  }
}

// Position of a half in value order (+0 and -0 both map to 0).
int ordered(uint16_t h) {
  return (h & 0x8000) ? -static_cast<int>(h & 0x7FFF) : static_cast<int>(h);
}

TEST(F16, DirectedRoundingBracketsTheValue) {
  Rng rng(11);
  for (int i = 0; i < 200000; ++i) {
    const float f = rng.normal() * std::pow(10.0f, rng.uniform(-9.0f, 4.0f));
    const uint16_t up = f32_to_f16_up(f), down = f32_to_f16_down(f);
    ASSERT_GE(f16_to_f32(up), f);
    ASSERT_LE(f16_to_f32(down), f);
    // Either f is representable (up == down in value) or they are neighbours.
    if (f16_to_f32(up) != f16_to_f32(down)) {
      ASSERT_EQ(ordered(up) - ordered(down), 1) << f;
    }
  }
  EXPECT_EQ(round_f16_up(1.0f), 1.0f);
  EXPECT_EQ(round_f16_down(1.0f), 1.0f);
  EXPECT_GT(round_f16_up(1.0001f), 1.0f);
  EXPECT_EQ(round_f16_down(1.0001f), 1.0f);
  EXPECT_LT(round_f16_down(-1.0001f), -1.0f);
  EXPECT_EQ(round_f16_up(1e30f), std::numeric_limits<float>::infinity());
}

TEST(Json, QuotesAndValidatesUtf8) {
  EXPECT_EQ(json_quote("a\"b\\c\n"), "\"a\\\"b\\\\c\\n\"");
  EXPECT_EQ(json_quote(std::string("x\x01y")), "\"x\\u0001y\"");
  EXPECT_EQ(json_quote("caf\xC3\xA9"), "\"caf\xC3\xA9\"");
  EXPECT_EQ(json_quote("bad\xFF"), "\"bad\xEF\xBF\xBD\"");  // invalid byte -> U+FFFD
  EXPECT_EQ(json_quote("cut\xE2\x96"), "\"cut\xEF\xBF\xBD\xEF\xBF\xBD\"");
}

TEST(Json, WritesNestedObjects) {
  JsonWriter j;
  j.begin_object().kv("a", 1).key("b").begin_array().value(1.5).value("x").null().end_array();
  j.kv("c", true).kv("nan", std::nan("")).end_object();
  EXPECT_EQ(j.str(), "{\"a\":1,\"b\":[1.5,\"x\",null],\"c\":true,\"nan\":null}");
}

TEST(Rng, SameSeedSameStream) {
  Rng a(123), b(123), c(124);
  bool differs = false;
  for (int i = 0; i < 100; ++i) {
    const uint64_t x = a.next_u64();
    ASSERT_EQ(x, b.next_u64());
    differs |= x != c.next_u64();
  }
  EXPECT_TRUE(differs);
  Rng u(5);
  for (int i = 0; i < 10000; ++i) {
    const float f = u.uniform();
    ASSERT_GE(f, 0.0f);
    ASSERT_LT(f, 1.0f);
  }
}

TEST(Error, FailFormatsTheMessage) {
  try {
    fail("field '%s' = %d", "dim", -3);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "field 'dim' = -3");
  }
}

}  // namespace
}  // namespace kivi
