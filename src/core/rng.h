// Small deterministic random number generators: same seed, same stream, on every
// machine (no std:: distributions, whose output is implementation-defined).
#pragma once

#include <cmath>
#include <cstdint>
#include <random>

namespace kivi {

// splitmix64 seeding + xoshiro256** generator.
class Rng {
 public:
  explicit Rng(uint64_t seed = 0x9E3779B97F4A7C15ull) {
    uint64_t z = seed;
    for (auto& s : s_) {
      z += 0x9E3779B97F4A7C15ull;
      uint64_t x = z;
      x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
      x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
      s = x ^ (x >> 31);
    }
  }
  uint64_t next_u64() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  // Uniform in [0, 1) with 24 bits of precision (exactly representable as float).
  float uniform() { return static_cast<float>(next_u64() >> 40) * (1.0f / 16777216.0f); }
  // Uniform in [lo, hi).
  float uniform(float lo, float hi) { return lo + (hi - lo) * uniform(); }
  // Standard normal (Box-Muller).
  float normal() {
    float u1 = uniform();
    if (u1 < 1e-12f) u1 = 1e-12f;
    const float u2 = uniform();
    return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853071795864f * u2);
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];

 public:
  // The state, for saving a generator and resuming it exactly.
  const uint64_t* state() const { return s_; }
  void set_state(const uint64_t st[4]) {
    for (int i = 0; i < 4; ++i) s_[i] = st[i];
  }
};

// A seed from the system's entropy (--seed -1: a different text every run).
inline uint64_t random_seed() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

}  // namespace kivi
