// A KV cache's contents as a file holds them (runtime/kv_file.h): per stored layer, a
// small state record and the parts of its keys and values, each part in the logical
// order of the layer's first nb blocks (nb = ceil(n / B)), whatever the block table:
//   codes      [H][region], a region holding the head's [nb][head_block_bytes]
//   scales     [H][region] of [nb][head_block_params], then [nb][shared_params]
//              (int8/token), in the parameter type
//   zeros      like scales (KIVI formats; empty otherwise)
//   ring       [H][rows][D] f32, the residual window (KIVI; empty otherwise): rows =
//              snapshot_ring_rows (the streaming ring, without CacheConfig::ring_slack),
//              the row of each of the last `rows` tokens t at (t + ring_shift) % rows;
//              a cache writes ring_shift 0 and whatever its own ring's length, so files
//              move between caches that keep more rows for cutting back and those that
//              keep none
// A head's region is kv::head_region_bytes of its data: padded with zeros to whole pages
// once it is 64 KiB or more, so that a loader can map it into a pool, whose heads'
// regions start on pages too. A cache restored from these parts has an identity block
// table and reads exactly the bytes the saved one read, so continuing from it gives the
// same bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kv/format.h"

namespace kivi::kv {

enum class Part : uint8_t { kCodes = 0, kScales = 1, kZeros = 2, kRing = 3 };
inline constexpr int kNumParts = 4;
const char* part_name(Part p);

// One stream's state beside its blocks.
struct StreamState {
  int32_t n_stored = 0;    // tokens in blocks (KIVI); the rest are in the ring
  int32_t ring_shift = 0;  // token t's ring row is (t + ring_shift) % snapshot_ring_rows
  float tensor_scale = 0.0f;
  int32_t calibrated = 0;  // int8/tensor: the scale is fixed
  int64_t clamped = 0;     // int8/tensor: elements clamped so far
};
struct LayerState {
  int32_t n = 0;  // tokens
  StreamState k, v;
};
// Bytes of a LayerState record in a file (little-endian fields in the order above).
inline constexpr size_t kLayerStateBytes = 4 + 2 * (4 + 4 + 4 + 4 + 8);
void encode_layer_state(const LayerState& s, uint8_t* out);  // out: kLayerStateBytes
LayerState decode_layer_state(const uint8_t* in);

// Bytes of one head's data in a part with a region per head (codes, scales, zeros) for
// the first nb blocks, before padding; 0 for the other parts.
size_t part_head_bytes(const CacheConfig& c, Stream s, Part p, int nb);
// Rows of a stream's ring in a snapshot: the ring streaming needs (no ring_slack).
int snapshot_ring_rows(const CacheConfig& c, Stream s);
// Bytes of one part of one stream for the first nb blocks (0: the part is absent).
size_t part_bytes(const CacheConfig& c, Stream s, Part p, int nb);

// Throws kivi::Error (prefixed by `what`) unless `s` is a state the cache's append and
// drop rules can reach for config c: n within the context, stored tokens in whole key
// groups, residuals within the flush thresholds and the ring, ring shifts in range,
// finite non-negative tensor scales. A cache restored from a checked state cannot read
// or write outside its buffers.
void check_layer_state(const CacheConfig& c, const LayerState& s, const std::string& what);

}  // namespace kivi::kv
