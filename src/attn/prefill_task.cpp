// One task of the tiled prefill (prefill.h), compiled for every SIMD target and chosen
// at run time: query rows [i0, i1) of a chunk, all query heads of KV head h, against
// every token they see, a run of up to kPrefillKeys tokens (within one block) at a time:
//   1. stage the run's keys as floats (the stored codes dequantized, and/or the
//      full-precision rows where some query still saw them in the residual), rotate
//      pre-RoPE keys, transpose, and score all the tile's queries: S = Q K^T;
//   2. mask (causal, window and sinks), pick each query's representation of each key,
//      soft cap and ALiBi, and update each query's online softmax (m, d, o);
//   3. stage the values the same way and accumulate O += P V.
// The products are register-blocked outer products: four queries by two vectors of
// keys (or channels) per step, so each staged row is read once per four queries.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attn/prefill_task.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include <hwy/highway.h>

#include "attn/kernels-inl.h"
#include "attn/params-inl.h"
#include "attn/prefill.h"
#include "attn/rope-inl.h"
#include "attn/softmax-inl.h"
#include "attn/stage-inl.h"

#ifndef KIVI_ATTN_PREFILL_LAYOUT_ONCE
#define KIVI_ATTN_PREFILL_LAYOUT_ONCE
namespace kivi::attn {
namespace {
// A task's scratch (floats from PrefillTask::scratch), for QT query vectors rounded up
// to 4 (QP) and J = kPrefillKeys tokens per run.
struct PrefillLayout {
  size_t qn, o, m, d, s, s2, kq, kf, kt, vq, vf, ps, pz, sp, zp, rs, end;
  PrefillLayout(int QP, int D) {
    const size_t J = kPrefillKeys, rows = static_cast<size_t>(QP) * D, tile = J * D;
    qn = 0;
    o = qn + rows;
    m = o + rows;
    d = m + QP;
    s = d + QP;
    s2 = s + static_cast<size_t>(QP) * J;
    kq = s2 + static_cast<size_t>(QP) * J;
    kf = kq + tile;
    kt = kf + tile;
    vq = kt + tile;
    vf = vq + tile;
    ps = vf + tile;
    pz = ps + tile;
    sp = pz + tile;
    zp = sp + D;
    rs = zp + D;
    end = rs + J;
  }
};
}  // namespace
}  // namespace kivi::attn
#endif

HWY_BEFORE_NAMESPACE();
namespace kivi::attn::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace {

constexpr int J = kPrefillKeys;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Full-precision rows of tokens [t0, t0 + n) of head h into out[n][D] (zeros before
// the chunk's first full-precision row: no query reads them in this form).
void StageFull(const PrefillChunk& c, bool key, int h, int D, int t0, int n, float* out) {
  for (int i = 0; i < n; ++i) {
    const int t = t0 + i;
    float* o = out + static_cast<size_t>(i) * D;
    if (t < c.fp_first) {
      std::fill(o, o + D, 0.0f);
      continue;
    }
    const float* src = t < c.pos0 ? (key ? c.pre_k : c.pre_v) + (t - c.fp_first) * c.kv_stride
                                  : (key ? c.new_k : c.new_v) + (t - c.pos0) * c.kv_stride;
    std::memcpy(o, src + static_cast<size_t>(h) * D, static_cast<size_t>(D) * sizeof(float));
  }
}

// kt[D][J] = the transpose of k[n][D], columns n..J zero.
void Transpose(const float* k, int n, int D, float* kt) {
  for (int d = 0; d < D; ++d) {
    float* row = kt + static_cast<size_t>(d) * J;
    for (int j = 0; j < n; ++j) row[j] = k[static_cast<size_t>(j) * D + d];
    std::fill(row + n, row + J, 0.0f);
  }
}

// S[QP][J] = Q[QP][D] Kt[D][J]: four queries by two vectors of tokens per step.
void Scores(const float* HWY_RESTRICT Q, int QP, int D, const float* HWY_RESTRICT kt,
            float* HWY_RESTRICT S) {
  const hn::ScalableTag<float> df;
  const int N = static_cast<int>(hn::Lanes(df));
  for (int q = 0; q < QP; q += 4) {
    const float* q0 = Q + static_cast<size_t>(q) * D;
    for (int c = 0; c < J; c += 2 * N) {
      auto a00 = hn::Zero(df), a01 = hn::Zero(df), a10 = hn::Zero(df), a11 = hn::Zero(df);
      auto a20 = hn::Zero(df), a21 = hn::Zero(df), a30 = hn::Zero(df), a31 = hn::Zero(df);
      for (int d = 0; d < D; ++d) {
        const float* kr = kt + static_cast<size_t>(d) * J + c;
        const auto k0 = hn::LoadU(df, kr), k1 = hn::LoadU(df, kr + N);
        auto b = hn::Set(df, q0[d]);
        a00 = hn::MulAdd(b, k0, a00);
        a01 = hn::MulAdd(b, k1, a01);
        b = hn::Set(df, q0[D + d]);
        a10 = hn::MulAdd(b, k0, a10);
        a11 = hn::MulAdd(b, k1, a11);
        b = hn::Set(df, q0[2 * D + d]);
        a20 = hn::MulAdd(b, k0, a20);
        a21 = hn::MulAdd(b, k1, a21);
        b = hn::Set(df, q0[3 * D + d]);
        a30 = hn::MulAdd(b, k0, a30);
        a31 = hn::MulAdd(b, k1, a31);
      }
      float* s = S + static_cast<size_t>(q) * J + c;
      hn::StoreU(a00, df, s);
      hn::StoreU(a01, df, s + N);
      hn::StoreU(a10, df, s + J);
      hn::StoreU(a11, df, s + J + N);
      hn::StoreU(a20, df, s + 2 * J);
      hn::StoreU(a21, df, s + 2 * J + N);
      hn::StoreU(a30, df, s + 3 * J);
      hn::StoreU(a31, df, s + 3 * J + N);
    }
  }
}

// O[QP][D] += P[QP][J] V[n][D]: four queries by two vectors of channels per step (one
// at the end of the row, then single lanes), accumulators in named registers.
void Accum(const float* HWY_RESTRICT P, int QP, int n, const float* HWY_RESTRICT V, int D,
           float* HWY_RESTRICT O) {
  const hn::ScalableTag<float> df;
  const int N = static_cast<int>(hn::Lanes(df));
  for (int q = 0; q < QP; q += 4) {
    const float* p0 = P + static_cast<size_t>(q) * J;
    float* o0 = O + static_cast<size_t>(q) * D;
    int c = 0;
    for (; c + 2 * N <= D; c += 2 * N) {
      float* o = o0 + c;
      auto a00 = hn::LoadU(df, o), a01 = hn::LoadU(df, o + N);
      auto a10 = hn::LoadU(df, o + D), a11 = hn::LoadU(df, o + D + N);
      auto a20 = hn::LoadU(df, o + 2 * D), a21 = hn::LoadU(df, o + 2 * D + N);
      auto a30 = hn::LoadU(df, o + 3 * D), a31 = hn::LoadU(df, o + 3 * D + N);
      for (int j = 0; j < n; ++j) {
        const float* vr = V + static_cast<size_t>(j) * D + c;
        const auto v0 = hn::LoadU(df, vr), v1 = hn::LoadU(df, vr + N);
        auto b = hn::Set(df, p0[j]);
        a00 = hn::MulAdd(b, v0, a00);
        a01 = hn::MulAdd(b, v1, a01);
        b = hn::Set(df, p0[J + j]);
        a10 = hn::MulAdd(b, v0, a10);
        a11 = hn::MulAdd(b, v1, a11);
        b = hn::Set(df, p0[2 * J + j]);
        a20 = hn::MulAdd(b, v0, a20);
        a21 = hn::MulAdd(b, v1, a21);
        b = hn::Set(df, p0[3 * J + j]);
        a30 = hn::MulAdd(b, v0, a30);
        a31 = hn::MulAdd(b, v1, a31);
      }
      hn::StoreU(a00, df, o);
      hn::StoreU(a01, df, o + N);
      hn::StoreU(a10, df, o + D);
      hn::StoreU(a11, df, o + D + N);
      hn::StoreU(a20, df, o + 2 * D);
      hn::StoreU(a21, df, o + 2 * D + N);
      hn::StoreU(a30, df, o + 3 * D);
      hn::StoreU(a31, df, o + 3 * D + N);
    }
    for (; c + N <= D; c += N) {
      float* o = o0 + c;
      auto a0 = hn::LoadU(df, o), a1 = hn::LoadU(df, o + D);
      auto a2 = hn::LoadU(df, o + 2 * D), a3 = hn::LoadU(df, o + 3 * D);
      for (int j = 0; j < n; ++j) {
        const auto v0 = hn::LoadU(df, V + static_cast<size_t>(j) * D + c);
        a0 = hn::MulAdd(hn::Set(df, p0[j]), v0, a0);
        a1 = hn::MulAdd(hn::Set(df, p0[J + j]), v0, a1);
        a2 = hn::MulAdd(hn::Set(df, p0[2 * J + j]), v0, a2);
        a3 = hn::MulAdd(hn::Set(df, p0[3 * J + j]), v0, a3);
      }
      hn::StoreU(a0, df, o);
      hn::StoreU(a1, df, o + D);
      hn::StoreU(a2, df, o + 2 * D);
      hn::StoreU(a3, df, o + 3 * D);
    }
    for (; c < D; ++c) {
      for (int r = 0; r < 4; ++r) {
        float a = o0[static_cast<size_t>(r) * D + c];
        for (int j = 0; j < n; ++j) a += p0[static_cast<size_t>(r) * J + j] * V[j * D + c];
        o0[static_cast<size_t>(r) * D + c] = a;
      }
    }
  }
}

// The largest of s[J] (J a multiple of the lanes).
float RowMax(const float* s) {
  const hn::ScalableTag<float> df;
  const int N = static_cast<int>(hn::Lanes(df));
  auto m = hn::LoadU(df, s);
  for (int j = N; j < J; j += N) m = hn::Max(m, hn::LoadU(df, s + j));
  return hn::GetLane(hn::MaxOfLanes(df, m));
}

// Scales o[D] by f.
void ScaleRow(float* o, int D, float f) {
  const hn::ScalableTag<float> df;
  const int N = static_cast<int>(hn::Lanes(df));
  const auto vf = hn::Set(df, f);
  int i = 0;
  for (; i + N <= D; i += N) hn::StoreU(hn::Mul(hn::LoadU(df, o + i), vf), df, o + i);
  for (; i < D; ++i) o[i] *= f;
}

// s[J] <- exp(s - m) (J a multiple of the lanes), returning their sum.
float ExpRow(float* s, float m) {
  const hn::ScalableTag<float> df;
  const int N = static_cast<int>(hn::Lanes(df));
  const auto vm = hn::Set(df, m);
  auto sum = hn::Zero(df);
  for (int j = 0; j < J; j += N) {
    const auto e = ExpNonPositive(df, hn::Sub(hn::LoadU(df, s + j), vm));
    hn::StoreU(e, df, s + j);
    sum = hn::Add(sum, e);
  }
  return SumLanes(df, sum);
}

// Whether some query i of the tile sees a token of [t0, t1) in full precision: its
// first unstored token `stored[i]` is at most its last visible one.
bool AnyFull(const int* stored, int i0, int i1, int pos0, int t0, int t1) {
  for (int i = i0; i < i1; ++i) {
    if (std::max(t0, stored[i]) <= std::min(t1 - 1, pos0 + i)) return true;
  }
  return false;
}

void PrefillTile(const detail::PrefillTask& task) {
  const kv::LayerView& kv = *task.kv;
  const PrefillChunk& c = *task.c;
  const Params& p = *task.p;
  const kv::StreamView& K = kv.k;
  const kv::StreamView& V = kv.v;
  const int D = K.head_dim, h = task.h, i0 = task.i0, i1 = task.i1;
  const int rep = p.n_heads / K.n_heads, QT = (i1 - i0) * rep, QP = (QT + 3) / 4 * 4;
  const PrefillLayout L(QP, D);
  float* sc = task.scratch;
  float *qn = sc + L.qn, *O = sc + L.o, *M = sc + L.m, *Dn = sc + L.d, *S = sc + L.s,
        *S2 = sc + L.s2, *kq = sc + L.kq, *kf = sc + L.kf, *kt = sc + L.kt, *vq = sc + L.vq,
        *vf = sc + L.vf, *ps = sc + L.ps, *pz = sc + L.pz, *sp = sc + L.sp, *zp = sc + L.zp,
        *rs = sc + L.rs;
  // Query vector qi = (i - i0) * rep + r: position pos0 + i, head h * rep + r, scaled.
  for (int qi = 0; qi < QP; ++qi) {
    float* dst = qn + static_cast<size_t>(qi) * D;
    if (qi >= QT) {
      std::fill(dst, dst + D, 0.0f);
      continue;
    }
    const int i = i0 + qi / rep, r = qi % rep;
    const float* src =
        c.q + static_cast<size_t>(i) * c.q_stride + static_cast<size_t>(h * rep + r) * D;
    for (int d = 0; d < D; ++d) dst[d] = src[d] * p.scale;
  }
  std::fill(O, O + static_cast<size_t>(QP) * D, 0.0f);
  std::fill(M, M + QP, kNegInf);
  std::fill(Dn, Dn + QP, 0.0f);

  // Query i sees [0, sink_end(i)) and [start(i), pos0 + i]; both bounds grow with i.
  auto start_of = [&](int i) { return p.window > 0 ? std::max(0, c.pos0 + i + 1 - p.window) : 0; };
  auto sink_end_of = [&](int i) {
    const int st = start_of(i);
    return st > 0 ? std::min(p.sinks, st) : 0;
  };
  const int last = c.pos0 + i1 - 1;
  const int sinks_hi = sink_end_of(i1 - 1), lo = start_of(i0);
  const float* slopes = p.alibi_slopes ? p.alibi_slopes + static_cast<size_t>(h) * rep : nullptr;
  const int B = K.block;

  auto run = [&](int t0, int t1) {
    const int nt = t1 - t0;
    // 1. Keys: the stored form where some query saw it stored, the full one where some
    //    query saw it in the residual.
    const bool need_kq = t0 < c.k_stored[i1 - 1];
    const bool need_kf = AnyFull(c.k_stored, i0, i1, c.pos0, t0, t1);
    float* Sf = need_kq ? S2 : S;  // scores against full-precision keys
    if (need_kq) {
      const int ns = std::max(0, std::min(t1, K.n_stored) - t0);
      if (ns > 0) StageStored(K, h, t0, ns, kq, ps, pz, sp, zp, rs);
      std::fill(kq + static_cast<size_t>(ns) * D, kq + static_cast<size_t>(nt) * D, 0.0f);
      if (p.rope) RotateRows(kq, nt, D, p.rope + static_cast<size_t>(t0) * D, p.rope_style);
      Transpose(kq, nt, D, kt);
      Scores(qn, QP, D, kt, S);
    }
    if (need_kf) {
      StageFull(c, true, h, D, t0, nt, kf);
      if (p.rope) RotateRows(kf, nt, D, p.rope + static_cast<size_t>(t0) * D, p.rope_style);
      Transpose(kf, nt, D, kt);
      Scores(qn, QP, D, kt, Sf);
    }
    // 2. Per query: its representation of each key, the masks, soft cap, ALiBi, softmax.
    const bool need_vq = t0 < c.v_stored[i1 - 1];
    const bool need_vf = AnyFull(c.v_stored, i0, i1, c.pos0, t0, t1);
    for (int qi = 0; qi < QT; ++qi) {
      const int i = i0 + qi / rep, r = qi % rep, q_pos = c.pos0 + i;
      float* s = S + static_cast<size_t>(qi) * J;
      if (need_kq && need_kf) {  // tokens from k_stored[i] on: the full-precision scores
        const int from = std::clamp(c.k_stored[i] - t0, 0, nt);
        std::memcpy(s + from, S2 + static_cast<size_t>(qi) * J + from,
                    static_cast<size_t>(nt - from) * sizeof(float));
      }
      // Visible: t <= q_pos and (t < sink_end or t >= start).
      const int vis_end = std::clamp(q_pos + 1 - t0, 0, nt);
      std::fill(s + vis_end, s + J, kNegInf);
      const int se = sink_end_of(i), st = start_of(i);
      const int gap0 = std::clamp(se - t0, 0, vis_end), gap1 = std::clamp(st - t0, 0, vis_end);
      if (gap1 > gap0) std::fill(s + gap0, s + gap1, kNegInf);
      if (p.softcap > 0.0f || slopes) {
        for (int j = 0; j < vis_end; ++j) {
          if (s[j] == kNegInf) continue;
          if (p.softcap > 0.0f) s[j] = p.softcap * std::tanh(s[j] / p.softcap);
          if (slopes) s[j] += slopes[r] * static_cast<float>(t0 + j - q_pos);
        }
      }
      const float mx = vis_end > 0 ? RowMax(s) : kNegInf;  // (hidden columns hold -inf)
      if (mx == kNegInf) {                                 // nothing visible in this run
        std::fill(s, s + J, 0.0f);
        if (need_vq && need_vf)
          std::fill(S2 + static_cast<size_t>(qi) * J, S2 + (qi + 1) * J, 0.0f);
        continue;
      }
      const float m_new = std::max(M[qi], mx);
      const float f = M[qi] == m_new ? 1.0f : M[qi] == kNegInf ? 0.0f : std::exp(M[qi] - m_new);
      const float sum = ExpRow(s, m_new);
      Dn[qi] = Dn[qi] * f + sum;
      M[qi] = m_new;
      if (f != 1.0f) ScaleRow(O + static_cast<size_t>(qi) * D, D, f);
      if (need_vq && need_vf) {  // split the weights: stored values before v_stored[i]
        float* s2 = S2 + static_cast<size_t>(qi) * J;
        const int from = std::clamp(c.v_stored[i] - t0, 0, nt);
        std::fill(s2, s2 + from, 0.0f);
        std::memcpy(s2 + from, s + from, static_cast<size_t>(J - from) * sizeof(float));
        std::fill(s + from, s + J, 0.0f);
      }
    }
    for (int qi = QT; qi < QP; ++qi) {
      std::fill(S + static_cast<size_t>(qi) * J, S + static_cast<size_t>(qi + 1) * J, 0.0f);
      std::fill(S2 + static_cast<size_t>(qi) * J, S2 + static_cast<size_t>(qi + 1) * J, 0.0f);
    }
    // 3. Values.
    if (need_vq) {
      const int ns = std::max(0, std::min(t1, V.n_stored) - t0);
      if (ns > 0) StageStored(V, h, t0, ns, vq, ps, pz, sp, zp, rs);
      std::fill(vq + static_cast<size_t>(ns) * D, vq + static_cast<size_t>(nt) * D, 0.0f);
      Accum(S, QP, nt, vq, D, O);
    }
    if (need_vf) {
      StageFull(c, false, h, D, t0, nt, vf);
      Accum(need_vq ? S2 : S, QP, nt, vf, D, O);
    }
  };
  // Runs of at most J tokens within one block, over the sinks and then the window, on a
  // grid of J tokens so that each query's runs do not depend on its tile.
  auto visit = [&](int a, int b) {
    for (int t0 = a; t0 < b;) {
      const int t1 = std::min({b, (t0 / J + 1) * J, (t0 / B + 1) * B});
      run(t0, t1);
      t0 = t1;
    }
  };
  if (sinks_hi > 0 && sinks_hi < lo) {
    visit(0, sinks_hi);
    visit(lo, last + 1);
  } else {
    visit(lo > 0 && sinks_hi >= lo ? 0 : lo, last + 1);
  }
  for (int qi = 0; qi < QT; ++qi) {
    const int i = i0 + qi / rep, r = qi % rep;
    float* o = O + static_cast<size_t>(qi) * D;
    const float* sink = p.head_sinks ? p.head_sinks + h * rep + r : nullptr;
    normalize_state(o, D, M[qi], Dn[qi], sink);
    std::memcpy(
        c.out + static_cast<size_t>(i) * c.out_stride + static_cast<size_t>(h * rep + r) * D, o,
        static_cast<size_t>(D) * sizeof(float));
  }
}

}  // namespace
}  // namespace kivi::attn::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kivi::attn {
namespace {
HWY_EXPORT(PrefillTile);
}  // namespace

size_t prefill_scratch_floats(int rows, int D) { return PrefillLayout((rows + 3) / 4 * 4, D).end; }

namespace detail {
void prefill_tile(const PrefillTask& t) { HWY_DYNAMIC_DISPATCH(PrefillTile)(t); }
}  // namespace detail

}  // namespace kivi::attn
#endif
