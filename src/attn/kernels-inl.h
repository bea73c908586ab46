// The kernels the task loop (task.cpp) calls, per SIMD target: declared here, defined
// in the multi-target translation units kernels_rows.cpp (f32, f16 and int8 rows),
// kernels_kivi.cpp (KIVI keys and values) and kernels_tq.cpp (tq rows). Every translation unit is
// compiled for the same targets, so task.cpp's code for a target calls that target's kernels.
//
// Conventions: D is the head size, rep the query heads of one KV head, S[r * ld + i]
// the score (then the softmax weight) of head r and token i of the range, O + r *
// ostride head r's unnormalized output; rows of a tile are at rows + i * stride.

#ifndef KIVI_ATTN_KERNEL_ARGS_ONCE
#define KIVI_ATTN_KERNEL_ARGS_ONCE
#include <cstddef>
#include <cstdint>

#include "attn/prefetch.h"
#include "core/f16.h"
#include "kv/kv_cache.h"
#include "kv/tq.h"

namespace kivi::attn {

// One task's KIVI key scores over tokens [t0, t1) (all stored), group by group.
struct KeyGroupArgs {
  const kv::StreamView* K;
  int h, t0, t1;    // column 0 of S is token t0
  const float* qn;  // [rep][D], scaled
  int rep;
  float* S;  // [rep][ld]
  int ld;
  float* sp;   // [D] a group's scales
  float* zp;   // [D] a group's zero points
  float* qs;   // [4][D] the prepared query: floats (exact) or int16 (fast)
  float* tmp;  // [4][G] a partial group's scores
  bool wide;   // 512-bit vectors (AVX3)
};

// The most query heads per KV head the fast int8 key kernel takes: their int16 query
// lives in the key staging buffer and their scales on the stack.
inline constexpr int kMaxFastInt8Heads = 64;

}  // namespace kivi::attn
#endif  // KIVI_ATTN_KERNEL_ARGS_ONCE

// Per-target include guard (Highway's toggle).
#if defined(KIVI_ATTN_KERNELS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KIVI_ATTN_KERNELS_INL_H_
#undef KIVI_ATTN_KERNELS_INL_H_
#else
#define KIVI_ATTN_KERNELS_INL_H_
#endif

#include "attn/vec-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kivi::attn::HWY_NAMESPACE {

// --- Row formats (kernels_rows.cpp) ----------------------------------------------

// S[r * ld + i] = q_r . row_i for T = float, f16_t and int8_t rows (int8: the codes;
// the caller applies the row scales).
template <class T>
void DotRows(const float* q, int rep, int D, const T* rows, size_t stride, int len, float* S,
             int ld, Prefetcher& pf);
// O_r += sum_i P[r * ld + i] row_i for T = float, f16_t and int8_t rows.
template <class T>
void AccumRows(const float* P, int ld, int rep, int D, const T* rows, size_t stride, int len,
               float* O, size_t ostride, Prefetcher& pf);
// Staging of f32 and f16 rows as floats: out[len][D].
template <class T>
void StageRows(const T* rows, size_t stride, int len, int D, float* out);
// Staging of int8 rows with scales per row or per group of Gc channels: out[len][D].
void DequantInt8(const int8_t* rows, size_t stride, int len, int D, const float* row_scale,
                 const float* group_scale, int Gc, size_t gstride, float* out);

#ifdef KIVI_X86
// Fast int8 keys (one scale per row): whether the kernel takes the shape; the query of
// the rep heads rounded to int16 once per task (q16 [rep][D], scales qsc [rep]); the
// scores of n rows with row scales rs[n].
bool FastInt8KeysOk(int D, int rep);
void PrepareInt8KeyQuery(const float* qn, int rep, int D, int16_t* q16, float* qsc);
void FastInt8Keys(const int16_t* q16, const float* qsc, int rep, int D, const int8_t* rows,
                  size_t stride, int n, const float* rs, float* S, int ld, Prefetcher& pf);
#endif

// --- KIVI (kernels_kivi.cpp) -------------------------------------------------------

// Staging of tokens [i0, i0 + len) of one key group of G interleaved rows at `group`,
// with the group's parameters sp, zp [D]: out[len][D].
void DequantKiviKeys(const uint8_t* group, int G, int i0, int len, int D, int bits, const float* sp,
                     const float* zp, float* out);
// Staging of value tokens [t, t + len) of one block: `quad` holds token t, t4 = t % 4,
// per-token parameters s, z [len][gstride] per group of Gc channels: out[len][D].
void DequantKiviValues(const uint8_t* quad, int t4, int len, int D, int bits, int Gc,
                       const float* s, const float* z, size_t gstride, float* out);

#ifdef KIVI_X86
// Key groups: whether the group kernels take the shape (step: tokens per pass, two
// vectors), and the scores of a task's stored keys (fast or exact).
bool KiviKeyGroupsOk(int D, int bits, int G, int step);
void KiviKeyGroups(const KeyGroupArgs& k, bool fast, Prefetcher& pf);

// Values without staging, over n tokens of one block starting at the quad `quad0`
// (t4 = position in the first quad), parameters vs, vz [n][D/Gc]:
//   exact: whole quads (t4 = 0, n % 4 == 0), 2- and 4-bit codes; lut: scratch of
//          n (D/Gc) 8 floats;
//   fast:  any range; wq, wsc, wtmp: scratch (task.cpp).
bool ExactKiviValuesOk(int D, int bits, int Gc, int t4, int n);
void AccumKiviExact(const float* P, int ld, int rep, int D, int bits, int Gc, const uint8_t* quad0,
                    int n, const float* vs, const float* vz, float* O, size_t ostride, float* lut);
bool FastKiviValuesOk(int D, int bits, int Gc);
void FastKiviValues(const float* P, int ld, int rep, int D, int bits, int Gc, const uint8_t* quad0,
                    int t4, int n, const float* vs, const float* vz, float* O, size_t ostride,
                    uint64_t* wq, float* wsc, float* wtmp);
#endif

// --- tq (kernels_tq.cpp) -------------------------------------------------------------

// Rows i = 0..n) at rows + i * stride with scales rs[i] decoded into the rotated space:
// out[n][dim] (kv::TqCodec::decode_rotated for every row, bit for bit).
void DecodeTqRows(const kv::TqCodec& c, const uint8_t* rows, size_t stride, int n, const float* rs,
                  float* out);

}  // namespace kivi::attn::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
