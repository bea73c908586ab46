// A 64-bit checksum of a byte stream, for detecting corrupted or truncated files (not
// an adversary: it is no cryptographic hash). Bytes are taken in little-endian 8-byte
// words; each word is mixed into one of four lanes by a multiply and a rotation (the
// lanes keep four multiplies in flight), and the lanes, the length and a tail of fewer
// than eight bytes are folded together at the end. The result depends only on the
// bytes, not on how update() calls split them.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace kivi {

class Checksum {
 public:
  void update(const void* data, size_t n) {
    const uint8_t* p = static_cast<const uint8_t*>(data);
    total_ += n;
    // Complete a pending partial block first.
    if (used_ != 0) {
      const size_t take = std::min(n, sizeof buf_ - used_);
      std::memcpy(buf_ + used_, p, take);
      used_ += take;
      p += take;
      n -= take;
      if (used_ < sizeof buf_) return;
      block(buf_);
      used_ = 0;
    }
    for (; n >= sizeof buf_; p += sizeof buf_, n -= sizeof buf_) block(p);
    std::memcpy(buf_, p, n);
    used_ = n;
  }

  uint64_t digest() const {
    uint64_t h = rotl(lane_[0], 1) + rotl(lane_[1], 7) + rotl(lane_[2], 12) + rotl(lane_[3], 18);
    h ^= total_ * kP1;
    for (size_t i = 0; i < used_; ++i) h = (h ^ buf_[i]) * kP3;  // the tail, bytewise
    h ^= h >> 33;
    h *= kP2;
    h ^= h >> 29;
    h *= kP3;
    h ^= h >> 32;
    return h;
  }

  static uint64_t of(const void* data, size_t n) {
    Checksum c;
    c.update(data, n);
    return c.digest();
  }

 private:
  static constexpr uint64_t kP1 = 0x9E3779B185EBCA87ull;
  static constexpr uint64_t kP2 = 0xC2B2AE3D27D4EB4Full;
  static constexpr uint64_t kP3 = 0x165667B19E3779F9ull;
  static uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
  static uint64_t word(const uint8_t* p) {
    uint64_t w;
    std::memcpy(&w, p, 8);  // little-endian hosts only, like every file the project reads
    return w;
  }
  void block(const uint8_t* p) {
    for (int i = 0; i < 4; ++i) lane_[i] = rotl(lane_[i] + word(p + 8 * i) * kP2, 31) * kP1;
  }

  uint64_t lane_[4] = {kP1 + kP2, kP2, 0, 0 - kP1};
  uint8_t buf_[32] = {};
  size_t used_ = 0;
  uint64_t total_ = 0;
};

}  // namespace kivi
