#include "ops/ops.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/ops.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <algorithm>
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

// Finishes one dot product: lane reduction, then the scalar tail in order.
template <class WT>
HWY_INLINE float Finish(DF df, hn::Vec<DF> acc, const WT* HWY_RESTRICT w,
                        const float* HWY_RESTRICT x, size_t i, size_t n) {
  float s = hn::GetLane(hn::SumOfLanes(df, acc));
  for (; i < n; ++i) s += ScalarW(w, i) * x[i];
  return s;
}

// Each dot product runs two accumulator chains so that its multiply-adds do not all wait
// on each other: the columns' whole vector steps go in blocks of ChainSteps<WT>() (256
// bytes of weights), alternately to chain 0 and chain 1, and the result is
// SumOfLanes(chain 0 + chain 1) plus the scalar tail in order. Every (row, token) result
// is computed this way whatever the tile, the batch or the task, so results do not depend
// on them.
#if HWY_HAVE_SCALABLE
constexpr int kChains = 1;
#else
constexpr int kChains = 2;
#endif

// A single token runs both chains side by side, so it reads two places a block apart. On
// Zen 5 (f16, 16 lanes) blocks of 256 bytes read as fast as the bandwidth probe
// (core/bandwidth.h); blocks of 512 read 1.7x slower, and 1 KiB slower still.
template <class WT>
constexpr size_t ChainSteps() {
  constexpr size_t bytes = hn::MaxLanes(DF()) * sizeof(WT);
  return bytes >= 256 ? 1 : 256 / bytes;
}

// A single row's weights are prefetched this far ahead: on an Intel Xeon (2026-11-29,
// 260 MiB L3, matrices past it) one row at a time read F16 at 0.71 of the bandwidth
// probe without it and 0.86 with it (8192 x 2048, 2 threads), and decode of the
// Llama-3.2-1B shape in F16 went from 7.2 to 8.8 tok/s; the quantized kernels prefetch
// the same distance (ops/qdot32.cpp).
constexpr size_t kRowPrefetchBytes = 2048;

template <int C>
using Chain = std::integral_constant<int, C>;

// Calls f(Chain<c>(), i) for every whole vector step of chain c at column i; the chains
// advance side by side, block by block, so the weights are read in address order. The
// chain is a type so that accumulator arrays are indexed by constants and stay in
// registers.
template <size_t B, class F>
HWY_INLINE void ForSteps(size_t N, size_t n, F f) {
  const size_t steps = n / N;
  const size_t round = kChains * B;
  size_t b = 0;
  for (; b + round <= steps; b += round) {
    HWY_UNROLL(8)
    for (size_t k = 0; k < B; ++k) {
      f(Chain<0>(), (b + k) * N);
      if constexpr (kChains == 2) f(Chain<1>(), (b + B + k) * N);
    }
  }
  const size_t mid = std::min(steps, b + B);
  for (size_t j = b; j < mid; ++j) f(Chain<0>(), j * N);
  if constexpr (kChains == 2) {
    for (size_t j = mid; j < steps; ++j) f(Chain<1>(), j * N);
  }
}

// R rows for one token with every chain live (R * kChains accumulators):
// out[r] = w[r * ldw] . x.
template <int R, class WT>
HWY_INLINE void DotRows(const WT* HWY_RESTRICT w, size_t ldw, const float* HWY_RESTRICT x, size_t n,
                        float* HWY_RESTRICT out) {
  const DF df;
  const size_t N = hn::Lanes(df);
  hn::Vec<DF> acc[kChains][R];
  HWY_UNROLL(2)
  for (int c = 0; c < kChains; ++c) {
    HWY_UNROLL(4)
    for (int r = 0; r < R; ++r) acc[c][r] = hn::Zero(df);
  }
  ForSteps<ChainSteps<WT>()>(N, n, [&](auto chain, size_t i) HWY_ATTR {
    constexpr int c = decltype(chain)::value;
    const auto xv = hn::LoadU(df, x + i);
    HWY_UNROLL(4)
    for (int r = 0; r < R; ++r) {
      if constexpr (R == 1)
        hwy::Prefetch(reinterpret_cast<const uint8_t*>(w + i) + kRowPrefetchBytes);
      acc[c][r] = hn::MulAdd(LoadW(df, w + r * ldw + i), xv, acc[c][r]);
    }
  });
  HWY_UNROLL(4)
  for (int r = 0; r < R; ++r) {
    auto sum = acc[0][r];
    if constexpr (kChains == 2) sum = hn::Add(sum, acc[1][r]);
    out[r] = Finish(df, sum, w + r * ldw, x, n / N * N, n);
  }
}

// R rows x T tokens: out[t * ldo + r] = w[r * ldw] . x[t * ldx], for batches. Only one
// chain's R x T accumulators fit in the registers, so they go to memory at the end of
// each block and the other chain's come back; the weights are still read in order.
template <int R, int T, class WT>
HWY_INLINE void DotTile(const WT* HWY_RESTRICT w, size_t ldw, const float* HWY_RESTRICT x,
                        size_t ldx, size_t n, float* HWY_RESTRICT out, size_t ldo) {
  const DF df;
  const size_t N = hn::Lanes(df);
  const size_t steps = n / N;
  constexpr size_t B = ChainSteps<WT>();
  HWY_ALIGN float saved[kChains][R * T * hn::MaxLanes(df)];
  hn::Vec<DF> a[R][T];
  for (size_t b = 0, c = 0; b < steps; b += B, c = (c + 1) % kChains) {
    const bool first = b < kChains * B;
    HWY_UNROLL(4)
    for (int r = 0; r < R; ++r) {
      HWY_UNROLL(4)
      for (int t = 0; t < T; ++t)
        a[r][t] = first ? hn::Zero(df) : hn::Load(df, saved[c] + (r * T + t) * N);
    }
    const size_t e = std::min(steps, b + B);
    for (size_t j = b; j < e; ++j) {
      hn::Vec<DF> xv[T];
      HWY_UNROLL(4)
      for (int t = 0; t < T; ++t) xv[t] = hn::LoadU(df, x + t * ldx + j * N);
      HWY_UNROLL(4)
      for (int r = 0; r < R; ++r) {
        const auto wv = LoadW(df, w + r * ldw + j * N);
        HWY_UNROLL(4)
        for (int t = 0; t < T; ++t) a[r][t] = hn::MulAdd(wv, xv[t], a[r][t]);
      }
    }
    HWY_UNROLL(4)
    for (int r = 0; r < R; ++r) {
      HWY_UNROLL(4)
      for (int t = 0; t < T; ++t) hn::Store(a[r][t], df, saved[c] + (r * T + t) * N);
    }
  }
  // Chains that got no block are zero.
  for (size_t c = std::min<size_t>(kChains, (steps + B - 1) / B); c < kChains; ++c) {
    std::fill(saved[c], saved[c] + R * T * N, 0.0f);
  }
  HWY_UNROLL(4)
  for (int r = 0; r < R; ++r) {
    HWY_UNROLL(4)
    for (int t = 0; t < T; ++t) {
      auto sum = hn::Load(df, saved[0] + (r * T + t) * N);
      if constexpr (kChains == 2) sum = hn::Add(sum, hn::Load(df, saved[1] + (r * T + t) * N));
      out[t * ldo + r] = Finish(df, sum, w + r * ldw, x + t * ldx, steps * N, n);
    }
  }
}

#if HWY_HAVE_SCALABLE
constexpr int kBatchRows = 1, kTokTile = 1, kWideRowTile = 1;
#else
// Batches: kBatchRows x kTokTile accumulators (4 x 4 of 32 vector registers on AVX-512,
// 4 x 3 of 16 on AVX2); each weight vector feeds kTokTile multiply-adds and each
// activation vector kBatchRows.
constexpr int kBatchRows = 4, kTokTile = HWY_TARGET == HWY_AVX3 ? 4 : 3;
// Rows side by side for a single token over wide rows (see MatRows).
constexpr int kWideRowTile = 2;
#endif
// Rows of at least this many columns are wide: their activations (32 KiB of f32 at 8192)
// do not stay in L1 while a whole row streams past them.
constexpr size_t kWideCols = 8192;

// R rows for every token, in tiles of up to kTokTile tokens.
template <int R, class WT>
HWY_INLINE void RowsForTokens(const WT* HWY_RESTRICT w, size_t cols, const float* HWY_RESTRICT x,
                              int n, float* HWY_RESTRICT y, size_t rows) {
  int t = 0;
  for (; t + kTokTile <= n; t += kTokTile)
    DotTile<R, kTokTile>(w, cols, x + t * cols, cols, cols, y + t * rows, rows);
  switch (n - t) {  // fewer than a tile left: one pass
    case 3:
      if constexpr (kTokTile > 3)
        DotTile<R, 3>(w, cols, x + t * cols, cols, cols, y + t * rows, rows);
      break;
    case 2:
      if constexpr (kTokTile > 2)
        DotTile<R, 2>(w, cols, x + t * cols, cols, cols, y + t * rows, rows);
      break;
    case 1:
      DotTile<R, 1>(w, cols, x + t * cols, cols, cols, y + t * rows, rows);
      break;
    default:
      break;
  }
}

// Whether a single token reads wide rows two side by side. On Zen 5 one row at a time
// reloads the activations from L2 for every row, and two side by side measured 1.1-1.2x
// faster than one or four at 8192 columns. On an Intel Xeon one prefetched row at a time
// read 0.84-0.85 of the probe against 0.77-0.82 for two (2048 x 8192, 2 threads).
inline bool WideRowPairs() {
#if HWY_ARCH_X86
  static const bool pairs = !__builtin_cpu_is("intel");
  return pairs;
#else
  return true;
#endif
}

// Rows [r0, r1) for tokens [0, n). A single token reads one row at a time, so the weights
// stream in address order: four rows side by side (four streams 4 KiB apart) measured
// ~1.5x slower on Zen 5 at 2048 columns. Wide rows are the exception (WideRowPairs).
template <class WT>
void MatRows(const WT* HWY_RESTRICT w, size_t cols, const float* HWY_RESTRICT x, int n,
             float* HWY_RESTRICT y, size_t rows, size_t r0, size_t r1) {
  size_t r = r0;
  if (n == 1) {
    if (cols >= kWideCols && WideRowPairs()) {
      for (; r + kWideRowTile <= r1; r += kWideRowTile)
        DotRows<kWideRowTile>(w + r * cols, cols, x, cols, y + r);
    }
    for (; r < r1; ++r) DotRows<1>(w + r * cols, cols, x, cols, y + r);
    return;
  }
  for (; r + kBatchRows <= r1; r += kBatchRows)
    RowsForTokens<kBatchRows>(w + r * cols, cols, x, n, y + r, rows);
  for (; r < r1; ++r) RowsForTokens<1>(w + r * cols, cols, x, n, y + r, rows);
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
  DotRows<1>(a, n, b, n, &out);
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
  // Split rows in groups of 4; each (row, token) result is computed the same way in any
  // task, so the split does not change the bits.
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

void gelu_tanh_mul(float* gate, const float* up, int n) {
  constexpr float kC = 0.7978845608028654f;  // sqrt(2 / pi)
  for (int i = 0; i < n; ++i) {
    const float g = gate[i];
    gate[i] = 0.5f * g * (1.0f + std::tanh(kC * (g + 0.044715f * g * g * g))) * up[i];
  }
}

void swiglu_oai_mul(float* gate, const float* up, int n, float alpha, float limit) {
  for (int i = 0; i < n; ++i) {
    const float g = std::min(gate[i], limit);
    const float u = std::clamp(up[i], -limit, limit);
    gate[i] = g / (1.0f + std::exp(-alpha * g)) * (u + 1.0f);
  }
}

void softcap(float* x, size_t n, float cap) {
  const float inv = 1.0f / cap;
  for (size_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] * inv);
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
