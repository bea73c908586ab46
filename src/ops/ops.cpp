#include "ops/ops.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/ops.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "core/aligned.h"
#include "core/threadpool.h"
#include "ops/qkernels.h"
#include "quant/dequant.h"

HWY_BEFORE_NAMESPACE();
namespace kivi::ops::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;

// bfloat16 weights: the upper half of an f32.
struct Bf16 {
  uint16_t bits;
};

template <class WT>
HWY_INLINE hn::Vec<DF> LoadW(DF df, const WT* HWY_RESTRICT p) {
  if constexpr (sizeof(WT) == 4) {
    return hn::LoadU(df, reinterpret_cast<const float*>(p));
  } else if constexpr (std::is_same_v<WT, Bf16>) {
    const hn::Rebind<uint16_t, DF> du16;
    const hn::RebindToUnsigned<DF> du32;
    const auto u = hn::PromoteTo(du32, hn::LoadU(du16, reinterpret_cast<const uint16_t*>(p)));
    return hn::BitCast(df, hn::ShiftLeft<16>(u));
  } else {
    const hn::Rebind<hwy::float16_t, DF> dh;
    return hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p)));
  }
}

template <class WT>
HWY_INLINE float ScalarW(const WT* p, size_t i) {
  if constexpr (sizeof(WT) == 4) {
    return reinterpret_cast<const float*>(p)[i];
  } else if constexpr (std::is_same_v<WT, Bf16>) {
    return quant::bf16_to_f32(p[i].bits);
  } else {
    return f16_to_f32(reinterpret_cast<const uint16_t*>(p)[i]);
  }
}

// Finishes one dot product: lane reduction, then the scalar tail in order. Shared by
// every tile shape so that each (row, token) result has the same bits.
template <class WT>
HWY_INLINE float Finish(DF df, hn::Vec<DF> acc, const WT* HWY_RESTRICT w,
                        const float* HWY_RESTRICT x, size_t i, size_t n) {
  float s = hn::GetLane(hn::SumOfLanes(df, acc));
  for (; i < n; ++i) s += ScalarW(w, i) * x[i];
  return s;
}

// R rows x T tokens of dot products; each pair has one accumulator chain over the
// columns in vector steps. out[t * ldo + r].
template <int R, int T, class WT>
HWY_INLINE void DotTile(const WT* HWY_RESTRICT w, size_t ldw, const float* HWY_RESTRICT x,
                        size_t ldx, size_t n, float* HWY_RESTRICT out, size_t ldo) {
  const DF df;
  const size_t N = hn::Lanes(df);
#if HWY_HAVE_SCALABLE
  static_assert(R == 1 && T == 1, "scalable vectors use 1x1 tiles");
#endif
  hn::Vec<DF> acc[R][T];
  HWY_UNROLL(8)
  for (int r = 0; r < R; ++r) {
    HWY_UNROLL(8)
    for (int t = 0; t < T; ++t) acc[r][t] = hn::Zero(df);
  }
  size_t i = 0;
  for (; i + N <= n; i += N) {
    hn::Vec<DF> xv[T];
    HWY_UNROLL(8)
    for (int t = 0; t < T; ++t) xv[t] = hn::LoadU(df, x + t * ldx + i);
    HWY_UNROLL(8)
    for (int r = 0; r < R; ++r) {
      const auto wv = LoadW(df, w + r * ldw + i);
      HWY_UNROLL(8)
      for (int t = 0; t < T; ++t) acc[r][t] = hn::MulAdd(wv, xv[t], acc[r][t]);
    }
  }
  HWY_UNROLL(8)
  for (int r = 0; r < R; ++r) {
    HWY_UNROLL(8)
    for (int t = 0; t < T; ++t)
      out[t * ldo + r] = Finish(df, acc[r][t], w + r * ldw, x + t * ldx, i, n);
  }
}

#if HWY_HAVE_SCALABLE
constexpr int kRowTile = 1, kTokTile = 1;
#else
// 4 rows x 4 tokens with 32 vector registers (AVX-512: 16 accumulators, 4 activations,
// a weight; each converted weight vector feeds 4 multiply-adds), 4 x 3 with 16 (AVX2).
// A 2 x 8 tile on AVX-512 was 40% slower at batch 8: its 8 activation rows stream from
// L2 at every step.
constexpr int kRowTile = 4, kTokTile = HWY_TARGET == HWY_AVX3 ? 4 : 3;
#endif

// Rows [r0, r1) for tokens [0, n). Every (row, token) result is one accumulator chain
// over the columns whatever the tile, so results do not depend on the batch.
template <class WT>
void MatRows(const WT* HWY_RESTRICT w, size_t cols, const float* HWY_RESTRICT x, int n,
             float* HWY_RESTRICT y, size_t rows, size_t r0, size_t r1) {
  size_t r = r0;
  for (; r + kRowTile <= r1; r += kRowTile) {
    const WT* wr = w + r * cols;
    int t = 0;
    for (; t + kTokTile <= n; t += kTokTile) {
      DotTile<kRowTile, kTokTile>(wr, cols, x + t * cols, cols, cols, y + t * rows + r, rows);
    }
    if constexpr (kTokTile == 4) {  // 3 left: one pass, not three
      if (t + 3 <= n) {
        DotTile<kRowTile, 3>(wr, cols, x + t * cols, cols, cols, y + t * rows + r, rows);
        t += 3;
      }
    }
    for (; t < n; ++t)
      DotTile<kRowTile, 1>(wr, cols, x + t * cols, cols, cols, y + t * rows + r, rows);
  }
  for (; r < r1; ++r) {
    for (int t = 0; t < n; ++t)
      DotTile<1, 1>(w + r * cols, cols, x + t * cols, cols, cols, y + t * rows + r, rows);
  }
}

void MatRowsF32(const float* w, size_t cols, const float* x, int n, float* y, size_t rows,
                size_t r0, size_t r1) {
  MatRows(w, cols, x, n, y, rows, r0, r1);
}
void MatRowsF16(const uint16_t* w, size_t cols, const float* x, int n, float* y, size_t rows,
                size_t r0, size_t r1) {
  MatRows(w, cols, x, n, y, rows, r0, r1);
}
void MatRowsBF16(const uint16_t* w, size_t cols, const float* x, int n, float* y, size_t rows,
                 size_t r0, size_t r1) {
  MatRows(reinterpret_cast<const Bf16*>(w), cols, x, n, y, rows, r0, r1);
}

float DotF32(const float* a, const float* b, size_t n) {
  float out;
  DotTile<1, 1>(a, n, b, n, n, &out, 1);
  return out;
}

void F16ToF32(const uint16_t* HWY_RESTRICT in, float* HWY_RESTRICT out, size_t n) {
  const DF df;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const size_t N = hn::Lanes(df);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(in) + i)),
               df, out + i);
  }
  for (; i < n; ++i) out[i] = f16_to_f32(in[i]);
}

}  // namespace kivi::ops::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kivi::ops {

HWY_EXPORT(MatRowsF32);
HWY_EXPORT(MatRowsF16);
HWY_EXPORT(MatRowsBF16);
HWY_EXPORT(DotF32);
HWY_EXPORT(F16ToF32);

const char* dtype_name(DType t) { return quant::info(t).name; }

// Below this many multiply-adds a call runs on the calling thread: waking workers
// costs more than it saves.
static constexpr int64_t kParallelMacs = 1 << 17;
// Tasks per thread: rows are split into many small tasks so that a thread delayed by
// the system holds up a step by one small task, not by its whole share.
static constexpr int kTasksPerThread = 8;

namespace detail {

void quantize_acts(ActKind k, const float* x, int64_t cols, uint8_t* out) {
  if (k == ActKind::kQ8x32) {
    quantize_acts32(x, cols, out);
  } else {
    quantize_acts256(x, cols, out);
  }
}

static std::atomic<bool> g_vnni_allowed{true};
void set_vnni_allowed(bool allowed) { g_vnni_allowed.store(allowed, std::memory_order_relaxed); }
bool use_vnni() {
  static const bool has = __builtin_cpu_supports("avx512vnni");
  return has && g_vnni_allowed.load(std::memory_order_relaxed);
}

void quant_rows(quant::Type t, const uint8_t* w, size_t row_bytes, int64_t cols,
                const uint8_t* acts, size_t act_stride, int n, float* y, size_t ldy, size_t r0,
                size_t r1) {
  if (quant::is_k_quant(t)) {
    rowsk(t, w, row_bytes, cols, acts, act_stride, n, y, ldy, r0, r1);
  } else {
    rows32(t, w, row_bytes, cols, acts, act_stride, n, y, ldy, r0, r1);
  }
}

}  // namespace detail

// The calling thread's buffer of quantized activations; it grows to the largest
// product seen and is then reused, so decoding allocates nothing.
static uint8_t* activation_buffer(size_t bytes) {
  thread_local AlignedBuffer<uint8_t> buf;
  if (buf.size() < bytes) buf.reset(bytes, false);
  return buf.data();
}

void matmul(const Matrix& w, const float* x, int n, float* y, ThreadPool* pool) {
  const size_t rows = static_cast<size_t>(w.rows), cols = static_cast<size_t>(w.cols);
  const detail::ActKind kind = detail::act_kind(w.dtype);
  const uint8_t* acts = nullptr;
  size_t act_stride = 0;
  if (kind != detail::ActKind::kNone) {
    act_stride = detail::act_layout(kind, w.cols).bytes;
    uint8_t* buf = activation_buffer(act_stride * static_cast<size_t>(n));
    for (int t = 0; t < n; ++t)
      detail::quantize_acts(kind, x + static_cast<size_t>(t) * cols, w.cols, buf + t * act_stride);
    acts = buf;
  }
  auto run = [&](size_t r0, size_t r1) {
    switch (w.dtype) {
      case DType::kF32:
        HWY_DYNAMIC_DISPATCH(MatRowsF32)(w.f32(), cols, x, n, y, rows, r0, r1);
        break;
      case DType::kF16:
        HWY_DYNAMIC_DISPATCH(MatRowsF16)(w.f16(), cols, x, n, y, rows, r0, r1);
        break;
      case DType::kBF16:
        HWY_DYNAMIC_DISPATCH(MatRowsBF16)(w.f16(), cols, x, n, y, rows, r0, r1);
        break;
      default:
        detail::quant_rows(w.dtype, static_cast<const uint8_t*>(w.data), w.row_bytes(), w.cols,
                           acts, act_stride, n, y, rows, r0, r1);
    }
  };
  const int64_t macs = static_cast<int64_t>(rows) * static_cast<int64_t>(cols) * n;
  if (!pool || pool->size() == 1 || macs < kParallelMacs) {
    run(0, rows);
    return;
  }
  // Split rows in multiples of 4 (the float kernels' row tile) so tiles never straddle
  // tasks; each (row, token) result is computed the same way in any task.
  const size_t tiles = (rows + 3) / 4;
  const int n_tasks = static_cast<int>(
      std::min<size_t>(tiles, static_cast<size_t>(pool->size()) * kTasksPerThread));
  pool->run(n_tasks, [&](int task, int) {
    const size_t b = std::min(rows, tiles * task / n_tasks * 4);
    const size_t e = std::min(rows, tiles * (task + 1) / n_tasks * 4);
    if (b < e) run(b, e);
  });
}

void matvec(const Matrix& w, const float* x, float* y, ThreadPool* pool) {
  matmul(w, x, 1, y, pool);
}

float dot(const float* a, const float* b, size_t n) {
  return HWY_DYNAMIC_DISPATCH(DotF32)(a, b, n);
}

void f16_to_f32_n(const f16_t* in, float* out, size_t n) {
  HWY_DYNAMIC_DISPATCH(F16ToF32)(in, out, n);
}

void f32_to_f16_n(const float* in, f16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = f32_to_f16(in[i]);
}

void rmsnorm(float* out, const float* x, const float* weight, int n, float eps) {
  double ss = 0.0;
  for (int i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(ss / n + eps));
  for (int i = 0; i < n; ++i) out[i] = weight[i] * (inv * x[i]);
}

void silu_mul(float* gate, const float* up, int n) {
  for (int i = 0; i < n; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void add_inplace(float* y, const float* x, int n) {
  for (int i = 0; i < n; ++i) y[i] += x[i];
}

void softmax(float* x, int n) {
  float mx = x[0];
  for (int i = 1; i < n; ++i) mx = std::max(mx, x[i]);
  double sum = 0.0;
  for (int i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int i = 0; i < n; ++i) x[i] *= inv;
}

void copy_row(const Matrix& m, int64_t row, float* out) {
  const size_t cols = static_cast<size_t>(m.cols);
  if (m.dtype == DType::kF32) {
    std::memcpy(out, m.f32() + row * cols, cols * sizeof(float));
  } else if (m.dtype == DType::kF16) {
    f16_to_f32_n(m.f16() + row * cols, out, cols);
  } else {
    quant::dequantize_row(m.dtype, m.row(row), out, m.cols);
  }
}

}  // namespace kivi::ops
#endif  // HWY_ONCE
