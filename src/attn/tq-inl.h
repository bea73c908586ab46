// Decoding of tq code rows into the rotated space, per SIMD target (kernels_tq.cpp).
//
// A row's codes are one or two runs of one width each (kv/tq.h: the wide run of b + 1 bits,
// then the narrow run of b bits). A run that starts on a byte is cut a chunk at a time: a
// chunk is max(lanes, 8) codes, at most 8 bytes, broadcast into every 128-bit block; a byte
// shuffle gives each 32-bit lane the two bytes its code lies in and a per-lane shift and
// mask leave the code, which a lane permute of the row's scaled codebook (scale x
// centroid, one to four vectors of lanes) turns into the coordinate. The product is the
// one kv::TqCodec::decode_rotated computes, so the two agree bit for bit (tests/test_tq.cpp,
// on every target). Codes past the last whole chunk are decoded one at a time; rows of
// fewer than 8 bytes, runs that do not start on a byte and the one-lane target take the
// codec's scalar decoder.

// Per-target include guard (Highway's toggle).
#if defined(KIVI_ATTN_TQ_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KIVI_ATTN_TQ_INL_H_
#undef KIVI_ATTN_TQ_INL_H_
#else
#define KIVI_ATTN_TQ_INL_H_
#endif

#include <cstddef>
#include <cstdint>
#include <cstring>

#include <hwy/highway.h>

#include "kv/tq.h"

HWY_BEFORE_NAMESPACE();
namespace kivi::attn::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET != HWY_SCALAR
// One run's decoder: codes of B bits from a byte-aligned start, centroids cent[2^B].
template <int B>
class TqRunDecoder {
  using DF = hn::ScalableTag<float>;
  using DU = hn::RebindToUnsigned<DF>;
  using DI = hn::RebindToSigned<DF>;
  using VF = hn::Vec<DF>;
  using VU = hn::Vec<DU>;
  static constexpr size_t kN = hn::MaxLanes(DF());
  static constexpr int kL = kN > 8 ? static_cast<int>(kN) : 8;  // codes per chunk
  static constexpr int kV = kL / static_cast<int>(kN);          // vectors per chunk
  static constexpr int kCB = kL * B / 8;                        // bytes per chunk
  static constexpr int kK = 1 << B;                             // centroids
  static constexpr int kT = (kK + static_cast<int>(kN) - 1) / static_cast<int>(kN);
  static_assert(kCB <= 8, "a chunk is one 64-bit word");

 public:
  explicit TqRunDecoder(const float* cent) : cent_(cent) {
    const DF df;
    const DU du;
    HWY_ALIGN float t[kT * kN] = {};  // the codebook padded to whole vectors
    for (int k = 0; k < kK; ++k) t[k] = cent[k];
    for (int k = 0; k < kT; ++k) tab_[k] = hn::Load(df, t + k * kN);
    for (int v = 0; v < kV; ++v) {
      const VU off = hn::Mul(hn::Iota(du, static_cast<uint32_t>(v * kN)), hn::Set(du, B));
      const VU byte = hn::ShiftRight<3>(off);
      shift_[v] = hn::And(off, hn::Set(du, 7u));
      // Bytes 0 and 1 of the lane: the code's first byte and the next; 2 and 3: zero.
      idx_[v] = hn::Or(hn::Or(byte, hn::ShiftLeft<8>(hn::Add(byte, hn::Set(du, 1u)))),
                       hn::Set(du, 0x80800000u));
    }
  }

  // out[0..n) = scale * centroid(code i), the run starting at byte `at` of a row of rb
  // (>= 8) bytes. Every chunk is one unaligned 64-bit load: the row's last 8 bytes, shifted,
  // where fewer than 8 are left (a narrower load would stall the store forwarding of a copy).
  HWY_INLINE void Decode(const uint8_t* row, size_t at, size_t rb, int n, float scale,
                         float* out) const {
    const DF df;
    const DU du;
    const DI di;
    const hn::Repartition<uint8_t, DF> du8;
    const hn::Repartition<uint64_t, DF> du64;
    VF tab[kT];  // the row's codebook, in registers
    for (int k = 0; k < kT; ++k) tab[k] = hn::Mul(tab_[k], hn::Set(df, scale));
    const VU mask = hn::Set(du, static_cast<uint32_t>(kK - 1));
    int i = 0;
    size_t o = at;
    for (; i + kL <= n; i += kL, o += kCB) {
      uint64_t w;
      if (o + 8 <= rb) {
        std::memcpy(&w, row + o, 8);
      } else {
        std::memcpy(&w, row + rb - 8, 8);
        w >>= 8 * (o + 8 - rb);
      }
      const auto bytes = hn::BitCast(du8, hn::Set(du64, w));
      for (int v = 0; v < kV; ++v) {
        const VU lane = hn::BitCast(du, hn::TableLookupBytesOr0(bytes, hn::BitCast(du8, idx_[v])));
        const auto c = hn::BitCast(di, hn::And(lane >> shift_[v], mask));
        VF r;
        if constexpr (kT == 1) {
          r = hn::TableLookupLanes(tab[0], hn::IndicesFromVec(df, c));
        } else {
          const auto lo = hn::And(c, hn::Set(di, static_cast<int32_t>(kN - 1)));
          r = hn::TableLookupLanes(tab[0], hn::IndicesFromVec(df, lo));
          for (int k = 1; k < kT; ++k) {
            const auto m = c > hn::Set(di, static_cast<int32_t>(k * kN - 1));
            r = hn::IfThenElse(hn::RebindMask(df, m),
                               hn::TableLookupLanes(tab[k], hn::IndicesFromVec(df, lo)), r);
          }
        }
        hn::StoreU(r, df, out + i + v * static_cast<int>(kN));
      }
    }
    for (size_t bit = o * 8; i < n; ++i, bit += B) {  // the codes past the last chunk
      const size_t byte = bit >> 3, sh = bit & 7;
      unsigned v = row[byte] >> sh;
      if (sh + B > 8) v |= static_cast<unsigned>(row[byte + 1]) << (8 - sh);
      out[i] = cent_[v & (kK - 1)] * scale;
    }
  }

 private:
  const float* cent_;
  VF tab_[kT];
  VU idx_[kV], shift_[kV];
};

// Rows i = 0..n) at rows + i * stride with scales rs[i] into out[n][dim].
template <int B>
HWY_INLINE void DecodeTqRowsFor(const kv::TqCodec& c, const uint8_t* rows, size_t stride, int n,
                                const float* rs, float* out) {
  const int D = c.dim(), W = c.wide();
  const size_t nb = static_cast<size_t>(W) * (B + 1) / 8;  // the narrow run's first byte
  const size_t rb = c.row_bytes();
  const TqRunDecoder<B> narrow(c.centroids(W));
  if constexpr (B < 4) {  // (4-bit codes have no wide run: tq4 is not split)
    if (W > 0) {
      const TqRunDecoder<B + 1> wide(c.centroids(0));
      for (int i = 0; i < n; ++i) {
        const uint8_t* r = rows + i * stride;
        float* o = out + static_cast<size_t>(i) * D;
        wide.Decode(r, 0, rb, W, rs[i], o);
        narrow.Decode(r, nb, rb, D - W, rs[i], o + W);
      }
      return;
    }
  }
  for (int i = 0; i < n; ++i)
    narrow.Decode(rows + i * stride, 0, rb, D, rs[i], out + static_cast<size_t>(i) * D);
}

#endif  // HWY_TARGET != HWY_SCALAR

// Rows i = 0..n) at rows + i * stride with scales rs[i] into out[n][dim], in the rotated
// space: kv::TqCodec::decode_rotated for every row.
inline void DecodeTqRowsImpl(const kv::TqCodec& c, const uint8_t* rows, size_t stride, int n,
                             const float* rs, float* out) {
#if HWY_TARGET != HWY_SCALAR
  const int b = c.bits(), W = c.wide();
  const bool simd = c.row_bytes() >= 8 && (W * (b + 1)) % 8 == 0 && (W == 0 || b + 1 <= 4);
  if (simd && b == 2) return DecodeTqRowsFor<2>(c, rows, stride, n, rs, out);
  if (simd && b == 3) return DecodeTqRowsFor<3>(c, rows, stride, n, rs, out);
  if (simd && b == 4 && W == 0) return DecodeTqRowsFor<4>(c, rows, stride, n, rs, out);
#endif
  for (int i = 0; i < n; ++i)
    c.decode_rotated(rows + i * stride, rs[i], out + static_cast<size_t>(i) * c.dim());
}

}  // namespace kivi::attn::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // KIVI_ATTN_TQ_INL_H_
