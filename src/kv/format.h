// KV cache number formats and the cache's configuration. A format is chosen per
// stream (keys, values) at run time; src/kv/codec.h holds the quantizers and
// src/kv/kv_cache.h the storage.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/aligned.h"

namespace kivi::kv {

enum class Format : uint8_t {
  kF32 = 0,    // full precision
  kF16 = 1,    // IEEE half
  kInt8 = 2,   // symmetric absmax int8, scale per tensor/token/head/group
  kKivi2 = 3,  // KIVI asymmetric 2-bit (keys per channel, values per token) + residual
  kKivi4 = 4,  // KIVI asymmetric 4-bit
  kKivi8 = 5,  // KIVI asymmetric 8-bit (same scheme, for comparison)
  // Rotated vector quantization (kv/tq.h): per token and head a Hadamard rotation, one
  // Lloyd-Max code per rotated coordinate and one scale; the split widths give a quarter
  // of the coordinates one more bit.
  kTq2 = 6,
  kTq3 = 7,
  kTq4 = 8,
  kTq25 = 9,   // tq2.5: a quarter of the coordinates at 3 bits, the rest at 2
  kTq35 = 10,  // tq3.5: a quarter at 4 bits, the rest at 3
};
inline constexpr int kNumFormats = 11;

enum class Int8Granularity : uint8_t { kTensor = 0, kToken = 1, kHead = 2, kGroup = 3 };
enum class KeyFlush : uint8_t { kBatch = 0, kGroup = 1 };
// Storage type of quantization parameters (scales and zero points).
enum class ParamType : uint8_t { kF16 = 0, kF32 = 1 };
enum class Stream : uint8_t { kKey = 0, kValue = 1 };
// Where keys are stored relative to RoPE. KIVI stores (and quantizes) rotated keys;
// KVQuant (Hooper et al. 2024) quantizes them before RoPE, where channel outliers have
// not been smeared across channel pairs by the rotation, and rotates each key by its
// position when attention reads it.
enum class KeyRope : uint8_t { kPost = 0, kPre = 1 };
// --kv-rotate: a seeded randomized Hadamard rotation per layer and KV head applied to int8
// rows and KIVI values before they are quantized (tq formats always rotate; KIVI keys,
// quantized per channel, and float rows never do).
enum class KvRotate : uint8_t { kNone = 0, kHadamard = 1 };

const char* format_name(Format f);
const char* granularity_name(Int8Granularity g);
const char* key_flush_name(KeyFlush k);
const char* param_type_name(ParamType p);
const char* key_rope_name(KeyRope k);
const char* kv_rotate_name(KvRotate r);
inline size_t param_size(ParamType p) { return p == ParamType::kF16 ? 2 : 4; }

// Parsers throw kivi::Error naming the option and listing the valid values.
Format parse_format(const std::string& s, const char* option = "--kv-cache");
Int8Granularity parse_granularity(const std::string& s);
KeyFlush parse_key_flush(const std::string& s);
ParamType parse_param_type(const std::string& s);
KeyRope parse_key_rope(const std::string& s);
KvRotate parse_kv_rotate(const std::string& s);

inline bool is_kivi(Format f) {
  return f == Format::kKivi2 || f == Format::kKivi4 || f == Format::kKivi8;
}
inline bool is_tq(Format f) { return f >= Format::kTq2 && f <= Format::kTq35; }
// Formats that keep the most recent tokens in full precision (the residual window R) and
// quantize them as they leave it.
inline bool uses_ring(Format f) { return is_kivi(f) || is_tq(f); }
// Whether a stream's stored rows live in its heads' rotated space: tq always; with
// --kv-rotate hadamard int8 keys and values and KIVI values.
inline bool is_rotated(Format f, bool key, KvRotate r) {
  return is_tq(f) || (r == KvRotate::kHadamard && (f == Format::kInt8 || (!key && is_kivi(f))));
}
// Bits per stored element (before parameters), rounded down for the split tq widths.
int format_bits(Format f);
// Bits per stored element of the codes, exactly (2.5 for tq2.5).
double format_code_bits(Format f);
// Bytes of one token's codes for one head of head_dim channels.
size_t code_row_bytes(Format f, int head_dim);
// Throws unless bits is 2, 4 or 8 (the packings the codecs implement).
void check_bits(int bits);

// One stream's format.
struct StreamFormat {
  Format format = Format::kF32;
  Int8Granularity granularity = Int8Granularity::kHead;  // int8 only
  bool operator==(const StreamFormat&) const = default;
};
std::string describe(const StreamFormat& s);

inline constexpr uint64_t kDefaultRotationSeed = 0x6b697669u;  // "kivi"

struct CacheConfig {
  // Shape.
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int ctx = 0;  // tokens the cache holds
  // Formats.
  StreamFormat k, v;
  int group_size = 32;  // G: KIVI key groups (tokens), value and int8 groups (channels)
  int residual = 128;   // R: recent tokens kept in full precision (KIVI formats)
  KeyFlush key_flush = KeyFlush::kBatch;
  // KIVI: rows the residual rings keep past what streaming needs, so that the last
  // ring_slack tokens' full-precision rows outlive their quantization and a cache can be
  // cut back by up to that many tokens (KvCache::truncate). 0 for sessions that do not speculate.
  int ring_slack = 0;
  ParamType param_type = ParamType::kF16;
  int block_tokens = 0;  // tokens per storage block; 0 picks 128 rounded up to a multiple of G
  KeyRope key_rope = KeyRope::kPost;
  // tq formats and --kv-rotate: the base seed of the per-(layer, KV head) Hadamard rotations
  // (kv/rotation.h).
  uint64_t rotation_seed = kDefaultRotationSeed;
  KvRotate rotate = KvRotate::kNone;
  // Cross-layer sharing: a borrowing layer reads an earlier layer's keys and values
  // instead of storing its own (its K and V projections are skipped).
  int share_every = 1;  // groups of N adjacent layers read the first one's cache
  std::vector<std::pair<int, int>> share_map;  // (borrower, owner) pairs, applied after share_every
  // Per-layer precision: [n_layers] each layer's key and value formats, or empty when every
  // layer uses k and v. A borrowing layer (cross-layer sharing) reads its owner's.
  struct LayerFormats {
    StreamFormat k, v;
    bool operator==(const LayerFormats&) const = default;
  };
  std::vector<LayerFormats> layer_formats;
  // The map it comes from (--kv-cache-layers, kv/layer_formats.h), applied once the model's
  // layers are known (runtime::cache_shape_for); empty for none.
  std::string layer_map;
  // Sliding-window attention (model/config.h): [n_layers] the tokens each layer attends,
  // 0 for the whole context; empty when no layer has a window. A layer with a window
  // holds only layer_blocks() blocks and evicts the blocks that leave its window.
  std::vector<int> layer_window;

  // Throws kivi::Error naming the parameter and its valid range.
  void validate() const;
  // Effective values.
  int block() const;
  // Channel group for value / int8-group quantization: min(G, head_dim).
  int channel_group() const;
  bool has_residual() const;
  // Layer l's configuration: k and v its own formats, layer_formats empty.
  CacheConfig at_layer(int l) const;
  // Whether layers differ in format; every (key, value) format pair of the layers.
  bool mixed() const { return !layer_formats.empty(); }
  std::vector<LayerFormats> formats() const;
  // Whether --kv-rotate rotates some key (key) or value stream: tq's own rotation aside.
  bool rotates(bool key) const {
    return any_stream([&](const StreamFormat& f, bool k) {
      return k == key && !is_tq(f.format) && is_rotated(f.format, k, rotate);
    });
  }
  // Whether pred(format, is_key) holds for some stream of some layer.
  template <class Pred>
  bool any_stream(Pred pred) const {
    for (const LayerFormats& f : formats())
      if (pred(f.k, true) || pred(f.v, false)) return true;
    return false;
  }
  int window(int layer) const {
    return layer < static_cast<int>(layer_window.size()) ? layer_window[layer] : 0;
  }
  bool has_window() const;
};

// Physical blocks of one layer: the whole context's, or for a layer with a window W
// the fewest that hold W tokens, the tokens not yet quantized (the KIVI residual) and
// the block being filled: ceil((max(W, residual rings) + B) / B), at most the context's.
int layer_blocks(const CacheConfig& c, int layer);

// The layer whose cache each of the n_layers layers reads (itself for a layer that
// stores its own), from share_every and share_map. Throws if a pair names a layer out
// of range, an owner that is not before its borrower, or an owner that borrows itself.
std::vector<int> layer_owners(const CacheConfig& c);
// Layers that store a cache.
int stored_layers(const CacheConfig& c);
// "every 2 layers" / "layers 3:1 5:4" / "" for no sharing.
std::string describe_sharing(const CacheConfig& c);

// Asymptotic stored bytes per token for one stream of one layer (codes plus
// quantization parameters, every KV head), excluding the full-precision residual.
double stream_bytes_per_token(const CacheConfig& c, Stream s);
// Same for K + V of one layer.
double layer_bytes_per_token(const CacheConfig& c);
// Bits per element including parameters (for quality tables).
double bits_per_element(const CacheConfig& c, Stream s);

// Exact bytes the cache uses after n tokens (every layer), residual included.
uint64_t expected_bytes_used(const CacheConfig& c, int n_tokens);
// Exact bytes the cache reserves for c.ctx tokens.
uint64_t expected_bytes_reserved(const CacheConfig& c);

// Bytes between two heads' regions in a pool buffer or a KV file holding `bytes` of one
// head: regions of at least 64 KiB start on page boundaries (4096 bytes), so that a saved
// cache's blocks can be mapped into a pool instead of copied; smaller ones are packed.
inline constexpr uint64_t kPagedRegionMin = kMappedMin;  // the pool's maps start here too
inline uint64_t head_region_bytes(uint64_t bytes) {
  return bytes >= kPagedRegionMin ? (bytes + kPageBytes - 1) / kPageBytes * kPageBytes : bytes;
}

// Residual sizes after n appended tokens (KIVI formats; 0 otherwise): the number of
// keys/values held in full precision and the number quantized. These and the ring
// capacities are one layer's: pass at_layer(l) where layers differ in format (the ring
// capacities of a mixed configuration are the largest of its layers').
int keys_quantized_after(const CacheConfig& c, int n_tokens);
int values_quantized_after(const CacheConfig& c, int n_tokens);
// Ring capacities of the residual buffers.
int key_ring_capacity(const CacheConfig& c);
int value_ring_capacity(const CacheConfig& c);

}  // namespace kivi::kv
