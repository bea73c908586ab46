// Matrix products over every weight type, on every SIMD target this machine has:
// the fast kernels against the double-precision reference over the dequantized weights
// (with a bound derived from the activations' 8-bit rounding), against ggml's products
// in the fixtures' matvec.gguf, batched = one call per token bit for bit, and
// independent of the thread count.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/aligned.h"
#include "core/cpu.h"
#include "core/rng.h"
#include "core/threadpool.h"
#include "io/gguf.h"
#include "ops/ops.h"
#include "ops/qkernels.h"
#include "quant/blocks.h"
#include "quant/dequant.h"
#include "quant/quantize.h"
#include "test_util.h"

namespace kivi {
namespace {

using quant::Type;

struct TargetGuard {
  explicit TargetGuard(int64_t bits) { cpu::force_target_bits(bits); }
  ~TargetGuard() { cpu::reset_target(); }
};

const Type kWeightTypes[] = {Type::kF32,  Type::kF16,  Type::kBF16, Type::kQ4_0, Type::kQ4_1,
                             Type::kQ5_0, Type::kQ5_1, Type::kQ8_0, Type::kQ2_K, Type::kQ3_K,
                             Type::kQ4_K, Type::kQ5_K, Type::kQ6_K, Type::kMXFP4};

// A random matrix quantized to `t` (normal values, a few x10 outliers), its exact
// dequantization, and the matrix view.
struct QMatrix {
  Type type;
  int64_t rows, cols;
  std::vector<uint8_t> bytes;
  std::vector<float> deq;
  ops::Matrix m() const { return ops::Matrix{bytes.data(), type, rows, cols}; }
};

QMatrix random_matrix(Type t, int64_t rows, int64_t cols, uint64_t seed) {
  QMatrix q{t, rows, cols, {}, {}};
  Rng r(seed);
  std::vector<float> src(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < src.size(); ++i)
    src[i] = r.normal() * (i % 53 == 7 ? 10.0f : 1.0f) * 0.05f;
  const size_t rb = quant::row_bytes(t, static_cast<uint64_t>(cols));
  q.bytes.resize(rb * static_cast<size_t>(rows) + 64);  // slack: rows need not be aligned
  q.deq.resize(src.size());
  for (int64_t i = 0; i < rows; ++i) {
    quant::quantize_row(t, src.data() + i * cols, q.bytes.data() + i * rb, cols);
    quant::dequantize_row(t, q.bytes.data() + i * rb, q.deq.data() + i * cols, cols);
  }
  return q;
}

std::vector<float> random_x(int64_t n, uint64_t seed) {
  Rng r(seed);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = r.normal();
  return x;
}

// Bound on |fast - reference| for row r: the activations' rounding (half a step of
// their block, amax / 127 / 2, times the weights' magnitudes) plus f32 accumulation
// (1e-5 of sum |w x|, as for the float kernels).
double error_bound(const QMatrix& q, const std::vector<float>& x, int64_t r) {
  const int block = quant::is_float(q.type) ? 0 : quant::is_k_quant(q.type) ? 256 : 32;
  double bound = 0, mag = 0;
  for (int64_t c0 = 0; c0 < q.cols; c0 += block ? block : q.cols) {
    const int64_t c1 = block ? c0 + block : q.cols;
    double amax = 0, wsum = 0;
    for (int64_t c = c0; c < c1; ++c) {
      amax = std::max(amax, std::fabs(static_cast<double>(x[c])));
      wsum += std::fabs(static_cast<double>(q.deq[r * q.cols + c]));
      mag += std::fabs(static_cast<double>(q.deq[r * q.cols + c]) * x[c]);
    }
    if (block) bound += amax / 127.0 / 2.0 * wsum;
  }
  return bound + 1e-5 * mag + 1e-30;
}

TEST(QMatmul, EveryTypeMatchesTheReferenceOnEveryTarget) {
  for (const auto& target : test::simd_targets()) {
    TargetGuard g(target.bits);
    for (Type t : kWeightTypes) {
      const int block = quant::info(t).block;
      for (auto [rows, cols] :
           {std::pair<int64_t, int64_t>{1, 256}, {3, 512}, {37, 768}, {64, 256}}) {
        if (block == 32 && cols == 768) cols = 96;  // a row of 3 blocks
        const QMatrix q = random_matrix(
            t, rows, cols, static_cast<uint64_t>(rows * 1000 + cols + static_cast<int>(t)));
        const auto x = random_x(cols, static_cast<uint64_t>(cols) + 5);
        std::vector<float> y(rows), yr(rows);
        ops::matvec(q.m(), x.data(), y.data(), nullptr);
        ops::ref::matvec(q.m(), x.data(), yr.data());
        double worst = 0;
        for (int64_t r = 0; r < rows; ++r) {
          const double bound = error_bound(q, x, r);
          worst = std::max(worst, std::fabs(y[r] - static_cast<double>(yr[r])) / bound);
          ASSERT_LE(std::fabs(y[r] - static_cast<double>(yr[r])), bound)
              << target.name << " " << quant::type_name(t) << " " << rows << "x" << cols << " row "
              << r << ": " << y[r] << " vs " << yr[r];
        }
        // The bound is not vacuous: the error uses a fair part of it only for the
        // quantized activations, and stays far below it.
        ASSERT_LT(worst, 0.5) << target.name << " " << quant::type_name(t);
      }
    }
  }
}

TEST(QMatmul, BatchedEqualsPerTokenAndThreadCountDoesNotMatter) {
  ThreadPool p1(1), p3(3);
  for (Type t : kWeightTypes) {
    for (auto [rows, cols, n] : {std::tuple<int64_t, int64_t, int>{172, 256, 7},
                                 {133, 512, 13},
                                 {64, 1024, 4},
                                 {40, 256, 10}}) {
      const QMatrix q = random_matrix(t, rows, cols, 99 + static_cast<uint64_t>(t));
      const auto x = random_x(cols * n, 1);
      for (const auto& target : test::simd_targets()) {
        TargetGuard g(target.bits);
        std::vector<float> y1(static_cast<size_t>(n * rows)), y3(y1.size()), yv(y1.size());
        ops::matmul(q.m(), x.data(), n, y1.data(), &p1);
        ops::matmul(q.m(), x.data(), n, y3.data(), &p3);
        for (int i = 0; i < n; ++i)
          ops::matvec(q.m(), x.data() + i * cols, yv.data() + i * rows, &p3);
        ASSERT_EQ(std::memcmp(y1.data(), y3.data(), y1.size() * 4), 0)
            << target.name << " " << quant::type_name(t);
        ASSERT_EQ(std::memcmp(y1.data(), yv.data(), y1.size() * 4), 0)
            << target.name << " " << quant::type_name(t);
      }
    }
  }
}

// The x86 kernels give the same bits on AVX2 and on AVX-512 with and without VNNI: the
// 512-bit K-quant kernels (Q4_K, Q6_K) sum the same integer products into the same lanes
// as the 256-bit ones, the 512-bit Q8_0, Q4_0 and MXFP4 kernels hold the 256-bit kernel's even-
// and odd-block accumulators in their two halves, and vpdpbusd / vpdpwssd the same
// integers as vpmaddubsw and vpmaddwd. Rows of 32-value blocks also come with an odd
// number of blocks (the last one runs alone), and 7 tokens leave a partial tile.
TEST(QMatmul, X86KernelsGiveTheSameBitsOnEveryPath) {
  std::vector<cpu::Target> x86;
  for (const auto& target : test::simd_targets()) {
    if (target.name == "AVX2" || target.name == "AVX3") x86.push_back(target);
  }
  if (x86.size() < 2) GTEST_SKIP() << "needs both AVX2 and AVX-512";
  for (Type t : kWeightTypes) {
    for (auto [cols, n] : {std::pair<int64_t, int>{1024, 12}, {1056, 7}}) {
      if (quant::is_float(t)) continue;
      if (cols % 256 != 0 && quant::is_k_quant(t)) continue;
      const int64_t rows = 67;  // n = 12: tiles of 8 and 4 on AVX3, 4 on AVX2
      const QMatrix q = random_matrix(t, rows, cols, 7 + static_cast<uint64_t>(t));
      const auto x = random_x(cols * n, 3);
      std::vector<std::vector<float>> y;
      for (bool vnni : {true, false}) {
        ops::detail::set_vnni_allowed(vnni);
        for (const auto& target : x86) {
          TargetGuard g(target.bits);
          y.emplace_back(static_cast<size_t>(n * rows));
          ops::matmul(q.m(), x.data(), n, y.back().data(), nullptr);
        }
      }
      ops::detail::set_vnni_allowed(true);
      for (size_t i = 1; i < y.size(); ++i) {
        ASSERT_EQ(std::memcmp(y[0].data(), y[i].data(), y[0].size() * 4), 0)
            << quant::type_name(t) << " " << cols << " columns, path " << i;
      }
    }
  }
}

// The activation quantizers give the same bytes on every target, and the K-quant one
// equals Q8_K (quant::quantize_row, which reproduces ggml's bytes).
TEST(QMatmul, ActivationQuantizationIsTheSameOnEveryTarget) {
  const int64_t cols = 2048;
  auto x = random_x(cols, 3);
  x[5] = 4.0f;
  x[9] = -4.0f;  // a tie in magnitude: the first decides the sign of the Q8_K scale
  for (int i = 512; i < 768; ++i) x[i] = 0.0f;  // an all-zero block
  namespace detail = ops::detail;
  using detail::ActKind;
  for (ActKind k : {ActKind::kQ8x32, ActKind::kQ8x256}) {
    const auto l = detail::act_layout(k, cols);
    AlignedBuffer<uint8_t> first(l.bytes), out(l.bytes);
    bool have_first = false;
    for (const auto& target : test::simd_targets()) {
      TargetGuard g(target.bits);
      std::memset(out.data(), 0, l.bytes);
      detail::quantize_acts(k, x.data(), cols, out.data());
      if (!have_first) {
        std::memcpy(first.data(), out.data(), l.bytes);
        have_first = true;
      }
      ASSERT_EQ(std::memcmp(first.data(), out.data(), l.bytes), 0) << target.name;
      if (k == ActKind::kQ8x256) {
        for (int64_t b = 0; b < cols / 256; ++b) {
          quant::BlockQ8_K ref;
          quant::quantize_row(Type::kQ8_K, x.data() + 256 * b, &ref, 256);
          ASSERT_EQ(std::memcmp(ref.qs, out.data() + l.q + 256 * b, 256), 0)
              << target.name << " block " << b;
          ASSERT_EQ(std::memcmp(ref.bsums, out.data() + l.extra + 32 * b, 32), 0) << target.name;
          float d;
          std::memcpy(&d, out.data() + l.d + 4 * b, 4);
          ASSERT_EQ(d, ref.d) << target.name;
        }
      } else {
        // Definition: q = round_half_even(x * (127 / amax)), as ggml rounds activations on x86.
        for (int64_t b = 0; b < cols / 32; ++b) {
          float amax = 0;
          for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[32 * b + j]));
          const float id = amax != 0 ? 127.0f / amax : 0.0f;
          for (int j = 0; j < 32; ++j) {
            const int8_t want = static_cast<int8_t>(std::nearbyint(x[32 * b + j] * id));
            ASSERT_EQ(static_cast<int8_t>(out.data()[l.q + 32 * b + j]), want) << target.name;
          }
        }
      }
    }
  }
}

// ggml's products in matvec.gguf: y = deq(w) . x in double. The reference reproduces
// them exactly; the fast path (activations quantized like ggml's) stays within
// 2e-3 * sum |w x|, the tolerance the fixture's README gives for such kernels.
TEST(QMatmul, MatchesGgmlMatvecFixture) {
  const std::string path = test::shared_dir() + "/fixtures/quants/matvec.gguf";
  ASSERT_TRUE(test::file_exists(path)) << "missing " << path;
  io::GgufFile f(path);
  auto f32 = [&](const std::string& name) {
    const io::GgufTensor* t = f.find_tensor(name);
    EXPECT_NE(t, nullptr) << name;
    std::vector<float> v(t ? t->n_elements : 0);
    if (t) std::memcpy(v.data(), t->data, v.size() * 4);
    return v;
  };
  const auto x = f32("x");
  ASSERT_EQ(x.size(), 1024u);
  for (const char* name : {"q8_0", "q4_0", "q4_k", "q6_k"}) {
    const io::GgufTensor* w = f.find_tensor(std::string("w.") + name);
    ASSERT_NE(w, nullptr) << name;
    const auto want = f32(std::string("y.") + name), yabs = f32(std::string("yabs.") + name);
    const ops::Matrix m{w->data, static_cast<Type>(w->type), 64, 1024};
    std::vector<float> yr(64);
    ops::ref::matvec(m, x.data(), yr.data());
    for (int r = 0; r < 64; ++r) ASSERT_EQ(yr[r], want[r]) << name << " row " << r;
    for (const auto& target : test::simd_targets()) {
      TargetGuard g(target.bits);
      std::vector<float> y(64);
      ops::matvec(m, x.data(), y.data(), nullptr);
      double worst = 0;
      for (int r = 0; r < 64; ++r) {
        worst = std::max(worst, std::fabs(y[r] - static_cast<double>(want[r])) / yabs[r]);
        ASSERT_LE(std::fabs(y[r] - want[r]), 2e-3 * yabs[r])
            << target.name << " " << name << " row " << r;
      }
      std::printf("  %-6s %-7s max |y - y_ggml| / yabs = %.2e\n", target.name.c_str(), name, worst);
    }
  }
}

// MXFP4 against the block formula ggml's products use, written here from the format:
// per block, 2^(e - 128) * dx times the integer sum of the codes' values (the doubled
// E2M1 numbers, -12..12) with the 8-bit activations qx. The weights are random bytes, so
// every code appears, with exponents from 100 to 150 within each row. The kernels sum
// these block terms in f32 in their own order: the bound is 1e-5 of sum |term|.
TEST(QMatmul, Mxfp4MatchesTheBlockFormulaOnEveryTarget) {
  const int8_t values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
  const int64_t rows = 19, cols = 32 * 37;
  const int n = 5;
  const int64_t nb = cols / 32;
  Rng r(11);
  std::vector<uint8_t> w(static_cast<size_t>(rows * nb * 17));
  for (size_t i = 0; i < w.size(); ++i) {
    w[i] = static_cast<uint8_t>(i % 17 == 0 ? 100 + r.next_u64() % 51 : r.next_u64() & 0xFF);
  }
  const ops::Matrix m{w.data(), Type::kMXFP4, rows, cols};
  const auto x = random_x(cols * n, 4);
  // The activations as the kernels quantize them (the same bytes on every target).
  namespace detail = ops::detail;
  const auto l = detail::act_layout(detail::ActKind::kQ8x32, cols);
  AlignedBuffer<uint8_t> acts(l.bytes * n);
  for (int t = 0; t < n; ++t)
    detail::quantize_acts(detail::ActKind::kQ8x32, x.data() + t * cols, cols,
                          acts.data() + t * l.bytes);
  std::vector<double> want(static_cast<size_t>(n * rows)), mag(want.size());
  for (int t = 0; t < n; ++t) {
    const auto* qx = reinterpret_cast<const int8_t*>(acts.data() + t * l.bytes + l.q);
    const auto* dx = reinterpret_cast<const float*>(acts.data() + t * l.bytes + l.d);
    for (int64_t row = 0; row < rows; ++row) {
      double sum = 0, abs_sum = 0;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = w.data() + (row * nb + b) * 17;
        int isum = 0;
        for (int j = 0; j < 16; ++j) {
          isum += values[blk[1 + j] & 15] * qx[32 * b + j];
          isum += values[blk[1 + j] >> 4] * qx[32 * b + j + 16];
        }
        const double term = std::ldexp(1.0, blk[0] - 128) * dx[b] * isum;
        sum += term;
        abs_sum += std::fabs(term);
      }
      want[t * rows + row] = sum;
      mag[t * rows + row] = abs_sum;
    }
  }
  for (const auto& target : test::simd_targets()) {
    TargetGuard g(target.bits);
    std::vector<float> y(want.size());
    ops::matmul(m, x.data(), n, y.data(), nullptr);
    double worst = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      const double err = std::fabs(y[i] - want[i]);
      worst = std::max(worst, err / mag[i]);
      ASSERT_LE(err, 1e-5 * mag[i]) << target.name << " token " << i / rows << " row " << i % rows
                                    << ": " << y[i] << " vs " << want[i];
    }
    std::printf("  %-6s MXFP4 max |y - formula| / sum |term| = %.2e\n", target.name.c_str(), worst);
  }
}

TEST(QMatmul, EmbeddingRowsAreExactDequantization) {
  for (Type t : kWeightTypes) {
    const QMatrix q = random_matrix(t, 5, 512, 7);
    std::vector<float> row(512);
    for (int r = 0; r < 5; ++r) {
      ops::copy_row(q.m(), r, row.data());
      ASSERT_EQ(std::memcmp(row.data(), q.deq.data() + r * 512, 512 * 4), 0) << quant::type_name(t);
    }
  }
}

}  // namespace
}  // namespace kivi
