// The interface between the attention driver (attention.cpp) and the per-target task
// loop (task.cpp): one task's arguments, the layout of its scratch memory, and the
// switches tests use to reach every kernel variant.
#pragma once

#include <atomic>
#include <cstddef>

#include "attn/attention.h"
#include "kv/tq.h"

namespace kivi::attn {

// Tokens per tile: a tile's staged K and V rows (2 x 64 x D floats) stay in L1/L2.
inline constexpr int kTile = 64;

// One task: query heads [h * rep, (h + 1) * rep) against tokens [t0, t1) of KV head h.
struct TaskArgs {
  const kv::LayerView* kv = nullptr;
  int h = 0;
  int t0 = 0, t1 = 0;
  const float* q = nullptr;  // [rep][D], unscaled
  int rep = 1;
  float scale = 1.0f;
  const float* slopes = nullptr;  // [rep] ALiBi slopes or null
  float softcap = 0.0f;           // scores -> softcap * tanh(scores / softcap); 0: none
  int q_pos = 0;
  float* out = nullptr;  // per head r: out[r * out_stride + i]: o[0..D), then m, d
  int out_stride = 0;
  const float* rope = nullptr;  // keys stored before RoPE: Params::rope, else null
  RopeStyle rope_style = RopeStyle::kAdjacent;
  float* scratch = nullptr;  // ScratchLayout(rep, D, ld).floats() floats
  int ld = 0;                // capacity of the score row per head (>= t1 - t0)
  Precision precision = Precision::kExact;
};

// The task of a decode step (query q [n_heads][D] at position kv.n_tokens - 1, with p's
// scale, soft cap, ALiBi slopes, RoPE and precision) over tokens [t0, t1) of KV head h: its state
// goes to out [rep][D + 2], its scores fill rows of ld floats of `scratch`.
inline TaskArgs decode_task(const kv::LayerView& kv, const float* q, const Params& p, int h, int t0,
                            int t1, float* out, float* scratch, int ld) {
  const int D = kv.k.head_dim, rep = p.n_heads / kv.k.n_heads;
  TaskArgs a;
  a.kv = &kv;
  a.h = h;
  a.t0 = t0;
  a.t1 = t1;
  a.q = q + static_cast<size_t>(h) * rep * D;
  a.rep = rep;
  a.scale = p.scale;
  a.slopes = p.alibi_slopes ? p.alibi_slopes + h * rep : nullptr;
  a.softcap = p.softcap;
  a.q_pos = kv.n_tokens - 1;
  a.out = out;
  a.out_stride = D + 2;
  a.scratch = scratch;
  a.ld = ld;
  a.precision = p.precision;
  a.rope = p.rope;
  a.rope_style = p.rope_style;
  return a;
}

// A task's scratch memory: offsets in floats from TaskArgs::scratch. The fast paths
// carve their temporaries from the staging buffers they do not use (task.cpp).
struct ScratchLayout {
  size_t qn;    // [rep][D] the scaled query
  size_t S;     // [rep][ld] scores, then softmax weights, of the task's range
  size_t kbuf;  // [kTile][D] staged key rows
  size_t vbuf;  // [kTile][D] staged value rows
  size_t sp;    // [D] a key group's scales
  size_t zp;    // [D] a key group's zero points
  size_t vs;    // [kTile][D] a tile's per-token parameters: int8/group scales, KIVI value scales
  size_t vz;    // [kTile][D] KIVI value zero points
  size_t rs;    // [kTile] a tile's row scales (int8, tq)
  size_t qr;    // [rep][D] the scaled query in the head's rotated space (tq keys)
  size_t orot;  // [rep][D] the weighted sum of rotated values (tq values)
  size_t end;   // total

  ScratchLayout(int rep, int D, int ld) {
    const size_t tile = static_cast<size_t>(kTile) * D;
    qn = 0;
    S = qn + static_cast<size_t>(rep) * D;
    kbuf = S + static_cast<size_t>(rep) * ld;
    vbuf = kbuf + tile;
    sp = vbuf + tile;
    zp = sp + D;
    vs = zp + D;
    vz = vs + tile;
    rs = vz + tile;
    qr = rs + kTile;
    orot = qr + static_cast<size_t>(rep) * D;
    end = orot + static_cast<size_t>(rep) * D;
  }
  size_t floats() const { return end; }
};

// Runs a task on the SIMD target chosen at run time.
void attend_range(const TaskArgs& a);

// y[i] = exp(x[i]) for x[i] <= 0 with the softmax's vector exp (0 below -87.3), on the
// SIMD target chosen at run time. For tests.
void exp_nonpositive(const float* x, float* y, int n);

// tq rows i = 0..n) at rows + i * stride with scales rs[i] decoded into the rotated space,
// out[n][dim], on the SIMD target chosen at run time (the staging of the decode task). For
// tests.
void decode_tq_rows(const kv::TqCodec& c, const uint8_t* rows, size_t stride, int n,
                    const float* rs, float* out);

// Kernel variants that tests force so that every one runs on a machine that would
// otherwise pick another:
//   wide_scores / wide_kivi_values: whether the AVX3 target runs its 512-bit exact-path
//     kernels (the default) or the 256-bit ones it shares with AVX2, for scores (float,
//     f16 and int8 rows, KIVI keys) and for KIVI values;
//   vnni: whether the AVX3 fast path uses AVX512-VNNI where the CPU has it (the default)
//     or the vpmaddwd sequence of CPUs without it.
struct KernelSwitches {
  std::atomic<bool> wide_scores{true};
  std::atomic<bool> wide_kivi_values{true};
  std::atomic<bool> vnni{true};
};
inline KernelSwitches g_switches;

void set_wide_exact_kernels(bool scores, bool kivi_values);
void set_vnni_kernels(bool enabled);

}  // namespace kivi::attn
