// The KIVI kernels' entry points, compiled for every SIMD target: which kernel takes
// which shape, and the VNNI variants of the fast path (kivi_keys-inl.h,
// kivi_values-inl.h, kivi_values_avx512-inl.h).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attn/kernels_kivi.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <cassert>
#include <type_traits>

#include <hwy/highway.h>

#include "attn/kernels-inl.h"
#include "attn/kivi_keys-inl.h"
#include "attn/kivi_values-inl.h"
#include "attn/kivi_values_avx512-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kivi::attn::HWY_NAMESPACE {

#ifdef KIVI_X86
// --- Keys ---------------------------------------------------------------------------

#ifdef KIVI_VNNI
KIVI_VNNI_ATTR HWY_NOINLINE void KiviKeyGroupsVnni(const KeyGroupArgs& k, Prefetcher& pf) {
  KiviKeyGroupsForWidth<true, true>(k, pf);
}
#endif

// The fast kernel where `fast` is asked for and FastKiviKeyGroupsOk admits the shape,
// the exact one otherwise.
void KiviKeyGroups(const KeyGroupArgs& k, bool fast, Prefetcher& pf) {
  assert(KiviKeyGroupsOk(k.K->head_dim, kv::format_bits(k.K->fmt.format), k.K->group,
                         k.wide ? 32 : 16));
  if (fast && FastKiviKeyGroupsOk(k.K->head_dim, kv::format_bits(k.K->fmt.format), k.wide)) {
#ifdef KIVI_VNNI
    if (HasVnni()) return KiviKeyGroupsVnni(k, pf);
#endif
    return KiviKeyGroupsForWidth<true, false>(k, pf);
  }
  KiviKeyGroupsForWidth<false, false>(k, pf);
}

// --- Values, exact path ---------------------------------------------------------------

bool ExactKiviValuesOk(int D, int bits, int Gc, int t4, int n) {
  return (bits == 2 || bits == 4) && t4 == 0 && n % 4 == 0 && (D * bits / 8) % 8 == 0 &&
         Gc % 8 == 0;
}

// Four heads per pass with 512-bit vectors on AVX3 (whole 16-channel groups), up to
// four with 256-bit vectors otherwise.
void AccumKiviExact(const float* P, int ld, int rep, int D, int bits, int Gc, const uint8_t* quad0,
                    int n, const float* s, const float* z, float* O, size_t ostride, float* lut) {
  assert(ExactKiviValuesOk(D, bits, Gc, 0, n));
  if (bits == 2) BuildValueLut(s, z, n * (D / Gc), lut);
  auto run = [&](auto bits_c) {
    constexpr int BITS = decltype(bits_c)::value;
#ifdef KIVI_X86_512
    if ((D * BITS / 8) % 16 == 0 && Gc % 16 == 0 && rep % 4 == 0 &&
        g_switches.wide_kivi_values.load(std::memory_order_relaxed)) {
      for (int r = 0; r < rep; r += 4)
        AccumKiviExact512<4, BITS>(P + static_cast<size_t>(r) * ld, ld, D, Gc, quad0, n, lut, s, z,
                                   O + static_cast<size_t>(r) * ostride, ostride);
      return;
    }
#endif
    for (int r = 0; r < rep; r += 4) {
      const float* Pr = P + static_cast<size_t>(r) * ld;
      float* Or = O + static_cast<size_t>(r) * ostride;
      switch (std::min(4, rep - r)) {
        case 1:
          AccumKiviExact256<1, BITS>(Pr, ld, D, Gc, quad0, n, lut, s, z, Or, ostride);
          break;
        case 2:
          AccumKiviExact256<2, BITS>(Pr, ld, D, Gc, quad0, n, lut, s, z, Or, ostride);
          break;
        case 3:
          AccumKiviExact256<3, BITS>(Pr, ld, D, Gc, quad0, n, lut, s, z, Or, ostride);
          break;
        default:
          AccumKiviExact256<4, BITS>(Pr, ld, D, Gc, quad0, n, lut, s, z, Or, ostride);
          break;
      }
    }
  };
  if (bits == 2) {
    run(std::integral_constant<int, 2>());
  } else {
    run(std::integral_constant<int, 4>());
  }
}

// --- Values, fast path ----------------------------------------------------------------

bool FastKiviValuesOk(int D, int bits, int Gc) {
  const int W = D * bits / 8;
  return Gc % 8 == 0 && W % 8 == 0 && D % 8 == 0;
}

template <int BITS, bool kVnni>
HWY_INLINE void FastKiviValuesByHeads(const float* P, int ld, int rep, int D, int Gc,
                                      const uint8_t* quad0, int t4, int n, const float* vs,
                                      const float* vz, float* O, size_t ostride, uint64_t* wq,
                                      float* wsc, float* wtmp) {
  // Up to four heads per pass over the codes: 512-bit kernels on AVX3 (the 256-bit
  // FastKiviValues256 where a load would span two channel groups), FastKiviValuesPairs on
  // AVX2 (FastKiviValuesOk guarantees its W % 8 == 0 and Gc % 8 == 0).
  for (int r = 0; r < rep; r += 4) {
    const float* Pr = P + static_cast<size_t>(r) * ld;
    float* Or = O + static_cast<size_t>(r) * ostride;
#ifdef KIVI_X86_512
    if ((D * BITS / 8) % 16 == 0 && Gc % 16 == 0) {
      switch (std::min(4, rep - r)) {
        case 1:
          FastKiviValues512<1, BITS, kVnni, 0>(Pr, ld, D, Gc, quad0, t4, n, vs, vz, Or, ostride, wq,
                                               wsc, wtmp);
          break;
        case 2:
          FastKiviValues512<2, BITS, kVnni, 0>(Pr, ld, D, Gc, quad0, t4, n, vs, vz, Or, ostride, wq,
                                               wsc, wtmp);
          break;
        case 3:
          FastKiviValues512<3, BITS, kVnni, 0>(Pr, ld, D, Gc, quad0, t4, n, vs, vz, Or, ostride, wq,
                                               wsc, wtmp);
          break;
        default:
          if (D == 128) {
            FastKiviValues512<4, BITS, kVnni, 128>(Pr, ld, D, Gc, quad0, t4, n, vs, vz, Or, ostride,
                                                   wq, wsc, wtmp);
          } else {
            FastKiviValues512<4, BITS, kVnni, 0>(Pr, ld, D, Gc, quad0, t4, n, vs, vz, Or, ostride,
                                                 wq, wsc, wtmp);
          }
          break;
      }
      continue;
    }
    switch (std::min(4, rep - r)) {
      case 1:
        FastKiviValues256<1, BITS, kVnni>(Pr, ld, D, Gc, quad0, t4, n, vs, vz, Or, ostride, wq,
                                          wsc);
        break;
      case 2:
        FastKiviValues256<2, BITS, kVnni>(Pr, ld, D, Gc, quad0, t4, n, vs, vz, Or, ostride, wq,
                                          wsc);
        break;
      case 3:
        FastKiviValues256<3, BITS, kVnni>(Pr, ld, D, Gc, quad0, t4, n, vs, vz, Or, ostride, wq,
                                          wsc);
        break;
      default:
        FastKiviValues256<4, BITS, kVnni>(Pr, ld, D, Gc, quad0, t4, n, vs, vz, Or, ostride, wq,
                                          wsc);
        break;
    }
#else
    uint32_t* wp = reinterpret_cast<uint32_t*>(wq);
    switch (std::min(4, rep - r)) {
      case 1:
        FastKiviValuesPairs<1, BITS>(Pr, ld, D, Gc, quad0, t4, n, vs, vz, Or, ostride, wp, wsc,
                                     wtmp);
        break;
      case 2:
        FastKiviValuesPairs<2, BITS>(Pr, ld, D, Gc, quad0, t4, n, vs, vz, Or, ostride, wp, wsc,
                                     wtmp);
        break;
      case 3:
        FastKiviValuesPairs<3, BITS>(Pr, ld, D, Gc, quad0, t4, n, vs, vz, Or, ostride, wp, wsc,
                                     wtmp);
        break;
      default:
        FastKiviValuesPairs<4, BITS>(Pr, ld, D, Gc, quad0, t4, n, vs, vz, Or, ostride, wp, wsc,
                                     wtmp);
        break;
    }
#endif
  }
}

template <bool kVnni>
HWY_INLINE void FastKiviValuesForBits(const float* P, int ld, int rep, int D, int bits, int Gc,
                                      const uint8_t* quad0, int t4, int n, const float* vs,
                                      const float* vz, float* O, size_t ostride, uint64_t* wq,
                                      float* wsc, float* wtmp) {
  switch (bits) {
    case 2:
      return FastKiviValuesByHeads<2, kVnni>(P, ld, rep, D, Gc, quad0, t4, n, vs, vz, O, ostride,
                                             wq, wsc, wtmp);
    case 4:
      return FastKiviValuesByHeads<4, kVnni>(P, ld, rep, D, Gc, quad0, t4, n, vs, vz, O, ostride,
                                             wq, wsc, wtmp);
    default:
      return FastKiviValuesByHeads<8, kVnni>(P, ld, rep, D, Gc, quad0, t4, n, vs, vz, O, ostride,
                                             wq, wsc, wtmp);
  }
}

#ifdef KIVI_VNNI
KIVI_VNNI_ATTR HWY_NOINLINE void FastKiviValuesVnni(const float* P, int ld, int rep, int D,
                                                    int bits, int Gc, const uint8_t* quad0, int t4,
                                                    int n, const float* vs, const float* vz,
                                                    float* O, size_t ostride, uint64_t* wq,
                                                    float* wsc, float* wtmp) {
  FastKiviValuesForBits<true>(P, ld, rep, D, bits, Gc, quad0, t4, n, vs, vz, O, ostride, wq, wsc,
                              wtmp);
}
#endif

void FastKiviValues(const float* P, int ld, int rep, int D, int bits, int Gc, const uint8_t* quad0,
                    int t4, int n, const float* vs, const float* vz, float* O, size_t ostride,
                    uint64_t* wq, float* wsc, float* wtmp) {
  assert(FastKiviValuesOk(D, bits, Gc));
#ifdef KIVI_VNNI
  if (HasVnni())
    return FastKiviValuesVnni(P, ld, rep, D, bits, Gc, quad0, t4, n, vs, vz, O, ostride, wq, wsc,
                              wtmp);
#endif
  FastKiviValuesForBits<false>(P, ld, rep, D, bits, Gc, quad0, t4, n, vs, vz, O, ostride, wq, wsc,
                               wtmp);
}

#endif  // KIVI_X86

}  // namespace kivi::attn::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();
