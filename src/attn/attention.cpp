#include "attn/attention.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <string>

#include "core/error.h"
#include "core/threadpool.h"
#include "attn/task.h"

namespace kivi::attn {

const char* precision_name(Precision p) { return p == Precision::kExact ? "exact" : "fast"; }

Precision parse_precision(const std::string& s) {
  if (s == "exact") return Precision::kExact;
  if (s == "fast") return Precision::kFast;
  fail("--attn-precision: unknown value '%s' (valid: exact, fast)", s.c_str());
}

std::vector<float> alibi_slopes(int n) {
  // Press et al. 2022, and the extension used by BLOOM/MPT for non-powers of two.
  std::vector<float> s(n);
  int p2 = 1;
  while (p2 * 2 <= n) p2 *= 2;
  const double base = std::pow(2.0, -8.0 / p2);
  for (int i = 0; i < p2; ++i) s[i] = static_cast<float>(std::pow(base, i + 1));
  if (p2 < n) {
    const double base2 = std::pow(2.0, -4.0 / p2);
    for (int i = 0; i < n - p2; ++i) s[p2 + i] = static_cast<float>(std::pow(base2, 2 * i + 1));
  }
  return s;
}

void rotate_rope(float* x, int D, const float* rope_row, RopeStyle style) {
  const int half = D / 2;
  for (int i = 0; i < half; ++i) {
    const float c = rope_row[2 * i], s = rope_row[2 * i + 1];
    const int i0 = style == RopeStyle::kAdjacent ? 2 * i : i;
    const int i1 = style == RopeStyle::kAdjacent ? 2 * i + 1 : i + half;
    const float a = x[i0], b = x[i1];
    x[i0] = a * c - b * s;
    x[i1] = a * s + b * c;
  }
}

namespace {

void prefetch_lines(const void* p, size_t bytes) {
  const char* c = static_cast<const char*>(p);
  const uintptr_t first = reinterpret_cast<uintptr_t>(c) & ~uintptr_t{63};
  for (uintptr_t at = first; at < reinterpret_cast<uintptr_t>(c) + bytes; at += 64)
    __builtin_prefetch(reinterpret_cast<const void*>(at), 0, 2);
}

void prefetch_stream(const kv::StreamView& st, int h, int t0, int t1) {
  const size_t ps = kv::param_size(st.param_type);
  for (int t = t0; t < t1;) {
    if (t >= st.n_stored) {  // residual rows (the ring may wrap)
      const int e = st.ring_run_end(t, t1);
      prefetch_lines(st.residual_row(t, h),
                     static_cast<size_t>(e - t) * st.head_dim * sizeof(float));
      t = e;
      continue;
    }
    const int e = std::min({t1, st.n_stored, (t / st.block + 1) * st.block});
    const kv::StreamView::Span s = st.span(t, e, h);
    prefetch_lines(s.codes, s.bytes);
    if (s.count) {
      prefetch_lines(st.scales + s.first * ps, s.count * ps);
      if (st.zeros) prefetch_lines(st.zeros + s.first * ps, s.count * ps);
    }
    t = e;
  }
}

}  // namespace

void prefetch_range(const kv::LayerView& kv, int h, int t0, int t1) {
  prefetch_stream(kv.k, h, t0, t1);
  prefetch_stream(kv.v, h, t0, t1);
}

void normalize_state(float* o, int D, float m, float d, const float* sink) {
  // A sink adds exp(sink - m) to the denominator; with no token (d = 0, m = -inf) the
  // output is zero either way.
  const float den = sink && d > 0.0f ? d + std::exp(*sink - m) : d;
  const float inv = den > 0.0f ? 1.0f / den : 0.0f;
  for (int i = 0; i < D; ++i) o[i] *= inv;
}

void merge_partials(const float* partials, size_t stride, int count, int rep, int D, float* out,
                    const float* head_sinks) {
  assert(count >= 1);
  for (int r = 0; r < rep; ++r) {
    float* o = out + static_cast<size_t>(r) * D;
    const float* first = partials + static_cast<size_t>(r) * (D + 2);
    std::copy(first, first + D, o);
    State acc{first[D], first[D + 1], o};
    for (int c = 1; c < count; ++c) {
      const float* b = partials + c * stride + static_cast<size_t>(r) * (D + 2);
      merge(acc, State{b[D], b[D + 1], const_cast<float*>(b)}, D);  // (merge reads b.o)
    }
    normalize_state(o, D, acc.m, acc.d, head_sinks ? head_sinks + r : nullptr);
  }
}

void merge_partial_states(const float* partials, size_t stride, int count, int rep, int D,
                          float* out) {
  assert(count >= 1);
  for (int r = 0; r < rep; ++r) {
    float* o = out + static_cast<size_t>(r) * (D + 2);
    const float* first = partials + static_cast<size_t>(r) * (D + 2);
    std::copy(first, first + D + 2, o);
    State acc{first[D], first[D + 1], o};
    for (int c = 1; c < count; ++c) {
      const float* b = partials + c * stride + static_cast<size_t>(r) * (D + 2);
      merge(acc, State{b[D], b[D + 1], const_cast<float*>(b)}, D);
    }
    o[D] = acc.m;
    o[D + 1] = acc.d;
  }
}

void merge(State& a, const State& b, int D) {
  if (b.d == 0.0f) return;
  if (a.d == 0.0f) {
    a.m = b.m;
    a.d = b.d;
    std::copy(b.o, b.o + D, a.o);
    return;
  }
  const float m = std::max(a.m, b.m);
  const float ca = std::exp(a.m - m), cb = std::exp(b.m - m);
  for (int i = 0; i < D; ++i) a.o[i] = a.o[i] * ca + b.o[i] * cb;
  a.d = a.d * ca + b.d * cb;
  a.m = m;
}

namespace {
int round_to_blocks(int tokens, int block) {
  return std::max(1, (tokens + block - 1) / block) * block;
}
}  // namespace

// Chunks of 2048 tokens amortize a task's fixed costs (query preparation, prefetch
// start, partial state and merge): at 64K context, 2 threads, 4-17% faster than 512
// (docs/KERNELS.md). Shorter contexts, or few KV heads, halve the chunk down to 512
// tokens while there are fewer than kMinTasks tasks. The choice does not depend on the
// thread count, so results are the same bits with any number of threads.
constexpr int kMinTasks = 32;
// Multiply-adds (scores and values) below which a call runs on one thread.
constexpr int64_t kParallelMacs = int64_t{1} << 17;
int chunk_tokens(int block) { return round_to_blocks(2048, block); }
int min_chunk_tokens(int block) { return round_to_blocks(512, block); }

int chunk_tokens_for(int block, int n_kv_heads, int range) {
  int C = chunk_tokens(block);
  const int c_min = min_chunk_tokens(block);
  while (C > c_min && static_cast<long>(n_kv_heads) * ((range + C - 1) / C) < kMinTasks) {
    C = std::max(c_min, round_to_blocks(C / 2, block));
  }
  return C;
}

Workspace::Workspace(int n_threads, int n_heads, int n_kv_heads, int head_dim, int block, int ctx) {
  const int rep = n_heads / n_kv_heads;
  const int chunks = (ctx + min_chunk_tokens(block) - 1) / min_chunk_tokens(block);
  max_tasks_ = n_kv_heads * (chunks + 1);  // + a sink task per head
  task_stride_ = static_cast<size_t>(rep) * (head_dim + 2);
  task_stride_ = (task_stride_ + 15) / 16 * 16;
  partial_.reset(task_stride_ * max_tasks_);
  // Each thread's scratch is followed by a guard of kGuardFloats that the debug builds
  // check after every call: a kernel writing past its ScratchLayout fails loudly there.
  scratch_floats_ = ScratchLayout(rep, head_dim, chunk_tokens(block)).floats();
  scratch_stride_ = (scratch_floats_ + kGuardFloats + 15) / 16 * 16;
  scratch_.reset(scratch_stride_ * std::max(1, n_threads));
  for (size_t base = 0; base < scratch_.size(); base += scratch_stride_) {
    for (size_t i = base + scratch_floats_; i < base + scratch_stride_; ++i) {
      std::memcpy(&scratch_[i], &kGuardBits, sizeof(float));
    }
  }
}

bool Workspace::scratch_guards_intact() const {
  for (size_t base = 0; base < scratch_.size(); base += scratch_stride_) {
    for (size_t i = base + scratch_floats_; i < base + scratch_stride_; ++i) {
      uint32_t bits;
      std::memcpy(&bits, &scratch_[i], sizeof(bits));
      if (bits != kGuardBits) return false;
    }
  }
  return true;
}

namespace {

// decode() and decode_state(): `states` false writes out [n_heads][D] normalized, true
// writes out [n_heads][D + 2] as (o unnormalized, m, d).
void decode_impl(const kv::LayerView& kv, const float* q, float* out, const Params& p,
                 ThreadPool* pool, Workspace& ws, bool states) {
  const int n = kv.n_tokens, D = kv.k.head_dim, Hkv = kv.k.n_heads;
  const int rep = p.n_heads / Hkv;
  if (n == 0) {
    if (!states) {
      std::fill(out, out + static_cast<size_t>(p.n_heads) * D, 0.0f);
      return;
    }
    empty_states(out, p.n_heads, D);
    return;
  }
  const int start = p.window > 0 ? std::max(0, n - p.window) : 0;
  // Sink tokens [0, sink_end) before the window: one more task per head, merged first.
  const int sink_end = start > 0 ? std::min(p.sinks, start) : 0;
  const int sink_tasks = sink_end > 0 ? 1 : 0;
  const int C = chunk_tokens_for(kv.k.block, Hkv, n - start);
  const int c_first = start / C, c_last = (n - 1) / C;
  const int n_chunks = c_last - c_first + 1 + sink_tasks;  // per head
  const int n_tasks = Hkv * n_chunks;
  assert(n_tasks <= ws.max_tasks());
  auto task = [&](int ti, int thread) {
    const int h = ti / n_chunks, j = ti % n_chunks;
    int t0 = 0, t1 = sink_end;
    if (j >= sink_tasks) {
      const int c = c_first + j - sink_tasks;
      t0 = std::max(start, c * C);
      t1 = std::min(n, (c + 1) * C);
    }
    // ws.partial(ti): [rep][D + 2], o then m, d.
    attend_range(decode_task(kv, q, p, h, t0, t1, ws.partial(ti), ws.thread_scratch(thread), C));
  };
  // Calls too small to gain from a second thread (a few microseconds: short contexts of
  // small models) run on the caller alone; the result is the same either way.
  const int64_t macs = 2ll * (n - start + sink_end) * p.n_heads * D;
  if (pool && pool->size() > 1 && n_tasks > 1 && macs >= kParallelMacs) {
    pool->run(n_tasks, task);
  } else {
    for (int t = 0; t < n_tasks; ++t) task(t, 0);
  }
  assert(ws.scratch_guards_intact());
  // Merge the states in task order (sinks, then chunks), per head.
  for (int h = 0; h < Hkv; ++h) {
    if (states) {
      merge_partial_states(ws.partial(h * n_chunks), ws.task_stride(), n_chunks, rep, D,
                           out + static_cast<size_t>(h) * rep * (D + 2));
    } else {
      merge_partials(ws.partial(h * n_chunks), ws.task_stride(), n_chunks, rep, D,
                     out + static_cast<size_t>(h) * rep * D,
                     p.head_sinks ? p.head_sinks + static_cast<size_t>(h) * rep : nullptr);
    }
  }
}

}  // namespace

void decode(const kv::LayerView& kv, const float* q, float* out, const Params& p, ThreadPool* pool,
            Workspace& ws) {
  decode_impl(kv, q, out, p, pool, ws, false);
}

void empty_states(float* states, int n_heads, int D) {
  for (int h = 0; h < n_heads; ++h) {
    float* s = states + static_cast<size_t>(h) * (D + 2);
    std::fill(s, s + D, 0.0f);
    s[D] = -INFINITY;
    s[D + 1] = 0.0f;
  }
}

void decode_state(const kv::LayerView& kv, const float* q, float* states, const Params& p,
                  ThreadPool* pool, Workspace& ws) {
  decode_impl(kv, q, states, p, pool, ws, true);
}

}  // namespace kivi::attn
