// The KV cache: every layer's keys and values in their configured formats, stored
// in fixed-size blocks of tokens described by a block table, with KIVI's
// full-precision residual window in a ring buffer. All storage is allocated by the
// constructor (or by a shared pool before); append() allocates no memory and never
// copies or re-quantizes history.
//
// Streaming (KIVI Algorithm 1 / seed 001), applied on every append, before the
// step's attention reads the cache:
//   keys,   --key-flush batch: when the key residual reaches max(R, G) tokens, all of
//           them are quantized, in groups of G.
//   keys,   --key-flush group: when the key residual exceeds R (and holds at least G),
//           the oldest G keys are quantized.
//   values: when the value residual would exceed R, the oldest value is quantized.
// Key groups therefore always cover tokens [gG, (g+1)G): both policies produce the
// same codes, they differ only in when. Formats without a residual (f32, f16, int8)
// store each token directly.
//
// Storage per layer and stream (B tokens per block, H KV heads, D = head_dim):
// Every pool is head-major: [H][n_blocks][...], so one head's history is contiguous and
// an attention task (one KV head, a run of tokens) reads one sequential stream. Each
// head's region starts code_head_stride bytes (parameters: param_head_stride) after the
// previous one: its blocks, then padding to a page once they take 64 KiB
// (kv::head_region_bytes), so that a saved cache can be mapped into it.
//   row formats (f32, f16, int8): codes [H][n_blocks][B][D * bytes]
//                                 int8 scales: head [H][n_blocks][B], group [H][n_blocks][B][D/Gc],
//                                 token [n_blocks][B] (shared by the heads); tensor: one per layer
//   KIVI keys:   codes [H][n_blocks][B/G][G*D*bits/8] (the rows of each group interleaved
//                in 4-byte units, kv/codec.h: one 32-bit word holds 4 bytes of one token and
//                consecutive words consecutive tokens), scale/zero [H][n_blocks][B/G][D]
//   KIVI values: codes [H][n_blocks][B/4][D*bits/8][4] (quads of tokens interleaved by
//                byte, so one 32-bit word holds byte j of four consecutive tokens: the
//                layout integer dot products over tokens want), scale/zero [H][n_blocks][B][D/Gc]
//   residual:    f32 ring [H][capacity][D], token p in slot p % capacity
//
// Blocks come from a kv::BlockPool (block_pool.h). A cache made from a configuration
// owns a pool of exactly the blocks its context needs, mapped in order (an identity
// block table). A cache made over a shared pool maps a logical block when the first
// of its tokens arrives, draws it from its reservation, can start with published
// blocks of an identical prompt prefix (never writing them: their stored contents are
// already what it would write), and returns its blocks to the pool when cleared.
// The residual ring, the token counts and the int8 tensor scales are per cache.
//
// Sliding windows (CacheConfig::layer_window): a layer with a window W owns only
// kv::layer_blocks() blocks of the cache's own pool. After each append it evicts the
// whole stored blocks that lie entirely before its last W tokens (as drop() does), so
// its memory stays bounded however long the context grows; evicted(layer) counts them
// and position(layer) = n_tokens(layer) + evicted(layer) is the next token's position.
// Caches over a shared pool refuse windows.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/aligned.h"
#include "kv/block_pool.h"
#include "kv/format.h"
#include "kv/rotation.h"
#include "kv/snapshot.h"
#include "kv/tq.h"

namespace kivi::kv {

// How attention finds one stream's data. Plain pointers and strides so that a
// kernel (or a later GPU backend) needs nothing else.
struct StreamView {
  StreamFormat fmt;
  ParamType param_type = ParamType::kF16;
  int n_heads = 0, head_dim = 0, block = 0, group = 0;  // group: G (keys) or Gc (values/int8)
  bool per_channel =
      false;  // KIVI keys: params per (group of tokens, channel), rows interleaved per group
  // Stored segment: tokens [0, n_stored).
  int n_stored = 0;
  const uint8_t* codes = nullptr;   // [H][code_head_stride], each [n_blocks][head_block_bytes]
  const uint8_t* scales = nullptr;  // [H][param_head_stride], each [n_blocks][head_block_params]
                                    // (int8/token: [n_blocks][B] after the heads)
  const uint8_t* zeros = nullptr;   // like scales (KIVI only)
  const int32_t* block_table = nullptr;  // logical block -> physical block
  int n_blocks = 0;                      // physical blocks per head
  size_t code_head_stride = 0;           // bytes from one head's codes to the next's
  size_t param_head_stride = 0;          // parameters from one head's to the next's
  size_t head_block_bytes = 0;           // codes of one head in one block
  size_t head_block_params = 0;  // parameters (each of scale, zero) of one head in one block
  size_t code_row_bytes = 0;     // bytes of one token's codes for one head
  size_t token_stride = 0;       // bytes between tokens' rows within a block
  bool quad = false;             // rows interleaved by quads of tokens (KIVI values)
  float tensor_scale = 0.0f;     // int8 tensor granularity
  // tq formats (kv/tq.h): the codec; the scales hold one scale per token and head ([B] per
  // head and block, as int8/head).
  const kv::TqCodec* tq = nullptr;
  // Stored rows in the heads' rotated space (tq, and int8 rows and KIVI values under
  // --kv-rotate hadamard), each head's rotation ([n_heads]); the residual rows are not.
  bool rotated = false;
  const kv::HadamardRotation* rotations = nullptr;
  // Residual segment: tokens [n_stored, n_tokens) in full precision.
  const float* ring = nullptr;  // [H][ring_capacity][D]
  int ring_capacity = 0;
  int ring_shift = 0;  // token t is in slot (t + ring_shift) % ring_capacity

  // Each head's blocks are contiguous, so a head's history (with an identity block
  // table) is one sequential stream: what one attention task reads.
  size_t physical_block(int t) const { return static_cast<size_t>(block_table[t / block]); }
  const uint8_t* head_block_codes(int t, int h) const {
    return codes + static_cast<size_t>(h) * code_head_stride + physical_block(t) * head_block_bytes;
  }
  // Pointer to the codes of token t (< n_stored), head h, in row formats. For quad-interleaved
  // streams: the start of t's quad; byte j of token t is at quad_row(t, h)[4 j + t % 4].
  // KIVI keys (per_channel): the start of t's group; byte j of token t is at
  // group_codes(t, h)[kv::key_group_offset(t % group, j, code_row_bytes, group)].
  const uint8_t* row(int t, int h) const {
    return head_block_codes(t, h) + static_cast<size_t>(t % block) * token_stride;
  }
  const uint8_t* group_codes(int t, int h) const {
    return head_block_codes(t, h) + static_cast<size_t>(t % block) / group * group * code_row_bytes;
  }
  const uint8_t* quad_row(int t, int h) const {
    return head_block_codes(t, h) + static_cast<size_t>(t % block) / 4 * 4 * code_row_bytes;
  }
  // Index of the first parameter of head h in the block holding token t; the layout
  // within it: KIVI keys [B/G][D], KIVI values and int8/group [B][D/Gc], int8/head [B].
  size_t param_base(int t, int h) const {
    return static_cast<size_t>(h) * param_head_stride + physical_block(t) * head_block_params;
  }
  // KIVI keys: index of the first of the D parameters of the group holding token t.
  size_t group_params(int t, int h) const {
    return param_base(t, h) + static_cast<size_t>(t % block) / group * head_dim;
  }
  // int8/token: the one scale of token t.
  size_t token_param_index(int t) const {
    return static_cast<size_t>(block_table[t / block]) * block + static_cast<size_t>(t % block);
  }
  // What reading the stored tokens [t, e) of head h (within one block) touches: the
  // bytes of their codes (whole key groups, whole value quads) in rows of row_bytes, and
  // the run of `count` parameters from index `first` (each of scale and zero point; none
  // for int8 with one scale per tensor). For prefetching.
  struct Span {
    const uint8_t* codes;
    size_t bytes, row_bytes, first, count;
  };
  Span span(int t, int e, int h) const {
    Span s{row(t, h), static_cast<size_t>(e - t) * token_stride, token_stride, 0, 0};
    const size_t n = static_cast<size_t>(e - t), D = static_cast<size_t>(head_dim);
    if (per_channel) {  // KIVI keys: [B/G][D] parameters per head and block
      const int gs = t / group * group, ge = (e + group - 1) / group * group;
      s.codes = group_codes(t, h);
      s.bytes = static_cast<size_t>(ge - gs) * code_row_bytes;
      s.row_bytes = code_row_bytes;
      s.first = group_params(t, h);
      s.count = static_cast<size_t>((ge - gs) / group) * D;
    } else if (quad) {  // KIVI values: [B][D/Gc]
      s.codes = quad_row(t, h);
      s.bytes = static_cast<size_t>((e - t / 4 * 4 + 3) / 4) * 4 * code_row_bytes;
      s.row_bytes = code_row_bytes;
      s.first = param_base(t, h) + static_cast<size_t>(t % block) * (D / group);
      s.count = n * (D / group);
    } else if (tq) {
      s.first = param_base(t, h) + static_cast<size_t>(t % block);
      s.count = n;
    } else if (fmt.format == Format::kInt8) {
      switch (fmt.granularity) {
        case Int8Granularity::kGroup:
          s.first = param_base(t, h) + static_cast<size_t>(t % block) * (D / group);
          s.count = n * (D / group);
          break;
        case Int8Granularity::kHead:
          s.first = param_base(t, h) + static_cast<size_t>(t % block);
          s.count = n;
          break;
        case Int8Granularity::kToken:
          s.first = token_param_index(t);
          s.count = n;
          break;
        case Int8Granularity::kTensor:
          break;
      }
    }
    return s;
  }
  // Residual row of token t (>= n_stored), head h.
  const float* residual_row(int t, int h) const {
    return ring +
           (static_cast<size_t>(h) * ring_capacity + (t + ring_shift) % ring_capacity) * head_dim;
  }
  // The end of the run of residual tokens from t (< limit) that are contiguous in the
  // ring (the ring wraps after slot ring_capacity - 1).
  int ring_run_end(int t, int limit) const {
    const int slot = (t + ring_shift) % ring_capacity;
    return std::min(limit, t + ring_capacity - slot);
  }
};

struct LayerView {
  StreamView k, v;
  int n_tokens = 0;
};

class KvCache {
 public:
  // A single-sequence cache with its own pool for config.ctx tokens.
  explicit KvCache(const CacheConfig& config);
  // A cache of up to `ctx` tokens drawing blocks from `pool` (which must outlive it).
  KvCache(BlockPool& pool, int ctx);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  const CacheConfig& config() const { return cfg_; }
  int n_tokens(int layer) const { return layers_[owner_[layer]].n; }
  // Cross-layer sharing: the layer whose cache `layer` reads (itself when it stores
  // one). A borrowing layer has no storage; view() and n_tokens() give its owner's,
  // and calibrate() or append() on it is an error.
  int owner(int layer) const { return owner_[layer]; }
  bool borrows(int layer) const { return owner_[layer] != layer; }
  int capacity() const { return cfg_.ctx; }
  // Sliding windows: the tokens `layer` attends (0: all), the tokens it has evicted from
  // its front, and the position of its next token (n_tokens + evicted).
  int window(int layer) const { return layers_[owner_[layer]].window; }
  int evicted(int layer) const { return layers_[owner_[layer]].evicted; }
  int position(int layer) const { return n_tokens(layer) + evicted(layer); }

  // Fixes the int8 per-tensor scales of `layer` from the absmax of the first batch of
  // n tokens (k, v: [n, H, D]). Called by prefill on an empty cache; a no-op for
  // other formats or once calibrated.
  void calibrate(int layer, const float* k, const float* v, int n);
  // Context parallelism: position `pos` (>= n_tokens, in this cache's numbering) went to
  // another rank's cache. Quantizes what appending it here would have quantized (KIVI's
  // residual flushes), so a full shard ends with the codes one process would hold.
  void pass(int layer, int pos);
  // Int8 scales that span every KV head (per tensor, per token) see only the heads this
  // cache holds; under tensor parallelism `f` turns such a local absmax into the largest
  // over every process, so each one picks the whole model's scale. Null: local.
  void set_absmax_reduce(std::function<float(float)> f) { absmax_reduce_ = std::move(f); }

  // Appends one token: k, v are [H, D] (keys rotated by RoPE, or not: CacheConfig::key_rope).
  // Throws if the cache is full. A layer with a window then evicts the blocks before it.
  void append(int layer, const float* k, const float* v);

  // Forgets every token. An own pool keeps its storage; a shared pool gets back every
  // block and the unused reservation.
  void clear();

  // Drops tokens [first, first + count) of `layer`: whole stored blocks (first and count
  // multiples of the block size, within droppable()). The later tokens move down by
  // count (token t becomes t - count) without being copied: the block table skips the
  // dropped blocks, which become the blocks of the next tokens, and the residual ring
  // is renumbered. Positions of the tokens live outside the cache (keys before RoPE are
  // rotated by attention; keys after RoPE keep their rotation).
  void drop(int layer, int first, int count);
  // Tokens at the start of `layer` in whole stored blocks (the most drop() can take).
  int droppable(int layer) const;
  // Rotates the stored keys of tokens [first, last) of `layer` by one RoPE row
  // ([D/2][2] cos, sin; adjacent pairs) in place: moves keys stored after RoPE to other
  // positions. f32 and f16 keys only (quantized keys would be rounded twice).
  // `neox`: pairs (i, i + D/2) instead of (2i, 2i + 1).
  void rotate_keys(int layer, int first, int last, const float* rope_row, bool neox = false);

  LayerView view(int layer) const;
  // The view as it was when the layer held its first n tokens: exact for formats that
  // store each token at once (f32, f16, int8), whose stored tokens never change. For
  // attention by a borrowing layer within a prefill batch.
  LayerView view_prefix(int layer, int n) const;

  // Memory from the buffers: bytes holding live data, and bytes allocated (a cache
  // over a shared pool counts its rings and tables; the pool reports the blocks).
  uint64_t bytes_used() const;
  uint64_t bytes_used(int layer) const;
  uint64_t bytes_reserved() const;
  uint64_t bytes_reserved(int layer) const;

  // int8 per-tensor elements clamped since the cache was created/cleared.
  int64_t clamped() const;

  // Shared pools. All of these run on the thread that owns the pool.
  bool shares_pool() const { return own_pool_ == nullptr; }
  const BlockPool& pool() const { return *pool_; }
  // Maps the published blocks that hold the full blocks of `tokens` [n] (an empty
  // cache only; the tokens must be fed afterwards as usual). Returns the number of
  // blocks mapped.
  int share_prefix(const int* tokens, int n);
  // Whether the published blocks alone hold the whole state at a block boundary, so
  // that a sequence can start after them without computing them: true without a
  // residual window (f32, f16, int8, KIVI with R = 0, whose key groups divide a block).
  bool resumes_at_blocks() const;
  // Takes the first n tokens (a multiple of the block size, within the blocks
  // share_prefix mapped) as fed in every layer, without appending them: their stored
  // contents are what appending them would write. Needs resumes_at_blocks().
  void assume_shared(int n);
  // Whether truncate(n) can restore the state after the first n tokens: every token
  // that streaming n tokens leaves in full precision still has its row in the residual
  // ring (CacheConfig::ring_slack rows outlive their quantization); always for formats
  // without a residual window.
  bool can_truncate(int n) const;
  // Cuts the cache back to its first n tokens (0 < n <= n_tokens, can_truncate(n)): the
  // state streaming those n tokens would leave, bit for bit. In a shared pool blocks past
  // them return to the pool, and a published or shared block that will be written again
  // is copied first (one block drawn from the pool: false, and nothing changed, when none
  // is free). Caches without windows or dropped tokens, every layer holding the same
  // tokens.
  bool truncate(int n);
  // Reserves the blocks needed to grow to n_tokens; false (and nothing reserved) if
  // the pool cannot promise them.
  bool reserve(int n_tokens);
  // Gives back what is reserved and not yet drawn (a sequence that stops growing but
  // keeps its tokens).
  void release_reservation();
  // Maps the logical blocks that tokens [0, n_tokens) fall in (before a step that
  // appends from several threads, so that no append allocates).
  void map_blocks(int n_tokens);
  // Publishes the blocks whose tokens are all stored, under their prefixes (tokens:
  // every token fed so far, [n_tokens(0)]); a block identical to one already
  // published is replaced by it and returned to the pool.
  void publish(const int* tokens);
  int blocks_mapped() const { return mapped_; }
  int blocks_published() const { return published_; }  // logical blocks [0, n) are published
  int blocks_reserved() const { return reservation_; }
  int blocks_shared() const;  // mapped blocks held by other caches too

  // Snapshots (kv/snapshot.h): a stored layer's state, and the pieces of one part of
  // its first nb blocks in the snapshot's order, passed to f(bytes, n) one by one (a
  // head region's zero padding as f(nullptr, n)).
  LayerState layer_state(int layer) const;
  void read_part(int layer, Stream s, Part p, int nb,
                 const std::function<void(const uint8_t*, size_t)>& f) const;
  // Where snapshot parts lie in an open file, so that restore can map them.
  struct FileSource {
    int fd = -1;
    const uint8_t* base = nullptr;  // the file's first byte in memory: offset = part - base
  };
  // Restores a stored layer of an empty cache from a snapshot: its state (checked by
  // check_layer_state first) and its parts, parts[stream][part] of
  // part_bytes(config(), stream, part, ceil(st.n / B)) bytes each. A cache with its own
  // pool (a session's) maps, with a file, each head's region of codes, scales and zero
  // points that starts on a page in the file in place, copy-on-write, in whole pages (the
  // pool's heads start on pages when their regions are large), and copies the rest; a
  // cache in a shared pool draws the blocks (reserve() them first) and copies. The ring
  // holds the snapshot's rows; a longer ring (ring_slack) cannot cut back before them.
  // Returns the bytes mapped.
  uint64_t restore(int layer, const LayerState& st, const uint8_t* const parts[2][kNumParts],
                   const FileSource* file = nullptr);

  // Test access: a stored stream's raw storage (for bit-exact state comparison).
  struct RawStream {
    const AlignedBuffer<uint8_t>* codes;
    const AlignedBuffer<uint8_t>* scales;
    const AlignedBuffer<uint8_t>* zeros;
    const AlignedBuffer<float>* ring;
    int n_stored;
    float tensor_scale;
  };
  RawStream raw(int layer, Stream s) const;

 private:
  struct StreamStore {
    StreamLayout lay;
    uint8_t* codes = nullptr;  // the pool's buffers
    uint8_t* scales = nullptr;
    uint8_t* zeros = nullptr;
    size_t code_stride = 0;     // bytes between heads' codes
    size_t param_stride = 0;    // parameters between heads' parameters
    AlignedBuffer<float> ring;  // [H][ring_cap][D], this cache's own
    // The codes of head h in physical block pb, and the index of its first parameter.
    uint8_t* head_codes(int h, size_t pb) const {
      return codes + static_cast<size_t>(h) * code_stride + pb * lay.head_block_bytes;
    }
    size_t param_index(int h, size_t pb) const {
      return static_cast<size_t>(h) * param_stride + pb * lay.head_block_params;
    }
    int ring_shift =
        0;  // token t's ring slot is (t + ring_shift) % ring_cap (drop() renumbers tokens)
    int n_stored = 0;    // tokens in blocks
    int ring_floor = 0;  // tokens before it have no row in the ring (a restored cache)
    float tensor_scale = 0.0f;
    bool calibrated = false;
    int64_t clamped = 0;
    const TqCodec* tq = nullptr;  // tq formats
    bool rotated = false;         // stored rows in the heads' rotated space (kv::is_rotated)
  };
  struct Layer {
    int n = 0;
    std::vector<int32_t>
        block_table;  // [n_logical] physical block of each logical one, -1 unmapped
    StreamStore k, v;
    int n_blocks = 0;                   // physical blocks of this layer in the pool
    int window = 0;                     // sliding window (tokens), 0 = none
    int evicted = 0;                    // tokens evicted from the front by the window
    std::vector<HadamardRotation> rot;  // [H] each KV head's rotation (rotated streams)
  };

  void init(bool own);
  void evict(int layer);  // sliding window: drops the whole blocks before it
  void init_stream(StreamStore& s, BlockPool::StreamStorage& storage, bool key);
  void map_block(int logical, int32_t physical, bool readonly);
  bool readonly(int pos) const { return readonly_[pos / block_] != 0; }
  static int ring_slot(const StreamStore& s, int pos) {
    return (pos + s.ring_shift) % s.lay.ring_cap;
  }
  // The ring row of token pos, head h.
  float* ring_row(StreamStore& s, int h, int pos) const {
    return s.ring.data() +
           (static_cast<size_t>(h) * s.lay.ring_cap + ring_slot(s, pos)) * cfg_.head_dim;
  }
  void to_ring(StreamStore& s, int pos, const float* x);  // x [H][D] -> token pos's ring rows
  StreamView stream_view(const Layer& L, const StreamStore& s, Stream which) const;
  void store_rows(Layer& L, StreamStore& s, int pos, const float* x);  // row formats, one token
  void flush_keys(Layer& L, int first, int count);                     // KIVI keys from ring
  void flush_value(Layer& L, int pos);                                 // KIVI value from ring
  void store_value(Layer& L, int pos, int h, const float* v);          // quantize + interleave
  // tq: one token of every head, head h's row at x + h * head_stride.
  void store_tq(Layer& L, StreamStore& s, int pos, const float* x, size_t head_stride);
  void flush_tq(Layer& L, StreamStore& s, int pos);                   // tq: one token from ring
  void append_tq(Layer& L, StreamStore& s, int pos, const float* x);  // tq: streaming rules
  uint64_t stream_bytes_used(const StreamStore& s, Stream which, int n) const;
  // The pieces of a snapshot part (kv/snapshot.h) in order: f(pointer, bytes).
  void for_each_piece(const Layer& L, Stream which, Part p, int nb,
                      const std::function<void(uint8_t*, size_t)>& f) const;

  CacheConfig cfg_;
  std::function<float(float)> absmax_reduce_;
  std::unique_ptr<BlockPool> own_pool_;
  BlockPool* pool_ = nullptr;
  int block_ = 0, n_blocks_ = 0, n_logical_ = 0, cgroup_ = 0;
  AlignedBuffer<uint8_t> row_tmp_;          // one packed row, for interleaving value codes
  AlignedBuffer<float> tq_tmp_;             // [D] a row being rotated (tq, rotated values)
  AlignedBuffer<float> rot_tmp_;            // [H][D] a token's rows rotated (rotated int8)
  std::vector<Layer> layers_;               // [n_layers]; borrowing layers' entries hold no storage
  std::vector<int> owner_;                  // [n_layers] layer_owners(cfg_)
  int first_stored_ = 0, last_stored_ = 0;  // layers that store a cache: the first and the last
  std::vector<uint8_t>
      readonly_;         // [n_logical] 1: a published block of another sequence's, never written
  int mapped_ = 0;       // logical blocks [0, mapped_) are mapped
  int reservation_ = 0;  // blocks reserved in the pool and not yet drawn
  int published_ = 0;    // logical blocks [0, published_) are published
};

}  // namespace kivi::kv
