#include <cmath>
#include <cstring>
#include <vector>

#include "core/cpu.h"
#include "core/error.h"
#include "core/f16.h"
#include "core/rng.h"
#include "core/threadpool.h"
#include "ops/ops.h"
#include "test_util.h"

namespace kivi {
namespace {

using ops::DType;
using ops::Matrix;

struct TargetGuard {
  explicit TargetGuard(int64_t bits) { cpu::force_target_bits(bits); }
  ~TargetGuard() { cpu::reset_target(); }
};

struct Weights {
  std::vector<float> f32;
  std::vector<f16_t> f16;
  std::vector<uint16_t> bf16;  // the upper halves of f32
  Matrix m(DType t, int64_t rows, int64_t cols) const {
    const void* p = t == DType::kF32   ? static_cast<const void*>(f32.data())
                    : t == DType::kF16 ? static_cast<const void*>(f16.data())
                                       : static_cast<const void*>(bf16.data());
    return Matrix{p, t, rows, cols};
  }
};

Weights random_weights(size_t n, uint64_t seed) {
  Weights w;
  Rng r(seed);
  for (size_t i = 0; i < n; ++i) {
    w.f32.push_back(r.normal());
    w.f16.push_back(f32_to_f16(w.f32.back()));
    uint32_t bits;
    std::memcpy(&bits, &w.f32.back(), 4);
    w.bf16.push_back(static_cast<uint16_t>(bits >> 16));
  }
  return w;
}

// Each SIMD target's matvec stays within float rounding of the double reference:
// |y - y_ref| <= 1e-5 * sum_c |w_rc x_c| (a bound on the accumulated rounding error).
TEST(Ops, MatvecMatchesReferenceOnEveryTarget) {
  for (const auto& target : test::simd_targets()) {
    TargetGuard g(target.bits);
    for (auto [rows, cols] :
         {std::pair{1, 1}, {3, 7}, {64, 64}, {172, 64}, {64, 172}, {37, 301}, {512, 64}}) {
      const auto w = random_weights(static_cast<size_t>(rows) * cols, rows * 131 + cols);
      Rng r(cols);
      std::vector<float> x(cols);
      for (auto& v : x) v = r.normal();
      for (DType t : {DType::kF32, DType::kF16}) {
        const Matrix m = w.m(t, rows, cols);
        std::vector<float> y(rows), yr(rows);
        ops::matvec(m, x.data(), y.data(), nullptr);
        ops::ref::matvec(m, x.data(), yr.data());
        for (int i = 0; i < rows; ++i) {
          double mag = 0;
          for (int c = 0; c < cols; ++c) {
            const double wv =
                t == DType::kF32 ? w.f32[i * cols + c] : f16_to_f32(w.f16[i * cols + c]);
            mag += std::fabs(wv * x[c]);
          }
          ASSERT_NEAR(y[i], yr[i], 1e-5 * mag + 1e-30)
              << target.name << " " << ops::dtype_name(t) << " " << rows << "x" << cols << " row "
              << i;
        }
      }
    }
  }
}

// Batched matmul gives the same bits as one matvec per token, for any thread count. A
// single token and a batch run different kernels (one row at a time with both
// accumulator chains live, or tiles that swap chains through memory), so the shapes cover
// fewer columns than a vector, than a chain block and than two, tails after whole rounds
// (467 columns: whole rounds, then a part of a block for chain 1, on every target and
// weight size), rows that do not fill a tile, and wide rows (8192 columns and more, two
// rows side by side for a single token).
TEST(Ops, MatmulIsBitIdenticalToMatvecAndThreadCount) {
  ThreadPool p1(1), p3(3);
  for (const auto& target : test::simd_targets()) {
    TargetGuard g(target.bits);
    for (auto [rows, cols, n] : {std::tuple{172, 64, 7},
                                 {64, 172, 5},
                                 {517, 96, 13},
                                 {1024, 512, 4},
                                 {9, 7, 3},
                                 {5, 3, 4},
                                 {5, 467, 6},
                                 {6, 200, 9},
                                 {13, 8200, 5},
                                 {7, 8192 + 24, 2}}) {
      const auto w = random_weights(static_cast<size_t>(rows) * cols, 99);
      Rng r(1);
      std::vector<float> x(static_cast<size_t>(n) * cols);
      for (auto& v : x) v = r.normal();
      for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
        const Matrix m = w.m(t, rows, cols);
        std::vector<float> y1(static_cast<size_t>(n) * rows), y3(y1.size()), yv(y1.size());
        ops::matmul(m, x.data(), n, y1.data(), &p1);
        ops::matmul(m, x.data(), n, y3.data(), &p3);
        for (int i = 0; i < n; ++i) ops::matvec(m, x.data() + i * cols, yv.data() + i * rows, &p3);
        ASSERT_EQ(std::memcmp(y1.data(), y3.data(), y1.size() * 4), 0) << target.name;
        ASSERT_EQ(std::memcmp(y1.data(), yv.data(), y1.size() * 4), 0) << target.name;
      }
    }
  }
}

TEST(Ops, F16BulkConversionMatchesScalar) {
  for (const auto& target : test::simd_targets()) {
    TargetGuard g(target.bits);
    std::vector<f16_t> h(1000);
    for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<f16_t>(i * 65 + 3);
    std::vector<float> f(h.size());
    ops::f16_to_f32_n(h.data(), f.data(), h.size());
    for (size_t i = 0; i < h.size(); ++i) {
      const float s = f16_to_f32(h[i]);
      // Finite halves only: targets without F16C emulate the conversion and do not
      // keep Inf/NaN (weights and activations never hold them).
      if (std::isfinite(s)) {
        ASSERT_EQ(f[i], s) << target.name << " " << i;
      }
    }
  }
}

TEST(Ops, NormsAndActivations) {
  Rng r(5);
  std::vector<float> x(100), w(100), out(100), ref(100);
  for (int i = 0; i < 100; ++i) {
    x[i] = r.normal();
    w[i] = r.uniform(0.5f, 1.5f);
  }
  ops::rmsnorm(out.data(), x.data(), w.data(), 100, 1e-5f);
  ops::ref::rmsnorm(ref.data(), x.data(), w.data(), 100, 1e-5f);
  for (int i = 0; i < 100; ++i) ASSERT_NEAR(out[i], ref[i], 1e-6f * std::fabs(ref[i]) + 1e-7f);
  std::vector<float> s = x, sr = x;
  ops::softmax(s.data(), 100);
  ops::ref::softmax(sr.data(), 100);
  double total = 0;
  for (int i = 0; i < 100; ++i) {
    ASSERT_NEAR(s[i], sr[i], 1e-6f);
    total += s[i];
  }
  EXPECT_NEAR(total, 1.0, 1e-5);
  std::vector<float> g = {0.0f, 1.0f, -2.0f}, u = {2.0f, 3.0f, 1.0f};
  ops::silu_mul(g.data(), u.data(), 3);
  EXPECT_FLOAT_EQ(g[0], 0.0f);
  EXPECT_NEAR(g[1], 3.0 * 1.0 / (1.0 + std::exp(-1.0)), 1e-6);
  EXPECT_NEAR(g[2], -2.0 / (1.0 + std::exp(2.0)), 1e-6);
  for (const auto& target : test::simd_targets()) {
    TargetGuard tg(target.bits);
    EXPECT_NEAR(ops::dot(x.data(), w.data(), 100), ops::ref::dot(x.data(), w.data(), 100), 1e-4)
        << target.name;
  }
}

TEST(Cpu, TargetsCanBeForcedByName) {
  const auto targets = cpu::available_targets();
  ASSERT_FALSE(targets.empty());
  for (const auto& t : targets) {
    cpu::force_target(t.name);
    EXPECT_EQ(cpu::current_target_name(), t.name);
  }
  cpu::reset_target();
  EXPECT_EQ(cpu::current_target_name(), targets.front().name);
  EXPECT_THROW(cpu::force_target("nonsense"), Error);
}

}  // namespace
}  // namespace kivi
