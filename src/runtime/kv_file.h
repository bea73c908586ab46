// KV cache files: a session's compressed cache after a prefill, saved once and loaded
// by later sessions that continue from it ("compute once, use many"). The byte layout
// is in docs/KV_FORMATS.md; in short (little-endian):
//   header   64 bytes: magic "KIVIKVC\0", u32 version, u32 n_sections, u64 model
//            fingerprint, i64 n_tokens, i64 prefill_tokens, f64 prefill_seconds,
//            u64 file_bytes, u64 checksum of the header's first 56 bytes and the table
//   table    n_sections x 32 bytes: u32 kind, i32 layer (-1: none), u64 offset,
//            u64 bytes, u64 checksum (core/checksum.h) of the section's bytes
//   sections at offsets aligned to 64 bytes (4096 for sections of 64 KiB or more), in
//            the table's order, disjoint:
//            config, session, tokens, chat (only in a conversation's file), shard
//            (only in a --dist cp rank's file), then per
//            stored layer: its state, the parts of
//            its keys and values (kv/snapshot.h) that are not empty, and optionally
//            its block-sparse summaries.
// The reader trusts nothing: every offset, size and checksum is checked before a byte
// of a section is read, the configuration is checked field by field, and every layer
// state is one the cache's rules can reach (kv::check_layer_state). It reads from
// memory (a mapped file), so the fuzzer and the loader share it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "kv/format.h"
#include "kv/snapshot.h"

namespace kivi::runtime {

inline constexpr uint32_t kKvFileVersion = 4;
inline constexpr size_t kKvFileHeaderBytes = 64;
inline constexpr size_t kKvFileTableEntryBytes = 32;
inline constexpr size_t kKvFileAlign = 64;
// Sections of 64 KiB or more start on a page, so that the page-padded head regions in
// them (kv/snapshot.h) can be mapped into a cache.
inline constexpr size_t kKvFilePageAlign = kPageBytes;
inline constexpr size_t kKvFilePagedMin = kv::kPagedRegionMin;

enum class KvSection : uint32_t {
  kConfig = 1,   // KvFileConfig, i32 fields
  kSession = 2,  // i64 position_offset, i64 dropped, i32 overflows, i32 0
  kTokens = 3,   // i32 token ids fed so far (the text the cache holds)
  kChat = 5,     // i32 turns, i32 0, u64 sampler state [4]: written by kivi chat only
  kShard = 6,    // i32 ranks, i32 rank, i32 start, i32 size, i64 positions: --dist cp only
  kLayer = 4,    // kv::LayerState (kv::kLayerStateBytes)
  kPart = 16,    // + 8 * stream + part: one part of one stream (kv/snapshot.h)
  kSparse = 32,  // i32 summarized tokens, i32 0, then f16 [H][summarized / block][V][D]
};

// Everything the cache's bits depend on: the cache configuration and the session
// options that shape it. Written as i32 fields in this order, then the share map's
// pairs, then per layer (caches whose layers differ in format) its key format and int8
// granularity and its value format and granularity.
struct KvFileConfig {
  kv::CacheConfig cache;      // shape, formats, G, R, flush, param type, block, key RoPE, sharing
  int overflow = 0;           // runtime::ContextOverflow
  int sinks = 0, window = 0;  // shift/window policies only (0 otherwise)
  int summary_kind = 0;       // sparse::SummaryKind of the block-sparse summaries (0: none)
  int summary_block = 0;      // their block of tokens
};
// Named differences between two configurations, file first: "key format: kivi2 in
// the file, int8 here". The context and the sparse summaries are not compared here.
std::vector<std::string> config_differences(const KvFileConfig& file, const KvFileConfig& here);

struct KvFileLayer {
  int layer = 0;
  kv::LayerState state;
  const uint8_t* parts[2][kv::kNumParts] = {};  // into the file; null for an empty part
  int sparse_done = -1;                         // tokens summarized, -1: no summaries
  const uint8_t* sparse = nullptr;              // f16 [H][sparse_done / block][V][D]
};

// A parsed and checked file; the pointers point into the bytes it was parsed from.
struct KvFile {
  std::string name;
  uint32_t version = 0;
  uint64_t fingerprint = 0;
  int n_tokens = 0;
  int64_t prefill_tokens = 0;
  double prefill_seconds = 0.0;
  KvFileConfig config;
  int64_t position_offset = 0, dropped = 0;
  int overflows = 0;
  std::vector<int> tokens;
  bool chat = false;  // a conversation (kivi chat), with its turns and sampler state
  int chat_turns = 0;
  uint64_t chat_rng[4] = {};
  // Context parallelism: the file holds rank `rank`'s shard of `ranks`, positions
  // [start, start + size) of a context whose first `positions` are filled; the header's
  // n_tokens are the shard's. ranks == 0: the whole context.
  struct Shard {
    int ranks = 0, rank = 0, start = 0, size = 0;
    int64_t positions = 0;
  } shard;
  std::vector<KvFileLayer> layers;  // the stored layers, ascending
  uint64_t bytes = 0;
};

// Parses and checks `size` bytes (named `name` in errors). Throws kivi::Error with one
// line naming the file and the problem: not a KV file, another version, truncated,
// a section that fails its checksum, an invalid configuration or layer state.
KvFile parse_kv_file(const uint8_t* data, size_t size, const std::string& name);

// Throws kivi::Error unless the file can continue in a session with this model
// (fingerprint), configuration and context: same model, same configuration (the
// first difference named), a context no larger than the session's (equal under the
// shift and window policies) and tokens within the vocabulary.
void check_kv_file(const KvFile& f, uint64_t fingerprint, const KvFileConfig& here, int ctx,
                   int vocab);

// Writing. A section's bytes come from `emit`, which passes them to its argument in
// order (it is called twice: for the checksum, then for the file).
using ByteSink = std::function<void(const void*, size_t)>;
struct KvSectionSource {
  uint32_t kind = 0;
  int32_t layer = -1;
  uint64_t bytes = 0;
  std::function<void(const ByteSink&)> emit;
};
struct KvFileHeader {
  uint64_t fingerprint = 0;
  int64_t n_tokens = 0;
  int64_t prefill_tokens = 0;
  double prefill_seconds = 0.0;
};
// The config section's bytes.
std::vector<uint8_t> encode_config(const KvFileConfig& c);
// Writes the file through io::AtomicFile (a temporary file renamed into place).
// Returns the bytes written.
uint64_t write_kv_file(const std::string& path, const KvFileHeader& h,
                       const std::vector<KvSectionSource>& sections);

}  // namespace kivi::runtime
