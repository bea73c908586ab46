// The attention task, compiled for every SIMD target (Highway foreach_target) and
// chosen at run time. One task is one KV head h and a range of tokens (at most one
// sequence chunk):
//   1. scores  S[r][i] = q_r . k_i for the rep query heads of h   (K read in its format)
//   2. ALiBi bias, then the online softmax update of (m, d, o)    (softmax-inl.h)
//   3. values  o_r += sum_i p_r[i] v_i                           (V read in its format)
// K and V are each read in one sequential pass over the range, a tile of kTile tokens
// at a time (stored KIVI keys on AVX2/AVX3: a group at a time, before the tiles), with
// software prefetching a fixed distance ahead (prefetch.h).
//
// f32/f16 rows, int8 rows with one scale per row and, on AVX2/AVX3, KIVI keys and
// 2- and 4-bit KIVI values are read in place (kernels_rows.cpp, kernels_kivi.cpp). Other
// quantized rows are dequantized a tile at a time into an L1-resident staging buffer and
// consumed at once. Either way the bytes read from memory are the compressed ones, and
// no copy of the history is kept.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attn/task.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>

#include <hwy/cache_control.h>
#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include "attn/kernels-inl.h"
#include "attn/params-inl.h"
#include "attn/prefetch.h"
#include "attn/rope-inl.h"
#include "attn/softmax-inl.h"
#include "attn/stage-inl.h"
#include "attn/task.h"
#include "attn/vec-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kivi::attn::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// What every step of a task shares: its streams and shape, its scratch buffers
// (ScratchLayout), and which fast kernels apply.
struct Task {
  const TaskArgs& a;
  const kv::StreamView& K;
  const kv::StreamView& V;
  int D, rep, h, B, ld;
  float* qn;                 // [rep][D] scaled query
  float* S;                  // [rep][ld] scores of [a.t0, a.t1), then weights
  float* kbuf;               // [kTile][D] staged keys
  float* vbuf;               // [kTile][D] staged values
  float* sp;                 // [D] key group scales
  float* zp;                 // [D] key group zero points
  float* vs;                 // [kTile][D/Gc] per-token parameters (value scales, int8 group scales)
  float* vz;                 // [kTile][D/Gc] value zero points
  float* rs;                 // [kTile] int8 row scales, tq row scales
  float* qr;                 // [rep][D] rotated keys: the scaled query rotated as the head's keys
  float* orot;               // [rep][D] rotated values: the rotated weighted sum
  bool fast_int8_k = false;  // fast int8 keys (int16 query in kbuf, scales in q16_scale)
  bool fast_kivi_v = false;  // fast KIVI values (weights in vbuf, temporaries in kbuf)
  bool group_kivi_k = false;  // KIVI keys by the group kernels (query and partial group in kbuf)
  bool wide_k = false;        // ... with 512-bit vectors
  bool pre_rope = false;      // keys stored before RoPE: staged in kbuf and rotated
  bool rot_k = false;  // stored keys scored in the rotated space (against qr): tq, rotated int8
  bool rot_v = false;  // stored values summed in the rotated space (into orot)
  float q16_scale[kMaxFastInt8Heads + 4];

  explicit Task(const TaskArgs& args)
      : a(args),
        K(args.kv->k),
        V(args.kv->v),
        D(K.head_dim),
        rep(args.rep),
        h(args.h),
        B(K.block),
        ld(args.ld) {
    const ScratchLayout L(rep, D, ld);
    qn = a.scratch + L.qn;
    S = a.scratch + L.S;
    kbuf = a.scratch + L.kbuf;
    vbuf = a.scratch + L.vbuf;
    sp = a.scratch + L.sp;
    zp = a.scratch + L.zp;
    vs = a.scratch + L.vs;
    vz = a.scratch + L.vz;
    rs = a.scratch + L.rs;
    qr = a.scratch + L.qr;
    orot = a.scratch + L.orot;
    assert(D % 8 == 0 && a.t1 - a.t0 <= ld);
    pre_rope = a.rope != nullptr;
    rot_k = K.rotated && !pre_rope;  // (before RoPE the staged rows are rotated back)
    rot_v = V.rotated;
#ifdef KIVI_X86
    const bool fast = a.precision == Precision::kFast;
    const int kbits = kv::format_bits(K.fmt.format), vbits = kv::format_bits(V.fmt.format);
    fast_int8_k = fast && K.fmt.format == kv::Format::kInt8 &&
                  K.fmt.granularity != kv::Int8Granularity::kGroup && FastInt8KeysOk(D, rep);
    fast_kivi_v = fast && kv::is_kivi(V.fmt.format) && FastKiviValuesOk(D, vbits, V.group);
    wide_k = HWY_TARGET == HWY_AVX3 && K.group % 32 == 0 &&
             (fast || g_switches.wide_scores.load(std::memory_order_relaxed));
    group_kivi_k = kv::is_kivi(K.fmt.format) &&
                   KiviKeyGroupsOk(D, kbits, K.group, wide_k ? 32 : 16) &&
                   4 * (D + K.group) <= kTile * D;
    if (pre_rope) fast_int8_k = group_kivi_k = false;  // keys need their rotation first
#endif
  }
  // The scores of token t (column t - a.t0 of S).
  float* scores(int t) const { return S + (t - a.t0); }
};

// qn = the query times the softmax scale; every head's state (o, m, d) = (0, -inf, 0).
void StartTask(const Task& k) {
  const TaskArgs& a = k.a;
  const hn::ScalableTag<float> df;
  const int N = static_cast<int>(hn::Lanes(df)), n = k.rep * k.D;
  const auto sv = hn::Set(df, a.scale);
  int i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::Mul(hn::LoadU(df, a.q + i), sv), df, k.qn + i);
  for (; i < n; ++i) k.qn[i] = a.q[i] * a.scale;
  for (int r = 0; r < k.rep; ++r) {
    float* o = a.out + static_cast<size_t>(r) * a.out_stride;
    std::fill(o, o + k.D, 0.0f);
    o[k.D] = -std::numeric_limits<float>::infinity();
    o[k.D + 1] = 0.0f;
  }
  // Rotated streams: the query rotated once per head (q . k = Rq . Rk); the rotated value
  // sum from 0.
  const size_t n_rows = static_cast<size_t>(k.rep) * k.D;
  if (k.rot_k) {
    std::memcpy(k.qr, k.qn, n_rows * sizeof(float));
    for (int r = 0; r < k.rep; ++r) k.K.rotations[k.h].forward(k.qr + static_cast<size_t>(r) * k.D);
  }
  if (k.rot_v) std::fill(k.orot, k.orot + n_rows, 0.0f);
}

// Adds the byte ranges the task reads from one stream, in reading order: its stored
// codes block by block, then the residual rows (the ring may wrap).
void ListRanges(const Task& k, const kv::StreamView& st, Prefetcher& pf) {
  const int t_end = k.a.t1;
  for (int t = k.a.t0; t < t_end;) {
    if (t < st.n_stored) {
      const int e = std::min({t_end, st.n_stored, (t / k.B + 1) * k.B});
      const kv::StreamView::Span s = st.span(t, e, k.h);  // whole key groups, value quads
      pf.add(s.codes, s.bytes, s.row_bytes);
      t = e;
    } else {
      const int e = st.ring_run_end(t, t_end);
      const size_t row = static_cast<size_t>(k.D) * sizeof(float);
      pf.add(st.residual_row(t, k.h), static_cast<size_t>(e - t) * row, row);
      t = e;
    }
  }
}

// Prefetches the quantization parameters of the tile starting at token t (< end): they
// live in their own arrays, so they are fetched a tile ahead of their codes.
void PrefetchParams(const Task& k, const kv::StreamView& st, int t, int end) {
  if (t >= end || t >= st.n_stored) return;
  const int n = std::min({end - t, kTile, (t / k.B + 1) * k.B - t, st.n_stored - t});
  const kv::StreamView::Span s = st.span(t, t + n, k.h);
  const size_t ps = kv::param_size(st.param_type);
  for (size_t b = 0; b < s.count * ps; b += 64) {
    hwy::Prefetch(st.scales + s.first * ps + b);
    if (st.zeros) hwy::Prefetch(st.zeros + s.first * ps + b);
  }
}

// --- 1. Scores ---------------------------------------------------------------------

// Keys stored before RoPE: the stored keys [t0, t0 + n) (one tile, within one block)
// dequantized into kbuf, rotated by their positions, and scored against every query
// head of the KV head (one rotation serves all of them).
void ScoreStoredTilePreRope(Task& k, int t0, int n, Prefetcher& pf) {
  const int D = k.D;
  StageStored(k.K, k.h, t0, n, k.kbuf, k.vs, k.vz, k.sp, k.zp, k.rs);
  RotateRows(k.kbuf, n, D, k.a.rope + static_cast<size_t>(t0) * D, k.a.rope_style);
  DotRows(k.qn, k.rep, D, k.kbuf, static_cast<size_t>(D), n, k.scores(t0), k.ld, pf);
}

// Scores of the stored keys [t0, t0 + n) (one tile, within one block), by format.
void ScoreStoredTile(Task& k, int t0, int n, Prefetcher& pf) {
  if (k.pre_rope) return ScoreStoredTilePreRope(k, t0, n, pf);
  const kv::StreamView& K = k.K;
  const int D = k.D, rep = k.rep, h = k.h;
  float* St = k.scores(t0);
  if (K.tq && k.rot_k) {  // centroid rows in the rotated space against the rotated query
    StageTqRotated(K, h, t0, n, k.kbuf, k.rs);
    DotRows(k.qr, rep, D, k.kbuf, static_cast<size_t>(D), n, St, k.ld, pf);
    return;
  }
  const float* q = k.rot_k ? k.qr : k.qn;  // rotated int8 rows: against the rotated query
  switch (K.fmt.format) {
    case kv::Format::kF32:
      DotRows(q, rep, D, reinterpret_cast<const float*>(K.row(t0, h)), K.token_stride / 4, n, St,
              k.ld, pf);
      return;
    case kv::Format::kF16:
      DotRows(q, rep, D, reinterpret_cast<const f16_t*>(K.row(t0, h)), K.token_stride / 2, n, St,
              k.ld, pf);
      return;
    case kv::Format::kInt8: {
      const int8_t* codes = reinterpret_cast<const int8_t*>(K.row(t0, h));
      LoadInt8Scales(K, t0, h, n, k.rs, k.vs);
#ifdef KIVI_X86
      if (k.fast_int8_k) {
        FastInt8Keys(reinterpret_cast<const int16_t*>(k.kbuf), k.q16_scale, rep, D, codes,
                     K.token_stride, n, k.rs, St, k.ld, pf);
        return;
      }
#endif
      if (K.fmt.granularity != kv::Int8Granularity::kGroup) {
        // One scale per row: the codes are converted inside the dot products and the
        // scores scaled afterwards, so nothing is staged.
        DotRows(q, rep, D, codes, K.token_stride, n, St, k.ld, pf);
        for (int r = 0; r < rep; ++r)
          for (int i = 0; i < n; ++i) St[static_cast<size_t>(r) * k.ld + i] *= k.rs[i];
        return;
      }
      DequantInt8(codes, K.token_stride, n, D, nullptr, k.vs, K.group, D / K.group, k.kbuf);
      DotRows(q, rep, D, k.kbuf, static_cast<size_t>(D), n, St, k.ld, pf);
      return;
    }
    default: {  // KIVI keys the group kernels do not take: staged group by group
      StageStored(K, h, t0, n, k.kbuf, k.vs, k.vz, k.sp, k.zp, k.rs);
      DotRows(q, rep, D, k.kbuf, static_cast<size_t>(D), n, St, k.ld, pf);
      return;
    }
  }
}

// Scores of the residual keys [r0, r1) (full-precision rows, at most a tile). Where the
// ring wraps inside the range, the rows are gathered into kbuf first, so that the scores
// are computed over one run whatever the ring's length (the kernels' rounding depends on
// where a run starts): a cache that keeps more ring rows for cutting back scores the same
// bits. Before RoPE, the rows are copied into kbuf and rotated first.
void ScoreResidual(const Task& k, const kv::StreamView& st, int r0, int r1, Prefetcher& pf) {
  if (r0 >= r1) return;
  const float* rows = st.residual_row(r0, k.h);
  if (st.ring_run_end(r0, r1) < r1 || k.pre_rope) {
    const size_t row = static_cast<size_t>(k.D) * sizeof(float);
    for (int t = r0; t < r1;) {
      const int e = st.ring_run_end(t, r1);
      std::memcpy(k.kbuf + static_cast<size_t>(t - r0) * k.D, st.residual_row(t, k.h),
                  static_cast<size_t>(e - t) * row);
      t = e;
    }
    if (k.pre_rope)
      RotateRows(k.kbuf, r1 - r0, k.D, k.a.rope + static_cast<size_t>(r0) * k.D, k.a.rope_style);
    rows = k.kbuf;
  }
  DotRows(k.qn, k.rep, k.D, rows, static_cast<size_t>(k.D), r1 - r0, k.scores(r0), k.ld, pf);
}

// Every score of the range: the stored KIVI keys group by group first where the group
// kernels take them, then tile by tile the other stored keys and the residual.
void ScoreKeys(Task& k, Prefetcher& pf) {
  const TaskArgs& a = k.a;
  const kv::StreamView& K = k.K;
#ifdef KIVI_X86
  if (k.fast_int8_k)
    PrepareInt8KeyQuery(k.rot_k ? k.qr : k.qn, k.rep, k.D, reinterpret_cast<int16_t*>(k.kbuf),
                        k.q16_scale);
  if (k.group_kivi_k && K.n_stored > a.t0) {
    const KeyGroupArgs ka{&K,      a.h,   a.t0,   std::min(a.t1, K.n_stored),
                          k.qn,    k.rep, k.S,    k.ld,
                          k.sp,    k.zp,  k.kbuf, k.kbuf + static_cast<size_t>(4) * k.D,
                          k.wide_k};
    KiviKeyGroups(ka, a.precision == Precision::kFast, pf);
  }
#endif
  if (!k.group_kivi_k) PrefetchParams(k, K, a.t0, a.t1);
  for (int t0 = a.t0; t0 < a.t1;) {
    const int t1 = std::min({a.t1, t0 + kTile, (t0 / k.B + 1) * k.B});
    if (t1 < a.t1) {
      if (!k.group_kivi_k) PrefetchParams(k, K, t1, a.t1);
    } else {
      PrefetchParams(k, k.V, a.t0, a.t1);  // the value pass starts next
    }
    const int ke = std::max(t0, std::min(t1, K.n_stored));  // [t0, ke) stored, [ke, t1) residual
    if (ke > t0 && !k.group_kivi_k) ScoreStoredTile(k, t0, ke - t0, pf);
    ScoreResidual(k, K, ke, t1, pf);
    t0 = t1;
  }
}

// --- 3. Values ---------------------------------------------------------------------

// o += the weighted sum of the stored values [t0, t0 + n) (one tile, within one block).
void AccumStoredTile(Task& k, int t0, int n, Prefetcher& pf) {
  const TaskArgs& a = k.a;
  const kv::StreamView& V = k.V;
  const int D = k.D, rep = k.rep, h = k.h;
  const float* P = k.scores(t0);
  // Rotated values are summed in the rotated space, rotated back once (AttendTask).
  float* const O = k.rot_v ? k.orot : a.out;
  const size_t os = k.rot_v ? static_cast<size_t>(D) : a.out_stride;
  if (V.tq &&
      k.rot_v) {  // centroid rows summed in the rotated space, rotated back once (AttendTask)
    StageTqRotated(V, h, t0, n, k.vbuf, k.rs);
    AccumRows(P, k.ld, rep, D, k.vbuf, static_cast<size_t>(D), n, k.orot, D, pf);
    return;
  }
  switch (V.fmt.format) {
    case kv::Format::kF32:
      AccumRows(P, k.ld, rep, D, reinterpret_cast<const float*>(V.row(t0, h)), V.token_stride / 4,
                n, O, os, pf);
      return;
    case kv::Format::kF16:
      AccumRows(P, k.ld, rep, D, reinterpret_cast<const f16_t*>(V.row(t0, h)), V.token_stride / 2,
                n, O, os, pf);
      return;
    case kv::Format::kInt8: {
      const int8_t* codes = reinterpret_cast<const int8_t*>(V.row(t0, h));
      const bool grp = V.fmt.granularity == kv::Int8Granularity::kGroup;
      LoadInt8Scales(V, t0, h, n, k.rs, k.vs);
      if (!grp && rep <= D) {  // (the weights fit in the value staging buffer)
        // One scale per row: folded into the weights (p * s), and the codes are
        // converted inside the accumulation, so nothing is staged.
        float* pw = k.vbuf;  // [rep][kTile]
        for (int r = 0; r < rep; ++r) {
          const float* Pr = P + static_cast<size_t>(r) * k.ld;
          for (int i = 0; i < n; ++i) pw[r * kTile + i] = Pr[i] * k.rs[i];
        }
        AccumRows(pw, kTile, rep, D, codes, V.token_stride, n, O, os, pf);
        return;
      }
      DequantInt8(codes, V.token_stride, n, D, k.rs, grp ? k.vs : nullptr, V.group,
                  grp ? D / V.group : 0, k.vbuf);
      AccumRows(P, k.ld, rep, D, k.vbuf, static_cast<size_t>(D), n, O, os, pf);
      return;
    }
    default: {  // KIVI values: per-token parameters per group of Gc channels
      const int Gc = V.group, NG = D / Gc, vbits = kv::format_bits(V.fmt.format);
      const size_t pi = V.param_base(t0, h) + static_cast<size_t>(t0 % k.B) * NG;
      LoadParams(V, pi, n * NG, k.vs);
      LoadParams(V, pi, n * NG, k.vz, true);
#ifdef KIVI_X86
      if (k.fast_kivi_v) {
        // Scratch: the int16 weights wq and their scales wsc in vbuf, temporaries in kbuf.
        uint64_t* wq = reinterpret_cast<uint64_t*>(k.vbuf);
        float* wsc = k.vbuf + static_cast<size_t>(kTile) * D / 2;
        pf.step(static_cast<size_t>(n));
        FastKiviValues(P, k.ld, rep, D, vbits, Gc, V.quad_row(t0, h), t0 % 4, n, k.vs, k.vz, O, os,
                       wq, wsc, k.kbuf);
        return;
      }
      if (ExactKiviValuesOk(D, vbits, Gc, t0 % 4, n) &&
          static_cast<size_t>(n) * NG * 8 <=
              static_cast<size_t>(kTile) * D) {  // (the 2-bit table fits in kbuf)
        pf.step(static_cast<size_t>(n));
        AccumKiviExact(P, k.ld, rep, D, vbits, Gc, V.quad_row(t0, h), n, k.vs, k.vz, O, os, k.kbuf);
        return;
      }
#endif
      DequantKiviValues(V.quad_row(t0, h), t0 % 4, n, D, vbits, Gc, k.vs, k.vz,
                        static_cast<size_t>(NG), k.vbuf);
      AccumRows(P, k.ld, rep, D, k.vbuf, static_cast<size_t>(D), n, O, os, pf);
      return;
    }
  }
}

// o += the weighted sum of the residual values [r0, r1) (the ring may wrap).
void AccumResidual(const Task& k, int r0, int r1, Prefetcher& pf) {
  const kv::StreamView& V = k.V;
  while (r0 < r1) {
    const int e = V.ring_run_end(r0, r1);
    AccumRows(k.scores(r0), k.ld, k.rep, k.D, V.residual_row(r0, k.h), static_cast<size_t>(k.D),
              e - r0, k.a.out, k.a.out_stride, pf);
    r0 = e;
  }
}

void AccumValues(Task& k, Prefetcher& pf) {
  const TaskArgs& a = k.a;
  for (int t0 = a.t0; t0 < a.t1;) {
    const int t1 = std::min({a.t1, t0 + kTile, (t0 / k.B + 1) * k.B});
    PrefetchParams(k, k.V, t1, a.t1);
    const int ve = std::max(t0, std::min(t1, k.V.n_stored));  // [t0, ve) stored, [ve, t1) residual
    if (ve > t0) AccumStoredTile(k, t0, ve - t0, pf);
    AccumResidual(k, ve, t1, pf);
    t0 = t1;
  }
}

// Scores s of rep rows (ld apart) -> cap * tanh(s / cap).
void SoftcapScores(float* S, int ld, int rep, int n, float cap) {
  const hn::ScalableTag<float> df;
  const int N = static_cast<int>(hn::Lanes(df));
  const auto vcap = hn::Set(df, cap), vinv = hn::Set(df, 1.0f / cap);
  for (int r = 0; r < rep; ++r) {
    float* s = S + static_cast<size_t>(r) * ld;
    int i = 0;
    for (; i + N <= n; i += N)
      hn::StoreU(hn::Mul(vcap, hn::Tanh(df, hn::Mul(hn::LoadU(df, s + i), vinv))), df, s + i);
    for (; i < n; ++i) s[i] = cap * std::tanh(s[i] * (1.0f / cap));
  }
}

// --- The task ----------------------------------------------------------------------

void AttendTask(const TaskArgs& a) {
  Task k(a);
  StartTask(k);
  Prefetcher pf;
  ListRanges(k, k.K, pf);
  ListRanges(k, k.V, pf);
  pf.lead(kPrefetchLead);

  // 1. Scores.
  ScoreKeys(k, pf);

  // 2. The soft cap, ALiBi and the softmax update over the whole range.
  const int total = a.t1 - a.t0;
  if (a.softcap > 0.0f) SoftcapScores(k.S, k.ld, k.rep, total, a.softcap);
  if (a.slopes) {
    for (int r = 0; r < k.rep; ++r)
      for (int i = 0; i < total; ++i)
        k.S[r * k.ld + i] += a.slopes[r] * static_cast<float>(a.t0 + i - a.q_pos);
  }
  SoftmaxUpdate(k.S, k.ld, k.rep, total, k.D, a.out, a.out_stride);

  // 3. Values.
  AccumValues(k, pf);
  if (k.rot_v) {  // o += R^T (the rotated sum): one rotation per query head
    for (int r = 0; r < k.rep; ++r) {
      float* orr = k.orot + static_cast<size_t>(r) * k.D;
      k.V.rotations[k.h].inverse(orr);
      float* o = a.out + static_cast<size_t>(r) * a.out_stride;
      for (int i = 0; i < k.D; ++i) o[i] += orr[i];
    }
  }
}

}  // namespace kivi::attn::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kivi::attn {

HWY_EXPORT(AttendTask);
HWY_EXPORT(ExpNonPositiveArray);

void attend_range(const TaskArgs& a) { HWY_DYNAMIC_DISPATCH(AttendTask)(a); }

void exp_nonpositive(const float* x, float* y, int n) {
  HWY_DYNAMIC_DISPATCH(ExpNonPositiveArray)(x, y, n);
}

void set_wide_exact_kernels(bool scores, bool kivi_values) {
  g_switches.wide_scores.store(scores, std::memory_order_relaxed);
  g_switches.wide_kivi_values.store(kivi_values, std::memory_order_relaxed);
}

void set_vnni_kernels(bool enabled) { g_switches.vnni.store(enabled, std::memory_order_relaxed); }

}  // namespace kivi::attn
#endif  // HWY_ONCE
