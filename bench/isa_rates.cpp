// kivi-isa-rates: issue rate of the vector instructions the attention kernels are built
// from, on this core (x86-64 with AVX2). Each loop runs 12 independent dependency chains
// of one instruction in inline assembly, so it measures throughput, not latency; a chain
// of dependent scalar adds (one per cycle) gives the clock. The sixth row mixes vpmaddwd
// and vpaddd one to one, as the integer KIVI kernels issue them on AVX2. On CPUs with
// AVX-512 the 512-bit forms follow (and VNNI's vpdpwssd/vpdpbusd where present).
// docs/PERFORMANCE.md quotes its output in the roofline of the decode-attention kernels.
//
//   kivi-isa-rates [--json]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>

namespace {

constexpr long kIters = 20'000'000;

// Best of three timings of f(kIters), in ns per instruction (12 per iteration).
template <class F>
double ns_per_op(F f) {
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    f(kIters);
    const auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double>(t1 - t0).count() / (kIters * 12.0) * 1e9);
  }
  return best;
}

#define KIVI_I3(op, n) op " %[b], %[a" #n "], %[a" #n "]\n"
#define KIVI_I2(op, n) op " %[b], %[a" #n "]\n"
#define KIVI_X12(M, op) \
  M(op, 0)              \
  M(op, 1)              \
  M(op, 2) M(op, 3) M(op, 4) M(op, 5) M(op, 6) M(op, 7) M(op, 8) M(op, 9) M(op, 10) M(op, 11)
// The 12 accumulators as asm operands; C is the register constraint ("x": xmm/ymm 0-15,
// "v": any of the 32 AVX-512 registers, needed for zmm).
#define KIVI_CHAINS(C)                                                                          \
  [a0] "+" C(a[0]), [a1] "+" C(a[1]), [a2] "+" C(a[2]), [a3] "+" C(a[3]), [a4] "+" C(a[4]),     \
      [a5] "+" C(a[5]), [a6] "+" C(a[6]), [a7] "+" C(a[7]), [a8] "+" C(a[8]), [a9] "+" C(a[9]), \
      [a10] "+" C(a[10]), [a11] "+" C(a[11])

// op b, a_i, a_i on 12 accumulators (M = KIVI_I3), or op b, a_i (M = KIVI_I2), compiled for
// the ISA extensions `targets` with register constraint C.
#define KIVI_RATE_FN(name, targets, C, M, op, T, init, TB, initb) \
  __attribute__((target(targets), noinline)) void name(long n) {  \
    T a[12];                                                      \
    for (auto& x : a) x = init;                                   \
    const TB b = initb;                                           \
    for (long i = 0; i < n; ++i) {                                \
      asm volatile(KIVI_X12(M, op) : KIVI_CHAINS(C) : [b] C(b));  \
    }                                                             \
    asm volatile("" ::C(a[0]), C(a[5]), C(a[11]));                \
  }

#define KIVI_AVX2 "avx2,fma,f16c"
KIVI_RATE_FN(fma_loop, KIVI_AVX2, "x", KIVI_I3, "vfmadd231ps", __m256, _mm256_set1_ps(0.0f), __m256,
             _mm256_set1_ps(0.0f))
KIVI_RATE_FN(madd_loop, KIVI_AVX2, "x", KIVI_I3, "vpmaddwd", __m256i, _mm256_set1_epi16(1), __m256i,
             _mm256_set1_epi16(1))
KIVI_RATE_FN(maddubs_loop, KIVI_AVX2, "x", KIVI_I3, "vpmaddubsw", __m256i, _mm256_set1_epi8(1),
             __m256i, _mm256_set1_epi8(1))
KIVI_RATE_FN(addd_loop, KIVI_AVX2, "x", KIVI_I3, "vpaddd", __m256i, _mm256_set1_epi32(1), __m256i,
             _mm256_set1_epi32(1))
KIVI_RATE_FN(cvtph_loop, KIVI_AVX2, "x", KIVI_I2, "vcvtph2ps", __m256, _mm256_set1_ps(0.0f),
             __m128i, _mm_set1_epi16(0x3c00))

// The same with 512-bit registers (AVX-512 CPUs; the AVX3 kernels use these).
KIVI_RATE_FN(fma512_loop, "avx512f", "v", KIVI_I3, "vfmadd231ps", __m512, _mm512_set1_ps(0.0f),
             __m512, _mm512_set1_ps(0.0f))
KIVI_RATE_FN(maddwd512_loop, "avx512f,avx512bw", "v", KIVI_I3, "vpmaddwd", __m512i,
             _mm512_set1_epi16(1), __m512i, _mm512_set1_epi16(1))
KIVI_RATE_FN(cvtph512_loop, "avx512f", "v", KIVI_I2, "vcvtph2ps", __m512, _mm512_set1_ps(0.0f),
             __m256i, _mm256_set1_epi16(0x3c00))
KIVI_RATE_FN(dpwssd512_loop, "avx512f,avx512vnni", "v", KIVI_I3, "vpdpwssd", __m512i,
             _mm512_set1_epi32(1), __m512i, _mm512_set1_epi16(1))
KIVI_RATE_FN(dpbusd512_loop, "avx512f,avx512vnni", "v", KIVI_I3, "vpdpbusd", __m512i,
             _mm512_set1_epi32(1), __m512i, _mm512_set1_epi8(1))

// The KIVI kernels' inner pattern: each vpmaddwd result is added into an accumulator
// (6 products + 6 adds per iteration, 6 chains). Its rate bounds the integer kernels.
#define KIVI_MIX(n) "vpmaddwd %[b], %[c], %[t" #n "]\n vpaddd %[t" #n "], %[a" #n "], %[a" #n "]\n"
__attribute__((target("avx2"), noinline)) void madd_add_loop(long n) {
  __m256i a[6], t[6];
  for (auto& x : a) x = _mm256_set1_epi32(1);
  const __m256i b = _mm256_set1_epi16(1), c = _mm256_set1_epi16(2);
  for (long i = 0; i < n; ++i) {
    asm volatile(KIVI_MIX(0) KIVI_MIX(1) KIVI_MIX(2) KIVI_MIX(3) KIVI_MIX(4) KIVI_MIX(5)
                 : [a0] "+x"(a[0]), [a1] "+x"(a[1]), [a2] "+x"(a[2]), [a3] "+x"(a[3]),
                   [a4] "+x"(a[4]), [a5] "+x"(a[5]), [t0] "=&x"(t[0]), [t1] "=&x"(t[1]),
                   [t2] "=&x"(t[2]), [t3] "=&x"(t[3]), [t4] "=&x"(t[4]), [t5] "=&x"(t[5])
                 : [b] "x"(b), [c] "x"(c));
  }
  asm volatile("" ::"x"(a[0]), "x"(a[5]));
}

__attribute__((noinline)) void clock_loop(long n) {
  long x = 0;
  for (long i = 0; i < n; ++i) {
    asm volatile(
        "add $1, %0\n add $1, %0\n add $1, %0\n add $1, %0\n add $1, %0\n add $1, %0\n"
        "add $1, %0\n add $1, %0\n add $1, %0\n add $1, %0\n add $1, %0\n add $1, %0\n"
        : "+r"(x));
  }
}

int run(bool json) {
  const double cycle_ns = ns_per_op(clock_loop);
  struct Row {
    const char* name;
    const char* what;
    double ns;
  };
  Row rows[16] = {
      {"vfmadd231ps", "8 float multiply-adds", ns_per_op(fma_loop)},
      {"vpmaddwd", "16 int16 products, pairs summed", ns_per_op(madd_loop)},
      {"vpmaddubsw", "32 u8 x s8 products, pairs summed", ns_per_op(maddubs_loop)},
      {"vpaddd", "8 int32 adds", ns_per_op(addd_loop)},
      {"vcvtph2ps", "8 f16 -> f32", ns_per_op(cvtph_loop)},
      // 12 instructions per iteration as above: half of them multiplies.
      {"madd+add", "vpmaddwd then vpaddd (kernel mix)", ns_per_op(madd_add_loop)},
  };
  size_t n_rows = 6;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) {
    rows[n_rows++] = {"zmm vfmadd231ps", "16 float multiply-adds (512-bit)",
                      ns_per_op(fma512_loop)};
    rows[n_rows++] = {"zmm vpmaddwd", "32 int16 products (512-bit)", ns_per_op(maddwd512_loop)};
    rows[n_rows++] = {"zmm vcvtph2ps", "16 f16 -> f32 (512-bit)", ns_per_op(cvtph512_loop)};
    if (__builtin_cpu_supports("avx512vnni")) {
      rows[n_rows++] = {"zmm vpdpwssd", "32 int16 products, accumulated",
                        ns_per_op(dpwssd512_loop)};
      rows[n_rows++] = {"zmm vpdpbusd", "64 u8 x s8 products, accumulated",
                        ns_per_op(dpbusd512_loop)};
    }
  }
  if (json) {
    std::printf("{\"clock_ghz\": %.3f, \"instructions\": [", 1.0 / cycle_ns);
    for (size_t i = 0; i < n_rows; ++i) {
      std::printf("%s{\"name\": \"%s\", \"ns\": %.4f, \"per_cycle\": %.3f}", i ? ", " : "",
                  rows[i].name, rows[i].ns, cycle_ns / rows[i].ns);
    }
    std::printf("]}\n");
    return 0;
  }
  std::printf("clock ~%.2f GHz (dependent scalar adds)\n", 1.0 / cycle_ns);
  std::printf("%-16s %-36s %10s %12s\n", "instruction", "work (256-bit unless noted)", "ns each",
              "per cycle");
  for (size_t i = 0; i < n_rows; ++i)
    std::printf("%-16s %-36s %10.3f %12.2f\n", rows[i].name, rows[i].what, rows[i].ns,
                cycle_ns / rows[i].ns);
  return 0;
}

}  // namespace
#endif

int main(int argc, char** argv) {
  const bool json = argc > 1 && std::strcmp(argv[1], "--json") == 0;
  if (argc > 2 || (argc > 1 && !json)) {
    const bool help = std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0;
    std::fprintf(help ? stdout : stderr,
                 "%susage: kivi-isa-rates [--json]\n"
                 "Measures the issue rate of the AVX2 (and, where the CPU has them, AVX-512)\n"
                 "instructions the attention kernels use\n"
                 "(12 independent chains each) and the clock (a chain of dependent adds).\n"
                 "  --json  print {\"clock_ghz\", \"instructions\": [{name, ns, per_cycle}]}\n",
                 help ? "" : "kivi-isa-rates: unknown option\n");
    return help ? 0 : 2;
  }
#if defined(__x86_64__)
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") ||
      !__builtin_cpu_supports("f16c")) {
    std::fprintf(stderr, "kivi-isa-rates: this CPU lacks AVX2, FMA or F16C\n");
    return 1;
  }
  return run(json);
#else
  std::fprintf(stderr, "kivi-isa-rates: x86-64 only\n");
  return 1;
#endif
}
