#include "kv/snapshot.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "kv/block_pool.h"

namespace kivi::kv {

const char* part_name(Part p) {
  switch (p) {
    case Part::kCodes:
      return "codes";
    case Part::kScales:
      return "scales";
    case Part::kZeros:
      return "zero points";
    case Part::kRing:
      return "residual window";
  }
  return "?";
}

namespace {

void put_stream(const StreamState& s, uint8_t* out) {
  std::memcpy(out, &s.n_stored, 4);
  std::memcpy(out + 4, &s.ring_shift, 4);
  std::memcpy(out + 8, &s.tensor_scale, 4);
  std::memcpy(out + 12, &s.calibrated, 4);
  std::memcpy(out + 16, &s.clamped, 8);
}

StreamState get_stream(const uint8_t* in) {
  StreamState s;
  std::memcpy(&s.n_stored, in, 4);
  std::memcpy(&s.ring_shift, in + 4, 4);
  std::memcpy(&s.tensor_scale, in + 8, 4);
  std::memcpy(&s.calibrated, in + 12, 4);
  std::memcpy(&s.clamped, in + 16, 8);
  return s;
}

}  // namespace

void encode_layer_state(const LayerState& s, uint8_t* out) {
  std::memcpy(out, &s.n, 4);
  put_stream(s.k, out + 4);
  put_stream(s.v, out + 28);
}

LayerState decode_layer_state(const uint8_t* in) {
  LayerState s;
  std::memcpy(&s.n, in, 4);
  s.k = get_stream(in + 4);
  s.v = get_stream(in + 28);
  return s;
}

size_t part_head_bytes(const CacheConfig& c, Stream s, Part p, int nb) {
  const StreamLayout lay = stream_layout(c, s);
  const size_t n = static_cast<size_t>(nb), ps = param_size(c.param_type);
  switch (p) {
    case Part::kCodes:
      return n * lay.head_block_bytes;
    case Part::kScales:
      return n * lay.head_block_params * ps;
    case Part::kZeros:
      return is_kivi(lay.fmt.format) ? n * lay.head_block_params * ps : 0;
    default:
      return 0;
  }
}

int snapshot_ring_rows(const CacheConfig& c, Stream s) {
  CacheConfig streaming = c;
  streaming.ring_slack = 0;
  return s == Stream::kKey ? key_ring_capacity(streaming) : value_ring_capacity(streaming);
}

size_t part_bytes(const CacheConfig& c, Stream s, Part p, int nb) {
  const StreamLayout lay = stream_layout(c, s);
  const size_t H = c.n_kv_heads, D = c.head_dim, n = static_cast<size_t>(nb);
  const size_t ps = param_size(c.param_type);
  const size_t heads = H * head_region_bytes(part_head_bytes(c, s, p, nb));
  switch (p) {
    case Part::kCodes:
    case Part::kZeros:
      return heads;
    case Part::kScales:
      return heads + n * lay.shared_params * ps;
    case Part::kRing:
      return static_cast<size_t>(snapshot_ring_rows(c, s)) * H * D * sizeof(float);
  }
  return 0;
}

void check_layer_state(const CacheConfig& c, const LayerState& s, const std::string& what) {
  if (s.n < 0 || s.n > c.ctx)
    fail("%s: %d tokens, outside the context of %d", what.c_str(), s.n, c.ctx);
  const int G = c.group_size, R = c.residual;
  for (Stream which : {Stream::kKey, Stream::kValue}) {
    const StreamState& t = which == Stream::kKey ? s.k : s.v;
    const StreamFormat& f = which == Stream::kKey ? c.k : c.v;
    const char* name = which == Stream::kKey ? "keys" : "values";
    const int ring = snapshot_ring_rows(c, which);
    // Row formats store every token at once and read n alone; their count may run ahead
    // of n between a drop and the next append.
    const int most_stored = uses_ring(f.format) ? s.n : c.ctx;
    if (t.n_stored < 0 || t.n_stored > most_stored) {
      fail("%s: %d %s stored of %d tokens", what.c_str(), t.n_stored, name, s.n);
    }
    if (uses_ring(f.format)) {
      const int residual = s.n - t.n_stored;
      // The largest residual the flush rules leave after an append (format.h).
      int most = 0;
      if (which == Stream::kKey && is_kivi(f.format)) {
        most = c.key_flush == KeyFlush::kBatch ? std::max(R, G) - 1 : std::max(R + 1, G) - 1;
        if (t.n_stored % G != 0) {
          fail("%s: %d keys stored, not whole groups of %d", what.c_str(), t.n_stored, G);
        }
      } else {
        most = R;
      }
      if (residual > std::min(most, ring)) {
        fail("%s: %d %s in the residual window, at most %d", what.c_str(), residual, name,
             std::min(most, ring));
      }
    }
    if (ring == 0 ? t.ring_shift != 0 : t.ring_shift < 0 || t.ring_shift >= ring) {
      fail("%s: %s ring shift %d outside [0, %d)", what.c_str(), name, t.ring_shift,
           std::max(ring, 1));
    }
    if (!std::isfinite(t.tensor_scale) || t.tensor_scale < 0.0f) {
      fail("%s: %s tensor scale %g is not a finite non-negative number", what.c_str(), name,
           static_cast<double>(t.tensor_scale));
    }
    if (t.calibrated != 0 && t.calibrated != 1)
      fail("%s: %s calibration flag %d (0 or 1)", what.c_str(), name, t.calibrated);
    if (t.clamped < 0) fail("%s: %s clamped count %lld", what.c_str(), name, (long long)t.clamped);
  }
}

}  // namespace kivi::kv
