// The softmax of a task: a vector exp for non-positive arguments, and the online
// update of the mergeable state (m, d, o) over a range of scores (Milakov &
// Gimelshein 2018, "Online normalizer calculation for softmax").

// Per-target include guard (Highway's toggle).
#if defined(KIVI_ATTN_SOFTMAX_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KIVI_ATTN_SOFTMAX_INL_H_
#undef KIVI_ATTN_SOFTMAX_INL_H_
#else
#define KIVI_ATTN_SOFTMAX_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <limits>

#include "attn/vec-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kivi::attn::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// exp(x) for x <= 0 (scores minus their maximum), without the range handling a general
// exp needs: n = round(x log2 e), f = x - n ln 2 (ln 2 in two parts, so f is exact to
// a few ulp) in [-ln2/2, ln2/2], e^f by its degree-6 Taylor polynomial (remainder below
// |f|^7 / 7! = 1.2e-7 relative), and 2^n added to the exponent bits. x below -87.3
// (e^x under the smallest normal float), and -inf, give 0. Measured against a double
// exp by test_attn (ExpOfNonPositive): within 3 ulp. About 15 operations per vector
// against hwy::Exp's 40.
template <class DF>
HWY_INLINE hn::Vec<DF> ExpNonPositive(DF df, hn::Vec<DF> x) {
  const hn::RebindToSigned<DF> di;
  const auto n = hn::Round(hn::Mul(x, hn::Set(df, 1.44269504088896341f)));
  auto f = hn::NegMulAdd(n, hn::Set(df, 0.693145751953125f),
                         x);  // ln 2 = 0.693145751953125 + 1.42860677e-6
  f = hn::NegMulAdd(n, hn::Set(df, 1.428606765330187e-6f), f);
  auto p = hn::MulAdd(f, hn::Set(df, 1.0f / 720), hn::Set(df, 1.0f / 120));
  p = hn::MulAdd(p, f, hn::Set(df, 1.0f / 24));
  p = hn::MulAdd(p, f, hn::Set(df, 1.0f / 6));
  p = hn::MulAdd(p, f, hn::Set(df, 0.5f));
  p = hn::MulAdd(p, f, hn::Set(df, 1.0f));
  p = hn::MulAdd(p, f, hn::Set(df, 1.0f));
  // Scale by 2^n (n >= -126 wherever the result is kept): add n to the exponent field.
  const auto e = hn::ShiftLeft<23>(hn::ConvertTo(di, hn::Max(n, hn::Set(df, -126.0f))));
  const auto r = hn::BitCast(df, hn::Add(hn::BitCast(di, p), e));
  return hn::IfThenZeroElse(hn::Lt(x, hn::Set(df, -87.3f)), r);
}

// y[0..n) = ExpNonPositive(x[0..n)) (tests).
inline void ExpNonPositiveArray(const float* x, float* y, int n) {
  const hn::ScalableTag<float> df;
  const int N = static_cast<int>(hn::Lanes(df));
  int i = 0;
  for (; i + N <= n; i += N) hn::StoreU(ExpNonPositive(df, hn::LoadU(df, x + i)), df, y + i);
  if (i < n) {
    HWY_ALIGN float buf[hn::MaxLanes(df)];
    std::fill(buf, buf + N, 0.0f);
    std::copy(x + i, x + n, buf);
    hn::Store(ExpNonPositive(df, hn::Load(df, buf)), df, buf);
    std::copy(buf, buf + (n - i), y + i);
  }
}

// The online softmax over a range of scores, for rep heads: S[h][0..len) becomes
// exp(S - m_new); the state (o, m, d) at out + h * out_stride (o[0..D), then m, d) is
// rescaled to the new maximum m_new and d grows by the new weights.
inline void SoftmaxUpdate(float* S, int ld, int rep, int len, int D, float* out, int out_stride) {
  const hn::ScalableTag<float> df;
  const size_t N = hn::Lanes(df);
  for (int h = 0; h < rep; ++h) {
    float* s = S + static_cast<size_t>(h) * ld;
    float* o = out + static_cast<size_t>(h) * out_stride;
    float mx = o[D];
    {
      auto mv4 = hn::Set(df, mx);
      int i = 0;
      for (; i + static_cast<int>(N) <= len; i += static_cast<int>(N))
        mv4 = hn::Max(mv4, hn::LoadU(df, s + i));
      mx = hn::GetLane(hn::MaxOfLanes(df, mv4));
      for (; i < len; ++i) mx = std::max(mx, s[i]);
    }
    const float corr = std::exp(o[D] - mx);  // 0 when the state is empty (m = -inf)
    const auto mv = hn::Set(df, mx);
    auto sum = hn::Zero(df);
    int i = 0;
    for (; i + static_cast<int>(N) <= len; i += static_cast<int>(N)) {
      const auto e = ExpNonPositive(df, hn::Sub(hn::LoadU(df, s + i), mv));
      hn::StoreU(e, df, s + i);
      sum = hn::Add(sum, e);
    }
    if (i < len) {  // the last len % N scores, padded with -inf (exp 0)
      HWY_ALIGN float buf[hn::MaxLanes(df)];
      std::fill(buf, buf + N, -std::numeric_limits<float>::infinity());
      std::copy(s + i, s + len, buf);
      const auto e = ExpNonPositive(df, hn::Sub(hn::Load(df, buf), mv));
      hn::Store(e, df, buf);
      std::copy(buf, buf + (len - i), s + i);
      sum = hn::Add(sum, e);
    }
    const float total = SumLanes(df, sum);
    if (corr != 1.0f) {
      const auto cv = hn::Set(df, corr);
      int d = 0;
      for (; d + static_cast<int>(N) <= D; d += static_cast<int>(N))
        hn::StoreU(hn::Mul(hn::LoadU(df, o + d), cv), df, o + d);
      for (; d < D; ++d) o[d] *= corr;
    }
    o[D] = mx;
    o[D + 1] = o[D + 1] * corr + total;
  }
}

}  // namespace kivi::attn::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
