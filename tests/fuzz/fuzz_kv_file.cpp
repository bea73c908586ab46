// KV cache files (runtime/kv_file.h): parse and check, then touch every section the
// loader would copy. The first byte picks the mode:
//   even: the rest is parsed as it is (checksums guard the sections);
//   odd:  every checksum the table reaches is recomputed first, so that mutations get
//         past them to the structure, configuration and layer-state checks.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/checksum.h"
#include "core/error.h"
#include "runtime/kv_file.h"

namespace {

void reseal(std::vector<uint8_t>& f) {
  if (f.size() < 64) return;
  uint32_t n;
  std::memcpy(&n, f.data() + 12, 4);
  if (n > (f.size() - 64) / 32) return;
  for (uint32_t i = 0; i < n; ++i) {
    uint8_t* t = f.data() + 64 + 32 * static_cast<size_t>(i);
    uint64_t off, bytes;
    std::memcpy(&off, t + 8, 8);
    std::memcpy(&bytes, t + 16, 8);
    if (off > f.size() || bytes > f.size() - off) continue;
    const uint64_t sum = kivi::Checksum::of(f.data() + off, bytes);
    std::memcpy(t + 24, &sum, 8);
  }
  const uint64_t size = f.size();
  std::memcpy(f.data() + 48, &size, 8);
  kivi::Checksum h;
  h.update(f.data(), 56);
  h.update(f.data() + 64, 32 * static_cast<size_t>(n));
  const uint64_t sum = h.digest();
  std::memcpy(f.data() + 56, &sum, 8);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  std::vector<uint8_t> f(data + 1, data + size);
  if (data[0] & 1) reseal(f);
  try {
    const kivi::runtime::KvFile k = kivi::runtime::parse_kv_file(f.data(), f.size(), "fuzz.kv");
    kivi::runtime::check_kv_file(k, k.fingerprint, k.config, k.config.cache.ctx, 512);
    const kivi::kv::CacheConfig& c = k.config.cache;
    const int nb = (k.n_tokens + c.block() - 1) / c.block();
    uint64_t sum = 0;
    for (const auto& L : k.layers) {
      for (int s = 0; s < 2; ++s) {
        for (int q = 0; q < kivi::kv::kNumParts; ++q) {
          const size_t n =
              kivi::kv::part_bytes(c.at_layer(L.layer), static_cast<kivi::kv::Stream>(s),
                                   static_cast<kivi::kv::Part>(q), nb);
          if (n == 0) continue;
          if (!L.parts[s][q]) __builtin_trap();
          sum += L.parts[s][q][0] + L.parts[s][q][n - 1];
        }
      }
      if (L.sparse_done > 0) sum += L.sparse[0];
    }
    (void)sum;
  } catch (const kivi::Error&) {
  }
  return 0;
}
